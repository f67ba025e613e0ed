// Pool::save_state and Pool::restore_state: the pool's side of a hand-over to a successor
// process (pool_state.hpp, docs/operations.md).
//
// restore_state() reads input: it checks every id, range and reference before it uses one
// as an index, builds the tables, then runs the same cross-check the exit self-check runs
// (Pool::check); any problem clears the tables again (giving the memory back) and refuses
// the state, naming the entry.

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "pool/lease_token.hpp"
#include "pool/pool.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

/// Longest grace period left, snapshot age or idle time a state may give (a bound that
/// keeps time arithmetic far from overflow: ten years).
constexpr milliseconds kLongestWait = std::chrono::hours(24 * 3653);

[[noreturn]] void refuse(const std::string& why) {
  throw StatusError(Status::invalid_argument, "hand-over: " + why);
}

void expect(bool ok, const std::string& why) {
  if (!ok) refuse(why);
}

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

}  // namespace

// --- save ----------------------------------------------------------------------------

PoolState Pool::save_state() const {
  PoolState out;
  for (const PlanInfo& info : registry_.plans()) out.plans.push_back({registry_.plan(info.digest)});
  const std::size_t layouts = registry_.layout_count();
  for (LayoutId id = 1; id <= layouts; ++id) {
    const auto codec = registry_.layout(id);
    PoolStateLayout layout{id, codec->layout(), {}};
    if (layout.layout.plan != nullptr)
      layout.plan_digest = kernels::stepquant::digest(*layout.layout.plan);
    out.layouts.push_back(std::move(layout));
  }
  for (std::size_t t = 0; t < tenants_.size(); ++t) {
    PoolStateTenant saved;
    saved.name = tenants_[t].config->name;
    saved.layouts_added = registry_.layouts_added(t);
    saved.plans_added = registry_.plans_added(t);
    out.tenants.push_back(std::move(saved));
  }

  std::unique_lock lock(mutex_);
  created_.wait(lock, [&] { return !arenas_.any_creating(); });
  const Clock::time_point now = Clock::now();
  for (std::size_t t = 0; t < tenants_.size(); ++t) {
    static_cast<SnapshotCounters&>(out.tenants[t]) = tenants_[t];
  }
  std::map<ArenaId, std::size_t> arena_at;  // id -> index in out.arenas
  for (const auto& [id, arena] : arenas_.all()) {
    arena_at[id] = out.arenas.size();
    out.arenas.push_back({id, tenants_[arena->tenant].config->name, arena->layout,
                          arena->page_count(), arena->page_stride, arena->memory->size(),
                          arena->memory->info().where.handle_kind, arena->owner, arena->memory,
                          arena->memory->info().fd});
  }
  std::vector<const Snapshot*> saved_snapshots;
  for (const auto& [id, s] : snapshots_.all()) {
    if (s.visible && !s.erased) {
      saved_snapshots.push_back(&s);
      continue;
    }
    // Being published, or erased while read: the successor sees those pages free.
    for (const SlotId page : s.all_pages()) out.arenas[arena_at.at(s.arena)].owner[page] = 0;
  }
  std::sort(saved_snapshots.begin(), saved_snapshots.end(),
            [](const Snapshot* a, const Snapshot* b) { return a->last_use < b->last_use; });
  for (const Snapshot* s : saved_snapshots) {
    out.snapshots.push_back(
        {spaces_[s->space], s->prefix, s->position, s->layout, tenants_[s->tenant].config->name,
         s->arena, s->slot, s->kv, s->kv_pages, s->pinned, s->hits,
         duration_cast<milliseconds>(now - s->created), duration_cast<milliseconds>(now - s->used),
         s->below != nullptr && s->below->held(), std::nullopt});
  }
  std::vector<const Lease*> leases;
  for (const auto& [id, lease] : leases_.all()) {
    if (!lease.slots.empty()) leases.push_back(&lease);
  }
  std::sort(leases.begin(), leases.end(),
            [](const Lease* a, const Lease* b) { return a->id < b->id; });
  for (const Lease* lease : leases) {
    PoolStateLease saved{
        lease->id, tenants_[lease->tenant].config->name, lease->token, config_.grace_period, {}};
    if (!lease->attached) {
      saved.grace_left =
          std::max(milliseconds{0}, duration_cast<milliseconds>(lease->deadline - now));
    }
    for (const std::uint64_t key : lease->slots)
      saved.slots.emplace_back(key_arena(key), key_slot(key));
    std::sort(saved.slots.begin(), saved.slots.end());
    out.leases.push_back(std::move(saved));
  }
  out.next_arena = arenas_.next_id();
  out.next_lease = leases_.next_id();
  out.pages_reclaimed_total = pages_reclaimed_total_;
  return out;
}

