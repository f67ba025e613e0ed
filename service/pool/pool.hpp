#pragma once
// The pool: a small facade over four tables and a chain of memory resources.
//
//   LayoutRegistry  layouts (id -> page format) and STEPQuant plans     layout_registry.hpp
//   LeaseTable      leases (token, grace period) and the slots they hold lease_table.hpp
//   ArenaTable      arenas of each (tenant, layout): memory, slots, owners arena_table.hpp
//   SnapshotTable   prefix-state snapshots: pages no lease owns, by key    snapshot_table.hpp
//   memory          tenant quota -> pool capacity -> tracking -> backend  ../memory/
//
// Every operation validates everything before changing anything, so a failed call
// changes nothing. Errors are StatusError with a message an operator can act on.
//
// Thread-safety: every public member function is safe to call concurrently. The registry
// has its own lock; leases and arenas share one. Arena memory is allocated outside that
// lock (a large arena takes a while to commit), so open_arena() may block while it or a
// concurrent open_arena() for the same (tenant, layout) allocates: call it from a worker
// thread, never from an I/O thread. Page bytes returned by page() are read and written
// outside the lock; that is safe because a slot belongs to one lease and a lease to at
// most one connection, whose requests run one at a time.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "memory/limiting.hpp"
#include "memory/resource.hpp"
#include "memory/tracking.hpp"
#include "pool/arena_table.hpp"
#include "pool/ids.hpp"
#include "pool/layout_registry.hpp"
#include "pool/lease_table.hpp"
#include "pool/pool_state.hpp"
#include "pool/snapshot_table.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/snapshot.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {

/// What one tenant may take of the tables and budgets every tenant shares, so that no
/// tenant can starve another even with its byte quota unused (--tenant-max-* flags,
/// max-* keys of a [tenant.NAME] section). Going past one is quota_exceeded (connections:
/// too_many_connections), naming the limit.
/// A refusal of something that belongs to another tenant (an arena) or of a tenant a peer
/// may not use: what() is what the peer is told (it names nothing of the other tenant),
/// owner() whose it is, for the operator's audit log only (log.hpp, audit()).
class AccessRefused : public StatusError {
 public:
  AccessRefused(const std::string& message, std::string owner)
      : StatusError(Status::permission_denied, message), owner_(std::move(owner)) {}
  [[nodiscard]] const std::string& owner() const noexcept { return owner_; }

 private:
  std::string owner_;
};

struct TenantLimits {
  std::uint32_t max_layouts = 64;       ///< distinct layouts it registered (new to the daemon)
  std::uint32_t max_plans = 16;         ///< plans it installed (new to the daemon)
  std::uint32_t max_arenas = 64;        ///< arenas it opened
  std::uint32_t max_connections = 128;  ///< connections attached to it at once
  std::uint64_t max_staging_bytes = 8ull << 30;  ///< staging of all its connections together
  std::uint32_t max_pinned_snapshots = 256;      ///< pinned snapshots it published
};

struct TenantConfig {
  std::string name;
  std::uint64_t quota_bytes = 0;  ///< max reserved arena bytes; 0 = unlimited
  std::vector<uid_t> uids;        ///< peers allowed by uid; empty uids and gids = anyone
  std::vector<gid_t> gids;        ///< peers allowed by gid
  TenantLimits limits;
  /// Tenants with the same namespace share one snapshot key space (docs/prefix-store.md);
  /// empty = the tenant's own name (shares with nobody).
  std::string snapshot_namespace;
};

struct PoolConfig {
  std::uint64_t capacity_bytes = 1ull << 30;  ///< all arenas together
  std::uint32_t default_arena_pages = 64;     ///< OpenArena with pages = 0
  std::uint32_t max_arena_pages = 1u << 20;
  std::chrono::milliseconds grace_period{30000};
  std::vector<TenantConfig> tenants;  ///< empty -> a "default" tenant without quota
  TenantLimits default_limits;        ///< the "default" tenant's limits
  /// Snapshots are written through to tiers below the pool (host, remote). A snapshot
  /// evicted from the pool is then counted as demoted, not as evicted, when its
  /// SnapshotTierHold (put_snapshot's `below`) says a tier below still holds its value
  /// (or is being given it); without a hold, or with one that says no tier holds it (the
  /// host tier let it go, the remote write was dropped or failed), as evicted.
  bool snapshot_lower_tiers = false;
};

