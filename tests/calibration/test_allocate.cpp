// Bit allocation (allocate.hpp): the DP is exact (checked against brute force), the
// Lagrangian never exceeds the budget and stays close to the DP where both apply.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "statepool/calibration/allocate.hpp"

namespace statepool::calibration {
namespace {

std::uint64_t bits_of(const std::vector<std::uint8_t>& widths) {
  std::uint64_t sum = 0;
  for (const std::uint8_t w : widths) {
    sum += w;
  }
  return sum;
}

// Minimum total cost over every assignment within the budget (m^n candidates).
double brute_force(const CostTable& table, std::uint64_t budget) {
  const std::size_t n = table.units;
  const std::size_t m = table.widths.size();
  std::vector<std::size_t> pick(n, 0);
  double best = INFINITY;
  for (;;) {
    std::uint64_t bits = 0;
    double cost = 0.0;
    for (std::size_t u = 0; u < n; ++u) {
      bits += table.widths[pick[u]];
      cost += table.at(u, pick[u]);
    }
    if (bits <= budget) {
      best = std::min(best, cost);
    }
    std::size_t u = 0;
    while (u < n && ++pick[u] == m) {
      pick[u++] = 0;
    }
    if (u == n) {
      return best;
    }
  }
}

// Costs shaped like real ones: a per-unit scale times 4^-b (halving the step per extra
// bit), with noise; `monotone` = false also draws arbitrary costs.
// `noise` = 0.6 keeps them convex in the width; 3 makes some non-convex (as measured costs
// can be: a fit at 6 bits may gain little over 4 on one head and a lot on another); 8 makes some
// even non-monotone.
CostTable random_table(std::mt19937_64& rng, std::size_t units, std::vector<std::uint8_t> widths,
                       bool monotone, double noise = 0.6) {
  CostTable table(std::move(widths), units);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::size_t u = 0; u < units; ++u) {
    const double scale = std::exp(12.0 * unit(rng));  // lifetimes differ by orders of magnitude
    for (std::size_t w = 0; w < table.widths.size(); ++w) {
      table.at(u, w) =
          monotone ? scale * std::pow(4.0, -table.widths[w]) * std::exp(noise * (unit(rng) - 0.5))
                   : scale * unit(rng);
    }
  }
  return table;
}

TEST(AllocateDp, EqualsBruteForceOnSmallRandomCases) {
  std::mt19937_64 rng(1);
  const std::vector<std::vector<std::uint8_t>> width_sets = {{4, 6, 8}, {2, 4, 6, 8}, {3, 5, 8}};
  int cases = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 8;
    const auto& widths = width_sets[rng() % width_sets.size()];
    const CostTable table = random_table(rng, n, widths, trial % 2 == 0);
    const std::uint64_t lo = std::uint64_t{widths.front()} * n;
    const std::uint64_t hi = std::uint64_t{widths.back()} * n + 3;
    const std::uint64_t budget = lo + rng() % (hi - lo + 1);
    const std::vector<std::uint8_t> dp = allocate_dp(table, budget);
    ASSERT_EQ(dp.size(), n);
    EXPECT_LE(bits_of(dp), budget);
    const double expected = brute_force(table, budget);
    EXPECT_NEAR(table.total(dp), expected, 1e-12 * std::max(1.0, expected))
        << "trial " << trial << ", " << n << " units, budget " << budget;
    ++cases;
  }
  EXPECT_EQ(cases, 300);
}

TEST(AllocateDp, RejectsInfeasibleBudgetsAndBadTables) {
  CostTable table({4, 6, 8}, 3);
  EXPECT_THROW((void)allocate_dp(table, 11), std::invalid_argument);  // 3 x 4 = 12 needed
  EXPECT_EQ(allocate_dp(table, 12), (std::vector<std::uint8_t>{4, 4, 4}));
  table.at(1, 2) = -1.0;
  EXPECT_THROW((void)allocate_dp(table, 18), std::invalid_argument);
  table.at(1, 2) = NAN;
  EXPECT_THROW((void)allocate_lagrangian(table, 18), std::invalid_argument);
  CostTable unsorted({6, 4}, 1);
  EXPECT_THROW((void)allocate_dp(unsorted, 10), std::invalid_argument);
  EXPECT_TRUE(allocate_dp(CostTable({4, 6, 8}, 0), 0).empty());
}

