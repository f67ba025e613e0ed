#pragma once
// Runs statepoold in its own process for integration tests: a private temp directory,
// its own socket, stderr captured to a log file. No GoogleTest here: a daemon that does
// not start throws DaemonError carrying its log (a test reports the exception as a
// failure with that message). gtest/daemon_process.hpp adds printing the log when a test
// fails.
//
// Thread-safety: a Daemon belongs to one thread; the free functions are independent.

#include <sys/types.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "statepool/testing/temp_dir.hpp"

namespace statepool::testing {

/// statepoold did not get ready (it exited, or its socket did not accept within 20 s).
/// what(): "statepoold did not get ready; its log:\n" followed by the whole log.
class DaemonError : public std::runtime_error {
 public:
  explicit DaemonError(const std::string& log)
      : std::runtime_error("statepoold did not get ready; its log:\n" + log), log_(log) {}
  [[nodiscard]] const std::string& log() const noexcept { return log_; }

 private:
  std::string log_;
};

/// Which TCP listeners a Daemon gets; each one that is on gets a free port on
/// 127.0.0.1, the others are passed "off".
struct DaemonOptions {
  bool metrics = false;  ///< --metrics-address (Prometheus exporter)
  bool api = false;      ///< --api-address (HTTP JSON API)
  /// When set, the daemon runs with this descriptor limit, soft and hard (prlimit(1)
  /// from util-linux starts it).
  unsigned descriptor_limit = 0;
  /// A successor (--take-over) of this running daemon: the same socket, hand-over socket
  /// and TCP ports; ready once its log says it serves ("ready on"), which it says only
  /// after taking the pool over.
  const class Daemon* take_over_from = nullptr;
  /// With take_over_from: the successor gets TCP ports of its own (as `metrics` and `api`
  /// say) instead of its predecessor's, which keeps them (--after-handover=wait).
  bool own_ports = false;
  /// Started as systemd starts a unit's main process (spawn_with_fds(),
  /// service_manager.hpp): NOTIFY_SOCKET is this manager's socket, and the descriptors in
  /// its store are passed as 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID.
  /// Without one the daemon inherits this process's environment as it is.
  const class ServiceManager* service_manager = nullptr;
};

class Daemon {
 public:
  /// Starts the daemon with `args` added to --socket/--metrics-address/--api-address
  /// defaults and waits (up to 20 s) until its socket accepts connections. Throws
  /// DaemonError (after killing it) when it exits or does not get ready, and
  /// std::runtime_error when it cannot be spawned.
  Daemon(std::vector<std::string> args, DaemonOptions options);
  explicit Daemon(std::vector<std::string> args, bool with_metrics = false)
      : Daemon(std::move(args), DaemonOptions{with_metrics, false}) {}
  /// Kills the daemon if it still runs and removes its directory.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  [[nodiscard]] const std::string& socket_path() const noexcept { return socket_; }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_.path(); }
  [[nodiscard]] int metrics_port() const noexcept { return metrics_port_; }
  /// Port of the HTTP API; 0 unless DaemonOptions::api.
  [[nodiscard]] int api_port() const noexcept { return api_port_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const;
  /// The daemon's log so far.
  [[nodiscard]] std::string log() const;

  /// Sends `signal` and waits up to `timeout` for the exit. Returns the exit code, or -1
  /// when it did not exit in time (it is then killed), or 128+N when killed by signal N.
  /// stop(SIGKILL, ...) is `kill -9` (a crash: no drain, nothing written at exit), and
  /// returns 137.
  int stop(int signal, std::chrono::milliseconds timeout);

 private:
  TempDir dir_{"/tmp/statepool-test"};  // short: the socket's path must fit in sun_path
  std::string socket_;
  int metrics_port_ = 0;
  int api_port_ = 0;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

/// How a daemon run that was expected to end by itself ended.
struct Exit {
  int code = -1;  ///< exit status; -1 when it could not be started or was killed
  std::string stdout_text;
  std::string stderr_text;
};

/// Runs the program argv[0] with arguments argv[1..] to completion, capturing its output in
/// files under `dir` (stdout.txt, stderr.txt). code is -1 when it could not be started or
/// was killed by a signal.
Exit run_program(const std::vector<std::string>& argv, const std::string& dir);

/// Runs statepoold with `args` to completion (for runs that must exit by themselves, such
/// as configuration errors or --print-config), capturing its output in files under `dir`.
Exit run_daemon(const std::vector<std::string>& args, const std::string& dir);

/// Polls `condition` every few milliseconds until it holds or `timeout` passes.
/// Returns whether it held. (Waiting for a condition, not sleeping blindly.)
template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout);

/// A TCP port that was free a moment ago on 127.0.0.1.
int free_tcp_port();

/// GET http://127.0.0.1:port/path; returns the body ("" on failure).
std::string http_get(int port, const std::string& path);

/// Connects to 127.0.0.1:port, sends `bytes` (stopping early if the peer closes), and
/// reads until the peer closes the connection (at most 30 s). Returns what was read.
std::string http_raw(int port, const std::string& bytes);

/// An HTTP response as http_request() read it.
struct HttpResponse {
  int status = 0;       ///< 0 when no response could be read
  std::string headers;  ///< status line and header fields, CRLF-separated
  std::string body;
  /// The value of header field `name` (case-insensitive), "" when absent.
  [[nodiscard]] std::string header(const std::string& name) const;
};

/// Sends one request to http://127.0.0.1:port`target` over a fresh connection
/// (`Connection: close`; a Content-Length header when `body` is not empty, or when the
/// method is POST) and reads the response to the end. `version` is "1.1" or "1.0".
HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body = {}, const std::string& version = "1.1");

}  // namespace statepool::testing

#include <thread>

template <class Condition>
bool statepool::testing::eventually(Condition condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}
