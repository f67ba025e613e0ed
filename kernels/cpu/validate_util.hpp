#pragma once
// Message helpers shared by the validators of kernels/ (layouts, plans). Internal.

#include <cstdint>
#include <string>
#include <string_view>

namespace statepool::kernels::detail {

/// "" when lo <= value <= hi, else "FIELD must be between LO and HI, got VALUE".
inline std::string range_problem(std::string_view field, std::uint64_t value, std::uint64_t lo,
                                 std::uint64_t hi) {
  if (value >= lo && value <= hi) return {};
  return std::string(field) + " must be between " + std::to_string(lo) + " and " +
         std::to_string(hi) + ", got " + std::to_string(value);
}

}  // namespace statepool::kernels::detail
