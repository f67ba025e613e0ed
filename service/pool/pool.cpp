#include "pool/pool.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "pool/accounting.hpp"
#include "pool/lease_token.hpp"
#include "pool/slot_allocator.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

// Distinct layouts are few (one per model and codec); the cap bounds what a client that
// registers garbage layouts in a loop can make the daemon hold.
constexpr std::size_t kMaxLayouts = 256;

constexpr std::string_view kDefaultTenant = "default";

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

std::size_t round_up(std::size_t value, std::size_t alignment) noexcept {
  return (value + alignment - 1) / alignment * alignment;
}

/// One key per (arena, slot) for a lease's slot set.
std::uint64_t slot_key(ArenaId arena, SlotId slot) noexcept {
  return (std::uint64_t{arena} << 32) | slot;
}
ArenaId key_arena(std::uint64_t key) noexcept {
  return static_cast<ArenaId>(key >> 32);
}
SlotId key_slot(std::uint64_t key) noexcept {
  return static_cast<SlotId>(key & 0xffffffffu);
}

}  // namespace

struct Pool::Impl {
  struct Tenant {
    const TenantConfig* config = nullptr;  // into Pool::config_.tenants (never resized)
    ByteBudget reserved;                   // arena bytes against the quota
  };

  struct Arena {
    ArenaId id = 0;
    std::size_t tenant = 0;  // index into tenants
    LayoutId layout = 0;
    std::shared_ptr<const kernels::PageCodec> codec;
    std::size_t page_stride = 0;
    std::size_t bytes = 0;
    std::unique_ptr<Memory> memory;
    SlotAllocator slots;
    std::vector<LeaseId> owner;  // per slot; 0 = free

    explicit Arena(std::uint32_t pages) : slots(pages), owner(pages, 0) {}
  };

  struct Lease {
    LeaseId id = 0;
    std::size_t tenant = 0;
    std::string token;
    bool attached = true;
    Clock::time_point deadline{};             // meaningful when !attached
    std::unordered_set<std::uint64_t> slots;  // slot_key(arena, slot)
  };

  std::unique_ptr<MemoryBackend> backend;

  mutable std::mutex mu;  // guards everything below
  std::vector<Tenant> tenants;
  std::map<std::string, std::size_t, std::less<>> tenant_index;
  std::map<std::string, std::shared_ptr<const kernels::stepquant::Plan>, std::less<>> plans;
  std::vector<std::shared_ptr<const kernels::PageCodec>> layouts;   // id = index + 1
  std::vector<std::unique_ptr<Arena>> arenas;                       // id = index + 1
  std::map<std::pair<std::size_t, LayoutId>, ArenaId> arena_index;  // (tenant, layout)
  ByteBudget reserved;                                              // all arenas
  std::unordered_map<LeaseId, Lease> leases;
  std::unordered_map<std::string, LeaseId> tokens;
  std::set<std::pair<Clock::time_point, LeaseId>> deadlines;  // orphaned leases
  LeaseId next_lease = 1;
  std::uint64_t pages_reclaimed_total = 0;

  // --- lookups (caller holds mu) ------------------------------------------------------

  std::size_t tenant_of(std::string_view name) const {
    if (name.empty()) name = kDefaultTenant;
    const auto it = tenant_index.find(name);
    if (it != tenant_index.end()) return it->second;
    std::string configured;
    for (const auto& t : tenants) {
      if (!configured.empty()) configured += ", ";
      configured += t.config->name;
    }
    throw StatusError(Status::unknown_tenant,
                      "unknown tenant " + quoted(name) + " (configured: " + configured + ")");
  }

  const std::shared_ptr<const kernels::PageCodec>& layout_of(LayoutId id) const {
    STATEPOOL_EXPECTS(id >= 1 && id <= layouts.size(), Status::not_found,
                      "layout " + std::to_string(id) + " not found");
    return layouts[id - 1];
  }

  Arena& arena_of(ArenaId id) const {
    STATEPOOL_EXPECTS(id >= 1 && id <= arenas.size(), Status::not_found,
                      "arena " + std::to_string(id) + " not found");
    return *arenas[id - 1];
  }

