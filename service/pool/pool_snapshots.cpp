// The pool's snapshot operations (docs/prefix-store.md): pages no lease owns, published
// under a key, copied into slots on a hit, evicted least recently used when an arena
// needs the room.
#include <algorithm>
#include <set>
#include <utility>

#include "pool/pool.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
void Pool::expect_key(const SnapshotKey& key) {
  STATEPOOL_EXPECTS(!key.prefix.empty(), Status::invalid_argument,
                    "a snapshot key needs a prefix of at least 1 byte");
  STATEPOOL_EXPECTS(key.prefix.size() <= kMaxSnapshotPrefixBytes, Status::invalid_argument,
                    "a snapshot prefix is at most " + std::to_string(kMaxSnapshotPrefixBytes) +
                        " bytes, got " + std::to_string(key.prefix.size()));
}

namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) noexcept {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

// --- SnapshotCopy --------------------------------------------------------------------

SnapshotCopy::SnapshotCopy(SnapshotCopy&& other) noexcept
    : source(other.source),
      target(other.target),
      kv(std::move(other.kv)),
      kv_chunks(std::move(other.kv_chunks)),
      keep_alive(std::move(other.keep_alive)),
      pool_(std::exchange(other.pool_, nullptr)),
      id_(other.id_),
      write_(other.write_) {}

SnapshotCopy::~SnapshotCopy() {
  if (pool_ != nullptr) pool_->end_snapshot_copy(id_, write_, false);
}

void SnapshotCopy::done() noexcept {
  if (pool_ != nullptr) std::exchange(pool_, nullptr)->end_snapshot_copy(id_, write_, true);
}

// --- pages (caller holds mutex_) -----------------------------------------------------

void Pool::free_snapshot_pages(ArenaId arena_id, SlotId state,
                               std::span<const SlotId> kv_pages) noexcept {
  Arena* found = arenas_.find_id(arena_id);
  if (found == nullptr) return;
  Arena& arena = *found;
  const auto free_one = [&arena](SlotId slot) {
    if (slot >= arena.owner.size() || arena.owner[slot] != kSnapshotOwner) return;
    arena.owner[slot] = 0;
    --arena.snapshot_pages;
    (void)arena.slots.free(slot);
  };
  free_one(state);
  for (const SlotId slot : kv_pages) free_one(slot);
}

void Pool::free_snapshot_pages(const std::optional<Snapshot>& gone) noexcept {
  if (gone) free_snapshot_pages(gone->arena, gone->slot, gone->kv_pages);
}

void Pool::evict(std::span<const SnapshotId> victims) noexcept {
  for (const SnapshotId id : victims) {
    const Snapshot* s = snapshots_.get(id);
    if (s == nullptr) continue;
    const std::size_t tenant = s->tenant;
    if (const std::optional<Snapshot> gone = snapshots_.erase(id)) {
      free_snapshot_pages(gone);
      // A demotion only when the value really is below: the host tier may have let it go
      // already, the remote write may have been dropped or have failed.
      if (config_.snapshot_lower_tiers && gone->below != nullptr && gone->below->held()) {
        ++tenants_[tenant].demotions;
      } else {
        ++tenants_[tenant].evictions;
      }
    }
  }
}

SnapshotCopy Pool::snapshot_copy(const Snapshot& s, const Arena* other, SlotId slot, bool write) {
  const Arena& home = arenas_.get(s.arena);
  SnapshotCopy copy(s.id, write);  // unarmed: the caller arms it once nothing can fail
  const kernels::BufferRef snapshot = home.page(s.slot);
  const kernels::BufferRef page = other != nullptr ? other->page(slot) : kernels::BufferRef{};
  copy.source = write ? page : snapshot;
  copy.target = write ? snapshot : page;
  if (s.kv) {
    copy.kv = s.kv;
    std::uint64_t left = kernels::kv_blocks_encoded_bytes(*s.kv);
    for (const SlotId kv_page : s.kv_pages) {
      kernels::BufferRef chunk = home.page(kv_page);
      chunk.size = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size, left));
      left -= chunk.size;
      copy.kv_chunks.push_back(chunk);
    }
  }
  copy.keep_alive = {home.memory};
  if (other != nullptr) copy.keep_alive.push_back(other->memory);
  return copy;
}

