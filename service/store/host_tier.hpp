#pragma once
// The host tier of the prefix-state store (docs/prefix-store.md, "Tiers"): snapshot
// values (snapshot_value.hpp) in the daemon's memory, at most `capacity` bytes of them,
// the least recently used leaving first. Entries are immutable and shared: a reader keeps
// its value alive while it copies it, whatever happens to the entry meanwhile. A name
// keeps its first value: putting it again (another daemon's value read from the remote
// store, a publication after the pool let the snapshot go) leaves the entry as it is.
// An entry may carry the SnapshotTierHold of the publication that put it there (or put it
// again), whose `host` flag says whether the entry is still here.
//
// Thread-safety: every member function may be called concurrently (one mutex).

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pool/snapshot_table.hpp"
#include "store/snapshot_value.hpp"

namespace statepool::service {

/// What one publishing tenant holds in a tier.
struct TierUsage {
  std::uint64_t snapshots = 0;
  std::uint64_t bytes = 0;
  std::uint64_t evictions = 0;  ///< since start: entries the tier let go for room
};

class HostTier {
 public:
  explicit HostTier(std::uint64_t capacity) : capacity_(capacity) {}

  /// Keeps `value` for `name`, published by `tenant`, evicting the least recently used
  /// entries for room. A name that has an entry keeps it (its value and its tenant): the
  /// entry only becomes the most recently used. True when the tier holds a value for the
  /// name afterwards; false, keeping nothing, when the value alone is larger than the
  /// capacity. `hold` (may be null): the publication's, whose `host` flag is set while
  /// the entry stays (and cleared when it goes).
  bool put(const SnapshotName& name, const std::string& tenant,
           std::shared_ptr<const std::string> value,
           std::shared_ptr<SnapshotTierHold> hold = nullptr);
  /// The value (the entry becomes the most recently used), or nullptr.
  [[nodiscard]] std::shared_ptr<const std::string> get(const SnapshotName& name);
  [[nodiscard]] bool contains(const SnapshotName& name) const;
  /// Removes the entries of the key under every layout; returns their names.
  std::vector<SnapshotName> remove_key(const std::string& space, const std::string& prefix,
                                       std::uint64_t position);

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t used() const;
  /// Per publishing tenant (tenants that never had an entry are absent).
  [[nodiscard]] std::map<std::string, TierUsage> usage() const;

 private:
  struct Entry {
    SnapshotName name;
    std::string tenant;
    std::shared_ptr<const std::string> value;
    std::shared_ptr<SnapshotTierHold> hold;  ///< the latest publication's; may be null
  };
  using Lru = std::list<Entry>;  // most recently used first

  void erase(Lru::iterator it);  // caller holds mutex_

  const std::uint64_t capacity_;
  mutable std::mutex mutex_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> index_;  // by remote_key(name)
  std::map<std::string, TierUsage> usage_;
  std::uint64_t used_ = 0;
};

}  // namespace statepool::service
