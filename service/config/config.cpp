#include "config/config.hpp"

#include "store/redis_store.hpp"

#include "statepool/support/read_file.hpp"
#include "statepool/support/size.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <grp.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <boost/asio/ip/address.hpp>
#include <boost/program_options.hpp>

namespace statepool::service {

std::vector<std::string> available_backends() {
#if defined(STATEPOOL_HAVE_CUDA)
  return {"host", "cuda"};
#else
  return {"host"};
#endif
}

namespace po = boost::program_options;
namespace {

using support::format_bytes;

constexpr const char* kVersion = "statepoold 0.1.0";

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// "0.8" (a decimal point and no unit) or "80%": a fraction; anything else is not one
// (a plain "1" is one byte, as parse_size reads it).
std::optional<double> parse_fraction(const std::string& text) {
  const std::string t = trim(text);
  const bool percent = !t.empty() && t.back() == '%';
  const std::string number = percent ? trim(t.substr(0, t.size() - 1)) : t;
  if (number.empty() || (!percent && number.find('.') == std::string::npos)) return std::nullopt;
  if (!std::all_of(number.begin(), number.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '.';
      }))
    return std::nullopt;
  if (std::count(number.begin(), number.end(), '.') > 1) return std::nullopt;
  const double value = std::stod(number);
  return percent ? value / 100.0 : value;
}

// Splits "12.5GiB" into number and unit.
void split_number(const std::string& text, double& number, std::string& unit, bool& ok) {
  const std::string t = trim(text);
  std::size_t pos = 0;
  while (pos < t.size() && (std::isdigit(static_cast<unsigned char>(t[pos])) != 0 || t[pos] == '.'))
    ++pos;
  ok = pos > 0;
  if (!ok) return;
  try {
    std::size_t used = 0;
    number = std::stod(t.substr(0, pos), &used);
    ok = used == pos && std::isfinite(number) && number >= 0;
  } catch (const std::exception&) {
    ok = false;
  }
  unit = lower(trim(t.substr(pos)));
}

std::uint32_t to_u32(std::uint64_t value, const std::string& what) {
  if (value > 0xffffffffull) throw ConfigError(what + " is too large: " + std::to_string(value));
  return static_cast<std::uint32_t>(value);
}

std::uint64_t parse_count(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  if (t.empty() ||
      !std::all_of(t.begin(), t.end(), [](unsigned char c) { return std::isdigit(c) != 0; }) ||
      t.size() > 18) {
    throw ConfigError("invalid " + what + " '" + text + "': expected a whole number");
  }
  return std::stoull(t);
}

std::vector<std::uint32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<std::uint32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (trim(item).empty()) continue;
    ids.push_back(to_u32(parse_count(item, what), what));
  }
  return ids;
}

bool valid_tenant_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '_' || c == '-' || c == '.';
  });
}

/// A [tenant.NAME] section's max-* keys; unset ones take the --tenant-max-* defaults.
struct LimitOverrides {
  std::optional<std::uint64_t> layouts, plans, arenas, connections, staging, pinned;
};
using Overrides = std::map<std::string, LimitOverrides>;

TenantConfig& tenant_entry(std::vector<TenantConfig>& tenants, const std::string& name,
                           const std::string& where) {
  if (!valid_tenant_name(name)) {
    throw ConfigError("invalid tenant name '" + name + "' in " + where +
                      ": use 1-64 letters, digits, '_', '-' or '.'");
  }
  for (auto& t : tenants)
    if (t.name == name) return t;
  tenants.push_back(TenantConfig{name, 0, {}, {}, {}, {}});
  return tenants.back();
}

void parse_tenant_flag(const std::string& text, std::vector<TenantConfig>& tenants) {
  const auto colon = text.find(':');
  const std::string name = trim(text.substr(0, colon));
  auto& tenant = tenant_entry(tenants, name, "--tenant");
  if (colon != std::string::npos)
    tenant.quota_bytes = parse_size(text.substr(colon + 1), "--tenant " + name + " quota");
}

