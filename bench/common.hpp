#pragma once
// What the benchmarks share: the one way they time a piece of work (one warm-up run for
// page faults and caches, then the median of `iters` timed runs, in seconds), and the
// GDN layout they measure on. Header-only, benchmarks only.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "statepool/kernels/layout.hpp"

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

/// `layers` x `heads` GDN heads of 128 x 128 with a bf16 conv state of `conv_channels` x 3
/// (Qwen3-Next: 8192 channels; Qwen3.5-27B: 10240), under `codec`.
inline kernels::StateLayout gdn_layout(std::uint32_t layers, std::uint32_t heads,
                                       std::uint32_t conv_channels, kernels::CodecId codec) {
  kernels::StateLayout layout;
  layout.name = "bench";
  layout.num_layers = layers;
  layout.num_heads = heads;
  layout.key_dim = 128;
  layout.value_dim = 128;
  layout.conv_channels = conv_channels;
  layout.conv_width = 3;
  layout.conv_dtype = kernels::DType::bf16;
  layout.codec = {codec, 0};
  return layout;
}

}  // namespace statepool::bench