struct ArenaInfo {
  ArenaId id = 0;
  std::string tenant;
  LayoutId layout = 0;
  std::string layout_name;
  kernels::CodecId codec = kernels::CodecId::fp32;
  std::string backend;  ///< the memory resource's name ("host", "cuda")
  std::size_t page_bytes = 0;
  std::size_t page_stride = 0;
  std::uint32_t page_count = 0;
  std::uint32_t pages_used = 0;
  /// Bytes of the allocation: page_count * page_stride rounded up to the memory's
  /// granularity (what the quota and the capacity are charged).
  std::size_t bytes = 0;
  std::size_t fp32_page_bytes = 0;
  std::uint32_t snapshot_pages = 0;  ///< of pages_used, those holding snapshots
  /// The arena's memory: where it lives and how a peer maps it (info().where).
  std::shared_ptr<const Allocation> memory;
  /// The share descriptor (memfd / CUDA VMM fd), borrowed from `memory`; -1 when the
  /// handle is not a descriptor.
  int fd = -1;
  bool created = false;  ///< open_arena only: true when this call created it
};

/// What close_arena() gave back.
struct ClosedArena {
  ArenaId id = 0;
  std::string layout_name;
  /// The arena's bytes, no longer charged to the tenant's quota or the pool's capacity once
  /// work already queued on the arena has ended.
  std::uint64_t bytes = 0;
  std::uint32_t snapshots_dropped = 0;  ///< its unpinned, idle snapshots, evicted
};

struct TenantUsage {
  std::string name;
  std::uint64_t quota_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t pages_used = 0;
  std::uint64_t stored_bytes = 0;  ///< page_bytes * pages used, over the tenant's arenas
  std::uint64_t fp32_bytes = 0;    ///< FP32-equivalent bytes of those pages
  // Snapshots it published (their pages count in pages_used and stored_bytes too).
  std::uint64_t snapshots = 0;
  std::uint64_t snapshot_bytes = 0;  ///< page bytes of its snapshots
  std::uint64_t pinned_snapshots = 0;
  // Counters since start: lookups by this tenant, puts by it, evictions of its snapshots.
  std::uint64_t snapshot_hits = 0;
  std::uint64_t snapshot_misses = 0;
  std::uint64_t snapshot_puts_created = 0;
  std::uint64_t snapshot_puts_existing = 0;
  std::uint64_t snapshot_evictions = 0;
  /// Evicted from the pool while a tier below held them (PoolConfig::snapshot_lower_tiers);
  /// those evicted while no tier held them count in snapshot_evictions.
  std::uint64_t snapshot_demotions = 0;
  std::uint64_t snapshot_hits_host = 0;    ///< of snapshot_hits, found in the host tier
  std::uint64_t snapshot_hits_remote = 0;  ///< of snapshot_hits, found in the remote store
};

/// A plain snapshot; one field per metric (service/metrics maps it one-to-one).
struct PoolStats {
  std::vector<ArenaInfo> arenas;
  std::vector<TenantUsage> tenants;
  std::uint64_t capacity_bytes = 0;   ///< configured pool capacity
  std::uint64_t reserved_bytes = 0;   ///< bytes of all arenas (and arenas being created)
  std::uint32_t leases_active = 0;    ///< attached to a live connection
  std::uint32_t leases_orphaned = 0;  ///< waiting for their grace period to end
  std::uint64_t pages_reclaimed_total = 0;
  MemoryUsage memory;  ///< what the backend holds for arenas (the tracking adaptor)
};

using kernels::SnapshotInfo;  // one snapshot as list_snapshots() reports it
using kernels::SnapshotKey;

class Pool;

