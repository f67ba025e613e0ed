#pragma once
// The one way the benchmarks time a piece of work: one warm-up run (page faults, caches),
// then the median of `iters` timed runs, in seconds. Header-only, benchmarks only.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace statepool::bench {

template <class Fn>
double median_seconds(std::uint32_t iters, Fn&& run) {
  run();
  std::vector<double> t;
  t.reserve(iters);
  for (std::uint32_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const auto stop = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace statepool::bench