  Arena& arena_for_tenant(std::size_t tenant, ArenaId id) const {
    Arena& arena = arena_of(id);
    // Do not name the owner: tenants learn nothing about each other.
    STATEPOOL_EXPECTS(arena.tenant == tenant, Status::permission_denied,
                      "arena " + std::to_string(id) + " does not belong to tenant " +
                          quoted(tenants[tenant].config->name));
    return arena;
  }

  Lease& attached_lease(LeaseId id) {
    const auto it = leases.find(id);
    STATEPOOL_EXPECTS(it != leases.end(), Status::not_found,
                      "lease " + std::to_string(id) + " not found");
    STATEPOOL_EXPECTS(it->second.attached, Status::not_found,
                      "lease " + std::to_string(id) + " is detached");
    return it->second;
  }
  const Lease& attached_lease(LeaseId id) const {
    return const_cast<Impl*>(this)->attached_lease(id);  // NOLINT: same lookup, const view
  }

  std::string arena_label(const Arena& arena) const {
    return "arena " + std::to_string(arena.id) + " (tenant " +
           quoted(tenants[arena.tenant].config->name) + ", layout " +
           quoted(arena.codec->layout().name) + ")";
  }

  /// Validates that `lease` may touch `slot` of `arena`. Throws like Pool::free.
  void expect_owned(const Lease& lease, const Arena& arena, SlotId slot) const {
    STATEPOOL_EXPECTS(slot < arena.owner.size(), Status::invalid_argument,
                      "slot " + std::to_string(slot) + " out of range: " + arena_label(arena) +
                          " has " + std::to_string(arena.owner.size()) + " pages");
    STATEPOOL_EXPECTS(arena.owner[slot] != 0, Status::invalid_argument,
                      "slot " + std::to_string(slot) + " of arena " + std::to_string(arena.id) +
                          " is not allocated");
    STATEPOOL_EXPECTS(arena.owner[slot] == lease.id, Status::not_owner,
                      "slot " + std::to_string(slot) + " of arena " + std::to_string(arena.id) +
                          " belongs to another lease");
  }

  ArenaInfo info(const Arena& arena) const {
    ArenaInfo out;
    out.id = arena.id;
    out.tenant = tenants[arena.tenant].config->name;
    out.layout = arena.layout;
    out.layout_name = arena.codec->layout().name;
    out.codec = arena.codec->layout().codec.id;
    out.backend = std::string(backend->name());
    out.page_bytes = arena.codec->page_bytes();
    out.page_stride = arena.page_stride;
    out.page_count = arena.slots.capacity();
    out.pages_used = arena.slots.used();
    out.bytes = arena.bytes;
    out.fp32_page_bytes = arena.codec->fp32_bytes();
    out.fd = arena.memory->share_fd();
    return out;
  }

  // --- leases (caller holds mu) -------------------------------------------------------

  /// Frees every slot of the lease and forgets it. noexcept: only erases and frees.
  std::uint64_t drop_lease(std::unordered_map<LeaseId, Lease>::iterator it) noexcept {
    Lease& lease = it->second;
    std::uint64_t freed = 0;
    for (const std::uint64_t key : lease.slots) {
      const ArenaId arena_id = key_arena(key);
      const SlotId slot = key_slot(key);
      // The tables agree unless there is a bug; check() reports it, here we free only
      // what is really ours so a bug never frees another lease's slot.
      if (arena_id < 1 || arena_id > arenas.size()) continue;
      Arena& arena = *arenas[arena_id - 1];
      if (slot >= arena.owner.size() || arena.owner[slot] != lease.id) continue;
      arena.owner[slot] = 0;
      if (arena.slots.free(slot) == SlotAllocator::FreeResult::ok) ++freed;
    }
    if (!lease.attached) deadlines.erase({lease.deadline, lease.id});
    tokens.erase(lease.token);
    leases.erase(it);
    return freed;
  }

