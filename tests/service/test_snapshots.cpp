// Pool snapshots (docs/prefix-store.md): publish, look up, layout binding, namespaces,
// eviction for live slots, pins, reads that outlive a delete, abandoned puts. Every test
// ends with Pool::check() clean (no leaked or doubly held page).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/testing/gtest/pool.hpp"

namespace statepool::service {
namespace {

using testing::config;
using testing::expect_status;
using testing::join;
using testing::make_pool;
using testing::same_stats;
using testing::small_layout;
using testing::tenant;

SnapshotKey key(std::string prefix, std::uint64_t position = 100) {
  return SnapshotKey{std::move(prefix), position};
}

/// What the Executor does with a SnapshotCopy.
void run(SnapshotCopy& copy) {
  ASSERT_EQ(copy.source.size, copy.target.size);
  std::memcpy(copy.target.data, copy.source.data, copy.source.size);
  copy.done();
}

class PoolSnapshots : public ::testing::Test {
 protected:
  void SetUp() override { make({tenant("alice"), tenant("bob")}); }
  void TearDown() override { EXPECT_TRUE(pool_->check().empty()) << join(pool_->check()); }

  void make(std::vector<TenantConfig> tenants, std::uint32_t pages = 4) {
    pool_ = make_pool(config(std::move(tenants)));
    layout_ = pool_->register_layout(small_layout());
    arena_ = pool_->open_arena("alice", layout_, pages);
    lease_ = pool_->attach_lease("alice", "").id;
  }

  /// A slot of `lease` in `arena` whose page is filled with `fill`.
  SlotId slot(LeaseId lease, const ArenaInfo& arena, std::uint8_t fill) {
    const SlotId s = pool_->allocate(lease, arena.id, 1).at(0);
    const PageRef page = pool_->page(lease, arena.id, s);
    std::memset(page.bytes.data(), fill, page.bytes.size());
    return s;
  }
  std::uint8_t first_byte(LeaseId lease, const ArenaInfo& arena, SlotId s) {
    return static_cast<std::uint8_t>(pool_->page(lease, arena.id, s).bytes[0]);
  }
  /// Publishes the page of `s` under `k` and completes the copy.
  SnapshotPut publish(const SnapshotKey& k, SlotId s, LeaseId lease = 0, ArenaId arena = 0) {
    SnapshotPut put =
        pool_->put_snapshot(lease == 0 ? lease_ : lease, arena == 0 ? arena_.id : arena, s, k);
    if (put.copy) run(*put.copy);
    return put;
  }
  SnapshotGet fetch(const SnapshotKey& k, SlotId s, LeaseId lease = 0, ArenaId arena = 0) {
    SnapshotGet get =
        pool_->get_snapshot(lease == 0 ? lease_ : lease, arena == 0 ? arena_.id : arena, s, k);
    if (get.copy) run(*get.copy);
    return get;
  }
  const TenantUsage& usage(const std::string& name) {
    stats_ = pool_->stats();
    for (const auto& t : stats_.tenants) {
      if (t.name == name) return t;
    }
    throw std::logic_error("no tenant " + name);
  }

