#pragma once
// Every codec on pages of many shapes: the instances the codec conformance suite
// (tests/kernels/test_codec_conformance.cpp) and the fused-step suite
// (tests/kernels/test_fused_step.cpp) run over, so that both cover the same codecs,
// variants, plans and odd shapes.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "statepool/kernels/format.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::testing {

struct Instance {
  std::string name;  // <codec>_<arch>_<K>x<V>[_g<group>][_<L>l<H>h][_conv][_<plan>][_<variant>]
  kernels::StateLayout layout;
};

inline void PrintTo(const Instance& instance, std::ostream* os) {
  *os << instance.name;
}

struct Shape {
  kernels::Arch arch;
  std::uint32_t key_dim;
  std::uint32_t value_dim;
  std::uint32_t group;  // int codecs only; 0 = default 128
  std::uint32_t layers = 1;
  std::uint32_t heads = 1;
  std::uint32_t conv_channels = 0;
  std::uint32_t conv_width = 0;
  kernels::DType conv_dtype = kernels::DType::bf16;
};

inline std::string describe(const kernels::StateLayout& l, const std::string& plan_tag) {
  std::string name = std::string(kernels::to_string(l.codec.id)) + "_" +
                     kernels::to_string(l.arch) + "_" + std::to_string(l.key_dim) + "x" +
                     std::to_string(l.value_dim);
  if (kernels::is_uniform_codec(l.codec.id) && l.codec.group_size != 0) {
    name += "_g" + std::to_string(l.codec.group_size);
  }
  if (l.num_layers * l.num_heads > 1) {
    name += "_" + std::to_string(l.num_layers) + "l" + std::to_string(l.num_heads) + "h";
  }
  if (l.conv_channels != 0) {
    name += "_conv";
  }
  if (!plan_tag.empty()) {
    name += "_" + plan_tag;
  }
  if (l.codec.variant == kernels::StepQuantVariant::spatial_only) {
    name += "_spatial_only";
  } else if (l.codec.variant == kernels::StepQuantVariant::temporal_only) {
    name += "_temporal_only";
  } else if (l.codec.variant == kernels::StepQuantVariant::no_refit) {
    name += "_no_refit";
  }
  return name;
}

inline kernels::StateLayout with_conv(kernels::StateLayout layout, std::uint32_t channels,
                                      std::uint32_t width, kernels::DType dtype) {
  layout.conv_channels = channels;
  layout.conv_width = width;
  layout.conv_dtype = dtype;
  return layout;
}

inline kernels::StateLayout shaped(kernels::CodecId id, const Shape& s) {
  kernels::StateLayout layout = head_layout(id, s.group, s.key_dim, s.value_dim);
  layout.arch = s.arch;
  layout.num_layers = s.layers;
  layout.num_heads = s.heads;
  return with_conv(layout, s.conv_channels, s.conv_width, s.conv_dtype);
}