void Pool::end_snapshot_copy(SnapshotId id, bool write, bool ok) noexcept {
  const CountChange change{changes_};
  const std::lock_guard lock(mutex_);
  if (!write) {
    free_snapshot_pages(snapshots_.release(id));
  } else if (ok) {
    try {
      free_snapshot_pages(snapshots_.commit(id));
    } catch (...) {  // out of memory for the LRU node: forget the snapshot instead
      free_snapshot_pages(snapshots_.abort(id));
    }
  } else {
    free_snapshot_pages(snapshots_.abort(id));
  }
}

// --- operations ----------------------------------------------------------------------

const std::string& Pool::snapshot_namespace(std::string_view tenant) const {
  return spaces_[tenants_[tenant_index(tenant)].space];
}

namespace {

/// Pages of `page_bytes` a snapshot with `kv_bytes` of KV blocks takes beside its state's.
std::uint64_t kv_page_count(std::uint64_t kv_bytes, std::uint64_t page_bytes) noexcept {
  return (kv_bytes + page_bytes - 1) / page_bytes;
}

/// Encoded bytes of well-formed KV blocks (invalid_argument otherwise); 0 without.
std::uint64_t expect_kv(const std::optional<kernels::KvBlocks>& kv) {
  if (!kv) return 0;
  const char* problem = kernels::kv_blocks_problem(*kv);
  STATEPOOL_EXPECTS(problem == nullptr, Status::invalid_argument,
                    std::string("the snapshot's KV blocks: ") + (problem ? problem : ""));
  return kernels::kv_blocks_encoded_bytes(*kv);
}

}  // namespace

SnapshotPut Pool::put_snapshot(LeaseId lease_id, ArenaId arena_id, SlotId slot,
                               const SnapshotKey& key, const std::optional<kernels::KvBlocks>& kv,
                               std::shared_ptr<const SnapshotTierHold> below) {
  const CountChange change{changes_};
  expect_key(key);
  (void)expect_kv(kv);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  expect_owned(lease, arena, slot);
  return publish(lease.tenant, arena, &slot, key, kv, std::move(below), now);
}

SnapshotPut Pool::import_snapshot(std::string_view tenant_name, std::string_view layout_digest,
                                  const SnapshotKey& key,
                                  const std::optional<kernels::KvBlocks>& kv,
                                  std::shared_ptr<const SnapshotTierHold> below) {
  const CountChange change{changes_};
  expect_key(key);
  const std::uint64_t kv_bytes = expect_kv(kv);
  const std::size_t tenant = tenant_index(tenant_name);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  // The tenant's arenas of the layout: the first with room, else the first (which evicts).
  Arena* chosen = nullptr;
  for (const auto& [id, arena] : arenas_.all()) {
    if (arena->tenant != tenant || arena->layout_digest != layout_digest || !arena->memory)
      continue;
    const std::uint64_t page_bytes = arena->codec->page_bytes();
    const std::uint64_t needed = 1 + kv_page_count(kv_bytes, page_bytes);
    if (chosen == nullptr) chosen = arena.get();
    if (arena->slots.available() >= needed) {
      chosen = arena.get();
      break;
    }
  }
  STATEPOOL_EXPECTS(chosen != nullptr, Status::not_found,
                    "tenant '" + tenants_[tenant].config->name +
                        "' has no arena of the snapshot's layout (digest " +
                        std::string(layout_digest) +
                        "): an engine of the model must open one before its snapshots can "
                        "be put");
  return publish(tenant, *chosen, nullptr, key, kv, std::move(below), now);
}

