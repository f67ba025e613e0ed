#pragma once
// SnapshotTable: the prefix-state snapshots the pool holds (docs/prefix-store.md).
//
// A snapshot is one page of an arena that no lease owns: an immutable copy of a slot's
// state published under a key (the engine's prefix hash and the token position), bound to
// the layout it was published with, in a namespace of tenants that share snapshots.
// Entries are found by (namespace, prefix, position, layout); a key may have one entry per
// layout.
//
// Life of an entry: put() adds it "busy" (its page is being written), commit() makes it
// visible, abort() forgets it. acquire() / release() bracket every read of its page. An
// entry that is erased (delete, eviction) while busy leaves the index at once and keeps
// its pages until its last reader or writer is done; release()/commit()/abort() then
// hand the entry back: its pages are the caller's to free.
//
// Eviction order: least recently used first (a monotonic use counter, bumped by
// commit() and by every acquire()), per arena, among the visible, unpinned, idle entries.
//
// Thread-safety: none; the Pool serializes every call.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/ids.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/snapshot.hpp"

namespace statepool::service {

using SnapshotId = std::uint64_t;  ///< 0 never names a snapshot

using kernels::kMaxSnapshotPrefixBytes;  ///< largest prefix (key) of a snapshot, in bytes

/// What the tiers below the pool (store/tiers.hpp) hold of one published snapshot's value,
/// so that the pool's eviction can tell a demotion (the value is still below, or on its
/// way there) from an eviction (it is gone from the daemon and from the remote store as far
/// as this daemon knows). The handler that publishes a snapshot makes one and hands it to
/// the pool (Snapshot::below) and to the tiers, which keep it up to date; the pool reads
/// it, under its lock, when it evicts the snapshot.
///
/// Thread-safety: atomics, written by the tiers' threads and read by the pool. The tiers
/// set `host` and `remote` before they clear `publishing`, and held() reads `publishing`
/// first, so that a value on its way is never seen as held by no tier.
struct SnapshotTierHold {
  /// The value is copied out of the pool and not yet offered to the tiers (its checksum
  /// is being computed on a worker).
  std::atomic<bool> publishing{true};
  /// The host tier holds the value; cleared when it lets it go for room or deletes it.
  std::atomic<bool> host{false};
  /// A remote write of the value is queued, in flight, or done (stored, or the key was
  /// there already: the first publication stands); cleared when the write failed. A write
  /// dropped because the queue was full never sets it. What the remote store does later
  /// (its ttl, its maxmemory policy) is not seen.
  std::atomic<bool> remote{false};

  /// Whether a tier below the pool holds the value, or soon will.
  [[nodiscard]] bool held() const noexcept {
    return publishing.load() || host.load() || remote.load();
  }
};

struct Snapshot {
  SnapshotId id = 0;
  std::size_t space = 0;  ///< namespace index (the pool's)
  std::string prefix;     ///< the engine's prefix hash (bytes)
  std::uint64_t position = 0;
  LayoutId layout = 0;
  std::size_t tenant = 0;  ///< the publisher, whose arena (and quota) holds the page
  ArenaId arena = 0;
  SlotId slot = 0;  ///< the recurrent state's page
  /// Hybrid entries: the attention layers' KV blocks, encoded (kernels::kv_encode_blocks)
  /// and spread over these further pages of the arena, in order; the last one partly used.
  std::optional<kernels::KvBlocks> kv;
  std::vector<SlotId> kv_pages;
  /// Where its value went below the pool; null when it was not written through (no tiers
  /// below), so that its eviction is no demotion.
  std::shared_ptr<const SnapshotTierHold> below;
  bool visible = false;  ///< committed and not erased
  bool erased = false;   ///< out of the index, page freed when idle
  bool pinned = false;
  std::uint32_t busy = 0;  ///< the writer until commit, then readers
  std::uint64_t last_use = 0;
  std::uint64_t hits = 0;
  Clock::time_point created{};
  Clock::time_point used{};

