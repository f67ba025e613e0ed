#pragma once
// Minimal structured logging to stderr: "2026-11-29T10:00:00.123Z INFO  server: message".
// Thread-safe (one line per call, written under a mutex).

#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

namespace statepool::support {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

void set_log_level(LogLevel level) noexcept;
[[nodiscard]] LogLevel log_level() noexcept;
/// Parses debug|info|warn|error.
[[nodiscard]] bool parse_log_level(std::string_view text, LogLevel& out) noexcept;
void log_line(LogLevel level, std::string_view component, std::string_view message) noexcept;

/// Lines of one kind that peers can make frequent (refusals, HTTP API errors), written
/// without letting a client that retries in a loop flood the log: a token bucket of
/// `burst` lines that gains one line every `period`. A line written after some were
/// dropped ends with "(N more <what> not shown)". Thread-safe.
class RateLimitedLog {
 public:
  RateLimitedLog(LogLevel level, std::string_view component, std::string_view what, int burst,
                 std::chrono::milliseconds period);
  void write(std::string_view message) noexcept;

 private:
  LogLevel level_;
  std::string component_;
  std::string what_;
  double burst_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  double tokens_;
  std::chrono::steady_clock::time_point last_;
  std::uint64_t dropped_ = 0;
};

/// Lines of an audit: what a peer was refused (another tenant's arena, a tenant its uid may
/// not use, a uid the daemon does not allow), as warn lines of component "audit": at most
/// kAuditBurst at once, then one a second (RateLimitedLog).
inline constexpr int kAuditBurst = 10;
void audit(std::string_view message) noexcept;

/// Concatenates any streamable values: cat("arena ", id, " full").
template <class... Args>
[[nodiscard]] std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace statepool::support

#define STATEPOOL_LOG(level, component, ...)                                            \
  do {                                                                                  \
    if (static_cast<int>(level) >= static_cast<int>(::statepool::support::log_level())) \
      ::statepool::support::log_line((level), (component),                              \
                                     ::statepool::support::cat(__VA_ARGS__));           \
  } while (false)
#define LOG_DEBUG(component, ...) \
  STATEPOOL_LOG(::statepool::support::LogLevel::debug, component, __VA_ARGS__)
#define LOG_INFO(component, ...) \
  STATEPOOL_LOG(::statepool::support::LogLevel::info, component, __VA_ARGS__)
#define LOG_WARN(component, ...) \
  STATEPOOL_LOG(::statepool::support::LogLevel::warn, component, __VA_ARGS__)
#define LOG_ERROR(component, ...) \
  STATEPOOL_LOG(::statepool::support::LogLevel::error, component, __VA_ARGS__)
