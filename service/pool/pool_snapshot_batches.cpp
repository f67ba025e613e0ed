// The pool's batched snapshot operations (LookupSnapshots, PutSnapshots, GetSnapshots:
// docs/protocol.md, "Batched snapshot requests"): one lock for the whole batch, each
// entry as its single-key counterpart (pool_snapshots.cpp) would do it.
#include <utility>

#include "pool/pool.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {

SnapshotLookup Pool::lookup_snapshots(LeaseId lease_id, ArenaId arena_id,
                                      std::span<const SnapshotKey> keys) const {
  for (const SnapshotKey& key : keys) expect_key(key);
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  const Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  const Tenant& tenant = tenants_[lease.tenant];
  SnapshotLookup out;
  out.page_bytes = arena.codec->page_bytes();
  out.space = spaces_[tenant.space];
  out.layout_digest = arena.layout_digest;
  out.in_pool.reserve(keys.size());
  for (const SnapshotKey& key : keys) {
    const Snapshot* s = snapshots_.find(tenant.space, key.prefix, key.position, arena.layout);
    out.in_pool.push_back(s != nullptr && s->visible);
  }
  return out;
}

std::vector<SnapshotPutOutcome> Pool::put_snapshots(LeaseId lease_id, ArenaId arena_id,
                                                    std::vector<SnapshotPutRequest> entries) {
  const CountChange change{changes_};
  for (const SnapshotPutRequest& entry : entries) expect_key(entry.key);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  std::vector<SnapshotPutOutcome> out(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    SnapshotPutRequest& entry = entries[i];
    try {
      if (entry.slot) expect_owned(lease, arena, *entry.slot);
      out[i].put.emplace(publish(lease.tenant, arena, entry.slot ? &*entry.slot : nullptr,
                                 entry.key, entry.kv, std::move(entry.below), now));
    } catch (const StatusError& e) {
      out[i].status = e.status();
      out[i].message = e.what();
    }
  }
  return out;
}

std::vector<SnapshotGet> Pool::get_snapshots(LeaseId lease_id, ArenaId arena_id,
                                             std::span<const SnapshotKey> keys, bool lower_tiers,
                                             bool stop_at_miss) {
  for (const SnapshotKey& key : keys) expect_key(key);
  const Clock::time_point now = Clock::now();
  const std::lock_guard lock(mutex_);
  const Lease& lease = leases_.attached(lease_id);
  const Arena& arena = arena_for_tenant(lease.tenant, arena_id);
  Tenant& tenant = tenants_[lease.tenant];
  std::vector<SnapshotGet> out(keys.size());
  bool stopped = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    SnapshotGet& get = out[i];
    get.page_bytes = arena.codec->page_bytes();
    get.space = spaces_[tenant.space];
    get.layout_digest = arena.layout_digest;
    if (stopped) continue;
    const SnapshotKey& key = keys[i];
    const Snapshot* s = snapshots_.find(tenant.space, key.prefix, key.position, arena.layout);
    if (s == nullptr || !s->visible) {
      if (!lower_tiers) {
        ++tenant.misses;
        stopped = stop_at_miss;
      }
      get.other_layouts = static_cast<std::uint32_t>(
          snapshots_.with_key(tenant.space, key.prefix, key.position).size());
      continue;
    }
    get.copy.emplace(snapshot_copy(*s, nullptr, 0, false));
    (void)snapshots_.acquire(s->id, now);
    get.copy->pool_ = this;  // armed: its end releases the read
    get.hit = true;
    ++tenant.hits;
  }
  return out;
}

}  // namespace statepool::service