  /// Pages of the arena the entry holds: its state's page and its KV pages.
  [[nodiscard]] std::size_t pages() const noexcept { return 1 + kv_pages.size(); }
  /// Every page, the state's first.
  [[nodiscard]] std::vector<SlotId> all_pages() const;
};

class SnapshotTable {
 public:
  /// The entry for the exact key, visible or being written; nullptr when none.
  [[nodiscard]] const Snapshot* find(std::size_t space, std::string_view prefix,
                                     std::uint64_t position, LayoutId layout) const;
  /// Visible entries of the namespace whose key is (prefix, position) under any layout.
  [[nodiscard]] std::vector<SnapshotId> with_key(std::size_t space, std::string_view prefix,
                                                 std::uint64_t position) const;
  /// Visible entries of the namespace whose prefix starts with `start`, in key order, at
  /// most `limit`; `more` tells whether others follow.
  [[nodiscard]] std::vector<SnapshotId> starting_with(std::size_t space, std::string_view start,
                                                      std::size_t limit, bool& more) const;

  /// Adds a busy, invisible entry for a page the caller has allocated. The key must not
  /// be in the index. Strong guarantee.
  const Snapshot& put(Snapshot entry, Clock::time_point now);
  /// Adds a visible entry taken over from another process, as the most recently used one
  /// (restore them least recently used first), with its pin, hits and times. The key must
  /// not be in the index (else StatusError(invalid_argument)). Strong guarantee.
  const Snapshot& restore(Snapshot entry);
  /// The writer is done: the entry becomes visible (unless erased meanwhile). Returns the
  /// entry when it is gone (erased meanwhile): its pages are then the caller's to free.
  std::optional<Snapshot> commit(SnapshotId id);
  /// The write failed: the entry is forgotten and returned; its pages are the caller's.
  std::optional<Snapshot> abort(SnapshotId id) noexcept;
  /// A reader starts: counts a hit and makes the entry the most recently used.
  const Snapshot& acquire(SnapshotId id, Clock::time_point now);
  /// A reader is done. Returns the entry when it is gone (its pages are the caller's).
  std::optional<Snapshot> release(SnapshotId id) noexcept;
  /// Takes the entry out of the index. Returns the entry when it was idle and is gone (its
  /// pages are the caller's to free); nothing when it stays until its last reader is done.
  std::optional<Snapshot> erase(SnapshotId id) noexcept;
  /// Pins or unpins a visible entry. Returns true when that changed it.
  bool set_pinned(SnapshotId id, bool pinned) noexcept;

  /// The least recently used visible, unpinned, idle entries of the arena, oldest first,
  /// until together they hold at least `pages` pages (all of them when they hold fewer).
  [[nodiscard]] std::vector<SnapshotId> evictable(ArenaId arena, std::size_t pages) const;
  /// Pages held by the entries evictable() returned.
  [[nodiscard]] std::size_t pages_of(std::span<const SnapshotId> ids) const noexcept;

  [[nodiscard]] const Snapshot* get(SnapshotId id) const noexcept;
  [[nodiscard]] const std::unordered_map<SnapshotId, Snapshot>& all() const noexcept {
    return entries_;
  }
  /// Pinned visible entries published by the tenant.
  [[nodiscard]] std::uint32_t pinned_count(std::size_t tenant) const noexcept;
  /// Cross-checks the index, the LRU order and the pin counts; one line per problem.
  [[nodiscard]] std::vector<std::string> check() const;

 private:
  using Key = std::tuple<std::size_t, std::string, std::uint64_t, LayoutId>;
  using Use = std::pair<std::uint64_t, SnapshotId>;  // (last_use, id)

  Snapshot& entry(SnapshotId id);
  std::optional<Snapshot> take(SnapshotId id) noexcept;  // out of entries_, moved
  void unlist(const Snapshot& s) noexcept;               // out of the LRU order
  void list(Snapshot& s);                                // into it, as the most recent use

  std::unordered_map<SnapshotId, Snapshot> entries_;
  std::map<Key, SnapshotId> index_;                        // visible and being written
  std::map<ArenaId, std::set<Use>> lru_;                   // visible and unpinned, per arena
  std::unordered_map<std::size_t, std::uint32_t> pinned_;  // per publishing tenant
  SnapshotId next_id_ = 1;
  std::uint64_t clock_ = 0;
};

}  // namespace statepool::service
