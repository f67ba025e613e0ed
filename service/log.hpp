#pragma once
// Minimal structured logging to stderr: "2026-11-29T10:00:00.123Z INFO  server: message".
// Thread-safe (one line per call, written under a mutex).

#include <sstream>
#include <string>
#include <string_view>

namespace statepool::service {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

void set_log_level(LogLevel level) noexcept;
[[nodiscard]] LogLevel log_level() noexcept;
/// Parses debug|info|warn|error.
[[nodiscard]] bool parse_log_level(std::string_view text, LogLevel& out) noexcept;
void log_line(LogLevel level, std::string_view component, std::string_view message) noexcept;

/// Concatenates any streamable values: cat("arena ", id, " full").
template <class... Args>
[[nodiscard]] std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace statepool::service

#define STATEPOOL_LOG(level, component, ...)                                            \
  do {                                                                                  \
    if (static_cast<int>(level) >= static_cast<int>(::statepool::service::log_level())) \
      ::statepool::service::log_line((level), (component),                              \
                                     ::statepool::service::cat(__VA_ARGS__));           \
  } while (false)
#define LOG_DEBUG(component, ...) \
  STATEPOOL_LOG(::statepool::service::LogLevel::debug, component, __VA_ARGS__)
#define LOG_INFO(component, ...) \
  STATEPOOL_LOG(::statepool::service::LogLevel::info, component, __VA_ARGS__)
#define LOG_WARN(component, ...) \
  STATEPOOL_LOG(::statepool::service::LogLevel::warn, component, __VA_ARGS__)
#define LOG_ERROR(component, ...) \
  STATEPOOL_LOG(::statepool::service::LogLevel::error, component, __VA_ARGS__)