SnapshotPut Pool::publish(std::size_t tenant_index, Arena& arena, const SlotId* source,
                          const SnapshotKey& key, const std::optional<kernels::KvBlocks>& kv,
                          std::shared_ptr<const SnapshotTierHold> below, Clock::time_point now) {
  const std::uint64_t kv_bytes = expect_kv(kv);
  Tenant& tenant = tenants_[tenant_index];
  const std::size_t page_bytes = arena.codec->page_bytes();
  SnapshotPut out;
  out.arena = arena.id;
  out.page_bytes = page_bytes;
  out.space = spaces_[tenant.space];
  out.layout_digest = arena.layout_digest;
  if (const Snapshot* existing =
          snapshots_.find(tenant.space, key.prefix, key.position, arena.layout)) {
    ++tenant.puts_existing;
    out.kv = existing->kv;
    out.kv_bytes = existing->kv ? kernels::kv_blocks_encoded_bytes(*existing->kv) : 0;
    out.pages = static_cast<std::uint32_t>(existing->pages());
    return out;  // idempotent: the first publication stands
  }
  const std::uint64_t needed = 1 + kv_page_count(kv_bytes, page_bytes);
  STATEPOOL_EXPECTS(needed <= arena.page_count(), Status::invalid_argument,
                    arena_label(arena) + ": the snapshot takes " + std::to_string(needed) +
                        " pages of " + std::to_string(page_bytes) + " bytes (" +
                        (kv ? kernels::describe(*kv) : std::string()) + ", " +
                        std::to_string(kv_bytes) + " bytes encoded, beside the state's page), " +
                        "the arena has " + std::to_string(arena.page_count()));
  if (arena.slots.available() < needed) {
    const std::size_t short_by = needed - arena.slots.available();
    const std::vector<SnapshotId> victims = snapshots_.evictable(arena.id, short_by);
    STATEPOOL_EXPECTS(
        snapshots_.pages_of(victims) >= short_by, Status::pool_exhausted,
        arena_label(arena) + ": no room for the snapshot's " + std::to_string(needed) +
            " page(s): " + std::to_string(arena.slots.available()) + " free, the other " +
            std::to_string(arena.page_count() - arena.slots.available()) + " hold slots (" +
            std::to_string(arena.snapshot_pages) + " of them snapshots, " +
            std::to_string(snapshots_.pages_of(victims)) +
            " pages of which are evictable: the rest are pinned or being read)");
    evict(victims);
    out.evicted = static_cast<std::uint32_t>(victims.size());
  }
  std::vector<SlotId> pages;
  const bool ok = arena.slots.allocate_n(static_cast<std::uint32_t>(needed), pages);
  STATEPOOL_EXPECTS(ok, Status::internal, "put_snapshot: slot allocator refused after check");
  for (const SlotId page : pages) arena.owner[page] = kSnapshotOwner;
  arena.snapshot_pages += static_cast<std::uint32_t>(pages.size());
  try {
    Snapshot entry;
    entry.space = tenant.space;
    entry.prefix = key.prefix;
    entry.position = key.position;
    entry.layout = arena.layout;
    entry.tenant = tenant_index;
    entry.arena = arena.id;
    entry.slot = pages[0];
    entry.kv = kv;
    entry.kv_pages.assign(pages.begin() + 1, pages.end());
    entry.below = std::move(below);
    const Snapshot& s = snapshots_.put(std::move(entry), now);
    try {
      out.copy.emplace(snapshot_copy(s, source != nullptr ? &arena : nullptr,
                                     source != nullptr ? *source : 0, true));
    } catch (...) {
      snapshots_.abort(s.id);
      throw;
    }
    out.copy->pool_ = this;  // armed: from here on its end commits or aborts
  } catch (...) {
    free_snapshot_pages(arena.id, pages[0], std::span(pages).subspan(1));
    throw;
  }
  out.created = true;
  out.kv = kv;
  out.kv_bytes = kv_bytes;
  out.pages = static_cast<std::uint32_t>(needed);
  ++tenant.puts_created;
  return out;
}