  std::unique_ptr<Pool> pool_;
  LayoutId layout_ = 0;
  ArenaInfo arena_;
  LeaseId lease_ = 0;
  PoolStats stats_;
};

TEST_F(PoolSnapshots, APublishedStateIsCopiedIntoAnotherSlotOnAHit) {
  const SlotId src = slot(lease_, arena_, 0x5a);
  const SnapshotPut put = publish(key("system-prompt"), src);
  EXPECT_TRUE(put.created);
  EXPECT_EQ(put.evicted, 0u);
  EXPECT_EQ(put.page_bytes, arena_.page_bytes);

  // The snapshot is a copy: overwriting the source later does not change it.
  std::memset(pool_->page(lease_, arena_.id, src).bytes.data(), 0x11, arena_.page_bytes);
  const SlotId dst = slot(lease_, arena_, 0x00);
  const SnapshotGet get = fetch(key("system-prompt"), dst);
  EXPECT_TRUE(get.hit);
  EXPECT_EQ(first_byte(lease_, arena_, dst), 0x5a);
  const PageRef page = pool_->page(lease_, arena_.id, dst);
  for (const std::byte b : page.bytes) ASSERT_EQ(b, std::byte{0x5a});

  const TenantUsage& u = usage("alice");
  EXPECT_EQ(u.snapshots, 1u);
  EXPECT_EQ(u.snapshot_bytes, arena_.page_bytes);
  EXPECT_EQ(u.pages_used, 3u);  // two slots and the snapshot's page
  EXPECT_EQ(u.snapshot_hits, 1u);
  EXPECT_EQ(u.snapshot_misses, 0u);
  EXPECT_EQ(u.snapshot_puts_created, 1u);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 1u);
}

TEST_F(PoolSnapshots, PublishingAKeyTwiceKeepsTheFirstAndCopiesNothing) {
  const SlotId a = slot(lease_, arena_, 0x01);
  const SlotId b = slot(lease_, arena_, 0x02);
  EXPECT_TRUE(publish(key("p"), a).created);
  const SnapshotPut again = pool_->put_snapshot(lease_, arena_.id, b, key("p"));
  EXPECT_FALSE(again.created);
  EXPECT_FALSE(again.copy.has_value());
  EXPECT_EQ(usage("alice").snapshots, 1u);
  EXPECT_EQ(usage("alice").snapshot_puts_existing, 1u);
  // Another position is another key.
  EXPECT_TRUE(publish(key("p", 101), b).created);
  ASSERT_TRUE(fetch(key("p"), b).hit);
  EXPECT_EQ(first_byte(lease_, arena_, b), 0x01);
}

TEST_F(PoolSnapshots, AMissChangesNothingAndNamesOtherLayouts) {
  const SlotId src = slot(lease_, arena_, 0x33);
  publish(key("k"), src);

  const SlotId dst = slot(lease_, arena_, 0x44);
  const SnapshotGet miss = fetch(key("k", 7), dst);
  EXPECT_FALSE(miss.hit);
  EXPECT_EQ(miss.other_layouts, 0u);
  EXPECT_EQ(first_byte(lease_, arena_, dst), 0x44);

  // The same key for another layout (another codec: another page format) is a miss.
  kernels::StateLayout other = small_layout();
  other.codec.id = kernels::CodecId::bf16;
  const LayoutId other_id = pool_->register_layout(other);
  const ArenaInfo bf16 = pool_->open_arena("alice", other_id, 2);
  const SlotId there = slot(lease_, bf16, 0x55);
  const SnapshotGet wrong = fetch(key("k"), there, lease_, bf16.id);
  EXPECT_FALSE(wrong.hit);
  EXPECT_EQ(wrong.other_layouts, 1u);
  EXPECT_EQ(first_byte(lease_, bf16, there), 0x55);
  EXPECT_EQ(usage("alice").snapshot_misses, 2u);
}

TEST_F(PoolSnapshots, TenantsShareOnlyWithinTheirNamespace) {
  TenantConfig carol = tenant("carol");
  carol.snapshot_namespace = "team";
  TenantConfig dave = tenant("dave");
  dave.snapshot_namespace = "team";
  make({tenant("alice"), tenant("bob"), carol, dave});
  EXPECT_EQ(pool_->snapshot_namespace("alice"), "alice");
  EXPECT_EQ(pool_->snapshot_namespace("dave"), "team");

  const SlotId mine = slot(lease_, arena_, 0x66);
  publish(key("shared"), mine);
  const ArenaInfo bob_arena = pool_->open_arena("bob", layout_, 2);
  const LeaseId bob = pool_->attach_lease("bob", "").id;
  const SlotId bob_slot = slot(bob, bob_arena, 0x00);
  EXPECT_FALSE(fetch(key("shared"), bob_slot, bob, bob_arena.id).hit);

  const ArenaInfo carol_arena = pool_->open_arena("carol", layout_, 2);
  const LeaseId carol_lease = pool_->attach_lease("carol", "").id;
  publish(key("shared"), slot(carol_lease, carol_arena, 0x77), carol_lease, carol_arena.id);
  const ArenaInfo dave_arena = pool_->open_arena("dave", layout_, 2);
  const LeaseId dave_lease = pool_->attach_lease("dave", "").id;
  const SlotId dave_slot = slot(dave_lease, dave_arena, 0x00);
  ASSERT_TRUE(fetch(key("shared"), dave_slot, dave_lease, dave_arena.id).hit);
  EXPECT_EQ(first_byte(dave_lease, dave_arena, dave_slot), 0x77);  // carol's, not alice's

  // The publisher pays: the page is in carol's arena, the hit counts for dave.
  EXPECT_EQ(usage("carol").snapshots, 1u);
  EXPECT_EQ(usage("dave").snapshots, 0u);
  EXPECT_EQ(usage("dave").snapshot_hits, 1u);
  bool more = true;
  const auto listed = pool_->list_snapshots("dave", "", 10, more);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].tenant, "carol");
  EXPECT_FALSE(more);
}