  std::uint64_t reclaim(Clock::time_point now) noexcept {
    std::uint64_t freed = 0;
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      const LeaseId id = deadlines.begin()->second;
      const auto it = leases.find(id);
      if (it == leases.end()) {  // cannot happen; keep the loop finite regardless
        deadlines.erase(deadlines.begin());
        continue;
      }
      freed += drop_lease(it);
    }
    pages_reclaimed_total += freed;
    return freed;
  }
};

// --- construction --------------------------------------------------------------------

Pool::Pool(PoolConfig config, std::unique_ptr<MemoryBackend> backend)
    : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  STATEPOOL_EXPECTS(backend != nullptr, Status::invalid_argument, "pool: no memory backend");
  STATEPOOL_EXPECTS(config_.capacity_bytes >= 1, Status::invalid_argument,
                    "pool: capacity_bytes must be at least 1");
  STATEPOOL_EXPECTS(config_.max_arena_pages >= 1, Status::invalid_argument,
                    "pool: max_arena_pages must be at least 1");
  STATEPOOL_EXPECTS(
      config_.default_arena_pages >= 1 && config_.default_arena_pages <= config_.max_arena_pages,
      Status::invalid_argument,
      "pool: default_arena_pages must be between 1 and max_arena_pages (" +
          std::to_string(config_.max_arena_pages) + "), got " +
          std::to_string(config_.default_arena_pages));
  STATEPOOL_EXPECTS(config_.grace_period.count() >= 0, Status::invalid_argument,
                    "pool: grace_period must not be negative");
  if (config_.tenants.empty()) {
    config_.tenants.push_back(TenantConfig{std::string(kDefaultTenant), 0, {}, {}});
  }
  impl_->backend = std::move(backend);
  impl_->tenants.reserve(config_.tenants.size());
  for (const TenantConfig& tenant : config_.tenants) {
    STATEPOOL_EXPECTS(!tenant.name.empty(), Status::invalid_argument,
                      "pool: a tenant has an empty name");
    const auto [it, inserted] = impl_->tenant_index.emplace(tenant.name, impl_->tenants.size());
    STATEPOOL_EXPECTS(inserted, Status::invalid_argument,
                      "pool: tenant " + quoted(tenant.name) + " is configured twice");
    impl_->tenants.push_back(Impl::Tenant{&tenant, ByteBudget(tenant.quota_bytes)});
  }
  impl_->reserved = ByteBudget(config_.capacity_bytes);
}

Pool::~Pool() = default;

std::string_view Pool::backend_name() const noexcept {
  return impl_->backend->name();
}

// --- tenants -------------------------------------------------------------------------

// Tenants never change after construction, so these two need no lock.
const TenantConfig& Pool::tenant(std::string_view name) const {
  return *impl_->tenants[impl_->tenant_of(name)].config;
}

void Pool::check_peer(std::string_view tenant_name, uid_t uid, gid_t gid) const {
  const TenantConfig& t = tenant(tenant_name);
  if (t.uids.empty() && t.gids.empty()) return;
  const bool allowed = std::find(t.uids.begin(), t.uids.end(), uid) != t.uids.end() ||
                       std::find(t.gids.begin(), t.gids.end(), gid) != t.gids.end();
  STATEPOOL_EXPECTS(allowed, Status::permission_denied,
                    "peer uid " + std::to_string(uid) + " gid " + std::to_string(gid) +
                        " is not allowed for tenant " + quoted(t.name));
}

// --- layouts -------------------------------------------------------------------------