void parse_tenant_key(const std::string& key, const std::string& value,
                      std::vector<TenantConfig>& tenants, Overrides& overrides,
                      const std::string& file) {
  // key is "tenant.NAME.FIELD"
  const auto last = key.rfind('.');
  const std::string name = key.substr(7, last - 7);
  const std::string field = key.substr(last + 1);
  auto& tenant = tenant_entry(tenants, name, file);
  const std::string what = "[tenant." + name + "] " + field;
  if (field == "quota") {
    tenant.quota_bytes = parse_size(value, what);
  } else if (field == "uids") {
    for (auto id : parse_id_list(value, what)) tenant.uids.push_back(static_cast<uid_t>(id));
  } else if (field == "gids") {
    for (auto id : parse_id_list(value, what)) tenant.gids.push_back(static_cast<gid_t>(id));
  } else if (field == "max-layouts") {
    overrides[name].layouts = parse_count(value, what);
  } else if (field == "max-plans") {
    overrides[name].plans = parse_count(value, what);
  } else if (field == "max-arenas") {
    overrides[name].arenas = parse_count(value, what);
  } else if (field == "max-connections") {
    overrides[name].connections = parse_count(value, what);
  } else if (field == "max-staging-bytes") {
    overrides[name].staging = parse_size(value, what);
  } else if (field == "max-pinned-snapshots") {
    overrides[name].pinned = parse_count(value, what);
  } else if (field == "snapshot-namespace") {
    if (!valid_tenant_name(value)) {
      throw ConfigError(what + " must be 1-64 letters, digits, '_', '-' or '.', got '" + value +
                        "'");
    }
    tenant.snapshot_namespace = value;
  } else {
    throw ConfigError("unknown key '" + field + "' in section [tenant." + name + "] of " + file +
                      " (known: quota, uids, gids, max-layouts, max-plans, max-arenas, "
                      "max-connections, max-staging-bytes, max-pinned-snapshots, "
                      "snapshot-namespace)");
  }
}

/// A count limit from `value`, which must lie in [1, max]; `what` names where it came from.
std::uint32_t count_limit(std::uint64_t value, std::uint64_t max, const std::string& what) {
  if (value < 1 || value > max) {
    throw ConfigError(what + " must be between 1 and " + std::to_string(max) + ", got " +
                      std::to_string(value));
  }
  return static_cast<std::uint32_t>(value);
}

/// Every tenant's limits: its section's max-* keys, else the --tenant-max-* defaults.
void resolve_limits(const TenantLimits& defaults, const Overrides& overrides,
                    std::vector<TenantConfig>& tenants) {
  for (TenantConfig& t : tenants) {
    t.limits = defaults;
    const auto it = overrides.find(t.name);
    if (it == overrides.end()) continue;
    const LimitOverrides& o = it->second;
    const std::string section = "[tenant." + t.name + "] ";
    if (o.layouts) t.limits.max_layouts = count_limit(*o.layouts, 65536, section + "max-layouts");
    if (o.plans) t.limits.max_plans = count_limit(*o.plans, 4096, section + "max-plans");
    if (o.arenas) t.limits.max_arenas = count_limit(*o.arenas, 65536, section + "max-arenas");
    if (o.connections)
      t.limits.max_connections = count_limit(*o.connections, 65536, section + "max-connections");
    if (o.pinned) {
      t.limits.max_pinned_snapshots =
          count_limit(*o.pinned, 1u << 20, section + "max-pinned-snapshots");
    }
    if (o.staging) {
      if (*o.staging == 0) throw ConfigError(section + "max-staging-bytes must be positive");
      t.limits.max_staging_bytes = *o.staging;
    }
  }
}

/// The bearer token in --api-token-file: the file's text without surrounding whitespace,
/// 16-1024 visible ASCII characters, in a file only its owner may read.
std::string read_token(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ConfigError("--api-token-file " + path + " may be read by others (mode " + mode +
                      "); chmod 600 it");
  }
  std::string token;
  try {
    token = support::read_file(path, 4096);
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("--api-token-file ") + e.what());
  }
  const auto first = token.find_first_not_of(" \t\r\n");
  token = first == std::string::npos
              ? std::string()
              : token.substr(first, token.find_last_not_of(" \t\r\n") - first + 1);
  const bool visible =
      std::all_of(token.begin(), token.end(), [](unsigned char c) { return c > 0x20 && c < 0x7f; });
  if (token.size() < 16 || token.size() > 1024 || !visible) {
    throw ConfigError("--api-token-file " + path +
                      ": the token must be 16 to 1024 visible ASCII characters (no spaces), "
                      "e.g. from: head -c 32 /dev/urandom | base64");
  }
  return token;
}

