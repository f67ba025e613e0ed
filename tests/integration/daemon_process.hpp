#pragma once
// Runs statepoold in its own process for integration tests: a private temp directory,
// its own socket, stderr captured to a log file that is printed when a test fails.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace statepool::testing {

class DaemonProcess {
 public:
  /// Starts the daemon with `args` added to --socket/--metrics-address defaults and waits
  /// (up to 20 s) until its socket accepts connections. Fails the test (ADD_FAILURE +
  /// throw) when it exits or does not get ready.
  explicit DaemonProcess(std::vector<std::string> args, bool with_metrics = false);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  [[nodiscard]] const std::string& socket_path() const noexcept { return socket_; }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  [[nodiscard]] int metrics_port() const noexcept { return metrics_port_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const;
  /// The daemon's log so far.
  [[nodiscard]] std::string log() const;

  /// Sends `signal` and waits up to `timeout` for the exit. Returns the exit code, or -1
  /// when it did not exit in time (it is then killed), or 128+N when killed by signal N.
  int stop(int signal, std::chrono::milliseconds timeout);

 private:
  std::string dir_;
  std::string socket_;
  int metrics_port_ = 0;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

/// How a daemon run that was expected to end by itself ended.
struct Exit {
  int code = -1;  ///< exit status; -1 when it could not be started or was killed
  std::string stdout_text;
  std::string stderr_text;
};

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