LayoutId Pool::register_layout(const kernels::StateLayout& layout) {
  const std::string problem = kernels::validate(layout);
  STATEPOOL_EXPECTS(problem.empty(), Status::invalid_argument, "invalid layout: " + problem);
  {
    std::lock_guard lock(impl_->mu);
    for (std::size_t i = 0; i < impl_->layouts.size(); ++i) {
      if (impl_->layouts[i]->layout().same_shape_and_codec(layout)) {
        return static_cast<LayoutId>(i + 1);
      }
    }
  }
  // Build the codec outside the lock: it may take a while for large layouts.
  std::shared_ptr<const kernels::PageCodec> codec;
  try {
    codec = std::make_shared<const kernels::PageCodec>(layout);
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, std::string("invalid layout: ") + e.what());
  }
  std::lock_guard lock(impl_->mu);
  // Another thread may have registered the same layout meanwhile: look again.
  for (std::size_t i = 0; i < impl_->layouts.size(); ++i) {
    if (impl_->layouts[i]->layout().same_shape_and_codec(layout)) {
      return static_cast<LayoutId>(i + 1);
    }
  }
  STATEPOOL_EXPECTS(
      impl_->layouts.size() < kMaxLayouts, Status::pool_exhausted,
      "too many distinct layouts registered (limit " + std::to_string(kMaxLayouts) + ")");
  impl_->layouts.push_back(std::move(codec));
  return static_cast<LayoutId>(impl_->layouts.size());
}

std::shared_ptr<const kernels::PageCodec> Pool::layout(LayoutId id) const {
  std::lock_guard lock(impl_->mu);
  return impl_->layout_of(id);
}

// --- plans ---------------------------------------------------------------------------

namespace {
PlanInfo describe_plan(const std::string& digest, const kernels::stepquant::Plan& plan,
                       bool created) {
  return PlanInfo{digest, static_cast<std::uint32_t>(plan.units()), plan.pivots(),
                  plan.average_width(), created};
}
}  // namespace

PlanInfo Pool::install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan) {
  STATEPOOL_EXPECTS(plan != nullptr, Status::invalid_argument, "install_plan without a plan");
  const std::string problem = kernels::stepquant::validate(*plan);
  STATEPOOL_EXPECTS(problem.empty(), Status::invalid_argument, "invalid plan: " + problem);
  const std::string digest = kernels::stepquant::digest(*plan);
  std::lock_guard lock(impl_->mu);
  if (const auto it = impl_->plans.find(digest); it != impl_->plans.end()) {
    // The digest is a fast hash, not a signature: never let a different plan take the
    // name of one that layouts may already use.
    STATEPOOL_EXPECTS(
        kernels::stepquant::same_codec_fields(*it->second, *plan), Status::invalid_argument,
        "a different plan with digest " + digest + " is already installed; refusing to replace it");
    return describe_plan(digest, *it->second, false);
  }
  STATEPOOL_EXPECTS(impl_->plans.size() < kMaxPlans, Status::pool_exhausted,
                    "too many plans installed (limit " + std::to_string(kMaxPlans) + ")");
  impl_->plans.emplace(digest, plan);
  return describe_plan(digest, *plan, true);
}

std::shared_ptr<const kernels::stepquant::Plan> Pool::plan(std::string_view digest) const {
  std::lock_guard lock(impl_->mu);
  const auto it = impl_->plans.find(digest);
  STATEPOOL_EXPECTS(it != impl_->plans.end(), Status::not_found,
                    "no plan with digest '" + std::string(digest) +
                        "' is installed (install it with InstallPlan, or start the daemon "
                        "with --plan FILE / --plan-dir DIR)");
  return it->second;
}

std::vector<PlanInfo> Pool::plans() const {
  std::lock_guard lock(impl_->mu);
  std::vector<PlanInfo> out;
  for (const auto& [digest, plan] : impl_->plans)
    out.push_back(describe_plan(digest, *plan, false));
  return out;
}

// --- arenas --------------------------------------------------------------------------

