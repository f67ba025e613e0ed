#pragma once
// ArenaTable: the arenas, each of one (tenant, layout): a memory allocation cut into
// pages at a fixed stride, a slot allocator, and the owning lease of every slot. An
// arena's size is fixed (clients map it whole); a tenant that needs a larger one for the
// same layout gets a second arena beside the first (find() picks among them).
//
// Creating an arena's memory can take long (a multi-GiB memfd is committed page by page)
// and must not happen under the pool's lock, so creation is two steps: reserve() marks
// the (tenant, layout) key as being created, the memory is allocated without the lock,
// and add() or cancel() ends it. Others asking for the same key meanwhile wait for it.
//
// An arena that is closed (CloseArena) leaves the table with remove(); ids are never
// used again, so a client holding a closed arena's id gets not_found, never another arena.
//
// Thread-safety: none; the Pool serializes every call.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memory/resource.hpp"
#include "pool/ids.hpp"
#include "pool/slot_allocator.hpp"
#include "statepool/kernels/page.hpp"

namespace statepool::service {

struct Arena {
  ArenaId id = 0;
  std::size_t tenant = 0;  ///< index into the pool's tenants
  LayoutId layout = 0;
  std::shared_ptr<const kernels::PageCodec> codec;
  std::string layout_digest;  ///< kernels::layout_digest of codec->layout()
  std::size_t page_stride = 0;
  std::shared_ptr<Allocation> memory;
  SlotAllocator slots;
  std::vector<LeaseId> owner;  ///< per slot; 0 = free, kSnapshotOwner = a snapshot's page
  std::uint32_t snapshot_pages = 0;  ///< slots whose owner is kSnapshotOwner
  /// Attached leases (live connections) that opened the arena and may have it mapped;
  /// a lease leaves when its connection ends. CloseArena waits for the others to go.
  std::set<LeaseId> openers;

  explicit Arena(std::uint32_t pages) : slots(pages), owner(pages, 0) {}
  [[nodiscard]] std::uint32_t page_count() const noexcept { return slots.capacity(); }
  /// The page of `slot` as a buffer (slot < page_count()).
  [[nodiscard]] kernels::BufferRef page(SlotId slot) const noexcept;
};

class ArenaTable {
 public:
  using Key = std::pair<std::size_t, LayoutId>;  ///< (tenant, layout)

  /// Of the arenas for `key` with at least `pages` pages (any size when 0), the one with
  /// the most free pages (the oldest among equals); nullptr when none.
  [[nodiscard]] Arena* find(const Key& key, std::uint32_t pages) noexcept;
  /// Arenas of the tenant, those being created included.
  [[nodiscard]] std::size_t count_for_tenant(std::size_t tenant) const noexcept;
  /// Throws StatusError(not_found).
  [[nodiscard]] Arena& get(ArenaId id);
  [[nodiscard]] const Arena& get(ArenaId id) const;
  /// nullptr when there is no arena `id` (never was, or closed).
  [[nodiscard]] Arena* find_id(ArenaId id) noexcept;
  [[nodiscard]] const Arena* find_id(ArenaId id) const noexcept;

  /// True while another caller is creating the arena for `key`.
  [[nodiscard]] bool creating(const Key& key) const noexcept { return pending_.contains(key); }
  [[nodiscard]] bool any_creating() const noexcept { return !pending_.empty(); }
  /// Marks `key` as being created (it must not be).
  void reserve(const Key& key) { pending_.insert(key); }
  /// Ends a failed creation.
  void cancel(const Key& key) noexcept { pending_.erase(key); }
  /// Ends a creation: takes the new arena (its id is assigned here) and returns it.
  /// Strong guarantee: on std::bad_alloc nothing changes (the key stays reserved).
  Arena& add(const Key& key, std::unique_ptr<Arena> arena);
  /// Adds an arena taken over from another process under its own id (arena->id, above
  /// every id in the table and below next_id()). Strong guarantee.
  Arena& restore(const Key& key, std::unique_ptr<Arena> arena);
  /// The id the next add() gives.
  [[nodiscard]] ArenaId next_id() const noexcept { return next_id_; }
  /// Ids are never used twice, also across a hand-over: the predecessor's next id.
  void set_next_id(ArenaId id) noexcept { next_id_ = id; }
  /// Takes arena `id` out of the table and hands it to the caller (nullptr: no such arena).
  std::unique_ptr<Arena> remove(ArenaId id) noexcept;

  /// The arenas in id order (id -> arena). A map, not a std::views::values view:
  /// clang 14 cannot instantiate libstdc++ 12's elements_view (the fuzz build).
  [[nodiscard]] const std::map<ArenaId, std::unique_ptr<Arena>>& all() const noexcept {
    return arenas_;
  }
  [[nodiscard]] std::size_t size() const noexcept { return arenas_.size(); }
  /// Arena ids in the index (each arena once).
  [[nodiscard]] std::size_t index_size() const noexcept;

 private:
  std::map<ArenaId, std::unique_ptr<Arena>> arenas_;
  ArenaId next_id_ = 1;
  std::map<Key, std::vector<ArenaId>> index_;  // oldest first
  std::set<Key> pending_;
};

}  // namespace statepool::service
