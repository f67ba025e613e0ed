#include "pool/pool.hpp"

#include <algorithm>
#include <utility>

#include "pool/lease_token.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/support/size.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using support::format_bytes;

constexpr std::string_view kDefaultTenant = "default";

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

std::size_t round_up(std::size_t value, std::size_t alignment) noexcept {
  return (value + alignment - 1) / alignment * alignment;
}

std::shared_ptr<MemoryResource> require(std::shared_ptr<MemoryResource> memory) {
  STATEPOOL_EXPECTS(memory != nullptr, Status::invalid_argument, "pool: no memory resource");
  return memory;
}

}  // namespace

kernels::BufferRef PageRef::buffer() const noexcept {
  kernels::BufferRef out = memory->buffer();
  out.data = bytes.data();
  out.size = bytes.size();
  return out;
}

// --- construction --------------------------------------------------------------------

Pool::Pool(PoolConfig config, std::shared_ptr<MemoryResource> memory)
    : config_(std::move(config)),
      memory_(require(std::move(memory))),
      tracking_(*memory_),
      capacity_(tracking_, config_.capacity_bytes, Status::pool_exhausted,
                LimitText{"pool capacity", "reserved", " capacity"}) {
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
    config_.tenants.push_back(
        TenantConfig{std::string(kDefaultTenant), 0, {}, {}, config_.default_limits, {}});
  }
  tenants_.reserve(config_.tenants.size());
  for (const TenantConfig& tenant : config_.tenants) {
    STATEPOOL_EXPECTS(!tenant.name.empty(), Status::invalid_argument,
                      "pool: a tenant has an empty name");
    for (const Tenant& other : tenants_) {
      STATEPOOL_EXPECTS(other.config->name != tenant.name, Status::invalid_argument,
                        "pool: tenant " + quoted(tenant.name) + " is configured twice");
    }
    const std::string& space =
        tenant.snapshot_namespace.empty() ? tenant.name : tenant.snapshot_namespace;
    auto known = std::find(spaces_.begin(), spaces_.end(), space);
    if (known == spaces_.end()) known = spaces_.insert(spaces_.end(), space);
    Tenant t{{},
             &tenant,
             std::make_unique<LimitingResource>(
                 capacity_, tenant.quota_bytes, Status::quota_exceeded,
                 LimitText{"tenant " + quoted(tenant.name) + " quota", "reserved", " quota"})};
    t.space = static_cast<std::size_t>(known - spaces_.begin());
    tenants_.push_back(std::move(t));
  }
}

Pool::~Pool() = default;

// --- tenants -------------------------------------------------------------------------

// Tenants never change after construction: no lock.
std::size_t Pool::tenant_index(std::string_view name) const {
  if (name.empty()) name = kDefaultTenant;
  for (std::size_t i = 0; i < tenants_.size(); ++i) {
    if (tenants_[i].config->name == name) return i;
  }
  // Peers learn nothing about other tenants, not even their names (the operator finds
  // them in the start-up log and in --print-config).
  throw StatusError(Status::unknown_tenant,
                    "unknown tenant " + quoted(name) + " (not configured in this daemon)");
}

RegistryOwner Pool::owner(std::size_t tenant, std::uint32_t TenantLimits::*limit) const {
  const TenantConfig& t = *tenants_[tenant].config;
  return RegistryOwner{tenant, t.name, t.limits.*limit};
}

LayoutId Pool::register_layout(std::string_view tenant_name, const kernels::StateLayout& layout) {
  const CountChange change{changes_};
  const std::size_t tenant = tenant_index(tenant_name);
  return registry_.register_layout(layout, owner(tenant, &TenantLimits::max_layouts));
}

PlanInfo Pool::install_plan(std::string_view tenant_name,
                            std::shared_ptr<const kernels::stepquant::Plan> plan) {
  const CountChange change{changes_};
  const std::size_t tenant = tenant_index(tenant_name);
  return registry_.install_plan(std::move(plan), owner(tenant, &TenantLimits::max_plans));
}

