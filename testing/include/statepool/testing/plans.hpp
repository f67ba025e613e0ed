#pragma once
// Hand-built STEPQuant plans and the layouts around them, for the codec tests.
//
// Thread-safety: pure functions (random_impact's functor owns its engine: one thread).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::testing {

/// A valid plan: width(unit) per unit (GDN: head index l*H + h; KDA: row index
/// (l*H + h)*K + i), impact(row) per key row (default 1).
inline kernels::stepquant::Plan make_plan(kernels::Arch arch, std::uint32_t layers,
                                          std::uint32_t heads, std::uint32_t key_dim,
                                          std::uint32_t value_dim, std::uint32_t budget,
                                          const std::function<std::uint8_t(std::size_t)>& width,
                                          const std::function<float(std::size_t)>& impact = {}) {
  kernels::stepquant::Plan plan;
  plan.arch = arch;
  plan.num_layers = layers;
  plan.num_heads = heads;
  plan.key_dim = key_dim;
  plan.value_dim = value_dim;
  plan.budget_bits = budget;
  plan.widths.resize(plan.units());
  for (std::size_t u = 0; u < plan.widths.size(); ++u) {
    plan.widths[u] = width(u);
  }
  plan.impact.resize(std::size_t{layers} * heads * key_dim);
  for (std::size_t i = 0; i < plan.impact.size(); ++i) {
    plan.impact[i] = impact ? impact(i) : 1.0f;
  }
  plan.source = "test";
  return plan;
}

/// Every unit at the budget width, unit impact.
inline kernels::stepquant::Plan uniform_plan(kernels::Arch arch, std::uint32_t layers,
                                             std::uint32_t heads, std::uint32_t key_dim,
                                             std::uint32_t value_dim, std::uint32_t budget) {
  return make_plan(arch, layers, heads, key_dim, value_dim, budget,
                   [budget](std::size_t) { return static_cast<std::uint8_t>(budget); });
}

/// A plan with every width and pivots, built here, not calibrated, with unit impact, for
/// layers x heads heads of 128 x 128 (the benchmarks' stand-in for a calibrated plan):
/// every unit (a GDN head, a KDA key row) at `budget` bits, except every 16th unit (from
/// 3) one width step wider (8 at a 6-bit budget, 6 at 4), every 16th (from 7) one step
/// narrower (4 at 6, 2 at 4), and up to two FP16 pivots (units 5 and units / 2 + 1).
/// `who` names the user in the plan's source field.
inline std::shared_ptr<const kernels::stepquant::Plan> mixed_width_plan(kernels::Arch arch,
                                                                        std::uint32_t layers,
                                                                        std::uint32_t heads,
                                                                        std::uint32_t budget,
                                                                        const std::string& who) {
  const std::size_t units = std::size_t{layers} * heads * (arch == kernels::Arch::kda ? 128u : 1u);
  const auto width = static_cast<std::uint8_t>(budget);
  auto plan = std::make_shared<kernels::stepquant::Plan>(
      make_plan(arch, layers, heads, 128, 128, budget, [&](std::size_t u) -> std::uint8_t {
        if (units > 2 && (u == 5 || u == units / 2 + 1)) return kernels::stepquant::kPivotWidth;
        if (u % 16 == 3) return static_cast<std::uint8_t>(width + 2);
        if (u % 16 == 7) return static_cast<std::uint8_t>(width - 2);
        return width;
      }));
  plan->source = who + " synthetic plan (unit impact)";
  return plan;
}

/// Impact factors drawn log-normally around 1 (as calibration's geometric-mean
/// normalisation gives).
inline std::function<float(std::size_t)> random_impact(std::uint64_t seed) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return [rng](std::size_t) {
    std::normal_distribution<float> normal(0.0f, 0.5f);
    return std::exp(normal(*rng));
  };
}

/// The layout `plan` describes, with codec `codec` (stepquant4/6), `variant` and an
/// optional bf16 conv state.
inline kernels::StateLayout plan_layout(
    const kernels::stepquant::Plan& plan, kernels::CodecId codec,
    kernels::StepQuantVariant variant = kernels::StepQuantVariant::full,
    std::uint32_t conv_channels = 0, std::uint32_t conv_width = 0) {
  kernels::StateLayout layout;
  layout.name = "stepquant-test";
  layout.arch = plan.arch;
  layout.num_layers = plan.num_layers;
  layout.num_heads = plan.num_heads;
  layout.key_dim = plan.key_dim;
  layout.value_dim = plan.value_dim;
  layout.conv_channels = conv_channels;
  layout.conv_width = conv_width;
  layout.conv_dtype = kernels::DType::bf16;
  layout.codec.id = codec;
  layout.codec.variant = variant;
  layout.plan = std::make_shared<const kernels::stepquant::Plan>(plan);
  return layout;
}

/// fp16(x) as a float (round to nearest even, saturating).
inline float fp16(float x) {
  return kernels::half_bits_to_float(kernels::float_to_half_bits(x));
}

inline bool is_fp16_exact(float x) {
  return kernels::float_bits(fp16(x)) == kernels::float_bits(x);
}

// --- example plans with every width, pivots and odd shapes (the codec tests' cases) ----

/// GDN, 2 layers x 3 heads, 128 x 128, budget 6: head widths 6, 8, 4, pivot, 6, 6.
inline kernels::stepquant::Plan gdn_plan6() {
  const std::uint8_t w[] = {6, 8, 4, kernels::stepquant::kPivotWidth, 6, 6};
  return make_plan(
      kernels::Arch::gdn, 2, 3, 128, 128, 6, [&](std::size_t u) { return w[u]; }, random_impact(1));
}

/// GDN, 1 layer x 6 heads, 128 x 128, budget 4: head widths 2, 4, 6, 8, pivot, 2.
inline kernels::stepquant::Plan gdn_plan4() {
  const std::uint8_t w[] = {2, 4, 6, 8, kernels::stepquant::kPivotWidth, 2};
  return make_plan(
      kernels::Arch::gdn, 1, 6, 128, 128, 4, [&](std::size_t u) { return w[u]; }, random_impact(2));
}

/// KDA, 1 layer x 2 heads, 8 x value_dim, budget 4. Row widths, head 0: 2 4 6 8 P 6 4 2;
/// head 1: P P 8 8 8 8 8 8.
inline kernels::stepquant::Plan kda_plan4(std::uint32_t value_dim) {
  constexpr std::uint8_t P = kernels::stepquant::kPivotWidth;
  const std::uint8_t w[] = {2, 4, 6, 8, P, 6, 4, 2, P, P, 8, 8, 8, 8, 8, 8};
  return make_plan(
      kernels::Arch::kda, 1, 2, 8, value_dim, 4, [&](std::size_t u) { return w[u]; },
      random_impact(3));
}

/// KDA, 2 layers x 2 heads, 16 x 24, budget 6: every width and some pivot rows.
inline kernels::stepquant::Plan kda_plan6() {
  const std::uint8_t w[] = {4, 6, 6, 8, kernels::stepquant::kPivotWidth, 6, 4, 6};
  return make_plan(
      kernels::Arch::kda, 2, 2, 16, 24, 6, [&](std::size_t u) { return w[(u * 5 + u / 7) % 8]; },
      random_impact(4));
}

}  // namespace statepool::testing
