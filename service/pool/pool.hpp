#pragma once
// The pool: layouts, tenants with quotas, arenas cut into pages, slots owned by leases.
//
//   Pool ── layouts (id -> PageCodec, deduplicated)
//       ├─ tenants (config: quota over reserved arena bytes, allowed uids/gids)
//       ├─ arenas  (one per (tenant, layout); Memory from the backend; SlotAllocator;
//       │           owner lease per slot)
//       └─ leases  (token; attached to one connection, or orphaned until a deadline)
//
// Every operation validates everything before changing anything, so a failed call
// changes nothing. Errors are StatusError with a message an operator can act on.
// Thread-safety: every public member function is safe to call concurrently (one internal
// mutex). Page bytes returned by page() are read and written outside the lock; that is
// safe because a slot belongs to one lease and a lease to at most one connection.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "backend/memory.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::service {

using Clock = std::chrono::steady_clock;
using LeaseId = std::uint64_t;  ///< 0 never names a lease
using LayoutId = std::uint32_t;
using ArenaId = std::uint32_t;
using SlotId = std::uint32_t;

/// Pages are placed at this alignment inside an arena (page_stride = round_up(page_bytes)).
inline constexpr std::size_t kPageAlignment = 256;

struct TenantConfig {
  std::string name;
  std::uint64_t quota_bytes = 0;  ///< max reserved arena bytes; 0 = unlimited
  std::vector<uid_t> uids;        ///< peers allowed by uid; empty uids and gids = anyone
  std::vector<gid_t> gids;        ///< peers allowed by gid
};

struct PoolConfig {
  std::uint64_t capacity_bytes = 1ull << 30;  ///< all arenas together
  std::uint32_t default_arena_pages = 64;     ///< OpenArena with pages = 0
  std::uint32_t max_arena_pages = 1u << 20;
  std::chrono::milliseconds grace_period{30000};
  std::vector<TenantConfig> tenants;  ///< empty -> a "default" tenant, unlimited
};

struct ArenaInfo {
  ArenaId id = 0;
  std::string tenant;
  LayoutId layout = 0;
  std::string layout_name;
  kernels::CodecId codec = kernels::CodecId::fp32;
  std::string backend;
  std::size_t page_bytes = 0;
  std::size_t page_stride = 0;
  std::uint32_t page_count = 0;
  std::uint32_t pages_used = 0;
  std::size_t bytes = 0;  ///< page_count * page_stride
  std::size_t fp32_page_bytes = 0;
  int fd = -1;           ///< borrowed share fd, valid for the pool's lifetime
  bool created = false;  ///< open_arena only: true when this call created it
};

struct TenantUsage {
  std::string name;
  std::uint64_t quota_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t pages_used = 0;
  std::uint64_t stored_bytes = 0;  ///< page_bytes * pages used, over the tenant's arenas
  std::uint64_t fp32_bytes = 0;    ///< FP32-equivalent bytes of those pages
};

/// A plain snapshot; one field per metric (service/metrics maps it one-to-one).
struct PoolStats {
  std::vector<ArenaInfo> arenas;
  std::vector<TenantUsage> tenants;
  std::uint64_t capacity_bytes = 0;   ///< configured pool capacity
  std::uint64_t reserved_bytes = 0;   ///< bytes of all arenas
  std::uint32_t leases_active = 0;    ///< attached to a live connection
  std::uint32_t leases_orphaned = 0;  ///< waiting for their grace period to end
  std::uint64_t pages_reclaimed_total = 0;
};

/// Plans the daemon holds are few (one per model and budget); the cap bounds what a
/// client installing garbage plans in a loop can make it keep.
inline constexpr std::size_t kMaxPlans = 64;

struct PlanInfo {
  std::string digest;
  std::uint32_t units = 0;
  std::uint32_t pivots = 0;
  double average_bits = 0;
  bool created = false;
};

struct LeaseGrant {
  LeaseId id = 0;
  std::string token;        ///< 32 hex characters from a CSPRNG
  bool resumed = false;     ///< an orphaned lease was re-attached
  std::uint32_t slots = 0;  ///< slots the lease holds now
};

/// A page the caller may read and write. Valid until the slot is freed.
struct PageRef {
  std::span<std::byte> bytes;                 ///< exactly page_bytes
  const kernels::PageCodec* codec = nullptr;  ///< the arena's layout and codec
};

class Pool {
 public:
  /// Throws StatusError(invalid_argument) on an inconsistent config (no backend, duplicate
  /// or empty tenant names, capacity_bytes 0, default_arena_pages 0 or above
  /// max_arena_pages, negative grace period).
  Pool(PoolConfig config, std::unique_ptr<MemoryBackend> backend);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// The configuration in effect; an empty tenant list has been replaced by the one
  /// "default" tenant (no quota, any peer).
  [[nodiscard]] const PoolConfig& config() const noexcept { return config_; }
  [[nodiscard]] std::string_view backend_name() const noexcept;

  // --- tenants -------------------------------------------------------------------
  /// Throws unknown_tenant. Empty name means "default".
  [[nodiscard]] const TenantConfig& tenant(std::string_view name) const;
  /// Throws permission_denied when the tenant restricts peers and uid/gid match none.
  void check_peer(std::string_view tenant, uid_t uid, gid_t gid) const;

  // --- layouts -------------------------------------------------------------------
  /// Validates and registers; identical layouts get the same id. Throws invalid_argument.
  LayoutId register_layout(const kernels::StateLayout& layout);
  /// Throws not_found.
  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> layout(LayoutId id) const;

  // --- STEPQuant plans -------------------------------------------------------------
  /// Keeps a calibration plan (already verified and validated by its loader) under its
  /// digest; the same plan twice is a no-op (created = false). At most kMaxPlans plans
  /// (pool_exhausted beyond).
  PlanInfo install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan);
  /// The plan with this digest. Throws not_found naming how to install one.
  [[nodiscard]] std::shared_ptr<const kernels::stepquant::Plan> plan(std::string_view digest) const;
  [[nodiscard]] std::vector<PlanInfo> plans() const;

  // --- arenas --------------------------------------------------------------------
  /// Returns the tenant's arena for the layout, creating it with `pages` pages (0 =
  /// default) if needed. Creation checks max_arena_pages (invalid_argument), the tenant
  /// quota (quota_exceeded) and the pool capacity (pool_exhausted).
  ArenaInfo open_arena(std::string_view tenant, LayoutId layout, std::uint32_t pages);
  /// Throws not_found, or permission_denied when the arena belongs to another tenant.
  [[nodiscard]] ArenaInfo arena(std::string_view tenant, ArenaId id) const;

  // --- leases --------------------------------------------------------------------
  /// Starts a new lease for the tenant, or resumes the orphaned lease named by `token`
  /// (same tenant, within its grace period). An unknown or expired token starts a new
  /// lease (resumed = false). Throws lease_busy if the token's lease is attached.
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

  // --- accounting ----------------------------------------------------------------
  [[nodiscard]] PoolStats stats() const;
  /// Cross-checks every allocator, owner table, lease and counter. Returns one line per
  /// inconsistency found; empty means consistent (no leaked or doubly handed-out page).
  [[nodiscard]] std::vector<std::string> check() const;

 private:
  struct Impl;
  PoolConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace statepool::service