TEST_F(PoolSnapshots, LiveSlotsEvictTheLeastRecentlyUsedUnpinnedSnapshots) {
  // 4 pages: one slot, three snapshots (old, pinned, recent).
  const SlotId src = slot(lease_, arena_, 0x01);
  publish(key("old"), src);
  publish(key("pinned"), src);
  publish(key("recent"), src);
  ASSERT_EQ(pool_->pin_snapshot("alice", key("pinned"), true), 1u);
  // Reading "old" makes it more recent than "recent".
  const SlotId dst = src;
  ASSERT_TRUE(fetch(key("old"), dst).hit);

  const PoolStats before = pool_->stats();
  const std::string msg =
      expect_status(Status::pool_exhausted, [&] { (void)pool_->allocate(lease_, arena_.id, 3); });
  EXPECT_NE(msg.find("3 pages hold snapshots, 2 of them evictable"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool_->stats()));

  (void)pool_->allocate(lease_, arena_.id, 1);  // evicts "recent"
  const SlotId probe = src;
  EXPECT_FALSE(fetch(key("recent"), probe).hit);
  EXPECT_TRUE(fetch(key("old"), probe).hit);
  EXPECT_EQ(usage("alice").snapshot_evictions, 1u);

  (void)pool_->allocate(lease_, arena_.id, 1);  // evicts "old"; "pinned" stays
  EXPECT_FALSE(fetch(key("old"), probe).hit);
  EXPECT_TRUE(fetch(key("pinned"), probe).hit);
  expect_status(Status::pool_exhausted, [&] { (void)pool_->allocate(lease_, arena_.id, 1); });

  // Unpinned, it goes too.
  EXPECT_EQ(pool_->pin_snapshot("alice", key("pinned"), false), 1u);
  EXPECT_EQ(pool_->pin_snapshot("alice", key("pinned"), false), 0u);
  (void)pool_->allocate(lease_, arena_.id, 1);
  EXPECT_EQ(usage("alice").snapshots, 0u);
  EXPECT_EQ(usage("alice").snapshot_evictions, 3u);
}

TEST_F(PoolSnapshots, APublicationIntoAFullArenaEvictsTheOldestSnapshot) {
  const SlotId a = slot(lease_, arena_, 0x01);
  const SlotId b = slot(lease_, arena_, 0x02);
  publish(key("one"), a);
  publish(key("two"), b);
  const SnapshotPut third = publish(key("three"), a);
  EXPECT_TRUE(third.created);
  EXPECT_EQ(third.evicted, 1u);
  EXPECT_FALSE(fetch(key("one"), b).hit);
  EXPECT_TRUE(fetch(key("two"), b).hit);

  // Every page a slot or a pinned snapshot: the put is refused and changes nothing.
  pool_->pin_snapshot("alice", key("two"), true);
  pool_->pin_snapshot("alice", key("three"), true);
  const PoolStats before = pool_->stats();
  const std::string msg = expect_status(Status::pool_exhausted, [&] { publish(key("four"), a); });
  EXPECT_NE(msg.find("no room for the snapshot's 1 page(s)"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool_->stats()));
}