ArenaInfo Pool::open_arena(std::string_view tenant_name, LayoutId layout_id, std::uint32_t pages) {
  std::lock_guard lock(impl_->mu);
  const std::size_t tenant = impl_->tenant_of(tenant_name);
  const auto& codec = impl_->layout_of(layout_id);
  if (const auto it = impl_->arena_index.find({tenant, layout_id});
      it != impl_->arena_index.end()) {
    return impl_->info(*impl_->arenas[it->second - 1]);
  }

  if (pages == 0) pages = config_.default_arena_pages;
  STATEPOOL_EXPECTS(pages <= config_.max_arena_pages, Status::invalid_argument,
                    "arena of " + std::to_string(pages) + " pages exceeds max_arena_pages (" +
                        std::to_string(config_.max_arena_pages) + ")");
  const std::size_t stride = round_up(codec->page_bytes(), kPageAlignment);
  const std::uint64_t bytes = std::uint64_t{pages} * stride;  // <= 2^32 * 2^33: no overflow

  Impl::Tenant& t = impl_->tenants[tenant];
  const std::string what = " (arena of " + std::to_string(pages) + " pages of " +
                           format_bytes(stride) + " for tenant " + quoted(t.config->name) +
                           ", layout " + quoted(codec->layout().name) + ")";
  STATEPOOL_EXPECTS(t.reserved.fits(bytes), Status::quota_exceeded,
                    "tenant " + quoted(t.config->name) + " quota exceeded: " +
                        format_bytes(t.reserved.used()) + " reserved + " + format_bytes(bytes) +
                        " requested > " + format_bytes(t.reserved.limit()) + " quota" + what);
  STATEPOOL_EXPECTS(impl_->reserved.fits(bytes), Status::pool_exhausted,
                    "pool capacity exceeded: " + format_bytes(impl_->reserved.used()) +
                        " reserved + " + format_bytes(bytes) + " requested > " +
                        format_bytes(impl_->reserved.limit()) + " capacity" + what);

  // Account first, then call the backend; the reservation undoes itself if anything
  // below throws.
  Reservation reservation(bytes, t.reserved, &impl_->reserved);
  const auto id = static_cast<ArenaId>(impl_->arenas.size() + 1);
  auto arena = std::make_unique<Impl::Arena>(pages);
  arena->id = id;
  arena->tenant = tenant;
  arena->layout = layout_id;
  arena->codec = codec;
  arena->page_stride = stride;
  arena->bytes = bytes;
  arena->memory = impl_->backend->allocate(
      bytes, "statepool-arena-" + t.config->name + "-" + std::to_string(layout_id));
  impl_->arena_index.emplace(std::pair{tenant, layout_id}, id);
  try {
    impl_->arenas.push_back(std::move(arena));
  } catch (...) {
    impl_->arena_index.erase({tenant, layout_id});
    throw;
  }
  reservation.commit();
  ArenaInfo out = impl_->info(*impl_->arenas.back());
  out.created = true;
  return out;
}

ArenaInfo Pool::arena(std::string_view tenant_name, ArenaId id) const {
  std::lock_guard lock(impl_->mu);
  return impl_->info(impl_->arena_for_tenant(impl_->tenant_of(tenant_name), id));
}

// --- leases --------------------------------------------------------------------------

LeaseGrant Pool::attach_lease(std::string_view tenant_name, std::string_view token) {
  return attach_lease(tenant_name, token, Clock::now());
}

LeaseGrant Pool::attach_lease(std::string_view tenant_name, std::string_view token,
                              Clock::time_point now) {
  // Drawn before taking the lock: getrandom may block early at boot.
  std::string fresh = make_lease_token();
  std::lock_guard lock(impl_->mu);
  const std::size_t tenant = impl_->tenant_of(tenant_name);

  if (!token.empty()) {
    if (const auto tok = impl_->tokens.find(std::string(token)); tok != impl_->tokens.end()) {
      const auto it = impl_->leases.find(tok->second);
      // Another tenant's token: treat it as unknown, and leave that lease alone.
      if (it != impl_->leases.end() && it->second.tenant == tenant) {
        Impl::Lease& lease = it->second;
        STATEPOOL_EXPECTS(
            !lease.attached, Status::lease_busy,
            "lease " + std::to_string(lease.id) + " is attached to another live connection");
        if (lease.deadline > now) {
          impl_->deadlines.erase({lease.deadline, lease.id});
          lease.attached = true;
          lease.deadline = {};
          return LeaseGrant{lease.id, lease.token, true,
                            static_cast<std::uint32_t>(lease.slots.size())};
        }
        // Expired but not reclaimed yet: reclaim now and start afresh.
        impl_->pages_reclaimed_total += impl_->drop_lease(it);
      }
    }
  }

  while (impl_->tokens.contains(fresh)) fresh = make_lease_token();  // 2^-128; still
  Impl::Lease lease;
  lease.id = impl_->next_lease++;
  lease.tenant = tenant;
  lease.token = fresh;
  const LeaseId id = lease.id;
  impl_->tokens.emplace(fresh, id);
  try {
    impl_->leases.emplace(id, std::move(lease));
  } catch (...) {
    impl_->tokens.erase(fresh);
    throw;
  }
  return LeaseGrant{id, std::move(fresh), false, 0};
}

