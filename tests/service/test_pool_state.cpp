// Pool::save_state / Pool::restore_state (pool_state.hpp): a successor pool takes over the
// arenas' memory from their descriptors and the tables under the same ids, so a client
// that resumes its lease finds its slots and bytes unchanged and its snapshots hit; and a
// state that does not add up is refused whole, leaving nothing held.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/testing/fds.hpp"
#include "statepool/testing/gtest/pool.hpp"

namespace statepool::service {
namespace {

using testing::config;
using testing::expect_status;
using testing::join;
using testing::make_pool;
using testing::small_layout;
using testing::tenant;

void fill(const PageRef& page, std::uint8_t value) {
  std::memset(page.bytes.data(), value, page.bytes.size());
}

bool all(const PageRef& page, std::uint8_t value) {
  for (const std::byte b : page.bytes) {
    if (b != std::byte{value}) return false;
  }
  return true;
}

void run(SnapshotCopy& copy) {
  std::memcpy(copy.target.data, copy.source.data, copy.source.size);
  for (std::size_t i = 0; i < copy.kv_chunks.size(); ++i) {
    std::memset(copy.kv_chunks[i].data, 0x40 + static_cast<int>(i), copy.kv_chunks[i].size);
  }
  copy.done();
}

/// A pool as a running daemon leaves it: two tenants, two layouts, three arenas, an
/// attached lease, an orphaned one, snapshots (one pinned, one hybrid) and counters.
class PoolHandOver : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = make_pool(config({tenant("alice"), tenant("bob")}));
    int8_ = old_->register_layout("alice", small_layout());
    fp32_ = old_->register_layout("bob", small_layout(kernels::CodecId::fp32, "fp32"));
    a1_ = old_->open_arena("alice", int8_, 8).id;
    a2_ = old_->open_arena("alice", int8_, 16).id;
    b1_ = old_->open_arena("bob", fp32_, 4).id;

    const LeaseGrant alice = old_->attach_lease("alice", "");
    alice_token_ = alice.token;
    alice_slots_ = old_->allocate(alice.id, a1_, 3);
    for (std::size_t i = 0; i < alice_slots_.size(); ++i) {
      fill(old_->page(alice.id, a1_, alice_slots_[i]), static_cast<std::uint8_t>(0x10 + i));
    }
    const SlotId in_a2 = old_->allocate(alice.id, a2_, 1).at(0);
    fill(old_->page(alice.id, a2_, in_a2), 0x21);
    alice_slots_.push_back(in_a2);

    SnapshotPut first = old_->put_snapshot(alice.id, a1_, alice_slots_[0], {"prefix-1", 64});
    run(*first.copy);
    SnapshotPut second = old_->put_snapshot(alice.id, a1_, alice_slots_[1], {"prefix-2", 128});
    run(*second.copy);
    EXPECT_EQ(old_->pin_snapshot("alice", {"prefix-2", 128}, true), 1u);
    const std::size_t page = old_->layout(int8_)->page_bytes();
    const kernels::KvBlocks kv{kernels::KvCodecId::bf16, 1, 1, 0, page / 2 + page / 4};
    SnapshotPut hybrid = old_->put_snapshot(alice.id, a2_, in_a2, {"hybrid", 64}, kv);
    run(*hybrid.copy);

    const LeaseGrant bob = old_->attach_lease("bob", "");
    bob_token_ = bob.token;
    bob_slot_ = old_->allocate(bob.id, b1_, 1).at(0);
    fill(old_->page(bob.id, b1_, bob_slot_), 0x7b);
    old_->detach_lease(bob.id, Clock::now());  // orphaned: its grace period runs
    (void)old_->attach_lease("bob", "");       // attached, without slots: not saved
    SnapshotGet miss = old_->get_snapshot(alice.id, a1_, alice_slots_[2], {"absent", 1});
    EXPECT_FALSE(miss.hit);
  }

  /// A successor as the daemon makes it at start: the same configuration.
  static std::unique_ptr<Pool> successor(PoolConfig c = config({tenant("alice"), tenant("bob")})) {
    return make_pool(std::move(c));
  }

  std::unique_ptr<Pool> old_;
  LayoutId int8_ = 0;
  LayoutId fp32_ = 0;
  ArenaId a1_ = 0;
  ArenaId a2_ = 0;
  ArenaId b1_ = 0;
  std::string alice_token_;
  std::string bob_token_;
  std::vector<SlotId> alice_slots_;
  SlotId bob_slot_ = 0;
};

