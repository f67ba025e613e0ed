#pragma once
// A fixed-capacity slot allocator: hands out indices in [0, capacity) with O(1) allocate
// and O(1) free, and detects misuse (double free, free of a slot never handed out) instead
// of corrupting itself.
//
// Representation: a stack of free indices (LIFO, so a freed page is reused first while it
// is still warm in cache) plus one state byte per slot. The stack starts as
// [capacity-1, ..., 1, 0], so a fresh allocator hands out 0, 1, 2, ... in order.
//
// Knows nothing about owners, leases or bytes; the pool composes it with those.
// Thread-safety: none; the owner serialises access.

#include <cstdint>
#include <string>
#include <vector>

namespace statepool::service {

class SlotAllocator {
 public:
  using Slot = std::uint32_t;

  enum class FreeResult : std::uint8_t {
    ok,
    out_of_range,   ///< slot >= capacity
    not_allocated,  ///< already free (double free) or never allocated
  };

  /// Throws std::bad_alloc only.
  explicit SlotAllocator(std::uint32_t capacity);
  /// An allocator whose slot i is allocated where `allocated[i]` (a pool taken over,
  /// pool_state.cpp); the free slots are handed out lowest first. `allocated.size()` must
  /// fit in 32 bits. Throws std::bad_alloc only.
  explicit SlotAllocator(const std::vector<bool>& allocated);

  [[nodiscard]] std::uint32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint32_t used() const noexcept { return capacity_ - available(); }
  [[nodiscard]] std::uint32_t available() const noexcept {
    return static_cast<std::uint32_t>(free_.size());
  }
  [[nodiscard]] bool is_allocated(Slot slot) const noexcept {
    return slot < capacity_ && state_[slot] == kAllocated;
  }

  /// Takes one free slot; false when none is left (nothing changes). O(1).
  [[nodiscard]] bool allocate(Slot& out) noexcept;
  /// Takes `count` slots, all or nothing: appends them to `out` and returns true, or
  /// returns false with nothing changed when fewer than `count` are free. O(count).
  /// `out` must have room (reserve before) for the call to be noexcept in practice;
  /// if push_back throws, every slot taken so far is returned and the exception
  /// propagates.
  bool allocate_n(std::uint32_t count, std::vector<Slot>& out);
  /// Returns a slot. O(1). Misuse is reported, and changes nothing.
  [[nodiscard]] FreeResult free(Slot slot) noexcept;

  /// Verifies the invariants: free stack + allocated == capacity, no index twice on the
  /// stack, every stacked index in range and marked free. One line per problem.
  [[nodiscard]] std::vector<std::string> check() const;

 private:
  static constexpr std::uint8_t kFree = 0;
  static constexpr std::uint8_t kAllocated = 1;

  std::uint32_t capacity_;
  std::vector<Slot> free_;           // stack; back() is handed out next
  std::vector<std::uint8_t> state_;  // kFree / kAllocated per slot
};

[[nodiscard]] const char* to_string(SlotAllocator::FreeResult result) noexcept;

}  // namespace statepool::service