// "host:port" -> host (brackets kept) and port, checking the form and the port's range.
std::pair<std::string, std::uint16_t> split_host_port(const std::string& address,
                                                      const std::string& option) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ConfigError("invalid " + option + " '" + address + "': expected host:port");
  const std::uint64_t port = parse_count(address.substr(colon + 1), option + " port");
  if (port > 65535) throw ConfigError(option + " port must be at most 65535");
  return {address.substr(0, colon), static_cast<std::uint16_t>(port)};
}

// An HTTP listen address (--metrics-address, --api-address): "IP:port" ("[IPv6]:port"), or
// empty, "off" or "none" for disabled (returned as ""). The host must be an IP address:
// the listener (http/server.hpp) does not resolve names.
std::string validate_listen_address(const std::string& text, const std::string& option) {
  std::string address = trim(text);
  if (address == "off" || address == "none") address.clear();
  if (!address.empty()) (void)split_listen_address(address, option);
  return address;
}

std::string usage_text(const po::options_description& options) {
  std::ostringstream out;
  out << "Usage: statepoold [OPTIONS]\n"
         "\n"
         "statepool daemon: owns the recurrent-state memory of hybrid linear-attention LLMs,\n"
         "keeps it compressed, and serves engines over a Unix socket.\n"
         "Every option can also be set in the --config file (INI: `name = value`; tenants in\n"
         "[tenant.NAME] sections with quota, uids, gids and the max-* limits). Flags override\n"
         "the file.\n"
         "Sizes are a number with an optional unit (docs/operations.md):\n  "
      << support::size_units_text() << "\nDurations take ms/s/m/h.\n\n"
      << options;
  return out.str();
}

}  // namespace

std::uint64_t parse_size(const std::string& text, const std::string& what) {
  try {
    return support::parse_size(text);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("invalid " + what + ": " + e.what());
  }
}

std::chrono::milliseconds parse_duration(const std::string& text, const std::string& what) {
  double number = 0;
  std::string unit;
  bool ok = false;
  split_number(text, number, unit, ok);
  static const std::map<std::string, double> kUnits = {
      {"ms", 1.0}, {"s", 1000.0}, {"m", 60000.0}, {"min", 60000.0}, {"h", 3600000.0}};
  auto it = kUnits.find(unit);
  if (ok && unit.empty() && number == 0) it = kUnits.find("ms");
  if (!ok || it == kUnits.end()) {
    throw ConfigError("invalid " + what + " '" + text +
                      "': expected a duration such as 500ms, 30s or 2m");
  }
  const double ms = number * it->second;
  if (ms > 1e12) throw ConfigError(what + " '" + text + "' is too long");
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

ListenAddress split_listen_address(const std::string& address, const std::string& option) {
  auto [host, port] = split_host_port(address, option);
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    throw ConfigError("invalid " + option + " '" + address +
                      "': write an IPv6 address in brackets, as in [::1]:" + std::to_string(port));
  }
  boost::system::error_code ec;
  const auto ip = boost::asio::ip::make_address(host, ec);
  if (ec || bracketed != ip.is_v6()) {
    throw ConfigError("invalid " + option + " '" + address + "': '" + host +
                      "' is not an IP address (host names are not resolved; use e.g. "
                      "127.0.0.1, 0.0.0.0 or [::1])");
  }
  return ListenAddress{host, port};
}