// With tiers below the pool, an evicted snapshot is a demotion only while its value is
// below (its hold says so: on its way there, in the host tier, or written or queued for
// the remote store); otherwise, or without a hold (not written through), an eviction.
TEST_F(PoolSnapshots, AnEvictionIsADemotionOnlyWhileATierBelowHoldsTheValue) {
  PoolConfig c = config({tenant("alice")});
  c.snapshot_lower_tiers = true;
  pool_ = make_pool(std::move(c));
  layout_ = pool_->register_layout(small_layout());
  arena_ = pool_->open_arena("alice", layout_, 6);  // a slot and five snapshots
  lease_ = pool_->attach_lease("alice", "").id;
  const SlotId src = slot(lease_, arena_, 0x10);
  const auto hold = [](bool publishing, bool host, bool remote) {
    auto h = std::make_shared<SnapshotTierHold>();
    h->publishing = publishing;
    h->host = host;
    h->remote = remote;
    return h;
  };
  const auto put = [&](const char* name, std::shared_ptr<const SnapshotTierHold> below) {
    SnapshotPut p =
        pool_->put_snapshot(lease_, arena_.id, src, key(name), std::nullopt, std::move(below));
    ASSERT_TRUE(p.copy.has_value());
    run(*p.copy);
  };
  put("on-its-way", hold(true, false, false));
  put("in-host", hold(false, true, false));
  put("in-remote", hold(false, false, true));
  const auto let_go = hold(false, true, false);
  put("let-go", let_go);
  put("not-written", nullptr);
  let_go->host = false;  // the host tier let it go after its publication

  (void)pool_->allocate(lease_, arena_.id, 5);  // evicts all five
  EXPECT_EQ(usage("alice").snapshots, 0u);
  EXPECT_EQ(usage("alice").snapshot_demotions, 3u);
  EXPECT_EQ(usage("alice").snapshot_evictions, 2u);
}

TEST_F(PoolSnapshots, AReadInFlightKeepsItsPageThroughADeleteAndAnEviction) {
  const SlotId src = slot(lease_, arena_, 0x42);
  publish(key("busy"), src);
  const SlotId dst = slot(lease_, arena_, 0x00);
  SnapshotGet get = pool_->get_snapshot(lease_, arena_.id, dst, key("busy"));
  ASSERT_TRUE(get.hit);

  // Being read, it cannot be evicted: allocate cannot take its page.
  expect_status(Status::pool_exhausted, [&] { (void)pool_->allocate(lease_, arena_.id, 2); });
  // A delete hides it at once but keeps the page until the read ends.
  EXPECT_EQ(pool_->delete_snapshot("alice", key("busy")), 1u);
  EXPECT_EQ(pool_->delete_snapshot("alice", key("busy")), 0u);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 1u);
  EXPECT_TRUE(pool_->check().empty()) << join(pool_->check());
  const SlotId other = slot(lease_, arena_, 0x00);
  EXPECT_FALSE(fetch(key("busy"), other).hit);

  run(*get.copy);
  EXPECT_EQ(first_byte(lease_, arena_, dst), 0x42);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 0u);
  EXPECT_EQ(pool_->arena("alice", arena_.id).pages_used, 3u);
}

TEST_F(PoolSnapshots, ClosingAnArenaDropsItsSnapshotsButNotPinnedOrBusyOnes) {
  const SlotId src = slot(lease_, arena_, 0x42);
  publish(key("pinned"), src);
  publish(key("plain"), src);
  EXPECT_EQ(pool_->pin_snapshot("alice", key("pinned"), true), 1u);
  ASSERT_EQ(pool_->free(lease_, arena_.id, std::vector<SlotId>{src}), 1u);
  const ArenaId id = arena_.id;
  arena_.memory.reset();

  auto msg = expect_status(Status::in_use, [&] { (void)pool_->close_arena("alice", id); });
  EXPECT_NE(msg.find("1 pinned snapshots and 0 being read or published"), std::string::npos) << msg;
  EXPECT_EQ(pool_->pin_snapshot("alice", key("pinned"), false), 1u);

  // A read in flight holds its snapshot (and the arena) until it ends.
  const ArenaInfo other = pool_->open_arena("alice", layout_, 8);  // a second, larger one
  ASSERT_NE(other.id, id);
  const SlotId dst = slot(lease_, other, 0x00);
  SnapshotGet get = pool_->get_snapshot(lease_, other.id, dst, key("plain"));
  ASSERT_TRUE(get.hit) << "a snapshot serves every arena of its layout";
  msg = expect_status(Status::in_use, [&] { (void)pool_->close_arena("alice", id); });
  EXPECT_NE(msg.find("0 pinned snapshots and 1 being read or published"), std::string::npos) << msg;
  run(*get.copy);
  EXPECT_EQ(first_byte(lease_, other, dst), 0x42);

  const std::uint64_t evicted = usage("alice").snapshot_evictions;
  const ClosedArena closed = pool_->close_arena("alice", id);
  EXPECT_EQ(closed.snapshots_dropped, 2u);
  EXPECT_EQ(usage("alice").snapshot_evictions, evicted + 2);
  EXPECT_EQ(usage("alice").snapshots, 0u);
  EXPECT_FALSE(fetch(key("plain"), dst, lease_, other.id).hit);
  bool more = false;
  EXPECT_TRUE(pool_->list_snapshots("alice", "", 10, more).empty());
}