inline std::vector<Instance> instances() {
  std::vector<Instance> out;
  const auto add = [&](const kernels::StateLayout& layout, const std::string& plan_tag = {}) {
    out.push_back({describe(layout, plan_tag), layout});
  };

  // Float and int codecs: full groups, a group spanning two rows, a short last group,
  // partial code quads, a single value; several layers and heads with conv states.
  const Shape uniform_shapes[] = {
      {kernels::Arch::gdn, 128, 128, 0},              // Qwen/Kimi heads, default group
      {kernels::Arch::gdn, 64, 128, 256},             // a group spans two rows
      {kernels::Arch::gdn, 16, 24, 32, 3, 4, 10, 3},  // n = 384: 12 full groups
      {kernels::Arch::gdn, 10, 10, 32},               // last group of 4
      {kernels::Arch::gdn, 7, 5, 12, 2, 3, 5, 2,
       kernels::DType::f32},          // last group of 11, partial quad
      {kernels::Arch::gdn, 3, 3, 4},  // last group of 1
      {kernels::Arch::gdn, 1, 1, 4},  // a single value
      {kernels::Arch::kda, 16, 24, 32, 2, 2, 4, 3,
       kernels::DType::bf16}};  // the arch is layout-only here
  for (const kernels::CodecId id :
       {kernels::CodecId::fp32, kernels::CodecId::bf16, kernels::CodecId::fp16,
        kernels::CodecId::int4, kernels::CodecId::int6, kernels::CodecId::int8}) {
    for (const Shape& s : uniform_shapes) {
      Shape shape = s;
      if (kernels::is_float_codec(id)) {
        shape.group = 0;  // ignored by the float codecs; keeps the names short
      }
      add(shaped(id, shape));
    }
  }

  // DSQ: the GDN head layout for either arch, no plan.
  const Shape dsq_shapes[] = {{kernels::Arch::gdn, 7, 5, 0},
                              {kernels::Arch::gdn, 1, 1, 0},
                              {kernels::Arch::gdn, 128, 128, 0},
                              {kernels::Arch::kda, 24, 36, 0, 1, 2},
                              {kernels::Arch::kda, 16, 24, 0, 2, 2, 4, 3}};
  for (const kernels::CodecId id : {kernels::CodecId::dsq4, kernels::CodecId::dsq6}) {
    for (const Shape& s : dsq_shapes) {
      add(shaped(id, s));
    }
  }

  // STEPQuant: every variant of plans with every width and pivots, plans without pivots
  // (the "pivots off" ablation), tiny and odd heads.
  struct PlanCase {
    kernels::stepquant::Plan plan;
    kernels::CodecId codec;
    std::uint32_t conv_channels;
    std::uint32_t conv_width;
    const char* tag;
  };
  const PlanCase plans[] = {
      {gdn_plan6(), kernels::CodecId::stepquant6, 10, 3, "mixed"},
      {gdn_plan4(), kernels::CodecId::stepquant4, 0, 0, "mixed"},
      {kda_plan4(20), kernels::CodecId::stepquant4, 0, 0, "mixed"},
      {kda_plan4(21), kernels::CodecId::stepquant4, 0, 0, "mixed"},
      {kda_plan6(), kernels::CodecId::stepquant6, 6, 2, "mixed"},
      {make_plan(
           kernels::Arch::kda, 1, 2, 8, 20, 4,
           [](std::size_t u) { return static_cast<std::uint8_t>(2 + 2 * (u % 4)); },
           random_impact(5)),
       kernels::CodecId::stepquant4, 0, 0, "nopivot"}};
  for (const PlanCase& c : plans) {
    for (const kernels::StepQuantVariant variant :
         {kernels::StepQuantVariant::full, kernels::StepQuantVariant::spatial_only,
          kernels::StepQuantVariant::temporal_only, kernels::StepQuantVariant::no_refit}) {
      add(plan_layout(c.plan, c.codec, variant, c.conv_channels, c.conv_width), c.tag);
    }
  }
  const kernels::stepquant::Plan uniform6 = make_plan(
      kernels::Arch::gdn, 2, 3, 7, 5, 6, [](std::size_t) { return std::uint8_t{6}; },
      random_impact(6));
  for (const kernels::StepQuantVariant variant :
       {kernels::StepQuantVariant::full, kernels::StepQuantVariant::temporal_only}) {
    add(with_conv(plan_layout(uniform6, kernels::CodecId::stepquant6, variant), 5, 2,
                  kernels::DType::f32),
        "nopivot");
  }
  add(plan_layout(uniform_plan(kernels::Arch::gdn, 1, 1, 1, 1, 6), kernels::CodecId::stepquant6),
      "uniform");
  add(plan_layout(make_plan(kernels::Arch::gdn, 1, 2, 3, 33, 4,
                            [](std::size_t u) {
                              return static_cast<std::uint8_t>(
                                  u == 0 ? 2 : kernels::stepquant::kPivotWidth);
                            }),
                  kernels::CodecId::stepquant4),
      "2bit_pivot");
  add(plan_layout(make_plan(kernels::Arch::kda, 1, 1, 3, 7, 4,
                            [](std::size_t u) { return static_cast<std::uint8_t>(2u << u); }),
                  kernels::CodecId::stepquant4),
      "mixed");
  return out;
}

}  // namespace statepool::testing