/// The page copy of a snapshot put or get, to run outside the pool's lock (on the
/// Executor): copy `source` to `target`, then call done(). Destroyed without done(), a
/// put is abandoned (the snapshot is forgotten) and a get's read ends. Move-only.
class SnapshotCopy {
 public:
  SnapshotCopy(SnapshotCopy&& other) noexcept;
  SnapshotCopy& operator=(SnapshotCopy&&) = delete;
  SnapshotCopy(const SnapshotCopy&) = delete;
  SnapshotCopy& operator=(const SnapshotCopy&) = delete;
  ~SnapshotCopy();

  kernels::BufferRef source;
  kernels::BufferRef target;
  /// Hybrid entries: the KV blocks and the snapshot's KV pages, as executor chunks (the
  /// last one cut to the blocks' end): a put encodes the caller's KV values into them, a
  /// get decodes them (kernels::kv_encode_blocks / kv_decode_blocks bytes).
  std::optional<kernels::KvBlocks> kv;
  std::vector<kernels::BufferRef> kv_chunks;
  /// The memory of both pages (kept alive while the copy runs).
  std::vector<std::shared_ptr<const Allocation>> keep_alive;

  /// The copy is complete: a put's snapshot becomes visible, a get's read ends. Never
  /// throws; a second call does nothing.
  void done() noexcept;

 private:
  friend class Pool;
  SnapshotCopy(SnapshotId id, bool write) noexcept : id_(id), write_(write) {}
  Pool* pool_ = nullptr;  // null: unarmed (its end does nothing)
  SnapshotId id_ = 0;
  bool write_ = false;
};

struct SnapshotPut {
  bool created = false;       ///< false: the key had a snapshot for this layout already
  std::uint32_t evicted = 0;  ///< snapshots evicted to make room for this one
  ArenaId arena = 0;          ///< the arena that holds (or would hold) the key's entry
  std::size_t page_bytes = 0;
  std::string space;                 ///< the namespace, and the arena's layout digest: the
  std::string layout_digest;         ///< snapshot's name in lower tiers
  std::optional<SnapshotCopy> copy;  ///< created only
  /// The key's entry (the new one, or the one that stood): its KV blocks and pages.
  std::optional<kernels::KvBlocks> kv;
  std::uint64_t kv_bytes = 0;
  std::uint32_t pages = 1;
};

struct SnapshotGet {
  bool hit = false;
  /// Miss only: snapshots under the same key for other layouts (a hint for operators).
  std::uint32_t other_layouts = 0;
  std::size_t page_bytes = 0;
  std::string space;  ///< as SnapshotPut: where a miss may be looked up below
  std::string layout_digest;
  std::optional<SnapshotCopy> copy;  ///< hit only (its kv and kv_chunks: a hybrid entry's)
};

/// One entry of Pool::put_snapshots().
struct SnapshotPutRequest {
  SnapshotKey key;
  /// Copy the state from this slot of the arena (one the lease owns); none: the caller
  /// writes the new snapshot's page (copy->target), as for import_snapshot.
  std::optional<SlotId> slot;
  std::optional<kernels::KvBlocks> kv;
  std::shared_ptr<const SnapshotTierHold> below;  ///< as put_snapshot's
};

/// What Pool::put_snapshots() did with one entry: `put` (created or existing), or the
/// status and message that refused this entry alone.
struct SnapshotPutOutcome {
  std::optional<SnapshotPut> put;
  Status status = Status::ok;
  std::string message;
};

/// What Pool::lookup_snapshots() found: per key, whether the pool has it.
struct SnapshotLookup {
  std::vector<bool> in_pool;
  std::size_t page_bytes = 0;
  std::string space;  ///< as SnapshotGet: where the others may be looked up below
  std::string layout_digest;
};

struct LeaseGrant {
  LeaseId id = 0;
  std::string token;        ///< 32 hex characters from a CSPRNG
  bool resumed = false;     ///< an orphaned lease was re-attached
  std::uint32_t slots = 0;  ///< slots the lease holds now
};

