// stepquant4/6 and dsq4/6 as page codecs, what is theirs alone: exact page sizes from the
// plan (computed by hand here), the byte format (rebuilt independently from the fit with
// random-access packing), heads outside the plan, what the ablation variants change,
// layout plumbing (plan required, plan matching, identity), and accuracy against
// int6/int4 on synthetic states. The contract they share with every codec (decode ==
// reconstruct(fit), bounds, non-finite rejection, staging, sizes) is
// test_codec_conformance.cpp.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/fit.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using stepquant::FitKind;
using stepquant::HeadFit;
using stepquant::kPivotWidth;
using stepquant::Plan;
using stepquant::Refit;
using testing::gdn_plan4;
using testing::gdn_plan6;
using testing::kda_plan4;
using testing::kda_plan6;
using testing::make_plan;
using testing::plan_layout;

constexpr StepQuantVariant kVariants[] = {StepQuantVariant::full, StepQuantVariant::spatial_only,
                                          StepQuantVariant::temporal_only,
                                          StepQuantVariant::no_refit};

// ---------------------------------------------------------------------------------------
// Page sizes, by hand.

TEST(StepQuantCodec, GdnPageBytesByHand) {
  const Plan plan = gdn_plan6();
  // Full: 6-bit 256 + 256 + 12,288 = 12,800; 8-bit 16,896; 4-bit 8,704; pivot 32,768.
  // temporal_only: 256 + codes: 12,544 / 16,640 / 8,448; pivot 32,768.
  // spatial_only: every non-pivot head at 6 bits.
  // conv: 2 layers x 10 channels x 3 x bf16 = 120.
  const std::size_t full[] = {12800, 16896, 8704, 32768, 12800, 12800};
  const std::size_t temporal[] = {12544, 16640, 8448, 32768, 12544, 12544};
  const std::size_t spatial[] = {12800, 12800, 12800, 32768, 12800, 12800};
  const std::map<StepQuantVariant, const std::size_t*> expect = {
      {StepQuantVariant::full, full},
      {StepQuantVariant::spatial_only, spatial},
      {StepQuantVariant::temporal_only, temporal},
      {StepQuantVariant::no_refit, full}};
  for (const auto& [variant, heads] : expect) {
    const PageCodec page(plan_layout(plan, CodecId::stepquant6, variant, 10, 3));
    std::size_t offset = 0;
    for (std::uint32_t l = 0; l < 2; ++l) {
      for (std::uint32_t h = 0; h < 3; ++h) {
        EXPECT_EQ(page.codec().head_bytes(l, h), heads[l * 3 + h]) << to_string(variant);
        EXPECT_EQ(stepquant::head_bytes(plan, variant, l, h), heads[l * 3 + h]);
        EXPECT_EQ(page.head_offset(l, h), offset);
        offset += heads[l * 3 + h];
      }
    }
    EXPECT_EQ(page.conv_bytes(), 120u);
    EXPECT_EQ(page.page_bytes(), offset + 120);
    const std::size_t fp32 = 4 * (6 * 128 * 128 + 2 * 10 * 3);
    EXPECT_EQ(page.fp32_bytes(), fp32);
    EXPECT_DOUBLE_EQ(page.compression_ratio(),
                     static_cast<double>(fp32) / static_cast<double>(offset + 120));
  }
  EXPECT_EQ(PageCodec(plan_layout(plan, CodecId::stepquant6)).page_bytes(), 96768u);
}

TEST(StepQuantCodec, GdnBudget4PageBytesByHand) {
  const Plan plan = gdn_plan4();
  // 2-bit: 256 B row scales + 256 B column scales + 4,096 B codes = 4,608.
  const std::size_t full[] = {4608, 8704, 12800, 16896, 32768, 4608};
  const PageCodec page(plan_layout(plan, CodecId::stepquant4));
  for (std::uint32_t h = 0; h < 6; ++h) {
    EXPECT_EQ(page.codec().head_bytes(0, h), full[h]);
  }
  EXPECT_EQ(page.page_bytes(), 80384u);
  // spatial_only: every non-pivot head at 4 bits (never 2).
  const PageCodec spatial(plan_layout(plan, CodecId::stepquant4, StepQuantVariant::spatial_only));
  EXPECT_EQ(spatial.page_bytes(), 5 * 8704u + 32768u);
  // temporal_only 2-bit head: 256 B of row scales + 4,096 B of codes.
  const PageCodec temporal(plan_layout(plan, CodecId::stepquant4, StepQuantVariant::temporal_only));
  EXPECT_EQ(temporal.codec().head_bytes(0, 0), 4352u);
  // An odd 2-bit head: 3 x 33 -> 6 B of row scales, 66 B of column scales, ceil(99 * 2 /
  // 8) = 25 B of codes, 97 -> 100.
  EXPECT_EQ(stepquant::gdn_head_bytes(3, 33, 2), 100u);
}