TEST_F(PoolSnapshots, APutWhoseCopyNeverCompletesIsForgotten) {
  const SlotId src = slot(lease_, arena_, 0x10);
  {
    SnapshotPut put = pool_->put_snapshot(lease_, arena_.id, src, key("lost"));
    ASSERT_TRUE(put.created);
    // While it is written: a second put of the key does nothing, a get misses.
    EXPECT_FALSE(pool_->put_snapshot(lease_, arena_.id, src, key("lost")).created);
    EXPECT_FALSE(fetch(key("lost"), src).hit);
    EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 1u);
  }  // the copy failed (destroyed without done())
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 0u);
  EXPECT_FALSE(fetch(key("lost"), src).hit);
  EXPECT_TRUE(publish(key("lost"), src).created);
}

TEST_F(PoolSnapshots, DeletingAKeyBeingWrittenFreesItsPageWhenTheWriteEnds) {
  const SlotId src = slot(lease_, arena_, 0x10);
  SnapshotPut put = pool_->put_snapshot(lease_, arena_.id, src, key("racy"));
  ASSERT_TRUE(put.created);
  EXPECT_EQ(pool_->delete_snapshot("alice", key("racy")), 0u);  // not visible yet: kept
  run(*put.copy);
  EXPECT_EQ(pool_->delete_snapshot("alice", key("racy")), 1u);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 0u);
}

TEST_F(PoolSnapshots, SnapshotsOutliveThePublishersLease) {
  const SlotId src = slot(lease_, arena_, 0x21);
  publish(key("kept"), src);
  pool_->detach_lease(lease_, Clock::now());
  (void)pool_->reclaim_expired(Clock::now() + std::chrono::hours(1));
  EXPECT_EQ(pool_->arena("alice", arena_.id).pages_used, 1u);  // the snapshot only

  const LeaseId next = pool_->attach_lease("alice", "").id;
  const SlotId dst = slot(next, arena_, 0x00);
  ASSERT_TRUE(fetch(key("kept"), dst, next).hit);
  EXPECT_EQ(first_byte(next, arena_, dst), 0x21);
}

TEST_F(PoolSnapshots, ASnapshotPageIsNoClientsSlot) {
  const SlotId src = slot(lease_, arena_, 0x21);
  publish(key("mine"), src);
  bool more = false;
  const auto listed = pool_->list_snapshots("alice", "", 10, more);
  ASSERT_EQ(listed.size(), 1u);
  // The snapshot's page is the one slot id the lease was not given.
  const std::vector<SlotId> rest = pool_->allocate(lease_, arena_.id, 2);
  SlotId page = 0;
  for (SlotId s = 0; s < 4; ++s) {
    if (s != src && s != rest[0] && s != rest[1]) page = s;
  }
  expect_status(Status::not_owner, [&] { (void)pool_->page(lease_, arena_.id, page); });
  const std::vector<SlotId> one{page};
  expect_status(Status::not_owner, [&] { (void)pool_->free(lease_, arena_.id, one); });
  expect_status(Status::not_owner,
                [&] { (void)pool_->put_snapshot(lease_, arena_.id, page, key("x")); });
}

