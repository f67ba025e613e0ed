// The option table (flags and the --config INI file share it, Boost.ProgramOptions) and
// parse_args(): read flags, then the file, then hand the values to validation.
#include "config/config.hpp"
#include "config/config_internal.hpp"

#include "statepool/support/size.hpp"
#include "statepool/support/version.hpp"

#include <fstream>
#include <sstream>
#include <utility>

#include <boost/program_options.hpp>

namespace statepool::service {

namespace po = boost::program_options;
using namespace config_detail;

namespace {

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

ParsedArgs parse_args(int argc, const char* const* argv) {
  ParsedArgs result;
  Config& config = result.config;
  RawOptions raw;

  // clang-format off
  po::options_description general("General");
  general.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("print-config", "print the effective configuration and exit")
      ("config,c", po::value<std::string>(&config.config_file), "read options from this INI file")
      ("log-level", po::value<std::string>(&raw.log_level)->default_value("info"),
       "debug, info, warn or error")
      ("threads", po::value<std::uint64_t>(&raw.threads)->default_value(2), "I/O threads (1-64)")
      ("workers", po::value<std::uint64_t>(&raw.workers)->default_value(0),
       "worker threads for codec work and allocations (0 = one per core, at most 256)");
  po::options_description server("Server");
  server.add_options()
      ("socket", po::value<std::string>(&config.socket_path)->default_value(config.socket_path),
       "Unix socket path")
      ("socket-mode", po::value<std::string>(&raw.socket_mode)->default_value("0660"),
       "socket file permission bits (octal)")
      ("socket-group", po::value<std::string>(&config.socket_group),
       "group that owns the socket file")
      ("take-over", po::value<std::string>(&raw.take_over)->implicit_value("required"),
       "start by taking over the pool, clients and socket of the statepoold serving --socket "
       "(an upgrade or a restart without losing a parked state; docs/operations.md); "
       "--take-over=if-running starts fresh when no statepoold serves there (Kubernetes)")
      ("after-handover", po::value<std::string>(&raw.after_handover)->default_value("exit"),
       "after handing the pool to a successor: 'exit' (systemd), or 'wait' for SIGTERM "
       "keeping the HTTP listeners (/readyz 503), so that a Kubernetes pod does not restart")
      ("handover-socket", po::value<std::string>(&config.handover_socket),
       "socket on which the daemon hands its pool to a successor started with --take-over; "
       "default: the --socket path with .handover appended")
      ("crash-journal-interval",
       po::value<std::string>(&raw.crash_journal_interval)->default_value("20ms"),
       "under systemd: how often at most the pool's state is written to the crash journal "
       "kept in the unit's descriptor store (a crash loses at most this much; "
       "docs/operations.md); 'off' keeps no journal")
      ("allow-uids", po::value<std::string>(&raw.allow_uids),
       "comma-separated peer uids allowed to connect (SO_PEERCRED); default any")
      ("max-connections", po::value<std::uint64_t>(&raw.max_connections)->default_value(256),
       "concurrent client connections")
      ("max-unattached-connections",
       po::value<std::uint64_t>(&raw.max_unattached)->default_value(8),
       "connections of one peer uid that have not completed Hello yet")
      ("hello-timeout", po::value<std::string>(&raw.hello_timeout)->default_value("5s"),
       "time a new connection has to complete Hello")
      ("max-frame-bytes", po::value<std::string>(&raw.max_frame)->default_value("4MiB"),
       "largest request payload accepted, header excluded (4KiB-64MiB)")
      ("max-staging-bytes", po::value<std::string>(&raw.max_staging)->default_value("4GiB"),
       "staging memory one connection may hold")
      ("staging-capacity", po::value<std::string>(&raw.staging_capacity)->default_value("16GiB"),
       "staging memory all connections together may hold")
      ("max-batch-keys", po::value<std::uint64_t>(&raw.max_batch_keys)->default_value(8192),
       "keys one batched snapshot request may name (1-65536)")
      ("max-batch-bytes", po::value<std::string>(&raw.max_batch_bytes)->default_value("4GiB"),
       "state and KV bytes one batched snapshot request may read or write together")
      ("io-timeout", po::value<std::string>(&raw.io_timeout)->default_value("10s"),
       "time to finish receiving a started frame or sending a reply")
      ("drain-timeout", po::value<std::string>(&raw.drain_timeout)->default_value("10s"),
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
      ("pool-capacity", po::value<std::string>(&raw.pool_capacity)->default_value("1GiB"),
       "bytes of all arenas together (e.g. 64GiB); with --backend cuda also a fraction "
       "of the device's free memory at start (0.8 or 80%)")
      ("arena-pages", po::value<std::uint64_t>(&raw.arena_pages)->default_value(64),
       "pages of an arena when the client does not say")
      ("max-arena-pages", po::value<std::uint64_t>(&raw.max_arena_pages)->default_value(1u << 20),
       "largest arena a client may ask for, in pages")
      ("grace-period", po::value<std::string>(&raw.grace)->default_value("30s"),
       "how long a dropped client's slots are kept for it to reconnect")
      ("plan", po::value<std::vector<std::string>>(&config.plan_files)->composing(),
       "STEPQuant plan file to load at start (repeatable; see statepool-quant calibrate)")
      ("plan-dir", po::value<std::string>(&config.plan_dir),
       "load every *.spqp plan file in this directory at start")
      ("tenant", po::value<std::vector<std::string>>(&raw.tenant_flags)->composing(),
       "NAME[:QUOTA] (repeatable); without tenants everyone is tenant 'default'");
  const TenantLimits limit_defaults;
  po::options_description limits("Tenant limits (defaults for every tenant; a [tenant.NAME] "
                                 "section's max-* keys override them)");
  limits.add_options()
      ("tenant-max-layouts",
       po::value<std::uint64_t>(&raw.tenant_layouts)->default_value(limit_defaults.max_layouts),
       "distinct layouts one tenant may add to the daemon (max-layouts)")
      ("tenant-max-plans",
       po::value<std::uint64_t>(&raw.tenant_plans)->default_value(limit_defaults.max_plans),
       "STEPQuant plans one tenant may add to the daemon (max-plans)")
      ("tenant-max-arenas",
       po::value<std::uint64_t>(&raw.tenant_arenas)->default_value(limit_defaults.max_arenas),
       "arenas one tenant may open (max-arenas)")
      ("tenant-max-connections",
       po::value<std::uint64_t>(&raw.tenant_connections)
           ->default_value(limit_defaults.max_connections),
       "connections attached to one tenant at once (max-connections)")
      ("tenant-max-staging-bytes",
       po::value<std::string>(&raw.tenant_staging)->default_value("8GiB"),
       "staging memory all connections of one tenant may hold together (max-staging-bytes)")
      ("tenant-max-pinned-snapshots",
       po::value<std::uint64_t>(&raw.tenant_pinned)
           ->default_value(limit_defaults.max_pinned_snapshots),
       "pinned prefix-state snapshots one tenant's publications may hold "
       "(max-pinned-snapshots)");
  po::options_description store("Prefix-state store (docs/prefix-store.md)");
  store.add_options()
      ("snapshot-host-capacity",
       po::value<std::string>(&raw.snapshot_host)->default_value("0"),
       "host memory for a tier of snapshots below the pool (every publication is written "
       "through to it; least recently used out first); 0 = none")
      ("snapshot-remote", po::value<std::string>(&config.snapshot_remote),
       "a Redis or Redis Cluster to share snapshots across daemons and machines: "
       "redis://[:PASSWORD@]HOST:PORT[,HOST:PORT...]; default none")
      ("snapshot-remote-timeout",
       po::value<std::string>(&raw.snapshot_timeout)->default_value("250ms"),
       "bound on connecting to the remote store and on each command")
      ("snapshot-remote-ttl", po::value<std::string>(&raw.snapshot_ttl)->default_value("0"),
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
      result.output = std::string("statepoold ") + support::version() + "\n";
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
                           tenants, raw.overrides, file);
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

  for (const auto& flag : raw.tenant_flags) parse_tenant_flag(flag, tenants);
  config.pool.tenants = std::move(tenants);

  raw.validate(config);

  if (vm.count("print-config") != 0U) {
    result.exit_now = true;
    result.output = describe(config);
  }
  return result;
}

}  // namespace statepool::service
