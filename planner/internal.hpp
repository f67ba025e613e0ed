#pragma once
// Shared inside the planner library only: number formatting for the text reports and the
// Boost.JSON objects the reports are built from (so one report can embed another).

#include <boost/json/object.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "statepool/planner/fits.hpp"
#include "statepool/planner/planner.hpp"

namespace statepool::planner::detail {

inline std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}
inline std::string mib(std::uint64_t bytes) {
  return fixed(static_cast<double>(bytes) / (1 << 20), 1);
}
inline std::string gib(double bytes) {
  return fixed(bytes / (1 << 30), 2);
}

/// A codec list with repeats dropped, first occurrence kept: one row per codec, whichever
/// door the list came through.
inline std::vector<kernels::CodecId> distinct(const std::vector<kernels::CodecId>& codecs) {
  std::vector<kernels::CodecId> out;
  for (const kernels::CodecId id : codecs) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

/// The range check of the slots input, shared by plan() and fits_now() (throws
/// std::invalid_argument "slots must be between 1 and 1024, got 0").
void check_slots(std::uint64_t slots);

}  // namespace statepool::planner::detail

namespace statepool::planner {

[[nodiscard]] boost::json::object to_json(const PlanReport& report);
[[nodiscard]] boost::json::object to_json(const FitsReport& report);

}  // namespace statepool::planner
