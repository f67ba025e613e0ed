// SlotAllocator: order, LIFO reuse, all-or-nothing batches, misuse detection.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "pool/slot_allocator.hpp"

namespace statepool::service {
namespace {

using FreeResult = SlotAllocator::FreeResult;

TEST(SlotAllocator, HandsOutInOrderThenReusesLastFreedFirst) {
  SlotAllocator slots(4);
  std::uint32_t s = 99;
  for (std::uint32_t expected = 0; expected < 4; ++expected) {
    ASSERT_TRUE(slots.allocate(s));
    EXPECT_EQ(s, expected);
  }
  EXPECT_FALSE(slots.allocate(s));
  EXPECT_EQ(slots.used(), 4u);
  EXPECT_EQ(slots.available(), 0u);

  EXPECT_EQ(slots.free(1), FreeResult::ok);
  EXPECT_EQ(slots.free(3), FreeResult::ok);
  ASSERT_TRUE(slots.allocate(s));
  EXPECT_EQ(s, 3u);  // LIFO: the warmest page first
  ASSERT_TRUE(slots.allocate(s));
  EXPECT_EQ(s, 1u);
  EXPECT_TRUE(slots.check().empty());
}

TEST(SlotAllocator, DoubleFreeIsDetectedAndChangesNothing) {
  SlotAllocator slots(8);
  std::uint32_t s = 0;
  ASSERT_TRUE(slots.allocate(s));
  EXPECT_EQ(slots.free(s), FreeResult::ok);
  EXPECT_EQ(slots.free(s), FreeResult::not_allocated);
  EXPECT_EQ(slots.free(5), FreeResult::not_allocated);  // never handed out
  EXPECT_EQ(slots.free(8), FreeResult::out_of_range);
  EXPECT_EQ(slots.free(0xffffffffu), FreeResult::out_of_range);
  EXPECT_EQ(slots.used(), 0u);
  EXPECT_EQ(slots.available(), 8u);
  EXPECT_TRUE(slots.check().empty());

  // Were the double free accepted, the same slot would now come out twice.
  std::vector<std::uint32_t> all;
  ASSERT_TRUE(slots.allocate_n(8, all));
  std::vector<bool> seen(8, false);
  for (const auto slot : all) {
    ASSERT_LT(slot, 8u);
    EXPECT_FALSE(seen[slot]) << "slot " << slot << " handed out twice";
    seen[slot] = true;
  }
}

TEST(SlotAllocator, AllocateNIsAllOrNothing) {
  SlotAllocator slots(5);
  std::vector<std::uint32_t> out;
  ASSERT_TRUE(slots.allocate_n(3, out));
  EXPECT_EQ(out, (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_FALSE(slots.allocate_n(3, out));
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(slots.used(), 3u);
  ASSERT_TRUE(slots.allocate_n(2, out));
  EXPECT_EQ(slots.available(), 0u);
  EXPECT_TRUE(slots.allocate_n(0, out));  // nothing asked, nothing taken
  EXPECT_TRUE(slots.check().empty());
}

TEST(SlotAllocator, ZeroCapacity) {
  SlotAllocator slots(0);
  std::uint32_t s = 0;
  EXPECT_FALSE(slots.allocate(s));
  EXPECT_EQ(slots.free(0), FreeResult::out_of_range);
  EXPECT_TRUE(slots.check().empty());
}

// Guards O(1) allocate/free: a million slots allocated, freed in a scattered order and
// allocated again. An implementation that scans for a free slot does ~10^12 steps here
// and never finishes within the test timeout; this one does a few million.
TEST(SlotAllocator, MillionSlotsChurnInConstantTimePerOperation) {
  constexpr std::uint32_t kCapacity = 1u << 20;
  SlotAllocator slots(kCapacity);
  std::uint32_t s = 0;
  for (std::uint32_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(slots.allocate(s));
  EXPECT_FALSE(slots.allocate(s));
  // Free in a scattered order (multiplication by an odd number permutes mod 2^20).
  for (std::uint32_t i = 0; i < kCapacity; ++i) {
    ASSERT_EQ(slots.free((i * 2654435761u) & (kCapacity - 1)), FreeResult::ok);
  }
  EXPECT_EQ(slots.used(), 0u);
  for (std::uint32_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(slots.allocate(s));
  EXPECT_EQ(slots.available(), 0u);
  EXPECT_TRUE(slots.check().empty());
}

TEST(SlotAllocator, CheckIsCleanThroughoutRandomChurn) {
  SlotAllocator slots(64);
  std::vector<std::uint32_t> held;
  std::uint32_t x = 12345;
  for (int step = 0; step < 2000; ++step) {
    x = x * 1103515245u + 12345u;
    if ((x >> 16) % 2 == 0 || held.empty()) {
      std::uint32_t s = 0;
      if (slots.allocate(s)) held.push_back(s);
    } else {
      const std::size_t i = (x >> 8) % held.size();
      ASSERT_EQ(slots.free(held[i]), FreeResult::ok);
      held[i] = held.back();
      held.pop_back();
    }
    ASSERT_EQ(slots.used(), held.size());
    ASSERT_TRUE(slots.check().empty());
  }
}

}  // namespace
}  // namespace statepool::service