TEST_F(PoolHandOver, ASuccessorServesTheSameLeasesSlotsBytesAndSnapshots) {
  const PoolStats before = old_->stats();
  const PoolState saved = old_->save_state();
  EXPECT_EQ(saved.arenas.size(), 3u);
  EXPECT_EQ(saved.leases.size(), 2u) << "the lease without slots is not saved";
  EXPECT_EQ(saved.snapshots.size(), 3u);

  auto next = successor();
  const Pool::RestoreReport report = next->restore_state(saved, Clock::now());
  EXPECT_EQ(report.arenas, 3u);
  EXPECT_EQ(report.leases, 2u);
  EXPECT_EQ(report.snapshots, 3u);
  old_.reset();  // the predecessor exits: the memory stays with its successor
  EXPECT_TRUE(next->check().empty()) << join(next->check());

  const PoolStats after = next->stats();
  ASSERT_EQ(after.arenas.size(), before.arenas.size());
  for (std::size_t i = 0; i < after.arenas.size(); ++i) {
    EXPECT_EQ(after.arenas[i].id, before.arenas[i].id);
    EXPECT_EQ(after.arenas[i].tenant, before.arenas[i].tenant);
    EXPECT_EQ(after.arenas[i].layout, before.arenas[i].layout);
    EXPECT_EQ(after.arenas[i].pages_used, before.arenas[i].pages_used);
    EXPECT_EQ(after.arenas[i].snapshot_pages, before.arenas[i].snapshot_pages);
    EXPECT_EQ(after.arenas[i].bytes, before.arenas[i].bytes);
  }
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  ASSERT_EQ(after.tenants.size(), 2u);
  EXPECT_EQ(after.tenants[0].snapshot_misses, 1u);
  EXPECT_EQ(after.tenants[0].snapshot_puts_created, 3u);
  EXPECT_EQ(after.tenants[0].pinned_snapshots, 1u);
  EXPECT_EQ(after.leases_orphaned, 2u) << "every lease waits for its client";

  // Alice reconnects with her token: her slots and their bytes.
  const LeaseGrant alice = next->attach_lease("alice", alice_token_);
  EXPECT_TRUE(alice.resumed);
  EXPECT_EQ(alice.slots, 4u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        all(next->page(alice.id, a1_, alice_slots_[i]), static_cast<std::uint8_t>(0x10 + i)))
        << "slot " << alice_slots_[i];
  }
  EXPECT_TRUE(all(next->page(alice.id, a2_, alice_slots_[3]), 0x21));
  // Her snapshots hit, bytes and KV blocks included; the pin held.
  SnapshotGet hit = next->get_snapshot(alice.id, a1_, alice_slots_[2], {"prefix-2", 128});
  ASSERT_TRUE(hit.hit);
  run(*hit.copy);
  EXPECT_TRUE(all(next->page(alice.id, a1_, alice_slots_[2]), 0x11));
  const std::vector<SnapshotKey> keys{{"hybrid", 64}};
  std::vector<SnapshotGet> hybrid = next->get_snapshots(alice.id, a2_, keys, false, false);
  ASSERT_TRUE(hybrid.at(0).hit);
  const auto& chunks = hybrid[0].copy->kv_chunks;
  ASSERT_FALSE(chunks.empty());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(static_cast<std::uint8_t>(chunks[i].data[chunks[i].size - 1]), 0x40 + i)
        << "KV chunk " << i;
  }
  hybrid[0].copy->done();
  bool more = false;
  for (const SnapshotInfo& s : next->list_snapshots("alice", "", 10, more)) {
    EXPECT_EQ(s.pinned, s.key.prefix == "prefix-2") << s.key.prefix;
  }
  // Bob's orphaned lease too; new ids never repeat the predecessor's.
  const LeaseGrant bob = next->attach_lease("bob", bob_token_);
  EXPECT_TRUE(bob.resumed);
  EXPECT_TRUE(all(next->page(bob.id, b1_, bob_slot_), 0x7b));
  EXPECT_GT(next->open_arena("bob", fp32_, 8).id, b1_);
  EXPECT_GE(next->attach_lease("bob", "").id, saved.next_lease);
  EXPECT_TRUE(next->check().empty()) << join(next->check());
}

TEST_F(PoolHandOver, PagesOfASnapshotBeingPublishedAreHandedOverFree) {
  const LeaseGrant alice = old_->attach_lease("alice", "");
  const SlotId slot = old_->allocate(alice.id, a1_, 1).at(0);
  SnapshotPut pending = old_->put_snapshot(alice.id, a1_, slot, {"pending", 1});
  ASSERT_TRUE(pending.copy.has_value());
  const PoolState saved = old_->save_state();
  auto next = successor();
  (void)next->restore_state(saved, Clock::now());
  EXPECT_TRUE(next->check().empty()) << join(next->check());
  bool more = false;
  EXPECT_EQ(next->list_snapshots("alice", "pending", 10, more).size(), 0u);
  pending.copy->done();
}