const TenantConfig& Pool::tenant(std::string_view name) const {
  return *tenants_[tenant_index(name)].config;
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

// --- lookups (caller holds mutex_) ---------------------------------------------------

Arena& Pool::arena_for_tenant(std::size_t tenant, ArenaId id) {
  return const_cast<Arena&>(std::as_const(*this).arena_for_tenant(tenant, id));  // NOLINT
}

const Arena& Pool::arena_for_tenant(std::size_t tenant, ArenaId id) const {
  const Arena& arena = arenas_.get(id);
  // Do not tell the peer the owner: tenants learn nothing about each other.
  if (arena.tenant != tenant) {
    throw AccessRefused("arena " + std::to_string(id) + " does not belong to tenant " +
                            quoted(tenants_[tenant].config->name),
                        tenants_[arena.tenant].config->name);
  }
  return arena;
}

std::string Pool::arena_label(const Arena& arena) const {
  return "arena " + std::to_string(arena.id) + " (tenant " +
         quoted(tenants_[arena.tenant].config->name) + ", layout " +
         quoted(arena.codec->layout().name) + ")";
}

void Pool::expect_owned(const Lease& lease, const Arena& arena, SlotId slot) const {
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

ArenaInfo Pool::info(const Arena& arena) const {
  ArenaInfo out;
  out.id = arena.id;
  out.tenant = tenants_[arena.tenant].config->name;
  out.layout = arena.layout;
  out.layout_name = arena.codec->layout().name;
  out.codec = arena.codec->layout().codec.id;
  out.backend = std::string(memory_->name());
  out.page_bytes = arena.codec->page_bytes();
  out.page_stride = arena.page_stride;
  out.page_count = arena.page_count();
  out.pages_used = arena.slots.used();
  out.bytes = arena.memory->size();
  out.fp32_page_bytes = arena.codec->fp32_bytes();
  out.snapshot_pages = arena.snapshot_pages;
  out.memory = arena.memory;
  out.fd = arena.memory->info().fd;
  return out;
}

// --- arenas --------------------------------------------------------------------------

ArenaInfo Pool::open_arena(std::string_view tenant_name, LayoutId layout_id, std::uint32_t pages,
                           std::optional<HandleKind> handle, LeaseId opener) {
  const CountChange change{changes_};
  const std::size_t tenant = tenant_index(tenant_name);
  const auto codec = registry_.layout(layout_id);  // not_found
  const ArenaTable::Key key{tenant, layout_id};
  {
    std::unique_lock lock(mutex_);
    created_.wait(lock, [&] { return !arenas_.creating(key); });
    if (Arena* existing = arenas_.find(key, pages)) {
      const HandleKind kind = existing->memory->info().where.handle_kind;
      STATEPOOL_EXPECTS(!handle || *handle == kind, Status::invalid_argument,
                        "arena " + std::to_string(existing->id) + " is already shared as " +
                            kernels::to_string(kind) + ", not " +
                            kernels::to_string(handle.value_or(kind)) +
                            " (the first client to open an arena chooses how it is shared)");
      ArenaInfo out = info(*existing);
      if (opener != 0) existing->openers.insert(opener);
      return out;
    }
    const std::size_t open = arenas_.count_for_tenant(tenant);
    const TenantConfig& t = *tenants_[tenant].config;
    STATEPOOL_EXPECTS(open < t.limits.max_arenas, Status::quota_exceeded,
                      "tenant " + quoted(t.name) + " has " + std::to_string(open) +
                          " arenas, its limit (max-arenas in its [tenant] section, default "
                          "--tenant-max-arenas)");
    arenas_.reserve(key);
  }
  // From here this call creates the arena; every way out ends the reservation.
  try {
    if (pages == 0) pages = config_.default_arena_pages;
    STATEPOOL_EXPECTS(pages <= config_.max_arena_pages, Status::invalid_argument,
                      "arena of " + std::to_string(pages) + " pages exceeds max_arena_pages (" +
                          std::to_string(config_.max_arena_pages) + ")");
    const std::size_t stride = round_up(codec->page_bytes(), kPageAlignment);
    const std::uint64_t bytes =
        memory_->allocation_size(std::uint64_t{pages} * stride);  // <= 2^32 * 2^33
    auto arena = std::make_unique<Arena>(pages);
    arena->tenant = tenant;
    arena->layout = layout_id;
    arena->codec = codec;
    arena->layout_digest = kernels::layout_digest(codec->layout());
    arena->page_stride = stride;
    const Tenant& t = tenants_[tenant];
    try {
      // Quota, then capacity, then the backend: each refuses with its own status, and
      // a refusal anywhere charges nothing.
      arena->memory = t.quota->allocate(
          bytes, "statepool-arena-" + t.config->name + "-" + std::to_string(layout_id), handle);
    } catch (const LimitExceeded& e) {
      throw LimitExceeded(
          e.status(), std::string(e.what()) + " (arena of " + std::to_string(pages) + " pages of " +
                          format_bytes(stride) + " for tenant " + quoted(t.config->name) +
                          ", layout " + quoted(codec->layout().name) + ")");
    }
    const std::lock_guard lock(mutex_);
    Arena& added = arenas_.add(key, std::move(arena));
    created_.notify_all();
    ArenaInfo out = info(added);
    out.created = true;
    if (opener != 0) added.openers.insert(opener);
    return out;
  } catch (...) {
    {
      const std::lock_guard lock(mutex_);
      arenas_.cancel(key);
    }
    created_.notify_all();
    throw;
  }
}

ArenaInfo Pool::arena(std::string_view tenant_name, ArenaId id) const {
  const std::size_t tenant = tenant_index(tenant_name);
  const std::lock_guard lock(mutex_);
  return info(arena_for_tenant(tenant, id));
}

ClosedArena Pool::close_arena(std::string_view tenant_name, ArenaId id, LeaseId requester) {
  const CountChange change{changes_};
  const std::size_t tenant = tenant_index(tenant_name);
  std::unique_ptr<Arena> closed;  // destroyed (its memory released) after the lock
  ClosedArena out;
  {
    const std::lock_guard lock(mutex_);
    Arena& arena = arena_for_tenant(tenant, id);
    const std::string label = arena_label(arena);
    const std::size_t others = arena.openers.size() - (arena.openers.contains(requester) ? 1 : 0);
    STATEPOOL_EXPECTS(others == 0, Status::in_use,
                      label + " is open on " + std::to_string(others) + " other connection" +
                          (others == 1 ? "" : "s") +
                          " of the tenant; it can be closed once they have disconnected");
    const std::uint32_t leased = arena.slots.used() - arena.snapshot_pages;
    STATEPOOL_EXPECTS(leased == 0, Status::in_use,
                      label + " has " + std::to_string(leased) + " page" +
                          (leased == 1 ? "" : "s") +
                          " held by leases: free them first (a disconnected lease's pages are "
                          "freed when its grace period ends)");
    const std::vector<SnapshotId> victims = snapshots_.evictable(id, arena.page_count());
    if (snapshots_.pages_of(victims) != arena.snapshot_pages) {
      std::uint32_t pinned = 0;
      std::uint32_t busy = 0;
      for (const auto& [sid, s] : snapshots_.all()) {
        if (s.arena != id) continue;
        pinned += s.visible && s.pinned ? 1 : 0;
        busy += s.busy > 0 ? 1 : 0;
      }
      throw StatusError(Status::in_use,
                        label + " holds " + std::to_string(pinned) + " pinned snapshots and " +
                            std::to_string(busy) +
                            " being read or published: unpin or delete them first, or wait");
    }
    // Nothing can fail from here.
    out.id = id;
    out.layout_name = arena.codec->layout().name;
    out.bytes = arena.memory->size();
    out.snapshots_dropped = static_cast<std::uint32_t>(victims.size());
    evict(victims);
    closed = arenas_.remove(id);
  }
  return out;
}

// --- leases --------------------------------------------------------------------------

std::uint64_t Pool::drop_lease(LeaseId id) noexcept {
  Lease* lease = leases_.find(id);
  if (lease == nullptr) return 0;
  std::uint64_t freed = 0;
  for (const std::uint64_t key : lease->slots) {
    const ArenaId arena_id = key_arena(key);
    const SlotId slot = key_slot(key);
    // The tables agree unless there is a bug; check() reports it, here we free only what
    // is really ours so a bug never frees another lease's slot.
    Arena* arena = arenas_.find_id(arena_id);
    if (arena == nullptr || slot >= arena->owner.size() || arena->owner[slot] != id) continue;
    arena->owner[slot] = 0;
    if (arena->slots.free(slot) == SlotAllocator::FreeResult::ok) ++freed;
  }
  leases_.erase(id);
  return freed;
}

LeaseGrant Pool::attach_lease(std::string_view tenant_name, std::string_view token) {
  return attach_lease(tenant_name, token, Clock::now());
}

LeaseGrant Pool::attach_lease(std::string_view tenant_name, std::string_view token,
                              Clock::time_point now) {
  const CountChange change{changes_};
  // Drawn before taking the lock: getrandom may block early at boot.
  std::string fresh = make_lease_token();
  const std::size_t tenant = tenant_index(tenant_name);
  const std::lock_guard lock(mutex_);
  const TenantConfig& t = *tenants_[tenant].config;
  const std::uint32_t attached = leases_.attached_count(tenant);
  STATEPOOL_EXPECTS(attached < t.limits.max_connections, Status::too_many_connections,
                    "tenant " + quoted(t.name) + " has " + std::to_string(attached) +
                        " connections, its limit (max-connections in its [tenant] section, "
                        "default --tenant-max-connections); retry later");

  if (!token.empty()) {
    // Another tenant's token: treat it as unknown, and leave that lease alone.
    if (Lease* lease = leases_.find_token(token); lease != nullptr && lease->tenant == tenant) {
      STATEPOOL_EXPECTS(
          !lease->attached, Status::lease_busy,
          "lease " + std::to_string(lease->id) + " is attached to another live connection");
      if (lease->deadline > now) {
        leases_.reattach(*lease);
        return LeaseGrant{lease->id, lease->token, true,
                          static_cast<std::uint32_t>(lease->slots.size())};
      }
      // Expired but not reclaimed yet: reclaim now and start afresh.
      pages_reclaimed_total_ += drop_lease(lease->id);
    }
  }

  while (leases_.token_in_use(fresh)) fresh = make_lease_token();  // 2^-128; still
  const Lease& lease = leases_.create(tenant, fresh);
  return LeaseGrant{lease.id, std::move(fresh), false, 0};
}

void Pool::detach_lease(LeaseId lease_id, Clock::time_point now) {
  const CountChange change{changes_};
  const std::lock_guard lock(mutex_);
  Lease* lease = leases_.find(lease_id);
  if (lease == nullptr || !lease->attached) return;
  for (const auto& [id, arena] : arenas_.all()) arena->openers.erase(lease_id);  // it unmapped them
  if (lease->slots.empty()) {
    drop_lease(lease_id);
    return;
  }
  if (config_.grace_period.count() <= 0) {  // no grace: nothing to wait for
    pages_reclaimed_total_ += drop_lease(lease_id);
    return;
  }
  try {
    leases_.orphan(*lease, now + config_.grace_period);
  } catch (...) {
    // Out of memory for one set node: drop the lease now rather than leak its slots.
    pages_reclaimed_total_ += drop_lease(lease_id);
  }
}

std::uint64_t Pool::reclaim_expired(Clock::time_point now) {
  const std::lock_guard lock(mutex_);
  std::uint64_t freed = 0;
  while (const auto id = leases_.first_expired(now)) {
    freed += drop_lease(*id);
    changes_.fetch_add(1, std::memory_order_release);  // under the lock: save_state waits
  }
  pages_reclaimed_total_ += freed;
  return freed;
}

std::optional<Clock::time_point> Pool::next_deadline() const {
  const std::lock_guard lock(mutex_);
  return leases_.next_deadline();
}

// --- slots ---------------------------------------------------------------------------

std::vector<SlotId> Pool::allocate(LeaseId lease_id, ArenaId arena_id, std::uint32_t count) {
  const CountChange change{changes_};
  const std::lock_guard lock(mutex_);
  Lease& lease = leases_.attached(lease_id);
  Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  STATEPOOL_EXPECTS(count >= 1, Status::invalid_argument, "allocate: count must be at least 1");
  if (count > arena.slots.available()) {
    // Live slots come first: make room by evicting snapshots, all or nothing.
    const std::size_t needed = count - arena.slots.available();
    const std::vector<SnapshotId> victims = snapshots_.evictable(arena.id, needed);
    const std::size_t evictable = snapshots_.pages_of(victims);
    STATEPOOL_EXPECTS(
        evictable >= needed, Status::pool_exhausted,
        arena_label(arena) + ": " + std::to_string(arena.slots.available()) + " of " +
            std::to_string(arena.slots.capacity()) + " pages free, " + std::to_string(count) +
            " requested" +
            (arena.snapshot_pages == 0
                 ? std::string()
                 : " (" + std::to_string(arena.snapshot_pages) + " pages hold snapshots, " +
                       std::to_string(evictable) + " of them evictable: the rest are " +
                       "pinned or being read)"));
    evict(victims);
  }

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
  const CountChange change{changes_};
  const std::lock_guard lock(mutex_);
  Lease& lease = leases_.attached(lease_id);
  Arena& arena = arena_for_tenant(lease.tenant, arena_id);

  // Validate everything first: a failed free changes nothing.
  for (const SlotId slot : slots) {
    STATEPOOL_EXPECTS(slot < arena.owner.size(), Status::invalid_argument,
                      "slot " + std::to_string(slot) + " out of range: " + arena_label(arena) +
                          " has " + std::to_string(arena.owner.size()) + " pages");
  }
  std::vector<SlotId> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
    throw StatusError(Status::invalid_argument,
                      "slot " + std::to_string(*dup) + " is listed twice");
  }
  for (const SlotId slot : slots) expect_owned(lease, arena, slot);

  // Apply: nothing below can fail.
  for (const SlotId slot : slots) {
    lease.slots.erase(slot_key(arena.id, slot));
    arena.owner[slot] = 0;
    (void)arena.slots.free(slot);
  }
  return static_cast<std::uint32_t>(slots.size());
}

PageRef Pool::page(LeaseId lease_id, ArenaId arena_id, SlotId slot) const {
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  const Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  expect_owned(lease, arena, slot);
  const kernels::BufferRef page = arena.page(slot);
  return PageRef{{page.data, page.size}, arena.codec, arena.memory};
}

std::shared_ptr<const kernels::PageCodec> Pool::page_codec(LeaseId lease_id,
                                                           ArenaId arena_id) const {
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  return arena_for_tenant(lease.tenant, arena_id).codec;
}

// --- accounting ----------------------------------------------------------------------

PoolStats Pool::stats() const {
  const std::lock_guard lock(mutex_);
  PoolStats out;
  out.capacity_bytes = capacity_.limit();
  out.reserved_bytes = capacity_.used();
  out.pages_reclaimed_total = pages_reclaimed_total_;
  out.memory = tracking_.usage();
  out.tenants.reserve(tenants_.size());
  for (const auto& t : tenants_) {
    TenantUsage usage;
    usage.name = t.config->name;
    usage.quota_bytes = t.config->quota_bytes;
    usage.reserved_bytes = t.quota->used();
    usage.snapshot_hits = t.hits;
    usage.snapshot_misses = t.misses;
    usage.snapshot_puts_created = t.puts_created;
    usage.snapshot_puts_existing = t.puts_existing;
    usage.snapshot_evictions = t.evictions;
    usage.snapshot_demotions = t.demotions;
    usage.snapshot_hits_host = t.hits_host;
    usage.snapshot_hits_remote = t.hits_remote;
    out.tenants.push_back(std::move(usage));
  }
  out.arenas.reserve(arenas_.size());
  for (const auto& [id, arena] : arenas_.all()) {
    out.arenas.push_back(info(*arena));
    TenantUsage& usage = out.tenants[arena->tenant];
    const std::uint64_t used = arena->slots.used();
    usage.pages_used += used;
    usage.stored_bytes += used * arena->codec->page_bytes();
    usage.fp32_bytes += used * arena->codec->fp32_bytes();
    usage.snapshot_bytes += std::uint64_t{arena->snapshot_pages} * arena->codec->page_bytes();
  }
  for (const auto& [id, snapshot] : snapshots_.all()) {
    if (!snapshot.visible) continue;
    TenantUsage& usage = out.tenants[snapshot.tenant];
    ++usage.snapshots;
    usage.pinned_snapshots += snapshot.pinned ? 1 : 0;
  }
  for (const auto& [id, lease] : leases_.all()) {
    if (lease.attached) {
      ++out.leases_active;
    } else {
      ++out.leases_orphaned;
    }
  }
  return out;
}

std::vector<std::string> Pool::check() const {
  std::unique_lock lock(mutex_);
  // Memory of an arena being created is charged before the arena is in the table.
  created_.wait(lock, [&] { return !arenas_.any_creating(); });
  return check_locked();
}

std::vector<std::string> Pool::check_locked() const {
  std::vector<std::string> problems;
  const auto report = [&](std::string line) { problems.push_back(std::move(line)); };

  // Arenas: allocator invariants, allocator vs owner table, owners vs leases.
  std::vector<std::uint64_t> tenant_bytes(tenants_.size(), 0);
  std::uint64_t total_bytes = 0;
  std::uint64_t total_used = 0;
  for (const auto& [id, stored] : arenas_.all()) {
    const Arena& arena = *stored;
    const std::string name = "arena " + std::to_string(arena.id);
    if (arenas_.find_id(arena.id) != &arena) report(name + ": not stored under its id");
    for (const std::string& line : arena.slots.check()) report(name + ": " + line);
    if (arena.tenant >= tenants_.size()) {
      report(name + ": tenant index out of range");
      continue;
    }
    if (arena.memory == nullptr ||
        arena.memory->size() < std::uint64_t{arena.page_count()} * arena.page_stride) {
      report(name + ": memory smaller than its pages");
      continue;
    }
    tenant_bytes[arena.tenant] += arena.memory->size();
    total_bytes += arena.memory->size();
    std::uint32_t owned = 0;
    for (SlotId slot = 0; slot < arena.owner.size(); ++slot) {
      const LeaseId owner = arena.owner[slot];
      const std::string where = name + " slot " + std::to_string(slot);
      if (arena.slots.is_allocated(slot) != (owner != 0)) {
        report(where + ": allocator says " +
               (arena.slots.is_allocated(slot) ? "allocated" : "free") + ", owner is " +
               std::to_string(owner));
      }
      if (owner == 0 || owner == kSnapshotOwner) continue;
      ++owned;
      const Lease* lease = leases_.find(owner);
      if (lease == nullptr) {
        report(where + ": owned by lease " + std::to_string(owner) + " that does not exist");
        continue;
      }
      if (!lease->slots.contains(slot_key(arena.id, slot))) {
        report(where + ": owner lease " + std::to_string(owner) + " does not list it");
      }
      if (lease->tenant != arena.tenant) report(where + ": owned by a lease of another tenant");
    }
    for (const LeaseId opener : arena.openers) {
      const Lease* lease = leases_.find(opener);
      if (lease == nullptr || !lease->attached) {
        report(name + ": opened by lease " + std::to_string(opener) + " that is not attached");
      } else if (lease->tenant != arena.tenant) {
        report(name + ": opened by a lease of another tenant");
      }
    }
    if (owned + arena.snapshot_pages != arena.slots.used()) {
      report(name + ": " + std::to_string(owned) + " owned slots and " +
             std::to_string(arena.snapshot_pages) + " snapshot pages but allocator has " +
             std::to_string(arena.slots.used()) + " used");
    }
    total_used += arena.slots.used() - std::min(arena.slots.used(), arena.snapshot_pages);
  }

  // Leases: every listed slot is owned by that lease (so no slot sits in two leases),
  // tokens and deadlines index exactly the leases they should.
  std::uint64_t listed = 0;
  for (const auto& [id, lease] : leases_.all()) {
    listed += lease.slots.size();
    for (const std::uint64_t key : lease.slots) {
      const ArenaId arena_id = key_arena(key);
      const SlotId slot = key_slot(key);
      const Arena* arena = arenas_.find_id(arena_id);
      if (arena == nullptr) {
        report("lease " + std::to_string(id) + ": lists arena " + std::to_string(arena_id) +
               " that does not exist");
        continue;
      }
      if (slot >= arena->owner.size() || arena->owner[slot] != id) {
        report("lease " + std::to_string(id) + ": lists arena " + std::to_string(arena_id) +
               " slot " + std::to_string(slot) + " that it does not own");
      }
    }
  }
  for (std::string& line : leases_.check()) report(std::move(line));
  for (std::string& line : check_snapshots()) report(std::move(line));
  if (listed != total_used) {
    report("leases list " + std::to_string(listed) + " slots, allocators have " +
           std::to_string(total_used) + " used by leases");
  }

  // Bytes: each tenant's quota adaptor, the capacity adaptor and the tracking adaptor
  // against the arenas they paid for.
  for (std::size_t t = 0; t < tenants_.size(); ++t) {
    const Tenant& tenant = tenants_[t];
    const std::string name = "tenant " + quoted(tenant.config->name);
    if (tenant.quota->used() != tenant_bytes[t]) {
      report(name + ": accounts " + std::to_string(tenant.quota->used()) +
             " reserved bytes, its arenas hold " + std::to_string(tenant_bytes[t]));
    }
    if (!tenant.quota->unlimited() && tenant.quota->used() > tenant.quota->limit()) {
      report(name + ": reserved bytes above the quota");
    }
  }
  if (capacity_.used() != total_bytes) {
    report("pool accounts " + std::to_string(capacity_.used()) + " reserved bytes, arenas hold " +
           std::to_string(total_bytes));
  }
  if (capacity_.used() > capacity_.limit()) report("pool reserved bytes above capacity");
  const MemoryUsage memory = tracking_.usage();
  if (memory.live_bytes != total_bytes || memory.live_allocations != arenas_.size()) {
    report(std::string(memory_->name()) + " memory holds " + std::to_string(memory.live_bytes) +
           " bytes in " + std::to_string(memory.live_allocations) + " allocations for " +
           std::to_string(arenas_.size()) + " arenas of " + std::to_string(total_bytes) + " bytes");
  }
  if (arenas_.index_size() != arenas_.size()) {
    report(std::to_string(arenas_.index_size()) + " arena index entries for " +
           std::to_string(arenas_.size()) + " arenas");
  }
  return problems;
}

}  // namespace statepool::service
