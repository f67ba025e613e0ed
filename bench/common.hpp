#pragma once
// What the benchmarks share: the one way they time a piece of work (one warm-up run for
// page faults and caches, then the median of `iters` timed runs, in seconds), the GDN
// layout they measure on, and the stand-in for a calibrated STEPQuant plan.
// Header-only, benchmarks only.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

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

/// A plan built here, not calibrated, with unit impact factors: every unit (a GDN head, a
/// KDA key row) at `budget` bits, except every 16th unit (from 3) one width step wider
/// (8 at a 6-bit budget, 6 at 4), every 16th (from 7) one step narrower (4 at 6, 2 at 4),
/// and up to two FP16 pivots (units 5 and units / 2 + 1). `who` names the benchmark in
/// the plan's source field.
inline std::shared_ptr<const kernels::stepquant::Plan> synthetic_plan(kernels::Arch arch,
                                                                      std::uint32_t layers,
                                                                      std::uint32_t heads,
                                                                      std::uint32_t budget,
                                                                      const std::string& who) {
  auto plan = std::make_shared<kernels::stepquant::Plan>();
  plan->arch = arch;
  plan->num_layers = layers;
  plan->num_heads = heads;
  plan->key_dim = 128;
  plan->value_dim = 128;
  plan->budget_bits = budget;
  const std::size_t units =
      std::size_t{layers} * heads * (arch == kernels::Arch::kda ? plan->key_dim : 1u);
  const auto width = static_cast<std::uint8_t>(budget);
  plan->widths.assign(units, width);
  for (std::size_t u = 0; u < units; ++u) {
    if (u % 16 == 3) {
      plan->widths[u] = static_cast<std::uint8_t>(width + 2);
    } else if (u % 16 == 7) {
      plan->widths[u] = static_cast<std::uint8_t>(width - 2);
    }
  }
  for (const std::size_t u : {std::size_t{5}, units / 2 + 1}) {
    if (u < units && units > 2) {
      plan->widths[u] = kernels::stepquant::kPivotWidth;
    }
  }
  plan->impact.assign(std::size_t{layers} * heads * plan->key_dim, 1.0f);
  plan->source = who + " synthetic plan (unit impact)";
  return plan;
}

/// The items of a comma-separated list ("1,32,128" -> "1", "32", "128").
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

/// A comma-separated list of batch sizes in [1, 65536]; std::invalid_argument naming
/// `option` otherwise.
inline std::vector<std::uint32_t> parse_batches(const std::string& text, const char* option) {
  std::vector<std::uint32_t> out;
  for (const std::string& item : split_list(text)) {
    std::size_t used = 0;
    unsigned long value = 0;
    try {
      value = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value == 0 || value > 65536) {
      throw std::invalid_argument(std::string(option) + ": '" + item +
                                  "' is not a batch size between 1 and 65536");
    }
    out.push_back(static_cast<std::uint32_t>(value));
  }
  if (out.empty()) throw std::invalid_argument(std::string(option) + ": no batch size given");
  return out;
}

/// The layer shapes of the fused-step benchmarks (one linear layer, K = V = 128).
struct StepShape {
  const char* name;
  kernels::Arch arch;
  std::uint32_t heads;     ///< state (value) heads
  std::uint32_t qk_heads;  ///< q/k heads
};
inline constexpr StepShape kStepShapes[] = {
    {"qwen3-next", kernels::Arch::gdn, 32, 16},   // 32 value heads share 16 q/k heads
    {"kimi-linear", kernels::Arch::kda, 32, 32},  // a gate per key channel
};

/// One layer of `shape` under `codec` (no conv state: the step does not touch it), with
/// synthetic_plan for the stepquant codecs.
inline kernels::StateLayout step_layout(const StepShape& shape, kernels::CodecId codec,
                                        const std::string& who) {
  kernels::StateLayout l = gdn_layout(1, shape.heads, 0, codec);
  l.name = shape.name;
  l.arch = shape.arch;
  l.conv_width = 0;
  if (codec == kernels::CodecId::stepquant6 || codec == kernels::CodecId::stepquant4) {
    l.plan = synthetic_plan(shape.arch, 1, shape.heads,
                            codec == kernels::CodecId::stepquant6 ? 6 : 4, who);
  }
  return l;
}

}  // namespace statepool::bench