TEST(AllocateDp, RefusesTablesBeyondTheCellLimit) {
  // 81,920 KDA rows with {2,4,6,8} is a Lagrangian job.
  const CostTable table({2, 4, 6, 8}, 81920);
  EXPECT_THROW((void)allocate_dp(table, 4 * 81920), std::invalid_argument);
  EXPECT_NO_THROW((void)allocate_lagrangian(table, 4 * 81920));
}

TEST(AllocateDp, SpendsBitsWhereTheyBuyMost) {
  // Unit 0 loses a lot per bit removed, unit 1 almost nothing.
  CostTable table({4, 6, 8}, 2);
  for (std::size_t w = 0; w < 3; ++w) {
    table.at(0, w) = 1000.0 * std::pow(4.0, -table.widths[w]);
    table.at(1, w) = 1.0 * std::pow(4.0, -table.widths[w]);
  }
  EXPECT_EQ(allocate_dp(table, 12), (std::vector<std::uint8_t>{8, 4}));
  EXPECT_EQ(allocate_lagrangian(table, 12), (std::vector<std::uint8_t>{8, 4}));
  EXPECT_EQ(allocate_dp(table, 100), (std::vector<std::uint8_t>{8, 8}));
}

TEST(AllocateLagrangian, NeverExceedsTheBudget) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + rng() % 300;
    const std::vector<std::uint8_t> widths =
        trial % 2 == 0 ? std::vector<std::uint8_t>{4, 6, 8} : std::vector<std::uint8_t>{2, 4, 6, 8};
    const CostTable table = random_table(rng, n, widths, trial % 3 != 0);
    const std::uint64_t lo = std::uint64_t{widths.front()} * n;
    const std::uint64_t budget = lo + rng() % (std::uint64_t{widths.back()} * n - lo + 5);
    const std::vector<std::uint8_t> lag = allocate_lagrangian(table, budget);
    ASSERT_EQ(lag.size(), n);
    EXPECT_LE(bits_of(lag), budget) << "trial " << trial;
    for (const std::uint8_t w : lag) {
      EXPECT_NE(std::find(widths.begin(), widths.end(), w), widths.end());
    }
    if (n <= 200) {
      const std::vector<std::uint8_t> dp = allocate_dp(table, budget);
      EXPECT_GE(table.total(lag), table.total(dp) * (1.0 - 1e-12));
    }
  }
  CostTable table({4, 6, 8}, 3);
  EXPECT_THROW((void)allocate_lagrangian(table, 11), std::invalid_argument);
}

TEST(AllocateLagrangian, WithinASmallGapOfTheDpOnGdnSizedCases) {
  // Qwen3-Next-sized: 36 x 32 = 1152 heads, 6-bit budget, and Qwen3.5-27B-sized 48 x 48.
  std::mt19937_64 rng(3);
  double worst = 0.0;
  for (const std::size_t n : {1152u, 2304u}) {
    for (int trial = 0; trial < 4; ++trial) {
      const CostTable table = random_table(rng, n, {4, 6, 8}, true, trial < 2 ? 0.6 : 8.0);
      for (const std::uint64_t budget : {6 * n, 6 * n - 8 * 16, 5 * n + 1}) {
        const double dp = table.total(allocate_dp(table, budget));
        const std::vector<std::uint8_t> lag_widths = allocate_lagrangian(table, budget);
        EXPECT_LE(bits_of(lag_widths), budget);
        const double gap = table.total(lag_widths) / dp - 1.0;
        EXPECT_GE(gap, -1e-12);
        worst = std::max(worst, gap);
      }
    }
  }
  std::printf("worst Lagrangian gap vs DP: %.3e\n", worst);
  EXPECT_LT(worst, 1e-3) << "Lagrangian + greedy repair is " << worst << " above the DP optimum";
}

}  // namespace
}  // namespace statepool::calibration
