#pragma once
// Bit allocation over a cost table: choose one width per unit to minimise the summed cost
// under a total bit budget (STEPQUANT.md, "Bit allocation"). Units are all the same size
// (a GDN head, or a KDA key row), so the budget counts widths: sum_u width_u <= budget.
//
//   allocate_dp          exact dynamic programming over the integer budget (GDN heads:
//                        ~1-2 thousand units, a few thousand budget steps).
//   allocate_lagrangian  bisection on the multiplier lambda of
//                        min_w cost(u, w) + lambda * w, then a gain-per-bit greedy repair
//                        that spends the leftover bits (KDA rows: ~80 thousand units).
//
// Both return one width per unit, never exceed the budget, and throw
// std::invalid_argument when the table is malformed (non-finite or negative costs,
// widths not strictly increasing) or the budget is below every unit at its smallest width.
// Ties go to the smaller width. Deterministic.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace statepool::calibration {

/// cost[u][w]: cost of unit u stored at candidate width widths[w].
struct CostTable {
  std::vector<std::uint8_t> widths;  ///< candidate widths, strictly increasing
  std::size_t units = 0;
  std::vector<double> cost;  ///< units * widths.size(), row-major by unit

  CostTable() = default;
  CostTable(std::vector<std::uint8_t> candidate_widths, std::size_t unit_count)
      : widths(std::move(candidate_widths)),
        units(unit_count),
        cost(unit_count * widths.size(), 0.0) {}

  [[nodiscard]] double& at(std::size_t unit, std::size_t width_index) {
    return cost[unit * widths.size() + width_index];
  }
  [[nodiscard]] double at(std::size_t unit, std::size_t width_index) const {
    return cost[unit * widths.size() + width_index];
  }
  /// Index of `width` in widths; throws std::invalid_argument if absent.
  [[nodiscard]] std::size_t index_of(std::uint8_t width) const;
  /// The table restricted to `units_kept` (in that order).
  [[nodiscard]] CostTable subset(std::span<const std::size_t> units_kept) const;
  /// sum_u cost(u, widths_chosen[u]); throws if a width is not a candidate.
  [[nodiscard]] double total(std::span<const std::uint8_t> widths_chosen) const;
};

/// Largest number of dynamic-programming cells (units x budget steps) allocate_dp accepts
/// (one byte each for the back-pointers).
inline constexpr std::uint64_t kMaxDpCells = 1ull << 27;

/// Exact minimum of sum cost subject to sum width <= budget_bits. Throws
/// std::invalid_argument when the problem exceeds kMaxDpCells (use the Lagrangian).
[[nodiscard]] std::vector<std::uint8_t> allocate_dp(const CostTable& table,
                                                    std::uint64_t budget_bits);

/// Lagrangian relaxation plus greedy repair; never above the budget, usually within a
/// fraction of a percent of the optimum on large tables.
[[nodiscard]] std::vector<std::uint8_t> allocate_lagrangian(const CostTable& table,
                                                            std::uint64_t budget_bits);

}  // namespace statepool::calibration
