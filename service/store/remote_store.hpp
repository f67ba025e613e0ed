#pragma once
// RemoteStore: the remote tier's view of a key-value store that holds snapshot values
// (docs/prefix-store.md), and RemoteError, the one exception it throws. The Redis client
// (store/redis_store.hpp) is the implementation; tests and other tiers may add more.
//
// Keys and values are bytes (any values, NUL included). The store logs nothing: a failure
// is a RemoteError whose message names the node and the reason, for the caller to log.
//
// Thread-safety: every member of a RemoteStore may be called from several threads at once.

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace statepool::service {

/// The remote store failed: unreachable, timed out, or it answered an error.
/// what(): "redis 127.0.0.1:6379 unreachable: Connection refused" and the like.
class RemoteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A remote key-value store for snapshot values. Thread-safe: every member may be called
/// from several threads at once.
class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  RemoteStore() = default;
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  /// SET key value (with PX ttl when the store has one). Throws RemoteError (unreachable,
  /// timeout, error reply).
  virtual void put(std::string_view key, std::string_view value) = 0;
  /// GET: the value, or nullopt when the key is absent. Throws RemoteError.
  virtual std::optional<std::string> get(std::string_view key) = 0;
  /// DEL (absent keys are fine). Throws RemoteError.
  virtual void remove(std::string_view key) = 0;
  /// "redis 127.0.0.1:6379" / "redis cluster of 3 nodes (127.0.0.1:7000, ...)": for logs.
  [[nodiscard]] virtual std::string describe() const = 0;
};

}  // namespace statepool::service
