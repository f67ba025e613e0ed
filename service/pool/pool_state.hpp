#pragma once
// PoolState: what a pool holds that a successor process needs to serve on as if nothing
// had happened (the hand-over of an upgrade, docs/operations.md), as plain data: layouts
// and plans, arenas with their slot owners, leases with their tokens and what is left of
// their grace period, the snapshot index and pins, and each tenant's counters.
//
// Pool::save_state() fills one (the memory of each arena as its Allocation, whose
// descriptor travels beside the image); Pool::restore_state() builds an empty pool's
// tables from one (the memory as a descriptor received from the predecessor). The
// hand-over image (service/handover/image.hpp) is its versioned, checksummed encoding.
// Ids are kept as they were: clients hold arena, slot and layout ids across a hand-over.
//
// Times are durations, not time points: a steady clock's epoch is the process's own.
//
// Plain data; no invariants are enforced here (restore_state() checks everything: a
// state read from an image is input).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memory/resource.hpp"
#include "pool/ids.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::service {

struct PoolStateLayout {
  LayoutId id = 0;
  /// The layout; its `plan` is the plan with `plan_digest` (stepquant codecs), null else.
  kernels::StateLayout layout;
  std::string plan_digest;  ///< empty for codecs without a plan
};

struct PoolStatePlan {
  std::shared_ptr<const kernels::stepquant::Plan> plan;
};

struct PoolStateArena {
  ArenaId id = 0;
  std::string tenant;  ///< the tenant's name (indices are the process's own)
  LayoutId layout = 0;
  std::uint32_t page_count = 0;
  std::size_t page_stride = 0;
  std::size_t bytes = 0;  ///< of the allocation (page_count * page_stride, rounded up)
  kernels::HandleKind handle = kernels::HandleKind::memfd;
  /// Per slot: 0 = free, kSnapshotOwner = a snapshot's page, else a lease id.
  std::vector<LeaseId> owner;
  /// save_state(): the arena's memory (its descriptor is info().fd). restore_state()
  /// reads `fd` instead.
  std::shared_ptr<const Allocation> memory;
  int fd = -1;  ///< restore_state(): the received descriptor (borrowed; restore dups it)
};

struct PoolStateLease {
  LeaseId id = 0;
  std::string tenant;
  std::string token;
  /// What is left of its grace period; a lease attached at save time gets the whole
  /// grace period (its client reconnects to the successor).
  std::chrono::milliseconds grace_left{0};
  std::vector<std::pair<ArenaId, SlotId>> slots;  ///< in ascending order
};

struct PoolStateSnapshot {
  std::string space;  ///< the namespace's name
  std::string prefix;
  std::uint64_t position = 0;
  LayoutId layout = 0;
  std::string tenant;  ///< the publisher
  ArenaId arena = 0;
  SlotId slot = 0;
  std::optional<kernels::KvBlocks> kv;
  std::vector<SlotId> kv_pages;
  bool pinned = false;
  std::uint64_t hits = 0;
  std::chrono::milliseconds age{0};    ///< since it was created
  std::chrono::milliseconds idle{0};   ///< since it was last used
  /// Whether a tier below the pool held its value at save time (an eviction in the
  /// successor then counts as a demotion).
  bool held_below = false;
  /// CRC-32C of its pages (the state slot, then kv_pages) as the crash journal's writer
  /// read them (server/crash_journal.hpp); a recovery drops a snapshot whose pages no
  /// longer match (evicted and reused after the journal's last write). Not saved by
  /// save_state(), ignored by restore_state().
  std::optional<std::uint32_t> pages_crc;
};

/// A tenant's snapshot counters since the pool was created (TenantUsage reports them).
struct SnapshotCounters {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t puts_created = 0;
  std::uint64_t puts_existing = 0;
  std::uint64_t evictions = 0;
  std::uint64_t demotions = 0;
  std::uint64_t hits_host = 0;
  std::uint64_t hits_remote = 0;
};

struct PoolStateTenant : SnapshotCounters {
  std::string name;
  std::uint32_t layouts_added = 0;  ///< registry entries the tenant's limits are charged
  std::uint32_t plans_added = 0;
};

struct PoolState {
  std::vector<PoolStatePlan> plans;
  std::vector<PoolStateLayout> layouts;  ///< in id order, ids 1..n without gaps
  std::vector<PoolStateArena> arenas;    ///< in id order
  std::vector<PoolStateLease> leases;    ///< in id order; each holds at least one slot
  /// Visible snapshots, least recently used first (the successor's eviction order).
  std::vector<PoolStateSnapshot> snapshots;
  std::vector<PoolStateTenant> tenants;
  ArenaId next_arena = 1;  ///< ids are never used twice, also across a hand-over
  LeaseId next_lease = 1;
  std::uint64_t pages_reclaimed_total = 0;
};

}  // namespace statepool::service