void Pool::detach_lease(LeaseId lease_id, Clock::time_point now) {
  std::lock_guard lock(impl_->mu);
  const auto it = impl_->leases.find(lease_id);
  if (it == impl_->leases.end() || !it->second.attached) return;
  Impl::Lease& lease = it->second;
  if (lease.slots.empty()) {
    impl_->drop_lease(it);
    return;
  }
  if (config_.grace_period.count() <= 0) {  // no grace: nothing to wait for
    impl_->pages_reclaimed_total += impl_->drop_lease(it);
    return;
  }
  lease.attached = false;
  lease.deadline = now + config_.grace_period;
  try {
    impl_->deadlines.emplace(lease.deadline, lease.id);
  } catch (...) {
    // Out of memory for one set node: drop the lease now rather than leak its slots.
    impl_->pages_reclaimed_total += impl_->drop_lease(it);
  }
}

std::uint64_t Pool::reclaim_expired(Clock::time_point now) {
  std::lock_guard lock(impl_->mu);
  return impl_->reclaim(now);
}

std::optional<Clock::time_point> Pool::next_deadline() const {
  std::lock_guard lock(impl_->mu);
  if (impl_->deadlines.empty()) return std::nullopt;
  return impl_->deadlines.begin()->first;
}

// --- slots ---------------------------------------------------------------------------

std::vector<SlotId> Pool::allocate(LeaseId lease_id, ArenaId arena_id, std::uint32_t count) {
  std::lock_guard lock(impl_->mu);
  Impl::Lease& lease = impl_->attached_lease(lease_id);
  Impl::Arena& arena = impl_->arena_for_tenant(lease.tenant, arena_id);
  STATEPOOL_EXPECTS(count >= 1, Status::invalid_argument, "allocate: count must be at least 1");
  STATEPOOL_EXPECTS(count <= arena.slots.available(), Status::pool_exhausted,
                    impl_->arena_label(arena) + ": " + std::to_string(arena.slots.available()) +
                        " of " + std::to_string(arena.slots.capacity()) + " pages free, " +
                        std::to_string(count) + " requested");

  std::vector<SlotId> out;
  out.reserve(count);
  lease.slots.reserve(lease.slots.size() + count);
  const bool ok = arena.slots.allocate_n(count, out);
  STATEPOOL_EXPECTS(ok, Status::internal, "allocate: slot allocator refused after check");
  try {
    for (const SlotId slot : out) {
      lease.slots.insert(slot_key(arena.id, slot));
      arena.owner[slot] = lease.id;
    }
  } catch (...) {
    // All or nothing: undo in reverse so the free stack is exactly as before. Every slot
    // in `out` was free before this call, so clearing its owner is right.
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      lease.slots.erase(slot_key(arena.id, *it));
      arena.owner[*it] = 0;
      (void)arena.slots.free(*it);
    }
    throw;
  }
  return out;
}

std::uint32_t Pool::free(LeaseId lease_id, ArenaId arena_id, std::span<const SlotId> slots) {
  std::lock_guard lock(impl_->mu);
  Impl::Lease& lease = impl_->attached_lease(lease_id);
  Impl::Arena& arena = impl_->arena_for_tenant(lease.tenant, arena_id);

  // Validate everything first: a failed free changes nothing.
  for (const SlotId slot : slots) {
    STATEPOOL_EXPECTS(slot < arena.owner.size(), Status::invalid_argument,
                      "slot " + std::to_string(slot) +
                          " out of range: " + impl_->arena_label(arena) + " has " +
                          std::to_string(arena.owner.size()) + " pages");
  }
  std::vector<SlotId> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    throw StatusError(Status::invalid_argument,
                      "slot " + std::to_string(*dup) + " is listed twice");
  }
  for (const SlotId slot : slots) impl_->expect_owned(lease, arena, slot);

  // Apply: nothing below can fail.
  for (const SlotId slot : slots) {
    lease.slots.erase(slot_key(arena.id, slot));
    arena.owner[slot] = 0;
    (void)arena.slots.free(slot);
  }
  return static_cast<std::uint32_t>(slots.size());
}

