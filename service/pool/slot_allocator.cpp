#include "pool/slot_allocator.hpp"

#include <cstddef>

namespace statepool::service {

SlotAllocator::SlotAllocator(std::uint32_t capacity)
    : capacity_(capacity), state_(capacity, kFree) {
  free_.reserve(capacity);
  for (std::uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
}

SlotAllocator::SlotAllocator(const std::vector<bool>& allocated)
    : capacity_(static_cast<std::uint32_t>(allocated.size())), state_(allocated.size(), kFree) {
  free_.reserve(capacity_);
  for (std::uint32_t i = capacity_; i > 0; --i) {
    if (allocated[i - 1]) {
      state_[i - 1] = kAllocated;
    } else {
      free_.push_back(i - 1);
    }
  }
}

bool SlotAllocator::allocate(Slot& out) noexcept {
  if (free_.empty()) return false;
  out = free_.back();
  free_.pop_back();
  state_[out] = kAllocated;
  return true;
}

bool SlotAllocator::allocate_n(std::uint32_t count, std::vector<Slot>& out) {
  if (count > available()) return false;
  const std::size_t first = out.size();
  try {
    for (std::uint32_t i = 0; i < count; ++i) {
      out.push_back(free_.back());  // may throw; the slot is still on the stack then
      free_.pop_back();
      state_[out.back()] = kAllocated;
    }
  } catch (...) {
    // Give back, in reverse, everything this call took: the stack ends up as before.
    while (out.size() > first) {
      state_[out.back()] = kFree;
      free_.push_back(out.back());  // cannot throw: capacity was reserved for all slots
      out.pop_back();
    }
    throw;
  }
  return true;
}

SlotAllocator::FreeResult SlotAllocator::free(Slot slot) noexcept {
  if (slot >= capacity_) return FreeResult::out_of_range;
  if (state_[slot] != kAllocated) return FreeResult::not_allocated;
  state_[slot] = kFree;
  free_.push_back(slot);  // cannot throw: capacity == capacity_ was reserved
  return FreeResult::ok;
}

std::vector<std::string> SlotAllocator::check() const {
  std::vector<std::string> problems;
  std::vector<std::uint8_t> seen(capacity_, 0);
  std::uint32_t allocated = 0;
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    if (state_[i] == kAllocated) {
      ++allocated;
    } else if (state_[i] != kFree) {
      problems.push_back("slot " + std::to_string(i) + " has invalid state " +
                         std::to_string(state_[i]));
    }
  }
  for (const Slot slot : free_) {
    if (slot >= capacity_) {
      problems.push_back("free list holds slot " + std::to_string(slot) + " >= capacity " +
                         std::to_string(capacity_));
      continue;
    }
    if (seen[slot] != 0) {
      problems.push_back("free list holds slot " + std::to_string(slot) + " twice");
    }
    seen[slot] = 1;
    if (state_[slot] != kFree) {
      problems.push_back("free list holds slot " + std::to_string(slot) +
                         " that is marked allocated");
    }
  }
  if (free_.size() + allocated != capacity_) {
    problems.push_back("free list (" + std::to_string(free_.size()) + ") + allocated (" +
                       std::to_string(allocated) + ") != capacity (" + std::to_string(capacity_) +
                       ")");
  }
  return problems;
}

const char* to_string(SlotAllocator::FreeResult result) noexcept {
  switch (result) {
    case SlotAllocator::FreeResult::ok: return "ok";
    case SlotAllocator::FreeResult::out_of_range: return "out of range";
    case SlotAllocator::FreeResult::not_allocated: return "not allocated";
  }
  return "unknown";
}

}  // namespace statepool::service
