#pragma once
// Identifiers and limits shared by the pool's tables. Records hold ids, not pointers.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace statepool::service {

using Clock = std::chrono::steady_clock;
using LeaseId = std::uint64_t;  ///< 0 never names a lease
using LayoutId = std::uint32_t;
using ArenaId = std::uint32_t;
using SlotId = std::uint32_t;

/// The owner of a slot whose page holds a snapshot (no lease ever has this id).
inline constexpr LeaseId kSnapshotOwner = ~LeaseId{0};

/// Pages are placed at this alignment inside an arena (page_stride = round_up(page_bytes)).
inline constexpr std::size_t kPageAlignment = 256;

}  // namespace statepool::service
