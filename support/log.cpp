#include "statepool/support/log.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <utility>

namespace statepool::support {
namespace {
std::atomic<LogLevel> g_level{LogLevel::info};
std::mutex g_mutex;

const char* level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug: return "DEBUG";
    case LogLevel::info: return "INFO ";
    case LogLevel::warn: return "WARN ";
    case LogLevel::error: return "ERROR";
  }
  return "?    ";
}
}  // namespace

void set_log_level(LogLevel level) noexcept {
  g_level.store(level);
}
LogLevel log_level() noexcept {
  return g_level.load();
}

bool parse_log_level(std::string_view text, LogLevel& out) noexcept {
  if (text == "debug")
    out = LogLevel::debug;
  else if (text == "info")
    out = LogLevel::info;
  else if (text == "warn" || text == "warning")
    out = LogLevel::warn;
  else if (text == "error")
    out = LogLevel::error;
  else
    return false;
  return true;
}

void log_line(LogLevel level, std::string_view component, std::string_view message) noexcept {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  const std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%s.%03dZ %s %.*s: %.*s\n", stamp, static_cast<int>(millis),
               level_name(level), static_cast<int>(component.size()), component.data(),
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
}

RateLimitedLog::RateLimitedLog(LogLevel level, std::string_view component, std::string_view what,
                               int burst, std::chrono::milliseconds period)
    : level_(level),
      component_(component),
      what_(what),
      burst_(burst),
      period_(period),
      tokens_(burst),
      last_(std::chrono::steady_clock::now()) {}

void RateLimitedLog::write(std::string_view message) noexcept {
  std::uint64_t dropped = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_) /
                                             std::chrono::duration<double>(period_));
    last_ = now;
    if (tokens_ < 1.0) {
      ++dropped_;
      return;
    }
    tokens_ -= 1.0;
    dropped = std::exchange(dropped_, 0);
  }
  if (static_cast<int>(level_) < static_cast<int>(log_level())) return;
  if (dropped == 0) {
    log_line(level_, component_, message);
    return;
  }
  try {
    log_line(level_, component_, cat(message, " (", dropped, " more ", what_, " not shown)"));
  } catch (...) {
    log_line(level_, component_, message);
  }
}

void audit(std::string_view message) noexcept {
  static RateLimitedLog log(LogLevel::warn, "audit", "refusals", kAuditBurst,
                            std::chrono::seconds(1));
  log.write(message);
}

}  // namespace statepool::support
