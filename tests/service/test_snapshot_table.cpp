// SnapshotTable alone: the index, the busy/erased life of an entry, the LRU order and the
// pin counts, each checked against check().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pool/snapshot_table.hpp"
#include "statepool/testing/gtest/pool.hpp"

namespace statepool::service {
namespace {

using testing::join;

class SnapshotTableTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(table_.check().empty()) << join(table_.check()); }

  SnapshotId add(std::string prefix, ArenaId arena = 1, SlotId slot = 0, bool commit = true,
                 std::vector<SlotId> kv_pages = {}) {
    Snapshot s;
    s.kv_pages = std::move(kv_pages);
    s.space = 0;
    s.prefix = std::move(prefix);
    s.position = 9;
    s.layout = 1;
    s.tenant = 0;
    s.arena = arena;
    s.slot = slot;
    const SnapshotId id = table_.put(std::move(s), Clock::now()).id;
    if (commit) {
      EXPECT_FALSE(table_.commit(id));
    }
    return id;
  }

  SnapshotTable table_;
};

TEST_F(SnapshotTableTest, EntriesAreVisibleOnlyOnceCommitted) {
  const SnapshotId id = add("a", 1, 0, false);
  ASSERT_NE(table_.find(0, "a", 9, 1), nullptr);  // indexed: a second put sees it
  EXPECT_TRUE(table_.with_key(0, "a", 9).empty());
  EXPECT_TRUE(table_.evictable(1, 10).empty());
  EXPECT_FALSE(table_.commit(id));
  EXPECT_EQ(table_.with_key(0, "a", 9), std::vector<SnapshotId>{id});
  EXPECT_EQ(table_.find(0, "a", 9, 2), nullptr);  // another layout
  EXPECT_EQ(table_.find(1, "a", 9, 1), nullptr);  // another namespace
}

TEST_F(SnapshotTableTest, EvictionOrderIsLeastRecentlyUsedPerArenaSkippingBusyAndPinned) {
  const SnapshotId a = add("a");
  const SnapshotId b = add("b");
  const SnapshotId c = add("c");
  const SnapshotId other = add("d", 2);
  EXPECT_EQ(table_.evictable(1, 10), (std::vector<SnapshotId>{a, b, c}));
  EXPECT_EQ(table_.evictable(2, 10), std::vector<SnapshotId>{other});
  (void)table_.acquire(a, Clock::now());  // a: most recent, and busy
  EXPECT_EQ(table_.evictable(1, 10), (std::vector<SnapshotId>{b, c}));
  EXPECT_FALSE(table_.release(a));
  EXPECT_EQ(table_.evictable(1, 10), (std::vector<SnapshotId>{b, c, a}));
  EXPECT_TRUE(table_.set_pinned(b, true));
  EXPECT_EQ(table_.pinned_count(0), 1u);
  EXPECT_EQ(table_.evictable(1, 2), (std::vector<SnapshotId>{c, a}));
  EXPECT_TRUE(table_.set_pinned(b, false));  // unpinned: the most recent
  EXPECT_EQ(table_.evictable(1, 10), (std::vector<SnapshotId>{c, a, b}));
  EXPECT_EQ(table_.get(a)->hits, 1u);
}

// Hybrid entries hold several pages: eviction picks the oldest entries until enough pages
// are free, however many entries that takes.
TEST_F(SnapshotTableTest, EvictionCountsPagesOfEntriesWithKvBlocks) {
  const SnapshotId a = add("a", 1, 0, true, {1, 2, 3});  // 4 pages
  const SnapshotId b = add("b", 1, 4);                   // 1 page
  const SnapshotId c = add("c", 1, 5, true, {6});        // 2 pages
  EXPECT_EQ(table_.get(a)->all_pages(), (std::vector<SlotId>{0, 1, 2, 3}));
  EXPECT_EQ(table_.evictable(1, 1), std::vector<SnapshotId>{a});
  EXPECT_EQ(table_.evictable(1, 4), std::vector<SnapshotId>{a});
  EXPECT_EQ(table_.evictable(1, 5), (std::vector<SnapshotId>{a, b}));
  EXPECT_EQ(table_.evictable(1, 6), (std::vector<SnapshotId>{a, b, c}));
  const std::vector<SnapshotId> all = table_.evictable(1, 100);  // not enough: all of them
  EXPECT_EQ(all, (std::vector<SnapshotId>{a, b, c}));
  EXPECT_EQ(table_.pages_of(all), 7u);
  (void)table_.acquire(a, Clock::now());  // busy: skipped
  EXPECT_EQ(table_.evictable(1, 2), (std::vector<SnapshotId>{b, c}));
  EXPECT_FALSE(table_.release(a));
}

TEST_F(SnapshotTableTest, AnEntryErasedWhileBusyLeavesWithItsLastUser) {
  const SnapshotId id = add("a");
  (void)table_.acquire(id, Clock::now());
  (void)table_.acquire(id, Clock::now());
  EXPECT_FALSE(table_.erase(id));  // hidden, kept
  EXPECT_EQ(table_.find(0, "a", 9, 1), nullptr);
  EXPECT_FALSE(table_.erase(id));  // once
  EXPECT_FALSE(table_.release(id));
  EXPECT_TRUE(table_.check().empty()) << join(table_.check());
  EXPECT_TRUE(table_.release(id));  // the page is the caller's now
  EXPECT_EQ(table_.get(id), nullptr);
  // The key is free again.
  add("a");
}

TEST_F(SnapshotTableTest, AWriteThatEndsAfterAnEraseHandsThePageBack) {
  const SnapshotId id = add("a", 1, 0, false);
  EXPECT_FALSE(table_.erase(id));
  EXPECT_TRUE(table_.commit(id));
  EXPECT_EQ(table_.get(id), nullptr);
  const SnapshotId aborted = add("b", 1, 1, false);
  table_.abort(aborted);
  EXPECT_EQ(table_.find(0, "b", 9, 1), nullptr);
}

TEST_F(SnapshotTableTest, ErasingAPinnedEntryReleasesItsPin) {
  const SnapshotId id = add("a");
  ASSERT_TRUE(table_.set_pinned(id, true));
  EXPECT_FALSE(table_.set_pinned(id, true));
  EXPECT_TRUE(table_.erase(id));
  EXPECT_EQ(table_.pinned_count(0), 0u);
}

TEST_F(SnapshotTableTest, PrefixListingStopsAtTheFirstKeyOutsideThePrefix) {
  add("ab");
  add("abc");
  add("b");
  const SnapshotId hidden = add("abd", 1, 3, false);
  bool more = true;
  EXPECT_EQ(table_.starting_with(0, "ab", 10, more).size(), 2u);
  EXPECT_FALSE(more);
  EXPECT_EQ(table_.starting_with(0, "", 10, more).size(), 3u);
  EXPECT_EQ(table_.starting_with(0, "ab", 1, more).size(), 1u);
  EXPECT_TRUE(more);
  table_.abort(hidden);
}

}  // namespace
}  // namespace statepool::service