SnapshotGet Pool::get_snapshot(LeaseId lease_id, ArenaId arena_id, SlotId slot,
                               const SnapshotKey& key, bool lower_tiers) {
  expect_key(key);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  const Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  expect_owned(lease, arena, slot);
  Tenant& tenant = tenants_[lease.tenant];
  SnapshotGet out;
  out.page_bytes = arena.codec->page_bytes();
  out.space = spaces_[tenant.space];
  out.layout_digest = arena.layout_digest;
  const Snapshot* s = snapshots_.find(tenant.space, key.prefix, key.position, arena.layout);
  if (s == nullptr || !s->visible) {
    if (!lower_tiers) ++tenant.misses;
    out.other_layouts = static_cast<std::uint32_t>(
        snapshots_.with_key(tenant.space, key.prefix, key.position).size());
    return out;
  }
  out.copy.emplace(snapshot_copy(*s, &arena, slot, false));
  (void)snapshots_.acquire(s->id, now);
  out.copy->pool_ = this;  // armed: its end releases the read
  out.hit = true;
  ++tenant.hits;
  return out;
}

SnapshotGet Pool::export_snapshot(std::string_view tenant_name, const SnapshotKey& key,
                                  std::string_view layout_digest) {
  expect_key(key);
  const std::size_t tenant = tenant_index(tenant_name);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  Tenant& t = tenants_[tenant];
  SnapshotGet out;
  out.space = spaces_[t.space];
  for (const SnapshotId id : snapshots_.with_key(t.space, key.prefix, key.position)) {
    const Snapshot& s = *snapshots_.get(id);
    const Arena& arena = arenas_.get(s.arena);
    if (!layout_digest.empty() && arena.layout_digest != layout_digest) continue;
    out.page_bytes = arena.codec->page_bytes();
    out.layout_digest = arena.layout_digest;
    out.copy.emplace(snapshot_copy(s, nullptr, 0, false));
    (void)snapshots_.acquire(s.id, now);
    out.copy->pool_ = this;  // armed: its end releases the read
    out.hit = true;
    return out;
  }
  return out;
}

std::uint32_t Pool::delete_snapshot(std::string_view tenant_name, const SnapshotKey& key,
                                    std::vector<std::string>* layout_digests) {
  const CountChange change{changes_};
  expect_key(key);
  const std::size_t tenant = tenant_index(tenant_name);
  const std::lock_guard lock(mutex_);
  std::uint32_t deleted = 0;
  for (const SnapshotId id :
       snapshots_.with_key(tenants_[tenant].space, key.prefix, key.position)) {
    const Snapshot* s = snapshots_.get(id);
    if (layout_digests != nullptr) layout_digests->push_back(arenas_.get(s->arena).layout_digest);
    free_snapshot_pages(snapshots_.erase(id));
    ++deleted;
  }
  return deleted;
}

void Pool::count_lower_tier_lookup(std::string_view tenant_name, std::string_view tier) {
  const std::size_t tenant = tenant_index(tenant_name);
  const std::lock_guard lock(mutex_);
  Tenant& t = tenants_[tenant];
  if (tier.empty()) {
    ++t.misses;
    return;
  }
  ++t.hits;
  if (tier == "host") {
    ++t.hits_host;
  } else {
    ++t.hits_remote;
  }
}

std::uint32_t Pool::pin_snapshot(std::string_view tenant_name, const SnapshotKey& key,
                                 bool pinned) {
  const CountChange change{changes_};
  expect_key(key);
  const std::size_t tenant = tenant_index(tenant_name);
  const std::lock_guard lock(mutex_);
  const std::vector<SnapshotId> ids =
      snapshots_.with_key(tenants_[tenant].space, key.prefix, key.position);
  if (pinned) {
    // All or nothing: check every publisher's limit first.
    std::map<std::size_t, std::uint32_t> adding;
    for (const SnapshotId id : ids) {
      const Snapshot& s = *snapshots_.get(id);
      if (!s.pinned) ++adding[s.tenant];
    }
    for (const auto& [publisher, count] : adding) {
      const TenantConfig& t = *tenants_[publisher].config;
      const std::uint32_t held = snapshots_.pinned_count(publisher);
      STATEPOOL_EXPECTS(held + count <= t.limits.max_pinned_snapshots, Status::quota_exceeded,
                        "tenant '" + t.name + "' has " + std::to_string(held) +
                            " pinned snapshots, its limit (max-pinned-snapshots, default "
                            "--tenant-max-pinned-snapshots); unpin or delete some first");
    }
  }
  std::uint32_t changed = 0;
  for (const SnapshotId id : ids) changed += snapshots_.set_pinned(id, pinned) ? 1 : 0;
  return changed;
}

