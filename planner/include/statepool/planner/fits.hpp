#pragma once
// "What fits now": given what a running pool has left, how many more requests of one
// state shape fit under each codec (docs/capacity.md, third question).
//
// The pool reserves memory per arena, one arena per (tenant, layout), sized when it is
// created. So for a codec the tenant already has an arena of this shape for, more
// requests fit only in that arena's free pages; for any other codec a new arena can take
// min(pool free bytes, tenant quota left) / page stride pages, at most max_arena_pages.
// The service fills LivePool from Pool::stats(); everything here is pure arithmetic.
//
// Thread-safety: pure functions; the structs are plain data.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"

namespace statepool::planner {

/// One of the tenant's arenas holding pages of the shape asked about.
struct LiveArena {
  std::uint32_t id = 0;
  kernels::CodecId codec = kernels::CodecId::fp32;
  std::uint64_t page_stride = 0;
  std::uint64_t free_pages = 0;
};

/// What the pool has left for one tenant (or for a new tenant: tenant empty, no quota,
/// no arenas).
struct LivePool {
  std::string tenant;                       ///< "" = pool-wide view (a new tenant)
  std::uint64_t capacity = 0;               ///< pool capacity in bytes
  std::uint64_t free = 0;                   ///< capacity - bytes of all arenas
  std::optional<std::uint64_t> quota_free;  ///< quota - the tenant's arena bytes; none = no quota
  std::uint32_t max_arena_pages = 0;
  std::vector<LiveArena> arenas;  ///< the tenant's arenas of this shape
};

/// Which limit ends the count for one codec.
enum class FitLimit : std::uint8_t {
  arena,            ///< the tenant's existing arena of this shape and codec is the room
  pool,             ///< free pool capacity
  quota,            ///< the tenant's quota
  max_arena_pages,  ///< one arena holds at most max_arena_pages pages
};
[[nodiscard]] const char* to_string(FitLimit limit) noexcept;

struct FitRow {
  kernels::CodecId codec = kernels::CodecId::fp32;
  bool nominal_plan = false;      ///< stepquant without an arena: nominal plan bytes
  std::uint64_t page_stride = 0;  ///< bytes one state slot takes in an arena
  std::uint64_t arena_pages = 0;  ///< free pages in the tenant's arena(s) of this codec
  std::uint64_t new_pages = 0;    ///< pages a new arena could get (0 when one exists)
  std::uint64_t requests = 0;     ///< (arena_pages + new_pages) / slots
  FitLimit limit = FitLimit::pool;
};

struct FitsReport {
  kernels::StateLayout shape;  ///< the codec field is ignored
  std::uint32_t slots = 1;     ///< state slots per request
  LivePool live;
  std::vector<FitRow> rows;
};

/// Counts, for each codec (empty = planner_codecs(); one row per codec named, in the order
/// first named), the requests that fit now. Throws std::invalid_argument for slots outside
/// 1..kMaxSlots or a shape the codecs cannot page.
[[nodiscard]] FitsReport fits_now(const kernels::StateLayout& shape, const LivePool& live,
                                  std::uint32_t slots,
                                  const std::vector<kernels::CodecId>& codecs = {});

/// Readable table.
[[nodiscard]] std::string format_text(const FitsReport& report);
/// One JSON object (docs/capacity.md, "What fits now").
[[nodiscard]] std::string format_json(const FitsReport& report);

}  // namespace statepool::planner