ParsedArgs parse_args(int argc, const char* const* argv) {
  ParsedArgs result;
  Config& config = result.config;
  std::string socket_mode, pool_capacity, grace, max_frame, max_staging, io_timeout, drain_timeout,
      log_level, allow_uids, hello_timeout, staging_capacity, tenant_staging, snapshot_host,
      snapshot_timeout, snapshot_ttl;
  std::vector<std::string> tenant_flags;
  std::uint64_t arena_pages = 0, max_arena_pages = 0, max_connections = 0, threads = 0, workers = 0,
                max_unattached = 0, tenant_layouts = 0, tenant_plans = 0, tenant_arenas = 0,
                tenant_connections = 0, tenant_pinned = 0;
  Overrides overrides;

  // clang-format off
  po::options_description general("General");
  general.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("print-config", "print the effective configuration and exit")
      ("config,c", po::value<std::string>(&config.config_file), "read options from this INI file")
      ("log-level", po::value<std::string>(&log_level)->default_value("info"),
       "debug, info, warn or error")
      ("threads", po::value<std::uint64_t>(&threads)->default_value(2), "I/O threads (1-64)")
      ("workers", po::value<std::uint64_t>(&workers)->default_value(0),
       "worker threads for codec work and allocations (0 = one per core, at most 256)");
  po::options_description server("Server");
  server.add_options()
      ("socket", po::value<std::string>(&config.socket_path)->default_value(config.socket_path),
       "Unix socket path")
      ("socket-mode", po::value<std::string>(&socket_mode)->default_value("0660"),
       "socket file permission bits (octal)")
      ("socket-group", po::value<std::string>(&config.socket_group),
       "group that owns the socket file")
      ("allow-uids", po::value<std::string>(&allow_uids),
       "comma-separated peer uids allowed to connect (SO_PEERCRED); default any")
      ("max-connections", po::value<std::uint64_t>(&max_connections)->default_value(256),
       "concurrent client connections")
      ("max-unattached-connections",
       po::value<std::uint64_t>(&max_unattached)->default_value(8),
       "connections of one peer uid that have not completed Hello yet")
      ("hello-timeout", po::value<std::string>(&hello_timeout)->default_value("5s"),
       "time a new connection has to complete Hello")
      ("max-frame-bytes", po::value<std::string>(&max_frame)->default_value("4MiB"),
       "largest request payload accepted, header excluded (4KiB-64MiB)")
      ("max-staging-bytes", po::value<std::string>(&max_staging)->default_value("4GiB"),
       "staging memory one connection may hold")
      ("staging-capacity", po::value<std::string>(&staging_capacity)->default_value("16GiB"),
       "staging memory all connections together may hold")
      ("io-timeout", po::value<std::string>(&io_timeout)->default_value("10s"),
       "time to finish receiving a started frame or sending a reply")
      ("drain-timeout", po::value<std::string>(&drain_timeout)->default_value("10s"),
       "on SIGTERM, longest wait for in-flight requests")
      ("metrics-address",
       po::value<std::string>(&config.metrics_address)->default_value(config.metrics_address),
       "Prometheus endpoint IP:port ([::]:9464 for IPv6); empty, 'off' or 'none' disables it")
      ("api-address",
       po::value<std::string>(&config.api_address)->default_value(config.api_address),
       "HTTP JSON API (capacity planning, docs/http-api.md) IP:port; empty, 'off' or "
       "'none' disables it. Other than loopback only with --api-token-file")
      ("api-token-file", po::value<std::string>(&config.api_token_file),
       "file (mode 0600 or stricter) holding the bearer token every HTTP API request must "
       "carry (Authorization: Bearer TOKEN)");
  po::options_description pool("Pool");
  pool.add_options()
      ("backend", po::value<std::string>(&config.backend)->default_value("host"),
       "memory backend: host (memfd shared memory) or cuda (device memory shared through "
       "CUDA IPC handles; builds with CUDA only)")
      ("device", po::value<int>(&config.device)->default_value(0),
       "cuda backend: CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers them)")
      ("pool-capacity", po::value<std::string>(&pool_capacity)->default_value("1GiB"),
       "bytes of all arenas together (e.g. 64GiB); with --backend cuda also a fraction "
       "of the device's free memory at start (0.8 or 80%)")
      ("arena-pages", po::value<std::uint64_t>(&arena_pages)->default_value(64),
       "pages of an arena when the client does not say")
      ("max-arena-pages", po::value<std::uint64_t>(&max_arena_pages)->default_value(1u << 20),
       "largest arena a client may ask for, in pages")
      ("grace-period", po::value<std::string>(&grace)->default_value("30s"),
       "how long a dropped client's slots are kept for it to reconnect")
      ("plan", po::value<std::vector<std::string>>(&config.plan_files)->composing(),
       "STEPQuant plan file to load at start (repeatable; see statepool-quant calibrate)")
      ("plan-dir", po::value<std::string>(&config.plan_dir),
       "load every *.spqp plan file in this directory at start")
      ("tenant", po::value<std::vector<std::string>>(&tenant_flags)->composing(),
       "NAME[:QUOTA] (repeatable); without tenants everyone is tenant 'default'");
  const TenantLimits limit_defaults;
  po::options_description limits("Tenant limits (defaults for every tenant; a [tenant.NAME] "
                                 "section's max-* keys override them)");
  limits.add_options()
      ("tenant-max-layouts",
       po::value<std::uint64_t>(&tenant_layouts)->default_value(limit_defaults.max_layouts),
       "distinct layouts one tenant may add to the daemon (max-layouts)")
      ("tenant-max-plans",
       po::value<std::uint64_t>(&tenant_plans)->default_value(limit_defaults.max_plans),
       "STEPQuant plans one tenant may add to the daemon (max-plans)")
      ("tenant-max-arenas",
       po::value<std::uint64_t>(&tenant_arenas)->default_value(limit_defaults.max_arenas),
       "arenas one tenant may open (max-arenas)")
      ("tenant-max-connections",
       po::value<std::uint64_t>(&tenant_connections)
           ->default_value(limit_defaults.max_connections),
       "connections attached to one tenant at once (max-connections)")
      ("tenant-max-staging-bytes",
       po::value<std::string>(&tenant_staging)->default_value("8GiB"),
       "staging memory all connections of one tenant may hold together (max-staging-bytes)")
      ("tenant-max-pinned-snapshots",
       po::value<std::uint64_t>(&tenant_pinned)
           ->default_value(limit_defaults.max_pinned_snapshots),
       "pinned prefix-state snapshots one tenant's publications may hold "
       "(max-pinned-snapshots)");
  po::options_description store("Prefix-state store (docs/prefix-store.md)");
  store.add_options()
      ("snapshot-host-capacity",
       po::value<std::string>(&snapshot_host)->default_value("0"),
       "host memory for a tier of snapshots below the pool (every publication is written "
       "through to it; least recently used out first); 0 = none")
      ("snapshot-remote", po::value<std::string>(&config.snapshot_remote),
       "a Redis or Redis Cluster to share snapshots across daemons and machines: "
       "redis://[:PASSWORD@]HOST:PORT[,HOST:PORT...]; default none")
      ("snapshot-remote-timeout",
       po::value<std::string>(&snapshot_timeout)->default_value("250ms"),
       "bound on connecting to the remote store and on each command")
      ("snapshot-remote-ttl", po::value<std::string>(&snapshot_ttl)->default_value("0"),
       "expiry of the values written to the remote store (e.g. 1h); 0 = none");
  // clang-format on
  po::options_description all;
  all.add(general).add(server).add(pool).add(limits).add(store);

  po::variables_map vm;
  std::vector<TenantConfig> tenants;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
    if (vm.count("help") != 0U) {
      result.exit_now = true;
      result.output = usage_text(all);
      return result;
    }
    if (vm.count("version") != 0U) {
      result.exit_now = true;
      result.output = std::string(kVersion) + "\n";
      return result;
    }
    if (vm.count("config") != 0U) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      if (!in) throw ConfigError("cannot read config file '" + file + "'");
      // A [tenant.NAME] section may be empty (a tenant without quota or peer rules);
      // program_options reports no keys for it, so find the section headers first.
      for (std::string line; std::getline(in, line);) {
        line = trim(line);
        if (line.rfind("[tenant.", 0) == 0 && line.size() > 9 && line.back() == ']')
          tenant_entry(tenants, line.substr(8, line.size() - 9), file);
      }
      in.clear();
      in.seekg(0);
      const auto parsed = po::parse_config_file(in, all, /*allow_unregistered=*/true);
      for (const auto& option : parsed.options) {
        if (!option.unregistered) continue;
        if (option.string_key.rfind("tenant.", 0) == 0 &&
            option.string_key.find('.', 7) != std::string::npos) {
          parse_tenant_key(option.string_key, option.value.empty() ? "" : option.value.front(),
                           tenants, overrides, file);
        } else {
          throw ConfigError("unknown option '" + option.string_key + "' in " + file);
        }
      }
      po::store(parsed, vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see statepoold --help)");
  }

  for (const auto& flag : tenant_flags) parse_tenant_flag(flag, tenants);
  config.pool.tenants = std::move(tenants);

  // --- validation: everything before anything is created -------------------------
  if (!support::parse_log_level(log_level, config.log_level))
    throw ConfigError("invalid --log-level '" + log_level + "': use debug, info, warn or error");
  if (threads < 1 || threads > 64)
    throw ConfigError("--threads must be between 1 and 64, got " + std::to_string(threads));
  config.threads = static_cast<unsigned>(threads);
  if (workers > 256)
    throw ConfigError("--workers must be between 0 (one per core) and 256, got " +
                      std::to_string(workers));
  config.workers = workers != 0 ? static_cast<unsigned>(workers)
                                : std::max(1u, std::thread::hardware_concurrency());

  if (config.socket_path.empty()) throw ConfigError("--socket must not be empty");
  if (config.socket_path.front() == '@') {
    throw ConfigError("--socket '" + config.socket_path +
                      "': abstract sockets are not supported by the daemon (their access cannot "
                      "be restricted by file mode); give a filesystem path");
  }
  if (config.socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    throw ConfigError("--socket path is too long (" + std::to_string(config.socket_path.size()) +
                      " bytes; a Unix socket path must be under " +
                      std::to_string(sizeof(sockaddr_un{}.sun_path)) + ")");
  }
  {
    const std::string mode = trim(socket_mode);
    if (mode.empty() || mode.size() > 4 ||
        !std::all_of(mode.begin(), mode.end(), [](char c) { return c >= '0' && c <= '7'; }))
      throw ConfigError("invalid --socket-mode '" + socket_mode + "': expected octal like 0660");
    config.socket_mode = static_cast<unsigned>(std::stoul(mode, nullptr, 8));
    if ((config.socket_mode & 0600) != 0600)
      throw ConfigError("--socket-mode " + socket_mode + " does not let the owner read and write");
  }
  if (!config.socket_group.empty() && getgrnam(config.socket_group.c_str()) == nullptr)
    throw ConfigError("--socket-group '" + config.socket_group + "' does not exist");
  for (auto id : parse_id_list(allow_uids, "--allow-uids"))
    config.allow_uids.push_back(static_cast<uid_t>(id));

  if (max_connections < 1 || max_connections > 65536)
    throw ConfigError("--max-connections must be between 1 and 65536");
  config.max_connections = static_cast<std::uint32_t>(max_connections);
  if (max_unattached < 1 || max_unattached > max_connections)
    throw ConfigError("--max-unattached-connections must be between 1 and --max-connections (" +
                      std::to_string(max_connections) + "), got " + std::to_string(max_unattached));
  config.max_unattached_connections = static_cast<std::uint32_t>(max_unattached);
  config.hello_timeout = parse_duration(hello_timeout, "--hello-timeout");
  if (config.hello_timeout.count() < 10) throw ConfigError("--hello-timeout must be at least 10ms");
  const std::uint64_t frame = parse_size(max_frame, "--max-frame-bytes");
  if (frame < 4096 || frame > (64u << 20))
    throw ConfigError("--max-frame-bytes must be between 4KiB and 64MiB, got " + max_frame);
  config.max_frame_bytes = static_cast<std::uint32_t>(frame);
  config.max_staging_bytes = parse_size(max_staging, "--max-staging-bytes");
  if (config.max_staging_bytes == 0)
    throw ConfigError(
        "--max-staging-bytes must be positive: states reach the daemon through "
        "staging buffers");
  config.staging_capacity = parse_size(staging_capacity, "--staging-capacity");
  if (config.staging_capacity == 0) throw ConfigError("--staging-capacity must be positive");
  {
    TenantLimits& d = config.pool.default_limits;
    d.max_layouts = count_limit(tenant_layouts, 65536, "--tenant-max-layouts");
    d.max_plans = count_limit(tenant_plans, 4096, "--tenant-max-plans");
    d.max_arenas = count_limit(tenant_arenas, 65536, "--tenant-max-arenas");
    d.max_connections = count_limit(tenant_connections, 65536, "--tenant-max-connections");
    d.max_pinned_snapshots = count_limit(tenant_pinned, 1u << 20, "--tenant-max-pinned-snapshots");
    d.max_staging_bytes = parse_size(tenant_staging, "--tenant-max-staging-bytes");
    if (d.max_staging_bytes == 0) throw ConfigError("--tenant-max-staging-bytes must be positive");
    resolve_limits(d, overrides, config.pool.tenants);
  }
  config.io_timeout = parse_duration(io_timeout, "--io-timeout");
  if (config.io_timeout.count() < 10) throw ConfigError("--io-timeout must be at least 10ms");
  config.drain_timeout = parse_duration(drain_timeout, "--drain-timeout");
  config.snapshot_host_capacity = parse_size(snapshot_host, "--snapshot-host-capacity");
  config.snapshot_remote_timeout = parse_duration(snapshot_timeout, "--snapshot-remote-timeout");
  if (config.snapshot_remote_timeout.count() < 1 || config.snapshot_remote_timeout.count() > 60000)
    throw ConfigError("--snapshot-remote-timeout must be between 1ms and 60s");
  config.snapshot_remote_ttl = std::chrono::duration_cast<std::chrono::seconds>(
      parse_duration(snapshot_ttl, "--snapshot-remote-ttl"));
  if (!config.snapshot_remote.empty()) {
    try {
      (void)parse_redis_url(config.snapshot_remote);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("--snapshot-remote: ") + e.what());
    }
    if (!redis_available()) {
      throw ConfigError(
          "--snapshot-remote: this statepoold was built without hiredis (Debian package "
          "libhiredis-dev), so it has no remote snapshot tier");
    }
  }
  config.pool.snapshot_lower_tiers =
      config.snapshot_host_capacity > 0 || !config.snapshot_remote.empty();

  config.metrics_address = validate_listen_address(config.metrics_address, "--metrics-address");
  config.api_address = validate_listen_address(config.api_address, "--api-address");
  if (!config.api_token_file.empty()) config.api_token = read_token(config.api_token_file);
  if (!config.api_address.empty() && config.api_token.empty()) {
    const ListenAddress where = split_listen_address(config.api_address, "--api-address");
    boost::system::error_code ec;
    const auto ip = boost::asio::ip::make_address(where.host, ec);
    if (ec || !ip.is_loopback()) {
      throw ConfigError("--api-address " + config.api_address +
                        " is not a loopback address: the HTTP API answers about every "
                        "tenant's capacity and layouts, so off loopback it needs "
                        "--api-token-file (requests then carry Authorization: Bearer TOKEN)");
    }
  }

  {
    const auto backends = available_backends();
    if (std::find(backends.begin(), backends.end(), config.backend) == backends.end()) {
      if (config.backend == "cuda")
        throw ConfigError(
            "--backend cuda: this statepoold was built without CUDA (nvcc was not found at "
            "build time); rebuild with the CUDA toolkit installed, or use --backend host");
      std::string list;
      for (const auto& name : backends) list += (list.empty() ? "" : ", ") + name;
      throw ConfigError("unknown --backend '" + config.backend + "' (available: " + list + ")");
    }
  }
  if (config.device < 0)
    throw ConfigError("--device must be a CUDA device ordinal (0, 1, ...), got " +
                      std::to_string(config.device));
  if (const std::optional<double> fraction = parse_fraction(pool_capacity)) {
    if (!(*fraction > 0.0 && *fraction <= 1.0))
      throw ConfigError("--pool-capacity fraction must be in (0, 1], got '" + pool_capacity + "'");
    if (config.backend != "cuda")
      throw ConfigError("--pool-capacity '" + pool_capacity +
                        "' is a fraction of device memory: it needs --backend cuda (give "
                        "bytes, e.g. 8GiB, for the " +
                        config.backend + " backend)");
    config.capacity_fraction = *fraction;
  } else {
    config.pool.capacity_bytes = parse_size(pool_capacity, "--pool-capacity");
    if (config.pool.capacity_bytes == 0) throw ConfigError("--pool-capacity must be positive");
  }
  if (max_arena_pages < 1 || max_arena_pages > (1u << 24))
    throw ConfigError("--max-arena-pages must be between 1 and 16777216");
  if (arena_pages < 1 || arena_pages > max_arena_pages)
    throw ConfigError("--arena-pages must be between 1 and --max-arena-pages (" +
                      std::to_string(max_arena_pages) + "), got " + std::to_string(arena_pages));
  config.pool.default_arena_pages = static_cast<std::uint32_t>(arena_pages);
  config.pool.max_arena_pages = static_cast<std::uint32_t>(max_arena_pages);
  config.pool.grace_period = parse_duration(grace, "--grace-period");

  if (!config.plan_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(config.plan_dir, ec))
      throw ConfigError("--plan-dir '" + config.plan_dir + "' is not a directory");
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(config.plan_dir, ec))
      if (entry.path().extension() == ".spqp") found.push_back(entry.path().string());
    std::sort(found.begin(), found.end());
    config.plan_files.insert(config.plan_files.end(), found.begin(), found.end());
  }

  if (vm.count("print-config") != 0U) {
    result.exit_now = true;
    result.output = describe(config);
  }
  return result;
}