TEST(StepQuantCodec, KdaPageBytesByHand) {
  {
    const Plan plan = kda_plan4(20);
    // Head 0: r 16 + c 40 = 56; rows 2,4,6,8,P,6,4,2 at V = 20: 5+10+15+20+40+15+10+5 = 120
    // -> 176. Head 1: 56 + 40 + 40 + 6 x 20 = 256.
    const PageCodec page(plan_layout(plan, CodecId::stepquant4));
    EXPECT_EQ(page.codec().head_bytes(0, 0), 176u);
    EXPECT_EQ(page.codec().head_bytes(0, 1), 256u);
    EXPECT_EQ(page.page_bytes(), 432u);
    // temporal_only: no column scales: 16 + 120 = 136 and 16 + 200 = 216.
    const PageCodec temporal(
        plan_layout(plan, CodecId::stepquant4, StepQuantVariant::temporal_only));
    EXPECT_EQ(temporal.codec().head_bytes(0, 0), 136u);
    EXPECT_EQ(temporal.codec().head_bytes(0, 1), 216u);
    // spatial_only: non-pivot rows at 4 bits: 56 + 7 x 10 + 40 = 166 -> 168;
    // 56 + 2 x 40 + 6 x 10 = 196.
    const PageCodec spatial(plan_layout(plan, CodecId::stepquant4, StepQuantVariant::spatial_only));
    EXPECT_EQ(spatial.codec().head_bytes(0, 0), 168u);
    EXPECT_EQ(spatial.codec().head_bytes(0, 1), 196u);
  }
  {
    // V = 21: rows take 6, 11, 18, 21 and 42 B; head 0: 16 + 42 + 6+11+18+21+42+18+11+6 =
    // 191 -> 192 (one byte of padding).
    const PageCodec page(plan_layout(kda_plan4(21), CodecId::stepquant4));
    EXPECT_EQ(page.codec().head_bytes(0, 0), 192u);
  }
}

TEST(StepQuantCodec, DsqPageBytes) {
  StateLayout layout = testing::qwen3_next_layout(CodecId::dsq6);
  const PageCodec dsq6(layout);
  EXPECT_EQ(dsq6.codec().head_bytes(0, 0), 12800u);
  // 1,152 heads x 12,800 + conv 1,769,472.
  EXPECT_EQ(dsq6.page_bytes(), 1152u * 12800u + 1769472u);
  layout.codec.id = CodecId::dsq4;
  EXPECT_EQ(PageCodec(layout).codec().head_bytes(0, 0), 8704u);
}

// ---------------------------------------------------------------------------------------
// The byte format, rebuilt from the fit with random-access packing (set_code).

class Bytes {
 public:
  explicit Bytes(std::size_t n) : b_(n, std::byte{0}) {}
  void half(float v) {
    const std::uint16_t h = float_to_half_bits(v);
    b_[pos_++] = static_cast<std::byte>(h & 0xFF);
    b_[pos_++] = static_cast<std::byte>(h >> 8);
  }
  // n codes u (already offset) packed from the current position at `bits` bits.
  void codes(const std::vector<std::uint32_t>& u, std::uint32_t bits) {
    auto* p = reinterpret_cast<std::uint8_t*>(b_.data() + pos_);
    for (std::size_t k = 0; k < u.size(); ++k) {
      set_code(p, k, bits, u[k]);
    }
    pos_ += bits == 6 ? 3 * ((u.size() + 3) / 4) : (u.size() * bits + 7) / 8;
  }
  [[nodiscard]] const std::vector<std::byte>& bytes() const { return b_; }

 private:
  std::vector<std::byte> b_;
  std::size_t pos_ = 0;
};

