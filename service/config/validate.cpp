// Validation: every option's value is checked, and turned into the Config, before the
// daemon creates anything.
#include "config/config.hpp"
#include "config/config_internal.hpp"

#include "store/redis_store.hpp"

#include "statepool/support/read_file.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include <grp.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <boost/asio/ip/address.hpp>

namespace statepool::service {

std::vector<std::string> available_backends() {
#if defined(STATEPOOL_HAVE_CUDA)
  return {"host", "cuda"};
#else
  return {"host"};
#endif
}

namespace config_detail {
namespace {

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

// An HTTP listen address (--metrics-address, --api-address): "IP:port" ("[IPv6]:port"), or
// empty, "off" or "none" for disabled (returned as ""). The host must be an IP address:
// the listener (http/server.hpp) does not resolve names.
std::string validate_listen_address(const std::string& text, const std::string& option) {
  std::string address = trim(text);
  if (address == "off" || address == "none") address.clear();
  if (!address.empty()) (void)split_listen_address(address, option);
  return address;
}

}  // namespace

void RawOptions::validate(Config& config) const {
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
  if (config.handover_socket.empty()) {
    // The default; none (no hand-over) when the socket's path leaves no room for it.
    const std::string fallback = config.socket_path + ".handover";
    if (fallback.size() < sizeof(sockaddr_un{}.sun_path)) config.handover_socket = fallback;
  } else if (config.handover_socket.size() >= sizeof(sockaddr_un{}.sun_path) ||
             config.handover_socket.front() == '@' ||
             config.handover_socket == config.socket_path) {
    throw ConfigError(
        "--handover-socket '" + config.handover_socket + "' must be a filesystem path under " +
        std::to_string(sizeof(sockaddr_un{}.sun_path)) + " bytes, other than --socket");
  }
  if (const std::string value = trim(take_over); value.empty() || value == "no" ||
                                                  value == "false" || value == "off") {
    config.take_over = false;
  } else if (value == "required" || value == "yes" || value == "true") {
    config.take_over = true;
  } else if (value == "if-running") {
    config.take_over = true;
    config.take_over_if_running = true;
  } else {
    throw ConfigError("--take-over=" + value +
                      ": --take-over takes over or fails; --take-over=if-running starts fresh "
                      "when no statepoold runs");
  }
  if (const std::string value = trim(after_handover); value == "exit") {
    config.wait_after_handover = false;
  } else if (value == "wait") {
    config.wait_after_handover = true;
  } else {
    throw ConfigError("--after-handover '" + value + "' must be exit or wait");
  }
  if (config.take_over && config.handover_socket.empty()) {
    throw ConfigError(
        "--take-over needs a --handover-socket (the --socket path is too long for "
        "the default, --socket with .handover appended)");
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
  if (max_batch_keys < 1 || max_batch_keys > 65536)
    throw ConfigError("--max-batch-keys must be between 1 and 65536, got " +
                      std::to_string(max_batch_keys));
  config.max_batch_keys = static_cast<std::uint32_t>(max_batch_keys);
  config.max_batch_bytes = parse_size(max_batch_bytes, "--max-batch-bytes");
  if (config.max_batch_bytes < (1u << 20))
    throw ConfigError("--max-batch-bytes must be at least 1MiB, got " + max_batch_bytes);
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
  if (crash_journal_interval == "off") {
    config.crash_journal_interval = std::chrono::milliseconds(0);
  } else {
    config.crash_journal_interval =
        parse_duration(crash_journal_interval, "--crash-journal-interval");
    if (config.crash_journal_interval.count() < 1 || config.crash_journal_interval.count() > 60000)
      throw ConfigError("--crash-journal-interval must be between 1ms and 60s, or off");
  }
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
}

}  // namespace config_detail
}  // namespace statepool::service