std::vector<SnapshotInfo> Pool::list_snapshots(std::string_view tenant_name, std::string_view start,
                                               std::size_t limit, bool& more) const {
  const std::size_t tenant = tenant_index(tenant_name);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  std::vector<SnapshotInfo> out;
  for (const SnapshotId id : snapshots_.starting_with(tenants_[tenant].space, start, limit, more)) {
    const Snapshot& s = *snapshots_.get(id);
    const Arena& arena = arenas_.get(s.arena);
    SnapshotInfo info;
    info.key = SnapshotKey{s.prefix, s.position};
    info.layout_id = s.layout;
    info.layout_name = arena.codec->layout().name;
    info.codec = arena.codec->layout().codec.id;
    info.tenant = tenants_[s.tenant].config->name;
    info.arena_id = s.arena;
    info.page_bytes = arena.codec->page_bytes();
    info.fp32_bytes = arena.codec->fp32_bytes();
    info.pinned = s.pinned;
    info.hits = s.hits;
    info.age_seconds = seconds_between(s.created, now);
    info.idle_seconds = seconds_between(s.used, now);
    info.kv = s.kv;
    info.kv_bytes = s.kv ? kernels::kv_blocks_encoded_bytes(*s.kv) : 0;
    info.pages = static_cast<std::uint32_t>(s.pages());
    info.layout_digest = arena.layout_digest;
    out.push_back(std::move(info));
  }
  return out;
}

// --- consistency (caller holds mutex_) -----------------------------------------------

std::vector<std::string> Pool::check_snapshots() const {
  std::vector<std::string> problems = snapshots_.check();
  std::set<std::pair<ArenaId, SlotId>> pages;
  for (const auto& [id, s] : snapshots_.all()) {
    const std::string name = "snapshot " + std::to_string(id);
    const Arena* found = arenas_.find_id(s.arena);
    if (found == nullptr) {
      problems.push_back(name + ": in arena " + std::to_string(s.arena) + " that does not exist");
      continue;
    }
    const Arena& arena = *found;
    for (const SlotId slot : s.all_pages()) {
      if (slot >= arena.owner.size() || arena.owner[slot] != kSnapshotOwner) {
        problems.push_back(name + ": arena " + std::to_string(s.arena) + " slot " +
                           std::to_string(slot) + " is not a snapshot page");
      }
      if (!pages.insert({s.arena, slot}).second) {
        problems.push_back(name + ": shares page " + std::to_string(slot) +
                           " with another snapshot");
      }
    }
    const std::uint64_t kv_bytes = s.kv ? kernels::kv_blocks_encoded_bytes(*s.kv) : 0;
    const std::uint64_t page_bytes = arena.codec->page_bytes();
    if (s.kv_pages.size() != kv_page_count(kv_bytes, page_bytes)) {
      problems.push_back(name + ": " + std::to_string(s.kv_pages.size()) + " KV pages for " +
                         std::to_string(kv_bytes) + " bytes of KV blocks");
    }
    if (arena.tenant != s.tenant) problems.push_back(name + ": in another tenant's arena");
    if (arena.layout != s.layout) problems.push_back(name + ": in an arena of another layout");
    if (s.space != tenants_[s.tenant].space) {
      problems.push_back(name + ": not in its publisher's namespace");
    }
  }
  for (const auto& [id, arena] : arenas_.all()) {
    std::uint32_t held = 0;
    for (SlotId slot = 0; slot < arena->owner.size(); ++slot) {
      if (arena->owner[slot] != kSnapshotOwner) continue;
      ++held;
      if (!pages.contains({arena->id, slot})) {
        problems.push_back("arena " + std::to_string(arena->id) + " slot " + std::to_string(slot) +
                           ": a snapshot page no snapshot holds");
      }
    }
    if (held != arena->snapshot_pages) {
      problems.push_back("arena " + std::to_string(arena->id) + ": counts " +
                         std::to_string(arena->snapshot_pages) + " snapshot pages, holds " +
                         std::to_string(held));
    }
  }
  return problems;
}

}  // namespace statepool::service