std::vector<std::byte> expected_head(Arch arch, StepQuantVariant variant, const HeadFit& fit,
                                     const std::vector<std::uint8_t>& widths, std::size_t size) {
  const std::size_t K = fit.key_dim;
  const std::size_t V = fit.value_dim;
  Bytes out(size);
  const auto offset_codes = [&](std::size_t begin, std::size_t n, std::uint32_t bits) {
    std::vector<std::uint32_t> u(n);
    for (std::size_t k = 0; k < n; ++k) {
      const int z = fit.codes[begin + k];
      u[k] = stepquant::unit_code(z, bits);
    }
    out.codes(u, bits);
  };
  if (arch == Arch::gdn) {
    const std::uint32_t b = widths[0];
    if (b == kPivotWidth) {
      for (const float v : fit.pivot_values) {
        out.half(v);
      }
      return out.bytes();
    }
    for (const float s : fit.row_scale) {
      out.half(s);
    }
    if (variant != StepQuantVariant::temporal_only) {
      for (const float c : fit.col_scale) {
        out.half(c);
      }
    }
    offset_codes(0, K * V, b);
    return out.bytes();
  }
  for (const float s : fit.row_scale) {
    out.half(s);
  }
  if (variant != StepQuantVariant::temporal_only) {
    for (const float c : fit.col_scale) {
      out.half(c);
    }
  }
  std::size_t pivot = 0;
  for (std::size_t i = 0; i < K; ++i) {
    if (widths[i] == kPivotWidth) {
      for (std::size_t j = 0; j < V; ++j) {
        out.half(fit.pivot_values[pivot++]);
      }
    } else {
      offset_codes(i * V, V, widths[i]);
    }
  }
  return out.bytes();
}

std::vector<std::uint8_t> stored_widths(const Plan& plan, StepQuantVariant variant, std::uint32_t l,
                                        std::uint32_t h) {
  std::vector<std::uint8_t> w(plan.key_dim);
  for (std::uint32_t i = 0; i < plan.key_dim; ++i) {
    w[i] = stepquant::stored_width(plan, variant, l, h, plan.arch == Arch::kda ? i : 0);
  }
  return w;
}

void fit_for(const Plan& plan, StepQuantVariant variant, std::uint32_t l, std::uint32_t h,
             std::span<const float> x, HeadFit& fit) {
  const auto widths = stored_widths(plan, variant, l, h);
  if (variant == StepQuantVariant::temporal_only) {
    stepquant::fit_head_absmax(plan.arch, x, plan.key_dim, plan.value_dim, widths, fit);
  } else {
    stepquant::fit_head(plan.arch, x, plan.key_dim, plan.value_dim, widths, plan.head_impact(l, h),
                        fit, variant == StepQuantVariant::no_refit ? Refit::off : Refit::on);
  }
}

struct Case {
  const char* what;
  Plan plan;
  CodecId codec;
};

std::vector<Case> cases() {
  return {{"gdn6", gdn_plan6(), CodecId::stepquant6},
          {"gdn4", gdn_plan4(), CodecId::stepquant4},
          {"kda4_v20", kda_plan4(20), CodecId::stepquant4},
          {"kda4_v21", kda_plan4(21), CodecId::stepquant4},
          {"kda6", kda_plan6(), CodecId::stepquant6}};
}

TEST(StepQuantCodec, PageIsTheFitInTheDocumentedFormat) {
  for (const auto& c : cases()) {
    for (const StepQuantVariant variant : kVariants) {
      SCOPED_TRACE(std::string(c.what) + " " + to_string(variant));
      const StateLayout layout = plan_layout(c.plan, c.codec, variant, 6, 2);
      const PageCodec page(layout);
      const auto staged = synthetic::synthetic_staged_state(layout, 200, 9, DType::f32);
      std::vector<std::byte> bytes(page.page_bytes(), std::byte{0xA5});
      page.encode(staged, DType::f32, bytes);
      const auto values = testing::bytes_to_floats(std::span<const std::byte>(staged).first(
          page.staged_bytes(DType::f32) - page.conv_bytes()));
      const std::size_t n = std::size_t{c.plan.key_dim} * c.plan.value_dim;
      HeadFit fit;
      for (std::uint32_t l = 0; l < c.plan.num_layers; ++l) {
        for (std::uint32_t h = 0; h < c.plan.num_heads; ++h) {
          const std::size_t index = std::size_t{l} * c.plan.num_heads + h;
          const std::span<const float> x(values.data() + index * n, n);
          fit_for(c.plan, variant, l, h, x, fit);
          const auto widths = stored_widths(c.plan, variant, l, h);
          // Bytes.
          const std::size_t size = page.codec().head_bytes(l, h);
          const auto expect = expected_head(c.plan.arch, variant, fit, widths, size);
          const std::span<const std::byte> got(bytes.data() + page.head_offset(l, h), size);
          ASSERT_EQ(testing::first_difference(got, expect), -1) << "layer " << l << " head " << h;
        }
      }
    }
  }
}

