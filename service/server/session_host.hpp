#pragma once
// What a session needs of the server that accepted it, and nothing more: the handlers'
// context (config, pool, workers, executor), the metrics, the drain flag (set once the
// listener has closed), the budget of connections before Hello per peer uid, and a way
// to say that it has ended. Server builds one for all its sessions; Session reaches no
// other part of the server.
//
// Thread-safety: UnattachedBudget is thread-safe; `ended` may be called from any thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include <sys/types.h>

#include "handlers/handlers.hpp"
#include "metrics/metrics.hpp"

namespace statepool::service {

/// Connections of one peer uid that have not completed Hello (--max-unattached-connections),
/// so that one user's silent connections cannot lock others out.
class UnattachedBudget {
 public:
  explicit UnattachedBudget(std::uint32_t per_uid) : per_uid_(per_uid) {}
  /// Claims one of `uid`'s places; false when they are all taken.
  [[nodiscard]] bool enter(uid_t uid) {
    const std::lock_guard lock(mutex_);
    std::uint32_t& count = by_uid_[uid];
    if (count >= per_uid_) return false;
    ++count;
    return true;
  }
  /// Gives one of `uid`'s places back (after a successful enter()).
  void leave(uid_t uid) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = by_uid_.find(uid);
    if (it != by_uid_.end() && --it->second == 0) by_uid_.erase(it);
  }

 private:
  const std::uint32_t per_uid_;
  std::mutex mutex_;
  std::map<uid_t, std::uint32_t> by_uid_;
};

struct SessionHost {
  ServerContext& context;
  Metrics* metrics;  ///< null when the daemon has none (tests)
  /// Set by a drain once the listener is closed: a session closes when it has nothing
  /// (no byte of a request) to serve.
  const std::atomic<bool>& listener_closed;
  UnattachedBudget& unattached;
  /// Called once per session when it has ended (its connection is closed).
  std::function<void(std::uint64_t id)> ended;
};

}  // namespace statepool::service