TEST_F(PoolSnapshots, PinsAreBoundedPerPublisher) {
  TenantConfig small = tenant("alice");
  small.limits.max_pinned_snapshots = 1;
  make({small});
  const SlotId src = slot(lease_, arena_, 0x01);
  publish(key("a"), src);
  publish(key("b"), src);
  EXPECT_EQ(pool_->pin_snapshot("alice", key("a"), true), 1u);
  EXPECT_EQ(pool_->pin_snapshot("alice", key("a"), true), 0u);  // already pinned
  const std::string msg =
      expect_status(Status::quota_exceeded, [&] { pool_->pin_snapshot("alice", key("b"), true); });
  EXPECT_NE(msg.find("max-pinned-snapshots"), std::string::npos) << msg;
  EXPECT_EQ(usage("alice").pinned_snapshots, 1u);
  pool_->delete_snapshot("alice", key("a"));  // a deleted pin frees its place
  EXPECT_EQ(pool_->pin_snapshot("alice", key("b"), true), 1u);
}

TEST_F(PoolSnapshots, ListingIsByPrefixInKeyOrderWithALimit) {
  make({tenant("alice")}, 8);
  const SlotId src = slot(lease_, arena_, 0x01);
  for (const char* p : {"sys/b", "sys/a", "user/1", "sys/a"}) publish(key(p, 5), src);
  publish(key("sys/a", 3), src);
  publish(key(std::string("sys/\0z", 6), 1), src);
  bool more = true;
  auto sys = pool_->list_snapshots("alice", "sys/", 10, more);
  ASSERT_EQ(sys.size(), 4u);
  EXPECT_FALSE(more);
  EXPECT_EQ(sys[0].key.prefix, std::string("sys/\0z", 6));
  EXPECT_EQ(sys[1].key.prefix, "sys/a");
  EXPECT_EQ(sys[1].key.position, 3u);
  EXPECT_EQ(sys[2].key.position, 5u);
  EXPECT_EQ(sys[3].key.prefix, "sys/b");
  EXPECT_EQ(sys[3].layout_id, layout_);
  EXPECT_EQ(sys[3].page_bytes, arena_.page_bytes);
  EXPECT_EQ(sys[3].tenant, "alice");
  auto two = pool_->list_snapshots("alice", "", 2, more);
  EXPECT_EQ(two.size(), 2u);
  EXPECT_TRUE(more);
  EXPECT_EQ(pool_->list_snapshots("alice", "nothing", 10, more).size(), 0u);
}

// --- hybrid entries: KV blocks in further pages of the arena ------------------------

/// KV blocks of bf16 keys only, one channel: `bytes` encoded bytes exactly (even).
kernels::KvBlocks kv_of_bytes(std::uint64_t bytes) {
  return kernels::KvBlocks{kernels::KvCodecId::bf16, 1, 1, 0, bytes / 2};
}