/// A page the caller may read and write. Valid (and its memory alive) as long as the
/// caller holds `memory`, even if the slot is freed meanwhile.
struct PageRef {
  std::span<std::byte> bytes;                       ///< exactly page_bytes (host or device)
  std::shared_ptr<const kernels::PageCodec> codec;  ///< the arena's layout and codec
  std::shared_ptr<const Allocation> memory;         ///< the arena's memory
  /// The page as an executor buffer (with its memory space).
  [[nodiscard]] kernels::BufferRef buffer() const noexcept;
};

class Pool {
 public:
  /// `memory` is the backend's resource (shared: staging may use it too). Throws
  /// StatusError(invalid_argument) on an inconsistent config (no resource, duplicate or
  /// empty tenant names, capacity_bytes 0, default_arena_pages 0 or above
  /// max_arena_pages, negative grace period).
  Pool(PoolConfig config, std::shared_ptr<MemoryResource> memory);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// The configuration in effect; an empty tenant list has been replaced by the one
  /// "default" tenant (no quota, any peer).
  [[nodiscard]] const PoolConfig& config() const noexcept { return config_; }
  [[nodiscard]] std::string_view backend_name() const noexcept { return memory_->name(); }
  /// The backend's resource (what the pool allocates from, under its adaptors).
  [[nodiscard]] MemoryResource& memory() const noexcept { return *memory_; }

  // --- tenants -------------------------------------------------------------------
  /// Throws unknown_tenant. Empty name means "default".
  [[nodiscard]] const TenantConfig& tenant(std::string_view name) const;
  /// Throws permission_denied when the tenant restricts peers and uid/gid match none.
  void check_peer(std::string_view tenant, uid_t uid, gid_t gid) const;