std::string describe(const Config& config) {
  std::ostringstream out;
  out << "socket " << config.socket_path << " (mode " << std::oct << config.socket_mode << std::dec
      << (config.socket_group.empty() ? "" : ", group " + config.socket_group) << ")\n"
      << "backend " << config.backend
      << (config.backend == "cuda" ? " (device " + std::to_string(config.device) + ")" : "")
      << ", pool capacity "
      << (config.capacity_fraction > 0
              ? std::to_string(static_cast<int>(std::lround(config.capacity_fraction * 100))) +
                    "% of the device's free memory"
              : format_bytes(config.pool.capacity_bytes))
      << ", arena pages " << config.pool.default_arena_pages << " (max "
      << config.pool.max_arena_pages << ")\n"
      << "grace period " << config.pool.grace_period.count() << " ms, io timeout "
      << config.io_timeout.count() << " ms, drain timeout " << config.drain_timeout.count()
      << " ms\n"
      << "limits: " << config.max_connections << " connections ("
      << config.max_unattached_connections << " per uid before Hello, which must come within "
      << config.hello_timeout.count() << " ms), frames up to "
      << format_bytes(config.max_frame_bytes) << ", staging up to "
      << format_bytes(config.max_staging_bytes) << " per connection and "
      << format_bytes(config.staging_capacity) << " in all\n"
      << "metrics " << (config.metrics_address.empty() ? "disabled" : config.metrics_address)
      << ", api " << (config.api_address.empty() ? "disabled" : config.api_address)
      << (config.api_token.empty() ? "" : " (bearer token required)") << ", threads "
      << config.threads << ", workers " << config.workers << "\n"
      << "snapshot tiers: host "
      << (config.snapshot_host_capacity == 0 ? std::string("none")
                                             : format_bytes(config.snapshot_host_capacity))
      << ", remote "
      << (config.snapshot_remote.empty() ? std::string("none") : config.snapshot_remote) << "\n";
  for (const auto& plan : config.plan_files) out << "plan " << plan << "\n";
  const auto describe_limits = [&out](const TenantLimits& l) {
    out << "; at most " << l.max_layouts << " layouts, " << l.max_plans << " plans, "
        << l.max_arenas << " arenas, " << l.max_connections << " connections, "
        << format_bytes(l.max_staging_bytes) << " staging, " << l.max_pinned_snapshots
        << " pinned snapshots";
  };
  if (config.pool.tenants.empty()) {
    out << "tenants: default (no quota";
    describe_limits(config.pool.default_limits);
    out << ")\n";
  } else {
    for (const auto& t : config.pool.tenants) {
      out << "tenant " << t.name << ": quota "
          << (t.quota_bytes == 0 ? std::string("unlimited") : format_bytes(t.quota_bytes));
      if (!t.uids.empty() || !t.gids.empty())
        out << ", " << t.uids.size() << " uids, " << t.gids.size() << " gids allowed";
      describe_limits(t.limits);
      if (!t.snapshot_namespace.empty()) out << "; snapshot namespace " << t.snapshot_namespace;
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace statepool::service