TEST_F(PoolSnapshots, KvBlocksTakeFurtherPagesCutToTheirLength) {
  make({tenant("alice")}, 6);
  const SlotId src = slot(lease_, arena_, 0x0A);
  const std::size_t page = pool_->page(lease_, arena_.id, src).bytes.size();
  const kernels::KvBlocks kv = kv_of_bytes(page + page / 2 + (page / 2) % 2);  // 2 pages
  const std::uint64_t kv_bytes = kernels::kv_blocks_encoded_bytes(kv);
  SnapshotPut put = pool_->put_snapshot(lease_, arena_.id, src, key("hybrid"), kv);
  ASSERT_TRUE(put.copy);
  EXPECT_EQ(put.pages, 3u);
  EXPECT_EQ(put.kv_bytes, kv_bytes);
  ASSERT_TRUE(put.copy->kv);
  EXPECT_EQ(*put.copy->kv, kv);
  ASSERT_EQ(put.copy->kv_chunks.size(), 2u);
  EXPECT_EQ(put.copy->kv_chunks[0].size, page);
  EXPECT_EQ(put.copy->kv_chunks[1].size, kv_bytes - page);
  for (std::size_t i = 0; i < 2; ++i) {
    std::memset(put.copy->kv_chunks[i].data, 0x60 + static_cast<int>(i),
                put.copy->kv_chunks[i].size);
  }
  run(*put.copy);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 3u);
  EXPECT_EQ(usage("alice").snapshot_bytes, 3 * page);

  const SlotId dst = slot(lease_, arena_, 0x00);
  SnapshotGet get = pool_->get_snapshot(lease_, arena_.id, dst, key("hybrid"));
  ASSERT_TRUE(get.copy);
  ASSERT_TRUE(get.copy->kv);
  ASSERT_EQ(get.copy->kv_chunks.size(), 2u);
  EXPECT_EQ(static_cast<int>(get.copy->kv_chunks[1].data[0]), 0x61);
  EXPECT_EQ(get.copy->kv_chunks[1].size, kv_bytes - page);
  run(*get.copy);
  EXPECT_EQ(first_byte(lease_, arena_, dst), 0x0A);

  bool more = false;
  const std::vector<SnapshotInfo> listed = pool_->list_snapshots("alice", "", 10, more);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].pages, 3u);
  EXPECT_EQ(listed[0].kv_bytes, kv_bytes);
  ASSERT_TRUE(listed[0].kv);

  // Publishing the key again (with or without blocks) keeps the first entry.
  const SnapshotPut again = publish(key("hybrid"), dst);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.pages, 3u);
  EXPECT_EQ(again.kv_bytes, kv_bytes);

  // Live slots evict the whole entry: its three pages come free at once.
  const std::vector<SlotId> more_slots = pool_->allocate(lease_, arena_.id, 3);
  EXPECT_EQ(more_slots.size(), 3u);
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 0u);
  EXPECT_FALSE(fetch(key("hybrid"), dst).hit);
}

TEST_F(PoolSnapshots, AHybridPutEvictsAsManyEntriesAsItNeedsPagesOrChangesNothing) {
  make({tenant("alice")}, 5);
  const SlotId src = slot(lease_, arena_, 0x01);
  const std::size_t page = pool_->page(lease_, arena_.id, src).bytes.size();
  publish(key("a"), src);
  publish(key("b"), src);
  publish(key("c"), src);  // 4 of 5 pages used: 1 slot, 3 snapshots
  SnapshotPut put = pool_->put_snapshot(lease_, arena_.id, src, key("big"), kv_of_bytes(2 * page));
  EXPECT_EQ(put.evicted, 2u);  // needs 3 pages, 1 free: the two oldest go
  ASSERT_TRUE(put.copy);
  run(*put.copy);
  EXPECT_FALSE(fetch(key("a"), src).hit);
  EXPECT_FALSE(fetch(key("b"), src).hit);

  // More pages than the arena has: invalid_argument, whatever is free.
  PoolStats before = pool_->stats();
  std::string msg = expect_status(Status::invalid_argument, [&] {
    (void)pool_->put_snapshot(lease_, arena_.id, src, key("huge"), kv_of_bytes(5 * page));
  });
  EXPECT_NE(msg.find("the snapshot takes 6 pages"), std::string::npos) << msg;
  // Ill-formed blocks.
  msg = expect_status(Status::invalid_argument, [&] {
    (void)pool_->put_snapshot(lease_, arena_.id, src, key("bad"),
                              kernels::KvBlocks{kernels::KvCodecId::kivi2, 0, 128, 128, 10});
  });
  EXPECT_NE(msg.find("at least 1 layer"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool_->stats()));
  // Room only by evicting a pinned entry: pool_exhausted.
  pool_->pin_snapshot("alice", key("big"), true);
  pool_->pin_snapshot("alice", key("c"), true);
  before = pool_->stats();
  msg = expect_status(Status::pool_exhausted, [&] {
    (void)pool_->put_snapshot(lease_, arena_.id, src, key("late"), kv_of_bytes(page));
  });
  EXPECT_NE(msg.find("no room for the snapshot's 2 page(s)"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool_->stats()));
}

TEST_F(PoolSnapshots, AHybridPutWhoseCopyFailsFreesEveryPage) {
  const SlotId src = slot(lease_, arena_, 0x01);
  const std::size_t page = pool_->page(lease_, arena_.id, src).bytes.size();
  {
    SnapshotPut put =
        pool_->put_snapshot(lease_, arena_.id, src, key("lost"), kv_of_bytes(page + 2));
    EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 3u);
  }  // abandoned (e.g. the KV values held a NaN)
  EXPECT_EQ(pool_->arena("alice", arena_.id).snapshot_pages, 0u);
  EXPECT_FALSE(fetch(key("lost"), src).hit);
}

