#pragma once
// Daemon configuration: command-line flags and an optional INI-style config file share one
// set of option names (Boost.ProgramOptions). Flags override the file. Tenants come from
// `[tenant.NAME]` sections of the file or from repeated `--tenant NAME[:QUOTA]` flags.
//
// Everything is validated here, before the daemon creates anything: a bad configuration is
// a ConfigError whose message names the option and the value.

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/types.h>

#include "pool/pool.hpp"
#include "statepool/support/log.hpp"

namespace statepool::service {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Config {
  std::string socket_path = "/run/statepool/statepool.sock";
  unsigned socket_mode = 0660;  ///< permission bits of the socket file
  std::string socket_group;     ///< group owning the socket file ("" = unchanged)
  std::string backend = "host";
  int device = 0;  ///< cuda backend: the CUDA device ordinal (--device)
  /// cuda backend: --pool-capacity given as a fraction of the device's free memory at
  /// start (0 < f <= 1); 0 = capacity_bytes as given. Resolved by the backend.
  double capacity_fraction = 0.0;
  std::string metrics_address = "127.0.0.1:9464";  ///< IP:port; "" = no /metrics
  std::string api_address = "127.0.0.1:9465";      ///< HTTP JSON API, IP:port; "" = none
  /// --api-token-file: the bearer token every HTTP API request must carry ("" = none,
  /// allowed only with a loopback --api-address).
  std::string api_token;
  std::string api_token_file;
  PoolConfig pool;
  std::uint32_t max_frame_bytes = 4u << 20;  ///< large enough for the plan of a 400B-class model
  std::uint64_t max_staging_bytes = 4ull << 30;  ///< per connection
  std::uint64_t staging_capacity = 16ull << 30;  ///< all connections together
  /// One batched snapshot request (LookupSnapshots, PutSnapshots, GetSnapshots): keys at
  /// most, and state and KV bytes read or written together at most (the Hello reply
  /// tells clients both).
  std::uint32_t max_batch_keys = 8192;
  std::uint64_t max_batch_bytes = 4ull << 30;
  std::uint32_t max_connections = 256;
  /// Connections of one peer uid that have not completed Hello yet (not attached to a
  /// tenant): at most this many at once, so one user's silent connections cannot lock
  /// other users out.
  std::uint32_t max_unattached_connections = 8;
  /// A connection must complete Hello within this time, or it is closed.
  std::chrono::milliseconds hello_timeout{5000};
  std::chrono::milliseconds io_timeout{10000};     ///< to finish a started frame or a reply
  std::chrono::milliseconds drain_timeout{10000};  ///< SIGTERM: longest wait for in-flight work
  unsigned threads = 2;                            ///< I/O threads
  unsigned workers = 0;  ///< worker threads (codec work, allocations); 0 = one per core
  support::LogLevel log_level = support::LogLevel::info;
  std::vector<uid_t> allow_uids;        ///< empty = any peer uid (socket mode rules)
  std::string config_file;              ///< the file read, if any
  std::vector<std::string> plan_files;  ///< STEPQuant plan files loaded at start
  // The prefix-state store's tiers below the pool (docs/prefix-store.md, "Tiers").
  std::uint64_t snapshot_host_capacity = 0;                ///< host tier bytes; 0 = none
  std::string snapshot_remote;                             ///< redis://host:port[,...]; "" = none
  std::chrono::milliseconds snapshot_remote_timeout{250};  ///< connect and each command
  std::chrono::seconds snapshot_remote_ttl{0};             ///< expiry of remote values; 0 = none
  std::string plan_dir;  ///< every *.spqp file in it is loaded too
  /// The hand-over (docs/operations.md, "Upgrade without losing state"): the socket on
  /// which this daemon hands its pool to a successor, and on which a successor started
  /// with --take-over asks for it. Default: --socket with ".handover" appended.
  std::string handover_socket;
  /// --crash-journal-interval: under systemd, the crash journal's longest delay after a
  /// change (server/crash_journal.hpp); 0 (off): no journal.
  std::chrono::milliseconds crash_journal_interval{20};
  bool take_over = false;  ///< --take-over: start with the pool of the daemon now serving
  /// --take-over=if-running: start fresh when no daemon listens on the hand-over socket.
  bool take_over_if_running = false;
  /// --after-handover=wait: a daemon that handed over keeps its HTTP listeners (they are
  /// not handed over), answers /readyz 503, and exits at SIGTERM (Kubernetes).
  bool wait_after_handover = false;
};

/// Outcome of parsing argv: either a configuration to run, or text to print and an exit
/// code (--help, --version, --print-config).
struct ParsedArgs {
  Config config;
  bool exit_now = false;
  int exit_code = 0;
  std::string output;
};

/// Parses flags (and the file named by --config). Throws ConfigError.
[[nodiscard]] ParsedArgs parse_args(int argc, const char* const* argv);

/// "1GiB", "512MiB", "64KiB", "1G", "4096" -> bytes. Throws ConfigError naming `what`.
[[nodiscard]] std::uint64_t parse_size(const std::string& text, const std::string& what);
/// "30s", "500ms", "2m", "0" -> milliseconds. Throws ConfigError naming `what`.
[[nodiscard]] std::chrono::milliseconds parse_duration(const std::string& text,
                                                       const std::string& what);

/// A validated listen address ("127.0.0.1:9465", "[::1]:0") split into its parts: the
/// host without IPv6 brackets and the port (0 = any free port).
struct ListenAddress {
  std::string host;
  std::uint16_t port = 0;
};
/// Splits an address that parse_args() accepted. Throws ConfigError otherwise.
[[nodiscard]] ListenAddress split_listen_address(const std::string& address,
                                                 const std::string& option);

/// The memory backends this build offers (--backend; backend/backend.hpp builds them): "host",
/// and "cuda" in builds with CUDA. For --help, validation and error messages.
[[nodiscard]] std::vector<std::string> available_backends();

/// Human-readable summary of the effective configuration (logged at start-up).
[[nodiscard]] std::string describe(const Config& config);

}  // namespace statepool::service