TEST(StepQuantCodec, DsqPageIsItsFitInTheGdnFormat) {
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (const CodecId id : {CodecId::dsq4, CodecId::dsq6}) {
      StateLayout layout = testing::head_layout(id, 0, 24, 36);
      layout.arch = arch;
      layout.num_heads = 2;
      const PageCodec page(layout);
      const auto staged = synthetic::synthetic_staged_state(layout, 200, 3, DType::f32);
      std::vector<std::byte> bytes(page.page_bytes());
      page.encode(staged, DType::f32, bytes);
      const auto values = testing::bytes_to_floats(staged);
      const std::uint32_t b = id == CodecId::dsq4 ? 4 : 6;
      const std::size_t n = 24 * 36;
      HeadFit fit;
      for (std::uint32_t h = 0; h < 2; ++h) {
        stepquant::fit_head_dsq(std::span<const float>(values.data() + h * n, n), 24, 36, b, fit);
        const std::vector<std::uint8_t> widths(24, static_cast<std::uint8_t>(b));
        const auto expect = expected_head(Arch::gdn, StepQuantVariant::full, fit, widths,
                                          page.codec().head_bytes(0, h));
        ASSERT_EQ(testing::first_difference(std::span<const std::byte>(bytes).subspan(
                                                page.head_offset(0, h), expect.size()),
                                            expect),
                  -1);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Heads of a plan (wrong buffer sizes in general: test_codec_conformance.cpp).

TEST(StepQuantCodec, RejectsHeadsOutsideThePlanAndAnotherHeadsSize) {
  const StateLayout layout = plan_layout(kda_plan4(20), CodecId::stepquant4);
  const auto codec = make_codec(layout);
  std::vector<float> values(8 * 20, 1.0f);
  std::vector<std::byte> bytes(codec->head_bytes(0, 0));
  EXPECT_NO_THROW(codec->encode_head(0, 0, values, bytes));
  // Head 1 has another size.
  EXPECT_THROW(codec->encode_head(0, 1, values, bytes), std::invalid_argument);
  EXPECT_THROW(codec->decode_head(0, 1, bytes, values), std::invalid_argument);
  EXPECT_THROW(codec->encode_head(0, 2, values, bytes), std::invalid_argument);
  EXPECT_THROW(codec->encode_head(1, 0, values, bytes), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Variants.

TEST(StepQuantCodec, VariantsChangeWhatTheyShould) {
  const Plan plan = kda_plan6();
  const auto x_all = [&] {
    const auto staged = synthetic::synthetic_staged_state(plan_layout(plan, CodecId::stepquant6),
                                                          200, 4, DType::f32);
    return testing::bytes_to_floats(staged);
  }();
  const std::size_t n = std::size_t{plan.key_dim} * plan.value_dim;
  const std::span<const float> x(x_all.data(), n);
  HeadFit full;
  HeadFit spatial;
  HeadFit temporal;
  fit_for(plan, StepQuantVariant::full, 0, 0, x, full);
  fit_for(plan, StepQuantVariant::spatial_only, 0, 0, x, spatial);
  fit_for(plan, StepQuantVariant::temporal_only, 0, 0, x, temporal);
  const auto w_full = stored_widths(plan, StepQuantVariant::full, 0, 0);
  const auto w_spatial = stored_widths(plan, StepQuantVariant::spatial_only, 0, 0);
  const auto w_temporal = stored_widths(plan, StepQuantVariant::temporal_only, 0, 0);
  // spatial_only: the budget for every non-pivot row, pivots kept; same dual-axis fit.
  for (std::size_t i = 0; i < plan.key_dim; ++i) {
    EXPECT_EQ(w_spatial[i], w_full[i] == kPivotWidth ? kPivotWidth : 6);
    EXPECT_EQ(w_temporal[i], w_full[i]);
  }
  EXPECT_EQ(full.kind, FitKind::dual_axis_grid8);
  EXPECT_EQ(spatial.kind, FitKind::dual_axis_grid8);
  EXPECT_EQ(spatial.pivot_values, full.pivot_values);
  // temporal_only: per-row absmax scales at the plan's widths, no column scales.
  EXPECT_EQ(temporal.kind, FitKind::row_absmax);
  EXPECT_TRUE(temporal.col_scale.empty());
  EXPECT_EQ(temporal.pivot_values, full.pivot_values);
  for (std::size_t i = 0; i < plan.key_dim; ++i) {
    if (w_full[i] == kPivotWidth) {
      EXPECT_EQ(temporal.row_scale[i], 0.0f);
      continue;
    }
    float absmax = 0.0f;
    for (std::size_t j = 0; j < plan.value_dim; ++j) {
      absmax = std::max(absmax, std::fabs(x[i * plan.value_dim + j]));
    }
    EXPECT_EQ(temporal.row_scale[i],
              testing::fp16(absmax / static_cast<float>(stepquant::level_max(w_full[i]))));
  }
  // The impact factors matter to full and spatial_only, not to temporal_only.
  Plan flat = plan;
  std::fill(flat.impact.begin(), flat.impact.end(), 1.0f);
  HeadFit full_flat;
  HeadFit temporal_flat;
  fit_for(flat, StepQuantVariant::full, 0, 0, x, full_flat);
  fit_for(flat, StepQuantVariant::temporal_only, 0, 0, x, temporal_flat);
  EXPECT_NE(full_flat.row_scale, full.row_scale);
  EXPECT_EQ(temporal_flat.row_scale, temporal.row_scale);
  EXPECT_EQ(temporal_flat.codes, temporal.codes);
}

// ---------------------------------------------------------------------------------------
// Layout plumbing.

TEST(StepQuantLayout, NeedsAMatchingPlan) {
  const Plan plan6 = gdn_plan6();
  StateLayout layout = plan_layout(plan6, CodecId::stepquant6);
  EXPECT_EQ(validate(layout), "");
  EXPECT_NO_THROW((void)make_codec(layout));

  const auto rejects = [](const StateLayout& l, const std::string& message) {
    EXPECT_EQ(validate(l), message);
    try {
      (void)make_codec(l);
      ADD_FAILURE() << "make_codec accepted: " << message;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "invalid layout: " + message);
    }
  };
  StateLayout no_plan = layout;
  no_plan.plan = nullptr;
  rejects(no_plan, "codec stepquant6 needs a calibration plan");
  no_plan.codec.id = CodecId::stepquant4;
  rejects(no_plan, "codec stepquant4 needs a calibration plan");

  StateLayout budget = layout;
  budget.codec.id = CodecId::stepquant4;
  rejects(budget, "plan budget is 6 bits, codec stepquant4 needs a 4-bit plan");

  StateLayout arch = layout;
  arch.arch = Arch::kda;
  rejects(arch, "plan is for arch gdn, layout is kda");

  StateLayout dims = layout;
  dims.num_heads = 4;
  rejects(dims, "plan num_heads is 3, layout num_heads is 4");
  dims = layout;
  dims.value_dim = 64;
  rejects(dims, "plan value_dim is 128, layout value_dim is 64");

  StateLayout bad_plan = layout;
  Plan corrupt = plan6;
  corrupt.impact[700] = -0.5f;
  bad_plan.plan = std::make_shared<const Plan>(corrupt);
  rejects(bad_plan, "plan: impact[700] is -0.5; impact factors must be finite and > 0");

  StateLayout other_codec = layout;
  other_codec.codec.id = CodecId::int6;
  rejects(other_codec, "codec int6 does not use a calibration plan; plan must be null");
  other_codec.codec.id = CodecId::dsq6;
  rejects(other_codec, "codec dsq6 does not use a calibration plan; plan must be null");

  StateLayout variant = layout;
  variant.codec.variant = static_cast<StepQuantVariant>(9);
  rejects(variant, "codec.variant must be full, spatial_only, temporal_only or no_refit, got 9");
}

TEST(StepQuantLayout, IdentityComparesVariantAndPlan) {
  const Plan plan = gdn_plan6();
  const StateLayout a = plan_layout(plan, CodecId::stepquant6);
  StateLayout b = a;  // same plan object
  b.name = "other";
  EXPECT_TRUE(a.same_shape_and_codec(b));
  b.plan = std::make_shared<const Plan>(plan);  // an equal copy
  EXPECT_TRUE(a.same_shape_and_codec(b));
  Plan provenance = plan;
  provenance.source = "another trace";
  provenance.tokens = 99;
  b.plan = std::make_shared<const Plan>(provenance);  // provenance does not change pages
  EXPECT_TRUE(a.same_shape_and_codec(b));
  Plan widths = plan;
  widths.widths[0] = 8;
  b.plan = std::make_shared<const Plan>(widths);
  EXPECT_FALSE(a.same_shape_and_codec(b));
  Plan impact = plan;
  impact.impact[7] = std::nextafter(impact.impact[7], 10.0f);
  b.plan = std::make_shared<const Plan>(impact);
  EXPECT_FALSE(a.same_shape_and_codec(b));
  b = a;
  b.plan = nullptr;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  EXPECT_FALSE(b.same_shape_and_codec(a));
  b = a;
  b.codec.variant = StepQuantVariant::temporal_only;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  b = a;
  b.codec.group_size = 64;  // ignored by stepquant
  EXPECT_TRUE(a.same_shape_and_codec(b));
  // The variant is not part of other codecs' identity.
  StateLayout i1 = testing::qwen3_next_layout(CodecId::int6);
  StateLayout i2 = i1;
  i2.codec.variant = StepQuantVariant::spatial_only;
  EXPECT_TRUE(i1.same_shape_and_codec(i2));
}

// ---------------------------------------------------------------------------------------
// Accuracy on synthetic states (a sanity check of the whole path, not a tuned target).

struct Accuracy {
  double rel_rms = 0.0;
  std::size_t head_bytes = 0;
};

Accuracy measure(const StateLayout& layout, std::uint32_t seeds) {
  const PageCodec page(layout);
  double err2 = 0.0;
  double ref2 = 0.0;
  for (std::uint32_t seed = 0; seed < seeds; ++seed) {
    const auto staged = synthetic::synthetic_staged_state(layout, 400, 77 + seed, DType::f32);
    std::vector<std::byte> bytes(page.page_bytes());
    page.encode(staged, DType::f32, bytes);
    std::vector<std::byte> out(staged.size());
    page.decode(bytes, DType::f32, out);
    const auto x = testing::bytes_to_floats(staged);
    const auto y = testing::bytes_to_floats(out);
    const std::size_t n =
        std::size_t{layout.num_layers} * layout.num_heads * layout.key_dim * layout.value_dim;
    for (std::size_t k = 0; k < n; ++k) {
      const double d = static_cast<double>(x[k]) - y[k];
      err2 += d * d;
      ref2 += static_cast<double>(x[k]) * x[k];
    }
  }
  return {std::sqrt(err2 / ref2), page.codec().head_bytes(0, 0)};
}

StateLayout heads_layout(Arch arch, CodecId id, std::uint32_t heads) {
  StateLayout layout = testing::head_layout(id, 0, 128, 128);
  layout.arch = arch;
  layout.num_heads = heads;
  return layout;
}

TEST(StepQuantAccuracy, UniformPlanBeatsIntAtComparableBytes) {
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (const std::uint32_t budget : {6u, 4u}) {
      const CodecId sq = budget == 6 ? CodecId::stepquant6 : CodecId::stepquant4;
      const CodecId uniform = budget == 6 ? CodecId::int6 : CodecId::int4;
      const CodecId dsq = budget == 6 ? CodecId::dsq6 : CodecId::dsq4;
      const Plan plan = testing::uniform_plan(arch, 1, 8, 128, 128, budget);  // unit impact
      const Accuracy a_sq = measure(plan_layout(plan, sq), 2);
      const Accuracy a_int = measure(heads_layout(arch, uniform, 8), 2);
      const Accuracy a_dsq = measure(heads_layout(arch, dsq, 8), 2);
      std::printf(
          "[ accuracy ] %s budget %u: %s %.4g (%zu B/head)  %s %.4g (%zu B/head)  "
          "%s %.4g (%zu B/head)\n",
          to_string(arch), budget, to_string(sq), a_sq.rel_rms, a_sq.head_bytes, to_string(uniform),
          a_int.rel_rms, a_int.head_bytes, to_string(dsq), a_dsq.rel_rms, a_dsq.head_bytes);
      const std::string key = std::string(to_string(arch)) + std::to_string(budget);
      RecordProperty("rel_rms_" + key + "_stepquant", std::to_string(a_sq.rel_rms));
      RecordProperty("rel_rms_" + key + "_int", std::to_string(a_int.rel_rms));
      RecordProperty("rel_rms_" + key + "_dsq", std::to_string(a_dsq.rel_rms));
      // Comparable bytes: the dual-axis head spends 2V bytes more on column scales.
      EXPECT_EQ(a_sq.head_bytes, a_int.head_bytes + 256);
      EXPECT_LT(a_sq.rel_rms, a_int.rel_rms) << key;
    }
  }
}

}  // namespace
}  // namespace statepool::kernels