// Import and export (statepoolctl snapshot-put / snapshot-get): by layout digest, with
// only the snapshot's side of the copy, and no lookup counted.
TEST_F(PoolSnapshots, ImportPublishesIntoTheArenaOfTheLayoutAndExportReadsOut) {
  const SlotId src = slot(lease_, arena_, 0x3C);
  const std::size_t page = pool_->page(lease_, arena_.id, src).bytes.size();
  const std::string digest =
      kernels::layout_digest(pool_->page(lease_, arena_.id, src).codec->layout());
  SnapshotPut put = pool_->import_snapshot("alice", digest, key("imported"), kv_of_bytes(page));
  ASSERT_TRUE(put.copy);
  EXPECT_EQ(put.arena, arena_.id);
  EXPECT_EQ(put.copy->source.data, nullptr);
  ASSERT_EQ(put.copy->kv_chunks.size(), 1u);
  std::memset(put.copy->target.data, 0x5E, put.copy->target.size);
  std::memset(put.copy->kv_chunks[0].data, 0x6F, put.copy->kv_chunks[0].size);
  put.copy->done();
  EXPECT_TRUE(fetch(key("imported"), src).hit);
  EXPECT_EQ(first_byte(lease_, arena_, src), 0x5E);
  EXPECT_FALSE(pool_->import_snapshot("alice", digest, key("imported")).created);

  const std::uint64_t hits = usage("alice").snapshot_hits;
  SnapshotGet out = pool_->export_snapshot("alice", key("imported"), "");
  ASSERT_TRUE(out.copy);
  EXPECT_EQ(out.layout_digest, digest);
  EXPECT_EQ(out.copy->target.data, nullptr);
  EXPECT_EQ(static_cast<int>(out.copy->source.data[0]), 0x5E);
  EXPECT_EQ(static_cast<int>(out.copy->kv_chunks.at(0).data[0]), 0x6F);
  out.copy->done();
  EXPECT_EQ(usage("alice").snapshot_hits, hits);  // an operator's read, not a lookup
  EXPECT_FALSE(pool_->export_snapshot("alice", key("imported"), "0000000000000000").hit);
  EXPECT_FALSE(pool_->export_snapshot("alice", key("absent"), "").hit);

  // No arena of the layout: not_found, nothing published.
  const std::string msg = expect_status(Status::not_found, [&] {
    (void)pool_->import_snapshot("alice", "0000000000000000", key("elsewhere"));
  });
  EXPECT_NE(msg.find("no arena of the snapshot's layout"), std::string::npos) << msg;
  expect_status(Status::not_found,
                [&] { (void)pool_->import_snapshot("bob", digest, key("bob's")); });
}

TEST_F(PoolSnapshots, BadKeysAreRefusedAndChangeNothing) {
  const SlotId src = slot(lease_, arena_, 0x01);
  const PoolStats before = pool_->stats();
  expect_status(Status::invalid_argument,
                [&] { (void)pool_->put_snapshot(lease_, arena_.id, src, key("")); });
  const std::string msg = expect_status(Status::invalid_argument, [&] {
    (void)pool_->put_snapshot(lease_, arena_.id, src, key(std::string(257, 'x')));
  });
  EXPECT_EQ(msg, "a snapshot prefix is at most 256 bytes, got 257");
  expect_status(Status::invalid_argument,
                [&] { (void)pool_->get_snapshot(lease_, arena_.id, src, key("")); });
  expect_status(Status::invalid_argument, [&] { pool_->delete_snapshot("alice", key("")); });
  expect_status(Status::invalid_argument, [&] { pool_->pin_snapshot("alice", key(""), true); });
  expect_status(Status::not_found, [&] { (void)pool_->put_snapshot(lease_, 99, src, key("k")); });
  EXPECT_TRUE(same_stats(before, pool_->stats()));
  EXPECT_TRUE(publish(key(std::string(256, 'x')), src).created);
}

}  // namespace
}  // namespace statepool::service
