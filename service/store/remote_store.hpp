#pragma once
// RemoteStore: the remote tier's view of a key-value store that holds snapshot values
// (docs/prefix-store.md), and RemoteError, the one exception it throws. The Redis client
// (store/redis_store.hpp) is the implementation; tests and other tiers may add more.
//
// Keys and values are bytes (any values, NUL included). A key keeps its first value: put
// stores only a key that is absent (snapshots are immutable, and a second publisher's
// value must not replace the first one that other daemons may be reading). The store
// logs nothing: a failure is a RemoteError whose message names the node and the reason,
// for the caller to log.
//
// Thread-safety: every member of a RemoteStore may be called from several threads at once.
// A get never waits for a put or a remove in flight (an implementation keeps lookups and
// writes on separate connections), so that a large write cannot delay a client's lookup.

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

  /// SET key value NX (with PX ttl when the store has one): true when the value was
  /// stored, false when the key had a value, which stays as it was (its ttl too). Throws
  /// RemoteError (unreachable, timeout, error reply).
  virtual bool put(std::string_view key, std::string_view value) = 0;
  /// GET: the value, or nullopt when the key is absent. Throws RemoteError.
  virtual std::optional<std::string> get(std::string_view key) = 0;
  /// DEL (absent keys are fine). Throws RemoteError.
  virtual void remove(std::string_view key) = 0;
  /// EXISTS: whether the key has a value, without reading it. Throws RemoteError.
  virtual bool exists(std::string_view key) = 0;
  /// "redis 127.0.0.1:6379" / "redis cluster of 3 nodes (127.0.0.1:7000, ...)": for logs.
  [[nodiscard]] virtual std::string describe() const = 0;
};

}  // namespace statepool::service