PageRef Pool::page(LeaseId lease_id, ArenaId arena_id, SlotId slot) const {
  std::lock_guard lock(impl_->mu);
  const Impl::Lease& lease = impl_->attached_lease(lease_id);
  const Impl::Arena& arena = impl_->arena_for_tenant(lease.tenant, arena_id);
  impl_->expect_owned(lease, arena, slot);
  const std::span<std::byte> all = arena.memory->bytes();
  return PageRef{all.subspan(std::size_t{slot} * arena.page_stride, arena.codec->page_bytes()),
                 arena.codec.get()};
}

// --- accounting ----------------------------------------------------------------------

PoolStats Pool::stats() const {
  std::lock_guard lock(impl_->mu);
  PoolStats out;
  out.capacity_bytes = impl_->reserved.limit();
  out.reserved_bytes = impl_->reserved.used();
  out.pages_reclaimed_total = impl_->pages_reclaimed_total;
  out.tenants.reserve(impl_->tenants.size());
  for (const auto& t : impl_->tenants) {
    TenantUsage usage;
    usage.name = t.config->name;
    usage.quota_bytes = t.config->quota_bytes;
    usage.reserved_bytes = t.reserved.used();
    out.tenants.push_back(std::move(usage));
  }
  out.arenas.reserve(impl_->arenas.size());
  for (const auto& arena : impl_->arenas) {
    out.arenas.push_back(impl_->info(*arena));
    TenantUsage& usage = out.tenants[arena->tenant];
    const std::uint64_t used = arena->slots.used();
    usage.pages_used += used;
    usage.stored_bytes += used * arena->codec->page_bytes();
    usage.fp32_bytes += used * arena->codec->fp32_bytes();
  }
  for (const auto& [id, lease] : impl_->leases) {
    if (lease.attached) {
      ++out.leases_active;
    } else {
      ++out.leases_orphaned;
    }
  }
  return out;
}

