#include "statepool/calibration/allocate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>

namespace statepool::calibration {
namespace {

void check_table(const CostTable& table, const char* who) {
  const std::string prefix = std::string(who) + ": ";
  if (table.widths.empty()) {
    throw std::invalid_argument(prefix + "no candidate widths");
  }
  for (std::size_t w = 0; w < table.widths.size(); ++w) {
    if (table.widths[w] == 0 || (w > 0 && table.widths[w] <= table.widths[w - 1])) {
      throw std::invalid_argument(prefix + "candidate widths must be positive and increasing");
    }
  }
  if (table.cost.size() != table.units * table.widths.size()) {
    throw std::invalid_argument(prefix + "cost table holds " + std::to_string(table.cost.size()) +
                                " entries, expected " +
                                std::to_string(table.units * table.widths.size()));
  }
  for (std::size_t i = 0; i < table.cost.size(); ++i) {
    if (!std::isfinite(table.cost[i]) || table.cost[i] < 0.0) {
      throw std::invalid_argument(prefix + "cost of unit " +
                                  std::to_string(i / table.widths.size()) + " at width " +
                                  std::to_string(table.widths[i % table.widths.size()]) +
                                  " is not a finite non-negative number");
    }
  }
}

void check_feasible(const CostTable& table, std::uint64_t budget_bits, const char* who) {
  const std::uint64_t minimum = std::uint64_t{table.widths.front()} * table.units;
  if (budget_bits < minimum) {
    throw std::invalid_argument(std::string(who) + ": budget of " + std::to_string(budget_bits) +
                                " bits is below the " + std::to_string(minimum) + " bits of " +
                                std::to_string(table.units) + " units at the smallest width " +
                                std::to_string(table.widths.front()));
  }
}

}  // namespace

std::size_t CostTable::index_of(std::uint8_t width) const {
  const auto it = std::find(widths.begin(), widths.end(), width);
  if (it == widths.end()) {
    throw std::invalid_argument("width " + std::to_string(width) + " is not a candidate width");
  }
  return static_cast<std::size_t>(it - widths.begin());
}

CostTable CostTable::subset(std::span<const std::size_t> units_kept) const {
  CostTable out(widths, units_kept.size());
  for (std::size_t i = 0; i < units_kept.size(); ++i) {
    if (units_kept[i] >= units) {
      throw std::invalid_argument("unit " + std::to_string(units_kept[i]) + " out of range");
    }
    for (std::size_t w = 0; w < widths.size(); ++w) {
      out.at(i, w) = at(units_kept[i], w);
    }
  }
  return out;
}

double CostTable::total(std::span<const std::uint8_t> widths_chosen) const {
  if (widths_chosen.size() != units) {
    throw std::invalid_argument("allocation has " + std::to_string(widths_chosen.size()) +
                                " widths for " + std::to_string(units) + " units");
  }
  double sum = 0.0;
  for (std::size_t u = 0; u < units; ++u) {
    sum += at(u, index_of(widths_chosen[u]));
  }
  return sum;
}

std::vector<std::uint8_t> allocate_dp(const CostTable& table, std::uint64_t budget_bits) {
  check_table(table, "allocate_dp");
  check_feasible(table, budget_bits, "allocate_dp");
  const std::size_t n = table.units;
  const std::size_t m = table.widths.size();
  if (n == 0) {
    return {};
  }
  // Work in units of the widths' gcd (2 for {2,4,6,8}), above the all-minimum allocation.
  std::uint64_t step = 0;
  for (const std::uint8_t w : table.widths) {
    step = std::gcd(step, std::uint64_t{w});
  }
  std::vector<std::size_t> extra(m);
  for (std::size_t w = 0; w < m; ++w) {
    extra[w] = (table.widths[w] - table.widths.front()) / step;
  }
  const std::uint64_t spare = budget_bits / step - n * (table.widths.front() / step);
  const auto budget = static_cast<std::size_t>(std::min<std::uint64_t>(spare, n * extra.back()));
  const std::uint64_t cells = std::uint64_t{n} * (budget + 1);
  if (cells > kMaxDpCells) {
    throw std::invalid_argument("allocate_dp: " + std::to_string(n) + " units x " +
                                std::to_string(budget + 1) + " budget steps exceed the limit of " +
                                std::to_string(kMaxDpCells) +
                                " cells; use allocate_lagrangian for this many units");
  }

  // best[b]: minimum cost of the units so far using at most b extra steps.
  std::vector<double> best(budget + 1, 0.0);
  std::vector<double> next(budget + 1);
  std::vector<std::uint8_t> choice(static_cast<std::size_t>(cells));
  for (std::size_t u = 0; u < n; ++u) {
    std::uint8_t* pick = choice.data() + u * (budget + 1);
    for (std::size_t b = 0; b <= budget; ++b) {
      double value = best[b] + table.at(u, 0);
      std::uint8_t arg = 0;
      for (std::size_t w = 1; w < m && extra[w] <= b; ++w) {
        const double candidate = best[b - extra[w]] + table.at(u, w);
        if (candidate < value) {
          value = candidate;
          arg = static_cast<std::uint8_t>(w);
        }
      }
      next[b] = value;
      pick[b] = arg;
    }
    best.swap(next);
  }

  std::vector<std::uint8_t> out(n);
  std::size_t b = budget;
  for (std::size_t u = n; u-- > 0;) {
    const std::uint8_t w = choice[u * (budget + 1) + b];
    out[u] = table.widths[w];
    b -= extra[w];
  }
  return out;
}

std::vector<std::uint8_t> allocate_lagrangian(const CostTable& table, std::uint64_t budget_bits) {
  check_table(table, "allocate_lagrangian");
  check_feasible(table, budget_bits, "allocate_lagrangian");
  const std::size_t n = table.units;
  const std::size_t m = table.widths.size();
  std::vector<std::uint8_t> pick(n);  // width index per unit

  // Chooses argmin_w cost + lambda * w per unit; returns the bits used.
  const auto choose = [&](double lambda, std::vector<std::uint8_t>& into) {
    std::uint64_t bits = 0;
    for (std::size_t u = 0; u < n; ++u) {
      double value = table.at(u, 0) + lambda * table.widths[0];
      std::uint8_t arg = 0;
      for (std::size_t w = 1; w < m; ++w) {
        const double candidate = table.at(u, w) + lambda * table.widths[w];
        if (candidate < value) {
          value = candidate;
          arg = static_cast<std::uint8_t>(w);
        }
      }
      into[u] = arg;
      bits += table.widths[arg];
    }
    return bits;
  };

  std::uint64_t used = choose(0.0, pick);
  if (used > budget_bits) {
    // Above the steepest cost-per-bit slope every unit takes the smallest width.
    double steepest = 0.0;
    for (std::size_t u = 0; u < n; ++u) {
      for (std::size_t a = 0; a < m; ++a) {
        for (std::size_t c = a + 1; c < m; ++c) {
          steepest = std::max(
              steepest, (table.at(u, a) - table.at(u, c)) / (table.widths[c] - table.widths[a]));
        }
      }
    }
    double lo = 0.0;
    double hi = 2.0 * steepest + 1e-300;
    std::vector<std::uint8_t> trial(n);
    for (int iteration = 0; iteration < 200 && lo < hi; ++iteration) {
      const double mid = 0.5 * (lo + hi);
      if (mid <= lo || mid >= hi) {
        break;
      }
      if (choose(mid, trial) <= budget_bits) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    used = choose(hi, pick);
  }

  // Greedy repair: spend the leftover bits on the upgrades with the best gain per bit.
  std::uint64_t left = budget_bits - used;
  struct Upgrade {
    double gain_per_bit;
    std::size_t unit;
    std::uint8_t from;
    std::uint8_t to;
  };
  const auto better = [](const Upgrade& a, const Upgrade& b) {
    if (a.gain_per_bit != b.gain_per_bit) {
      return a.gain_per_bit < b.gain_per_bit;
    }
    return a.unit > b.unit;  // lower unit first on ties
  };
  std::priority_queue<Upgrade, std::vector<Upgrade>, decltype(better)> queue(better);
  const auto offer = [&](std::size_t u) {
    const std::uint8_t from = pick[u];
    Upgrade best{0.0, u, from, from};
    for (std::size_t w = from + 1u; w < m; ++w) {
      const std::uint64_t bits = table.widths[w] - table.widths[from];
      if (bits > left) {
        break;
      }
      const double gain = (table.at(u, from) - table.at(u, w)) / static_cast<double>(bits);
      if (gain > best.gain_per_bit) {
        best.gain_per_bit = gain;
        best.to = static_cast<std::uint8_t>(w);
      }
    }
    if (best.to != from) {
      queue.push(best);
    }
  };
  if (left > 0) {
    for (std::size_t u = 0; u < n; ++u) {
      offer(u);
    }
  }
  while (!queue.empty() && left > 0) {
    const Upgrade top = queue.top();
    queue.pop();
    if (pick[top.unit] != top.from) {
      continue;  // stale
    }
    const std::uint64_t bits = table.widths[top.to] - table.widths[top.from];
    if (bits > left) {
      offer(top.unit);  // a smaller upgrade may still fit
      continue;
    }
    pick[top.unit] = top.to;
    left -= bits;
    offer(top.unit);
  }

  std::vector<std::uint8_t> out(n);
  for (std::size_t u = 0; u < n; ++u) {
    out[u] = table.widths[pick[u]];
  }
  return out;
}

}  // namespace statepool::calibration