// --- restore -------------------------------------------------------------------------

Pool::RestoreReport Pool::restore_state(const PoolState& state, Clock::time_point now) {
  const CountChange change{changes_};
  {
    const std::lock_guard lock(mutex_);
    expect(arenas_.size() == 0 && !arenas_.any_creating() && leases_.all().empty() &&
               snapshots_.all().empty() && registry_.layout_count() == 0,
           "this pool is in use already; a successor takes over before it serves");
  }
  const auto tenant_of = [&](const std::string& name, const std::string& holder) {
    for (std::size_t t = 0; t < tenants_.size(); ++t) {
      if (tenants_[t].config->name == name) return t;
    }
    refuse(holder + " belongs to tenant " + quoted(name) +
           ", which this statepoold does not configure (configure it, or let the old daemon "
           "drain instead of handing over)");
  };

  // Plans, then layouts (which name their plans), under the ids the clients know.
  for (std::size_t i = 0; i < state.plans.size(); ++i) {
    expect(state.plans[i].plan != nullptr, "plan " + std::to_string(i) + " is missing");
    try {
      (void)registry_.install_plan(state.plans[i].plan);
    } catch (const StatusError& e) {
      refuse("plan " + std::to_string(i) + ": " + e.what());
    }
  }
  for (std::size_t i = 0; i < state.layouts.size(); ++i) {
    const PoolStateLayout& layout = state.layouts[i];
    const std::string name = "layout " + std::to_string(layout.id);
    expect(layout.id == i + 1, name + " is out of order (layout ids run 1, 2, ... without gaps)");
    const bool plan_named =
        layout.layout.plan == nullptr
            ? layout.plan_digest.empty()
            : kernels::stepquant::digest(*layout.layout.plan) == layout.plan_digest;
    expect(plan_named, name + ": its plan is not the plan it names");
    LayoutId id = 0;
    try {
      id = registry_.register_layout(layout.layout);
    } catch (const StatusError& e) {
      refuse(name + ": " + e.what());
    }
    expect(id == layout.id, name + " is the same layout as layout " + std::to_string(id));
  }
  for (const PoolStateTenant& t : state.tenants) {
    const std::size_t tenant = tenant_of(t.name, "the counters of tenant " + quoted(t.name));
    registry_.restore_added(tenant, t.layouts_added, t.plans_added);
  }
  expect(state.next_arena >= 1 && state.next_lease >= 1 && state.next_lease < kSnapshotOwner,
         "the next arena and lease ids must be at least 1");

  // Arenas: checked, then their memory adopted outside the lock (a large one takes a while
  // to map), charged to the tenant's quota and the capacity.
  std::vector<std::unique_ptr<Arena>> arenas;
  std::vector<ArenaTable::Key> keys;
  RestoreReport report;
  ArenaId last_arena = 0;
  for (const PoolStateArena& saved : state.arenas) {
    const std::string name = "arena " + std::to_string(saved.id);
    expect(saved.id > last_arena && saved.id < state.next_arena,
           name + ": ids must rise and stay below the next id " + std::to_string(state.next_arena));
    last_arena = saved.id;
    const std::size_t tenant = tenant_of(saved.tenant, name);
    expect(saved.layout >= 1 && saved.layout <= state.layouts.size(),
           name + ": layout " + std::to_string(saved.layout) + " is not in the image");
    const auto codec = registry_.layout(saved.layout);
    const std::size_t stride =
        (codec->page_bytes() + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
    expect(saved.page_count >= 1 && saved.owner.size() == saved.page_count,
           name + ": " + std::to_string(saved.owner.size()) + " slot owners for " +
               std::to_string(saved.page_count) + " pages");
    expect(saved.page_stride == stride, name + ": page stride " +
                                            std::to_string(saved.page_stride) +
                                            ", its layout's is " + std::to_string(stride));
    expect(saved.bytes == memory_->allocation_size(std::uint64_t{saved.page_count} * stride),
           name + ": " + std::to_string(saved.bytes) +
               " bytes do not hold its pages as this "
               "backend allocates them");
    expect(saved.fd >= 0, name + ": no descriptor for its memory");
    auto arena = std::make_unique<Arena>(0);
    arena->id = saved.id;
    arena->tenant = tenant;
    arena->layout = saved.layout;
    arena->codec = codec;
    arena->layout_digest = kernels::layout_digest(codec->layout());
    arena->page_stride = stride;
    std::vector<bool> used(saved.page_count);
    for (std::size_t slot = 0; slot < saved.owner.size(); ++slot) {
      const LeaseId owner = saved.owner[slot];
      expect(owner == 0 || owner == kSnapshotOwner || owner < state.next_lease,
             name + " slot " + std::to_string(slot) + ": owner " + std::to_string(owner) +
                 " is no lease id");
      used[slot] = owner != 0;
      arena->snapshot_pages += owner == kSnapshotOwner ? 1 : 0;
    }
    arena->slots = SlotAllocator(used);
    arena->owner = saved.owner;
    const Tenant& t = tenants_[tenant];
    try {
      arena->memory = t.quota->adopt(
          support::duplicate(saved.fd), saved.bytes,
          "statepool-arena-" + t.config->name + "-" + std::to_string(saved.layout), saved.handle);
    } catch (const StatusError& e) {
      throw StatusError(e.status(), "hand-over: " + name + ": " + e.what());
    }
    report.arenas += 1;
    report.bytes += saved.bytes;
    report.pages += arena->slots.used();
    keys.emplace_back(tenant, saved.layout);
    arenas.push_back(std::move(arena));
  }

  const std::lock_guard lock(mutex_);
  try {
    arenas_.set_next_id(state.next_arena);
    for (std::size_t i = 0; i < arenas.size(); ++i) arenas_.restore(keys[i], std::move(arenas[i]));
    leases_.set_next_id(state.next_lease);
    LeaseId last_lease = 0;
    for (const PoolStateLease& saved : state.leases) {
      const std::string name = "lease " + std::to_string(saved.id);
      expect(
          saved.id > last_lease && saved.id < state.next_lease,
          name + ": ids must rise and stay below the next id " + std::to_string(state.next_lease));
      last_lease = saved.id;
      expect(is_lease_token(saved.token), name + ": its token is not a lease token");
      expect(!leases_.token_in_use(saved.token), name + ": its token is another lease's");
      expect(saved.grace_left >= milliseconds{0} && saved.grace_left <= kLongestWait,
             name + ": grace period left out of range");
      const std::size_t tenant = tenant_of(saved.tenant, name);
      Lease& lease = leases_.restore(saved.id, tenant, saved.token, now + saved.grace_left);
      for (const auto& [arena_id, slot] : saved.slots) {
        const Arena* arena = arenas_.find_id(arena_id);
        expect(arena != nullptr && slot < arena->page_count(),
               name + ": arena " + std::to_string(arena_id) + " slot " + std::to_string(slot) +
                   " does not exist");
        expect(lease.slots.insert(slot_key(arena_id, slot)).second,
               name + ": slot " + std::to_string(slot) + " of arena " + std::to_string(arena_id) +
                   " listed twice");
      }
      report.leases += 1;
    }
    for (const PoolStateSnapshot& saved : state.snapshots) {
      const std::string name = "snapshot at position " + std::to_string(saved.position);
      Snapshot entry;
      entry.tenant = tenant_of(saved.tenant, name);
      const Tenant& publisher = tenants_[entry.tenant];
      expect(spaces_[publisher.space] == saved.space,
             name + ": published in namespace " + quoted(saved.space) + ", but tenant " +
                 quoted(saved.tenant) + " now shares namespace " +
                 quoted(spaces_[publisher.space]));
      expect(!saved.prefix.empty() && saved.prefix.size() <= kMaxSnapshotPrefixBytes,
             name + ": its key's prefix is empty or too long");
      const Arena* arena = arenas_.find_id(saved.arena);
      expect(arena != nullptr && arena->tenant == entry.tenant && arena->layout == saved.layout,
             name + ": arena " + std::to_string(saved.arena) +
                 " is not an arena of its publisher and layout");
      expect(saved.kv.has_value() == !saved.kv_pages.empty(),
             name + ": KV pages without KV blocks, or KV blocks without pages");
      if (saved.kv) {
        const char* problem = kernels::kv_blocks_problem(*saved.kv);
        expect(problem == nullptr, name + ": its KV blocks: " + (problem ? problem : ""));
        const std::uint64_t page_bytes = arena->codec->page_bytes();
        const std::uint64_t pages =
            (kernels::kv_blocks_encoded_bytes(*saved.kv) + page_bytes - 1) / page_bytes;
        expect(pages == saved.kv_pages.size(), name + ": " + std::to_string(saved.kv_pages.size()) +
                                                   " KV pages for blocks "
                                                   "that take " +
                                                   std::to_string(pages));
      }
      entry.space = publisher.space;
      entry.prefix = saved.prefix;
      entry.position = saved.position;
      entry.layout = saved.layout;
      entry.arena = saved.arena;
      entry.slot = saved.slot;
      entry.kv = saved.kv;
      entry.kv_pages = saved.kv_pages;
      for (const SlotId page : entry.all_pages()) {
        expect(page < arena->page_count() && arena->owner[page] == kSnapshotOwner,
               name + ": page " + std::to_string(page) + " of arena " +
                   std::to_string(saved.arena) + " is not a snapshot page");
      }
      if (saved.held_below) {
        auto hold = std::make_shared<SnapshotTierHold>();
        hold->publishing = false;
        hold->host = true;  // what it was below is not known here: held, so a demotion
        entry.below = std::move(hold);
      }
      entry.pinned = saved.pinned;
      entry.hits = saved.hits;
      expect(saved.age >= milliseconds{0} && saved.age <= kLongestWait &&
                 saved.idle >= milliseconds{0} && saved.idle <= saved.age,
             name + ": age or idle time out of range");
      entry.created = now - saved.age;
      entry.used = now - saved.idle;
      try {
        (void)snapshots_.restore(std::move(entry));
      } catch (const StatusError& e) {
        refuse(name + ": " + e.what());
      }
      report.snapshots += 1;
    }
    // Every owner, allocator, lease and page agrees, and no page is a snapshot's twice.
    std::set<std::pair<ArenaId, SlotId>> snapshot_pages;
    for (const auto& [id, s] : snapshots_.all()) {
      for (const SlotId page : s.all_pages()) {
        expect(snapshot_pages.emplace(s.arena, page).second,
               "page " + std::to_string(page) + " of arena " + std::to_string(s.arena) +
                   " is held by two snapshots");
      }
    }
    std::size_t snapshot_owned = 0;
    for (const auto& [id, arena] : arenas_.all()) snapshot_owned += arena->snapshot_pages;
    expect(snapshot_owned == snapshot_pages.size(),
           std::to_string(snapshot_owned) + " pages are marked as snapshot pages, " +
               std::to_string(snapshot_pages.size()) + " belong to snapshots");
  } catch (...) {
    arenas_ = ArenaTable{};
    leases_ = LeaseTable{};
    snapshots_ = SnapshotTable{};
    throw;
  }
  if (std::vector<std::string> problems = check_locked(); !problems.empty()) {
    arenas_ = ArenaTable{};
    leases_ = LeaseTable{};
    snapshots_ = SnapshotTable{};
    std::string all;
    for (std::size_t i = 0; i < problems.size() && i < 3; ++i) all += (i ? "; " : "") + problems[i];
    refuse("the tables disagree: " + all +
           (problems.size() > 3 ? " (and " + std::to_string(problems.size() - 3) + " more)" : ""));
  }
  pages_reclaimed_total_ = state.pages_reclaimed_total;
  for (const PoolStateTenant& saved : state.tenants) {
    static_cast<SnapshotCounters&>(tenants_[tenant_of(saved.name, "")]) = saved;
  }
  return report;
}

}  // namespace statepool::service