std::vector<std::string> Pool::check() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> problems;
  const auto report = [&](std::string line) { problems.push_back(std::move(line)); };

  // Arenas: allocator invariants, allocator vs owner table, owners vs leases.
  std::vector<std::uint64_t> tenant_bytes(impl_->tenants.size(), 0);
  std::uint64_t total_bytes = 0;
  std::uint64_t total_used = 0;
  for (std::size_t i = 0; i < impl_->arenas.size(); ++i) {
    const Impl::Arena& arena = *impl_->arenas[i];
    const std::string name = "arena " + std::to_string(arena.id);
    if (arena.id != i + 1) report(name + ": stored at index " + std::to_string(i));
    for (const std::string& line : arena.slots.check()) report(name + ": " + line);
    if (arena.tenant >= impl_->tenants.size()) {
      report(name + ": tenant index out of range");
      continue;
    }
    tenant_bytes[arena.tenant] += arena.bytes;
    total_bytes += arena.bytes;
    if (arena.bytes != std::uint64_t{arena.slots.capacity()} * arena.page_stride) {
      report(name + ": bytes != pages * stride");
    }
    if (arena.memory == nullptr || arena.memory->bytes().size() < arena.bytes) {
      report(name + ": memory smaller than the arena");
    }
    std::uint32_t owned = 0;
    for (SlotId slot = 0; slot < arena.owner.size(); ++slot) {
      const LeaseId owner = arena.owner[slot];
      const std::string where = name + " slot " + std::to_string(slot);
      if (arena.slots.is_allocated(slot) != (owner != 0)) {
        report(where + ": allocator says " +
               (arena.slots.is_allocated(slot) ? "allocated" : "free") + ", owner is " +
               std::to_string(owner));
      }
      if (owner == 0) continue;
      ++owned;
      const auto it = impl_->leases.find(owner);
      if (it == impl_->leases.end()) {
        report(where + ": owned by lease " + std::to_string(owner) + " that does not exist");
        continue;
      }
      if (!it->second.slots.contains(slot_key(arena.id, slot))) {
        report(where + ": owner lease " + std::to_string(owner) + " does not list it");
      }
      if (it->second.tenant != arena.tenant) {
        report(where + ": owned by a lease of another tenant");
      }
    }
    if (owned != arena.slots.used()) {
      report(name + ": " + std::to_string(owned) + " owned slots but allocator has " +
             std::to_string(arena.slots.used()) + " used");
    }
    total_used += arena.slots.used();
  }

  // Leases: every listed slot is owned by that lease (so no slot sits in two leases),
  // tokens and deadlines index exactly the leases they should.
  std::uint64_t listed = 0;
  std::size_t orphaned = 0;
  for (const auto& [id, lease] : impl_->leases) {
    const std::string name = "lease " + std::to_string(id);
    if (lease.id != id) report(name + ": stored under the wrong id");
    listed += lease.slots.size();
    for (const std::uint64_t key : lease.slots) {
      const ArenaId arena_id = key_arena(key);
      const SlotId slot = key_slot(key);
      if (arena_id < 1 || arena_id > impl_->arenas.size()) {
        report(name + ": lists arena " + std::to_string(arena_id) + " that does not exist");
        continue;
      }
      const Impl::Arena& arena = *impl_->arenas[arena_id - 1];
      if (slot >= arena.owner.size() || arena.owner[slot] != id) {
        report(name + ": lists arena " + std::to_string(arena_id) + " slot " +
               std::to_string(slot) + " that it does not own");
      }
    }
    const auto tok = impl_->tokens.find(lease.token);
    if (tok == impl_->tokens.end() || tok->second != id) {
      report(name + ": token not indexed");
    }
    if (!lease.attached) {
      ++orphaned;
      if (!impl_->deadlines.contains({lease.deadline, id})) {
        report(name + ": orphaned without a deadline entry");
      }
      if (lease.slots.empty()) report(name + ": orphaned with no slots (should be dropped)");
    }
  }
  if (listed != total_used) {
    report("leases list " + std::to_string(listed) + " slots, allocators have " +
           std::to_string(total_used) + " used");
  }
  if (impl_->tokens.size() != impl_->leases.size()) {
    report(std::to_string(impl_->tokens.size()) + " tokens for " +
           std::to_string(impl_->leases.size()) + " leases");
  }
  if (impl_->deadlines.size() != orphaned) {
    report(std::to_string(impl_->deadlines.size()) + " deadlines for " + std::to_string(orphaned) +
           " orphaned leases");
  }

  // Bytes: per tenant, in total, against quotas and capacity.
  for (std::size_t t = 0; t < impl_->tenants.size(); ++t) {
    const Impl::Tenant& tenant = impl_->tenants[t];
    const std::string name = "tenant " + quoted(tenant.config->name);
    if (tenant.reserved.used() != tenant_bytes[t]) {
      report(name + ": accounts " + std::to_string(tenant.reserved.used()) +
             " reserved bytes, its arenas hold " + std::to_string(tenant_bytes[t]));
    }
    if (!tenant.reserved.unlimited() && tenant.reserved.used() > tenant.reserved.limit()) {
      report(name + ": reserved bytes above the quota");
    }
  }
  if (impl_->reserved.used() != total_bytes) {
    report("pool accounts " + std::to_string(impl_->reserved.used()) +
           " reserved bytes, arenas hold " + std::to_string(total_bytes));
  }
  if (!impl_->reserved.unlimited() && impl_->reserved.used() > impl_->reserved.limit()) {
    report("pool reserved bytes above capacity");
  }
  if (impl_->arena_index.size() != impl_->arenas.size()) {
    report(std::to_string(impl_->arena_index.size()) + " arena index entries for " +
           std::to_string(impl_->arenas.size()) + " arenas");
  }
  return problems;
}

}  // namespace statepool::service