// Each way a state can fail to add up is refused with the entry named, and the successor
// then holds no arena, no charged byte and no descriptor of the image's.
TEST_F(PoolHandOver, AnInconsistentStateIsRefusedWholeAndLeavesNothingHeld) {
  const PoolState good = old_->save_state();
  const LeaseId alice_lease = good.leases.at(0).id;
  struct Case {
    const char* name;
    std::function<void(PoolState&)> spoil;
    const char* says;
    Status status = Status::invalid_argument;
  };
  const std::vector<Case> cases = {
      {"a tenant this daemon lacks", [](PoolState& s) { s.arenas[2].tenant = "carol"; },
       "tenant 'carol'"},
      {"an owner that is no lease", [&](PoolState& s) { s.arenas[0].owner[7] = 999; },
       "is no lease id"},
      {"an owner lease that does not list the slot",
       [&](PoolState& s) { s.arenas[0].owner[7] = alice_lease; }, "does not list it"},
      {"a lease listing another's slot",
       [&](PoolState& s) { s.leases[0].slots.emplace_back(b1_, bob_slot_); },
       "the tables disagree"},
      {"a slot listed twice",
       [&](PoolState& s) { s.leases[0].slots.push_back(s.leases[0].slots[0]); }, "listed twice"},
      {"a slot out of range", [&](PoolState& s) { s.leases[0].slots.emplace_back(a1_, 8); },
       "does not exist"},
      {"too few owners", [](PoolState& s) { s.arenas[0].owner.pop_back(); },
       "slot owners for 8 pages"},
      {"a wrong page stride", [](PoolState& s) { s.arenas[0].page_stride += 256; }, "page stride"},
      {"bytes that do not hold the pages", [](PoolState& s) { s.arenas[0].bytes -= 1; },
       "do not hold its pages"},
      {"no descriptor", [](PoolState& s) { s.arenas[1].fd = -1; }, "no descriptor"},
      {"another arena's memory", [](PoolState& s) { s.arenas[1].fd = s.arenas[0].fd; }, "expected"},
      {"arenas out of order", [](PoolState& s) { std::swap(s.arenas[0], s.arenas[1]); },
       "ids must rise"},
      {"an arena id at the next id", [](PoolState& s) { s.next_arena = s.arenas.back().id; },
       "ids must rise"},
      {"a layout id gap", [](PoolState& s) { s.layouts[1].id = 3; }, "out of order"},
      {"a layout twice",
       [](PoolState& s) {
         s.layouts[1] = s.layouts[0];
         s.layouts[1].id = 2;
       },
       "same layout"},
      {"a bad token", [](PoolState& s) { s.leases[0].token = "guess"; }, "not a lease token"},
      {"a token twice", [](PoolState& s) { s.leases[1].token = s.leases[0].token; },
       "another lease's"},
      {"leases out of order", [](PoolState& s) { std::swap(s.leases[0], s.leases[1]); },
       "ids must rise"},
      {"an endless grace period",
       [](PoolState& s) { s.leases[0].grace_left = std::chrono::hours(24 * 365 * 20); },
       "out of range"},
      {"a snapshot page that is a lease's",
       [&](PoolState& s) { s.snapshots[0].slot = s.leases[0].slots[2].second; },
       "not a snapshot page"},
      {"a page of two snapshots", [](PoolState& s) { s.snapshots[1].slot = s.snapshots[0].slot; },
       "two snapshots"},
      {"a snapshot page nobody holds", [](PoolState& s) { s.snapshots.erase(s.snapshots.begin()); },
       "belong to snapshots"},
      {"a snapshot in another tenant's arena", [&](PoolState& s) { s.snapshots[0].arena = b1_; },
       "not an arena of its publisher"},
      {"a key twice",
       [](PoolState& s) {
         s.snapshots[1].prefix = s.snapshots[0].prefix;
         s.snapshots[1].position = s.snapshots[0].position;
       },
       "two snapshots under one key"},
      {"KV pages without blocks",
       [](PoolState& s) {
         for (auto& snapshot : s.snapshots) snapshot.kv.reset();
       },
       "KV pages without KV blocks"},
      {"a moved namespace", [](PoolState& s) { s.snapshots[0].space = "shared"; }, "namespace"},
      {"a quota too small for the arenas", [](PoolState&) {}, "quota exceeded",
       Status::quota_exceeded},
  };
  const std::size_t fds = testing::open_fd_count();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PoolState spoiled = good;
    c.spoil(spoiled);
    PoolConfig cfg = config({tenant("alice"), tenant("bob")});
    if (c.status == Status::quota_exceeded) cfg.tenants[0].quota_bytes = 4096;
    auto next = successor(std::move(cfg));
    const std::string message =
        expect_status(c.status, [&] { (void)next->restore_state(spoiled, Clock::now()); });
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
    EXPECT_NE(message.find("hand-over: "), std::string::npos) << message;
    const PoolStats stats = next->stats();
    EXPECT_TRUE(stats.arenas.empty());
    EXPECT_EQ(stats.reserved_bytes, 0u);
    EXPECT_EQ(stats.leases_orphaned, 0u);
    EXPECT_EQ(stats.memory.live_bytes, 0u);
    next.reset();
    EXPECT_EQ(testing::open_fd_count(), fds) << "a descriptor of the image stayed open";
  }
  // The good state still restores (nothing above changed the predecessor).
  EXPECT_EQ(successor()->restore_state(good, Clock::now()).arenas, 3u);
}

TEST_F(PoolHandOver, OnlyANewPoolTakesOver) {
  const PoolState saved = old_->save_state();
  const std::string message = expect_status(
      Status::invalid_argument, [&] { (void)old_->restore_state(saved, Clock::now()); });
  EXPECT_NE(message.find("in use already"), std::string::npos) << message;
}

}  // namespace
}  // namespace statepool::service