  // --- layouts and plans (LayoutRegistry) ------------------------------------------
  /// An operator's layout (no tenant limit).
  LayoutId register_layout(const kernels::StateLayout& layout) {
    return registry_.register_layout(layout);
  }
  /// A tenant's layout: a layout new to the daemon counts against the tenant's
  /// max_layouts (quota_exceeded beyond); unknown_tenant.
  LayoutId register_layout(std::string_view tenant, const kernels::StateLayout& layout);
  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> layout(LayoutId id) const {
    return registry_.layout(id);
  }
  /// An operator's plan (loaded at start; no tenant limit).
  PlanInfo install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan) {
    return registry_.install_plan(std::move(plan));
  }
  /// A tenant's plan: one new to the daemon counts against its max_plans.
  PlanInfo install_plan(std::string_view tenant,
                        std::shared_ptr<const kernels::stepquant::Plan> plan);
  [[nodiscard]] std::shared_ptr<const kernels::stepquant::Plan> plan(
      std::string_view digest) const {
    return registry_.plan(digest);
  }
  [[nodiscard]] std::vector<PlanInfo> plans() const { return registry_.plans(); }

  // --- arenas --------------------------------------------------------------------
  /// Returns an arena of the tenant for the layout with at least `pages` pages (any
  /// when 0; the one with the most free pages when several), or creates one with `pages`
  /// pages (0 = default) when it has none that large: arenas never grow, a tenant that
  /// needs more pages gets a second one. Creation checks max_arena_pages (invalid_argument), the
  /// tenant's max_arenas and quota (quota_exceeded) and the pool capacity
  /// (pool_exhausted), then allocates the memory without holding the pool's lock (see
  /// the top of this file).
  /// `handle`: how the arena is shared when this call creates it (unset: the backend's
  /// default); an existing arena shared another way is invalid_argument.
  /// `opener`: the attached lease of the connection asking (0: none), recorded as one that
  /// may have the arena mapped until its connection ends (detach_lease).
  ArenaInfo open_arena(std::string_view tenant, LayoutId layout, std::uint32_t pages,
                       std::optional<HandleKind> handle = {}, LeaseId opener = 0);
  /// Takes an arena of the tenant out of the pool and gives its memory back: the quota and
  /// the capacity are charged no more, and the backend frees the memory once nothing uses
  /// it (work queued on it, peers' mappings). Refused with in_use while a lease (attached or
  /// orphaned) holds one of its pages, while it holds a pinned snapshot or one being read
  /// or published, or while an attached lease other than `requester` opened it. Its other
  /// snapshots are evicted (counted as evictions, or demotions when a tier below holds
  /// them). Throws not_found (no such arena, or closed) and permission_denied (another
  /// tenant's) as arena() does. The memory is released outside the pool's lock, but
  /// munmap or cuMemRelease of a large arena may still take a while: call it from a worker.
  ClosedArena close_arena(std::string_view tenant, ArenaId id, LeaseId requester = 0);
  /// Throws not_found, or permission_denied when the arena belongs to another tenant.
  [[nodiscard]] ArenaInfo arena(std::string_view tenant, ArenaId id) const;

  // --- leases --------------------------------------------------------------------
  /// Starts a new lease for the tenant, or resumes the orphaned lease named by `token`
  /// (same tenant, within its grace period). An unknown or expired token starts a new
  /// lease (resumed = false). Throws lease_busy if the token's lease is attached, and
  /// too_many_connections when the tenant has max_connections attached leases already
  /// (each connection holds one).
  /// "Within its grace period" is judged against Clock::now(); an orphaned lease found
  /// expired here is reclaimed at once (its pages count as reclaimed).
  LeaseGrant attach_lease(std::string_view tenant, std::string_view token);
  /// Same, judging expiry at `now` (tests pass explicit time points).
  LeaseGrant attach_lease(std::string_view tenant, std::string_view token, Clock::time_point now);
  /// The lease's connection is gone: keep its slots until now + grace period. A lease
  /// without slots, or any lease when the grace period is zero, is dropped (and its
  /// slots reclaimed) at once. Unknown or already detached leases: no-op (the
  /// first deadline stays), so the server may call it from any cleanup path. Never throws.
  void detach_lease(LeaseId lease, Clock::time_point now);
  /// Frees the slots of every orphaned lease whose deadline has passed (deadline <= now)
  /// and forgets the lease and its token. Returns pages reclaimed.
  std::uint64_t reclaim_expired(Clock::time_point now);
  /// Earliest orphan deadline, if any (the server arms its reclaim timer with it).
  [[nodiscard]] std::optional<Clock::time_point> next_deadline() const;

  // --- slots ---------------------------------------------------------------------
  // Every slot call needs an attached lease: unknown or detached -> not_found.
  // Pages are not cleared on allocation or free (an arena never crosses tenants; clients
  // overwrite a page before use).
  /// Allocates `count` (>= 1) slots in the arena for the lease, all or nothing, O(1)
  /// each. Throws not_found / permission_denied / invalid_argument / pool_exhausted.
  std::vector<SlotId> allocate(LeaseId lease, ArenaId arena, std::uint32_t count);
  /// Frees slots owned by the lease, all or nothing (out of range or duplicate:
  /// invalid_argument; free already: invalid_argument; another lease's: not_owner).
  /// Returns the number freed (an empty list frees nothing and returns 0).
  std::uint32_t free(LeaseId lease, ArenaId arena, std::span<const SlotId> slots);
  /// The page of a slot the lease owns. Throws like free().
  [[nodiscard]] PageRef page(LeaseId lease, ArenaId arena, SlotId slot) const;
  /// The page format (layout and codec) of an arena of the lease's tenant.
  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> page_codec(LeaseId lease,
                                                                     ArenaId arena) const;
  // allocate() makes room by evicting the arena's least recently used snapshots that are
  // neither pinned nor being read, when its free pages are too few.

  // --- snapshots (pool_snapshots.cpp, docs/prefix-store.md) ------------------------
  // Keys live in the caller's tenant's snapshot namespace; an entry is bound to the layout
  // of the arena it was published from and serves only slots of arenas of that layout.
  // A bad key (empty prefix, or longer than kMaxSnapshotPrefixBytes) is invalid_argument.
  /// Publishes the state of a slot the lease owns: a page of the same arena is taken
  /// (evicting the arena's least recently used unpinned snapshots when none is free;
  /// pool_exhausted when every page holds a slot or a pinned or busy snapshot) and
  /// returned as the target of `copy`; the snapshot is visible once copy->done(). With
  /// `kv` (a hybrid entry) the KV blocks take ceil(kv_blocks_encoded_bytes / page_bytes)
  /// more pages, all taken (and evicted for) together, returned as copy->kv_chunks;
  /// invalid_argument for ill-formed blocks or blocks that need more pages than the arena
  /// has. A key that has a snapshot for the layout (visible or being published) is left
  /// as it is (created = false, no copy), KV blocks or not. `below`: what the tiers below
  /// the pool will hold of the snapshot's value when the caller writes it through (null:
  /// it does not); read when the snapshot is evicted, to count a demotion or an eviction.
  SnapshotPut put_snapshot(LeaseId lease, ArenaId arena, SlotId slot, const SnapshotKey& key,
                           const std::optional<kernels::KvBlocks>& kv = std::nullopt,
                           std::shared_ptr<const SnapshotTierHold> below = nullptr);
  /// Publishes a snapshot whose bytes the caller holds (an imported value: statepoolctl
  /// snapshot-put): as put_snapshot, into the tenant's first arena of the layout whose
  /// kernels::layout_digest is `layout_digest` with room for it (else the first one, which
  /// evicts), with copy->target and copy->kv_chunks for the caller to fill and no source.
  /// not_found when the tenant has no arena of that layout. `below` as for put_snapshot.
  SnapshotPut import_snapshot(std::string_view tenant, std::string_view layout_digest,
                              const SnapshotKey& key,
                              const std::optional<kernels::KvBlocks>& kv = std::nullopt,
                              std::shared_ptr<const SnapshotTierHold> below = nullptr);
  /// Reads the key's snapshot out (statepoolctl snapshot-get): the entry under the layout
  /// whose digest is `layout_digest` (empty: the first in layout order) as copy->source
  /// and copy->kv_chunks, no target; hit = false (no copy) when there is none. Not counted
  /// in the tenant's hits and misses (an operator's read, not an engine's lookup).
  SnapshotGet export_snapshot(std::string_view tenant, const SnapshotKey& key,
                              std::string_view layout_digest);
  /// Looks the key up for the layout of the arena of `slot` (a slot the lease owns); a
  /// hit returns the copy of the snapshot's page into the slot's page. A miss is no error;
  /// it is counted unless `lower_tiers` (the caller asks the tiers below and reports the
  /// outcome with count_lower_tier_lookup).
  SnapshotGet get_snapshot(LeaseId lease, ArenaId arena, SlotId slot, const SnapshotKey& key,
                           bool lower_tiers = false);
  /// Deletes the key's snapshots under every layout (pinned ones too); pages being read
  /// are freed when the read ends. Returns how many.
  /// `layout_digests` (optional) receives the deleted entries' layout digests.
  std::uint32_t delete_snapshot(std::string_view tenant, const SnapshotKey& key,
                                std::vector<std::string>* layout_digests = nullptr);
  /// The outcome of a pool miss of the tenant looked up in the tiers below: a hit from
  /// `tier` ("host" or "remote"), or a miss when `tier` is empty.
  void count_lower_tier_lookup(std::string_view tenant, std::string_view tier);
  /// Pins (never evicted) or unpins the key's snapshots under every layout. Returns how
  /// many changed. quota_exceeded when a publisher would pass max_pinned_snapshots.
  std::uint32_t pin_snapshot(std::string_view tenant, const SnapshotKey& key, bool pinned);
  /// Snapshots of the tenant's namespace whose prefix starts with `start` (all when
  /// empty), in key order, at most `limit`; `more` tells whether others follow.
  [[nodiscard]] std::vector<SnapshotInfo> list_snapshots(std::string_view tenant,
                                                         std::string_view start, std::size_t limit,
                                                         bool& more) const;
  /// The namespace the tenant's snapshot keys live in.
  [[nodiscard]] const std::string& snapshot_namespace(std::string_view tenant) const;

  // --- batched snapshot requests (pool_snapshot_batches.cpp) -------------------------
  // One lock for the whole batch; the arena must be the lease's tenant's. Errors that
  // concern the batch (lease, arena, a bad key) are thrown; an entry's own (a full arena,
  // a slot the lease does not own, ill-formed KV blocks) are its outcome.
  /// Which keys have a visible snapshot for the arena's layout: from the index only (no
  /// hit counted, no entry made recently used).
  [[nodiscard]] SnapshotLookup lookup_snapshots(LeaseId lease, ArenaId arena,
                                                std::span<const SnapshotKey> keys) const;
  /// Publishes each entry as put_snapshot (a slot) or import_snapshot (no slot: the
  /// caller fills copy->target) would, into `arena`, in order: a key already published
  /// (also by an earlier entry) is skipped with created = false before any page is taken.
  [[nodiscard]] std::vector<SnapshotPutOutcome> put_snapshots(
      LeaseId lease, ArenaId arena, std::vector<SnapshotPutRequest> entries);
  /// Each key's snapshot for the arena's layout as a read (copy->source and
  /// copy->kv_chunks, no target), or a miss. Hits are counted; misses too unless
  /// `lower_tiers` (the caller asks the tiers, count_lower_tier_lookup). `stop_at_miss`
  /// (without lower tiers only): keys after the first miss are not looked up.
  [[nodiscard]] std::vector<SnapshotGet> get_snapshots(LeaseId lease, ArenaId arena,
                                                       std::span<const SnapshotKey> keys,
                                                       bool lower_tiers, bool stop_at_miss);

  // --- hand-over (pool_state.cpp, docs/operations.md) ------------------------------
  /// Everything a successor needs (pool_state.hpp), as it is now. Attached leases are
  /// saved orphaned with the whole grace period (their clients reconnect to the
  /// successor); leases without slots and snapshots being published are left out (those
  /// pages are saved free). Waits for arena creations in progress. Call it once the server
  /// takes no more requests and those in flight have ended: the memory stays shared, so
  /// what is written after it is seen by both processes, but table changes are not.
  [[nodiscard]] PoolState save_state() const;
  /// Takes over what a predecessor saved: adopts each arena's memory from its descriptor
  /// (charged to its tenant's quota and to the capacity, as open_arena charges), then
  /// rebuilds the tables under the same ids; leases are orphaned until `now` + what was
  /// left of their grace period. `state` is input: every inconsistency is refused with
  /// StatusError(invalid_argument) naming the entry (a tenant this daemon does not
  /// configure, a page two owners claim, a descriptor that is not such memory, ...); a quota
  /// or capacity too small for the arenas is the limit's refusal. The pool must be new
  /// (no layouts, arenas or leases; the operator's plans may be installed). When it
  /// throws, destroy the pool: it may hold some of the state's layouts and plans, but no
  /// arena, lease or snapshot, and no memory is charged.
  struct RestoreReport {
    std::uint32_t arenas = 0;
    std::uint64_t bytes = 0;  ///< of their memory
    std::uint64_t pages = 0;  ///< used: leased and snapshot pages
    std::uint32_t leases = 0;
    std::uint32_t snapshots = 0;
  };
  RestoreReport restore_state(const PoolState& state, Clock::time_point now);

  /// How many changes a successor would need have been made (layouts, plans, arenas,
  /// leases, pages, snapshots and pins; not hits and last uses). Each call that may make
  /// one counts it after its locks are released, so save_state() called after reading a
  /// value sees every change that value counts: the crash journal
  /// (server/crash_journal.hpp) saves the state again only when this has moved.
  [[nodiscard]] std::uint64_t changes() const noexcept {
    return changes_.load(std::memory_order_acquire);
  }

  // --- accounting ----------------------------------------------------------------
  [[nodiscard]] PoolStats stats() const;
  /// Cross-checks every allocator, owner table, lease, byte counter and memory adaptor.
  /// Returns one line per inconsistency found; empty means consistent (no leaked or
  /// doubly handed-out page). Waits for arena creations in progress to end first. The
  /// memory of an arena closed while work still used it counts against the tables until
  /// that work ends (it is still allocated): check when the daemon is idle.
  [[nodiscard]] std::vector<std::string> check() const;

 private:
  // The snapshot counters (TenantUsage) are under mutex_.
  struct Tenant : SnapshotCounters {
    const TenantConfig* config = nullptr;     // into config_.tenants (never resized)
    std::unique_ptr<LimitingResource> quota;  // over capacity_
    std::size_t space = 0;                    // snapshot namespace (index into spaces_)
  };

  [[nodiscard]] std::size_t tenant_index(std::string_view name) const;
  /// The tenant's limits as a registry owner of entries of one kind.
  [[nodiscard]] RegistryOwner owner(std::size_t tenant, std::uint32_t TenantLimits::*limit) const;
  [[nodiscard]] Arena& arena_for_tenant(std::size_t tenant, ArenaId id);
  [[nodiscard]] const Arena& arena_for_tenant(std::size_t tenant, ArenaId id) const;
  [[nodiscard]] std::string arena_label(const Arena& arena) const;
  void expect_owned(const Lease& lease, const Arena& arena, SlotId slot) const;
  [[nodiscard]] ArenaInfo info(const Arena& arena) const;
  /// Frees every slot of the lease and forgets it. Caller holds mutex_.
  std::uint64_t drop_lease(LeaseId id) noexcept;
  // Snapshot pages (pool_snapshots.cpp); caller holds mutex_.
  void free_snapshot_pages(ArenaId arena, SlotId state, std::span<const SlotId> kv_pages) noexcept;
  /// The pages of an entry the table handed back (nothing when it stays).
  void free_snapshot_pages(const std::optional<Snapshot>& gone) noexcept;
  /// Evicts the entries (idle: erase() frees at once) and frees their pages; each one
  /// counts as a demotion when a tier below holds its value (Snapshot::below), else as an
  /// eviction.
  void evict(std::span<const SnapshotId> victims) noexcept;
  /// `other` null: only the snapshot's side is set (import, export).
  [[nodiscard]] SnapshotCopy snapshot_copy(const Snapshot& s, const Arena* other, SlotId slot,
                                           bool write);
  /// put_snapshot and import_snapshot after their checks: `source` (a slot of `arena`) or
  /// null for bytes the caller holds.
  SnapshotPut publish(std::size_t tenant, Arena& arena, const SlotId* source,
                      const SnapshotKey& key, const std::optional<kernels::KvBlocks>& kv,
                      std::shared_ptr<const SnapshotTierHold> below, Clock::time_point now);
  [[nodiscard]] std::vector<std::string> check_snapshots() const;
  /// check() without its lock and wait: the caller holds mutex_ and no arena is being made.
  [[nodiscard]] std::vector<std::string> check_locked() const;
  /// invalid_argument for an empty prefix or one longer than kMaxSnapshotPrefixBytes.
  static void expect_key(const SnapshotKey& key);
  // SnapshotCopy's ends.
  friend class SnapshotCopy;
  void end_snapshot_copy(SnapshotId id, bool write, bool ok) noexcept;

  /// Declared first in a call that may change the state: counts it when the call returns
  /// or throws, after every lock of the call is released (changes()).
  struct CountChange {
    std::atomic<std::uint64_t>& count;
    ~CountChange() { count.fetch_add(1, std::memory_order_release); }
  };

  PoolConfig config_;
  std::shared_ptr<MemoryResource> memory_;
  TrackingResource tracking_;  // over memory_
  LimitingResource capacity_;  // over tracking_
  std::vector<Tenant> tenants_;
  LayoutRegistry registry_;

  mutable std::mutex mutex_;                 // guards leases_, arenas_, pages_reclaimed_total_
  mutable std::condition_variable created_;  // an arena creation ended
  LeaseTable leases_;
  ArenaTable arenas_;
  SnapshotTable snapshots_;
  std::vector<std::string> spaces_;  // snapshot namespace names (never change)
  std::uint64_t pages_reclaimed_total_ = 0;
  std::atomic<std::uint64_t> changes_{0};
};

}  // namespace statepool::service
