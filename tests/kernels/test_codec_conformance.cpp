// The codec contract, one suite for every codec: fp32, bf16, fp16, int4, int6, int8,
// stepquant4, stepquant6 (full, spatial_only, temporal_only; plans with and without
// pivots), dsq4 and dsq6, on GDN and KDA pages of odd shapes, several layers and heads,
// with and without a conv state. What every codec promises (docs/codecs.md, codec.hpp,
// page.hpp):
//   - the page is exactly sum(head_bytes) + conv bytes, heads 4-byte multiples at their
//     prefix-sum offsets, sizes as the table of docs/codecs.md says;
//   - encode writes every byte of the page (padding zero) and nothing outside it, the same
//     bytes every time, on any thread;
//   - decode(encode(x)) is within the codec's bound and equals its oracle (reference.hpp
//     for the float and int codecs, reconstruct(fit) for the STEPQuant family), the conv
//     state is copied raw;
//   - re-encoding a decoded page is byte-stable where docs/codecs.md says so;
//   - NaN/Inf are refused with NonFiniteError naming layer, head, row and column, the page
//     left as it was; zeros decode to zeros, FP32 denormals to within their magnitude;
//   - f32 and bf16 staging (aligned or not) encode the same values to the same bytes;
//   - wrong dtypes and buffer sizes are refused with std::invalid_argument.
// Format details (exact scales, packing order, the fit's arithmetic) are tested beside
// each codec: test_uniform_edges.cpp, test_stepquant_codec.cpp, test_stepquant_fit.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/reference.hpp"
#include "statepool/kernels/stepquant/fit.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using stepquant::FitKind;
using stepquant::HeadFit;
using stepquant::kPivotWidth;
using stepquant::Plan;
using testing::bytes_to_floats;
using testing::first_difference;
using testing::float_bytes;
using testing::Instance;
using testing::instances;

// ---------------------------------------------------------------------------------------
// What docs/codecs.md says, transcribed independently of the code.

std::size_t packed(std::size_t n, std::uint32_t bits) {
  return bits == 6 ? 3 * ((n + 3) / 4) : (n * bits + 7) / 8;
}

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// Width the codec stores for row `row` of head (l, h): the plan's (a GDN head's width for
// every row), the budget for non-pivot units under spatial_only, the fixed width of dsq.
std::uint8_t row_width(const StateLayout& l, std::uint32_t layer, std::uint32_t head,
                       std::uint32_t row) {
  if (is_dsq_codec(l.codec.id)) {
    return l.codec.id == CodecId::dsq4 ? 4 : 6;
  }
  const Plan& plan = *l.plan;
  const std::size_t unit = std::size_t{layer} * l.num_heads + head;
  const std::uint8_t w =
      l.arch == Arch::gdn ? plan.widths[unit] : plan.widths[unit * l.key_dim + row];
  if (l.codec.variant == StepQuantVariant::spatial_only && w != kPivotWidth) {
    return static_cast<std::uint8_t>(plan.budget_bits);
  }
  return w;
}

std::vector<std::uint8_t> row_widths(const StateLayout& l, std::uint32_t layer,
                                     std::uint32_t head) {
  std::vector<std::uint8_t> w(l.key_dim);
  for (std::uint32_t i = 0; i < l.key_dim; ++i) {
    w[i] = row_width(l, layer, head, i);
  }
  return w;
}

// Bytes of head (l, h) before the zero padding to a multiple of 4 (the docs' table).
std::size_t unpadded_head_bytes(const StateLayout& l, std::uint32_t layer, std::uint32_t head) {
  const std::size_t K = l.key_dim;
  const std::size_t V = l.value_dim;
  const std::size_t n = K * V;
  const CodecId id = l.codec.id;
  switch (id) {
    case CodecId::fp32: return 4 * n;
    case CodecId::bf16:
    case CodecId::fp16: return 2 * n;
    case CodecId::int4:
    case CodecId::int6:
    case CodecId::int8:
      return 2 * ceil_div(n, effective_group_size(l.codec.group_size)) +
             packed(n, codec_code_bits(id));
    case CodecId::dsq4:
    case CodecId::dsq6: return 2 * K + 2 * V + packed(n, row_width(l, layer, head, 0));
    case CodecId::stepquant4:
    case CodecId::stepquant6: break;
  }
  const bool temporal = l.codec.variant == StepQuantVariant::temporal_only;
  if (l.arch == Arch::gdn) {
    const std::uint32_t b = row_width(l, layer, head, 0);
    if (b == kPivotWidth) return 2 * n;
    if (temporal) return 2 * K + packed(n, b);
    return 2 * K + 2 * V + packed(n, b);
  }
  std::size_t bytes = temporal ? 2 * K : 2 * K + 2 * V;
  for (std::uint32_t i = 0; i < K; ++i) {
    const std::uint32_t b = row_width(l, layer, head, i);
    bytes += b == kPivotWidth ? 2 * V : packed(V, b);
  }
  return bytes;
}

// Re-encoding a decoded head gives the same bytes: the float and int codecs (docs/codecs.md
// "Re-encoding", normal-range scales). The STEPQuant family recomputes its scales from the
// decoded values ("Re-encoding is not byte-stable").
bool reencode_is_byte_stable(CodecId id) {
  return is_float_codec(id) || is_uniform_codec(id);
}

// fp16 rounding: relative 2^-11 in the normal range, absolute 2^-25 below it.
double fp16_error_bound(double ax) {
  return ax * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
}

// ---------------------------------------------------------------------------------------
// The oracles and the per-value bound.

HeadFit fit_of(const StateLayout& l, std::uint32_t layer, std::uint32_t head,
               std::span<const float> x) {
  HeadFit fit;
  const auto widths = row_widths(l, layer, head);
  if (is_dsq_codec(l.codec.id)) {
    stepquant::fit_head_dsq(x, l.key_dim, l.value_dim, widths[0], fit);
  } else if (l.codec.variant == StepQuantVariant::temporal_only) {
    stepquant::fit_head_absmax(l.arch, x, l.key_dim, l.value_dim, widths, fit);
  } else {
    stepquant::fit_head(l.arch, x, l.key_dim, l.value_dim, widths, l.plan->head_impact(layer, head),
                        fit,
                        l.codec.variant == StepQuantVariant::no_refit ? stepquant::Refit::off
                                                                      : stepquant::Refit::on);
  }
  return fit;
}

// Per-value error bound of head (layer, head) of an encoded page, for input values x.
class HeadBound {
 public:
  HeadBound(const StateLayout& l, std::span<const std::byte> head_bytes, std::uint32_t layer,
            std::uint32_t head, std::span<const float> x)
      : layout_(l), head_bytes_(head_bytes) {
    if (is_stepquant_codec(l.codec.id) || is_dsq_codec(l.codec.id)) {
      fit_ = fit_of(l, layer, head, x);
      widths_ = row_widths(l, layer, head);
    }
  }

  [[nodiscard]] double operator()(std::size_t k, float value) const {
    const double ax = std::fabs(static_cast<double>(value));
    const CodecId id = layout_.codec.id;
    switch (id) {
      case CodecId::fp32: return 0.0;  // a copy
      case CodecId::bf16: return ax * std::ldexp(1.0, -8);
      case CodecId::fp16: return fp16_error_bound(ax);
      case CodecId::int4:
      case CodecId::int6:
      case CodecId::int8: {
        // Rounding to the grid costs at most s/2; the float quotient x / s adds at most
        // qmax ulps of 2^-24 relative (docs/codecs.md "Error bound").
        const double s =
            testing::stored_scale(head_bytes_, k / effective_group_size(layout_.codec.group_size));
        const double qmax = code_qmax(codec_code_bits(id));
        return 0.5 * s + s * qmax * std::ldexp(1.0, -22);
      }
      default: return fitted_bound(k, ax);
    }
  }

 private:
  // The nearest point of the fitted grid: half the spacing of its levels inside it (2
  // units apart in a four-level 2-bit row, which has no zero level), the distance to its
  // end beyond (a clamped code); pivots are fp16 values.
  [[nodiscard]] double fitted_bound(std::size_t k, double ax) const {
    const std::size_t V = layout_.value_dim;
    const std::size_t i = k / V;
    const std::size_t j = k % V;
    const std::uint32_t b = widths_[i];
    if (b == kPivotWidth) {
      return fp16_error_bound(ax);
    }
    const double qmax = stepquant::level_max(b);
    double step = 0.0;
    double top = 0.0;
    switch (fit_.kind) {
      case FitKind::dual_axis:
        step = static_cast<double>(fit_.row_scale[i]) * fit_.col_scale[j];
        top = step * qmax;
        break;
      case FitKind::dual_axis_grid8:
        step =
            static_cast<double>(fit_.row_scale[i]) * fit_.col_scale[j] * stepquant::grid_factor(b);
        top = step * qmax;
        break;
      case FitKind::row_absmax:
        step = fit_.row_scale[i];
        top = step * qmax;
        break;
    }
    const double spacing = step * static_cast<double>(1u << stepquant::level_shift(b));
    return std::max(0.5 * spacing, ax - top) + (spacing + ax) * std::ldexp(1.0, -21);
  }

  const StateLayout& layout_;
  std::span<const std::byte> head_bytes_;
  HeadFit fit_;
  std::vector<std::uint8_t> widths_;
};

// ---------------------------------------------------------------------------------------

class CodecConformance : public ::testing::TestWithParam<Instance> {
 protected:
  static constexpr std::uint32_t kSteps = 32;  // of the synthetic recurrence
  static constexpr std::uint64_t kSeed = 7;

  void SetUp() override {
    layout_ = GetParam().layout;
    page_ = std::make_unique<PageCodec>(layout_);
    n_ = std::size_t{layout_.key_dim} * layout_.value_dim;
    heads_ = std::size_t{layout_.num_layers} * layout_.num_heads;
  }

  [[nodiscard]] const PageCodec& page() const { return *page_; }
  [[nodiscard]] CodecId id() const { return layout_.codec.id; }
  [[nodiscard]] bool plan_codec() const { return is_stepquant_codec(id()) || is_dsq_codec(id()); }
  [[nodiscard]] std::size_t values() const { return heads_ * n_; }

  // A synthetic gated-delta-rule state, staged in f32 (made once per test: the recurrence
  // is the costly part of this suite, under ASan most of all).
  [[nodiscard]] const std::vector<std::byte>& realistic() {
    if (realistic_.empty()) {
      realistic_ = synthetic::synthetic_staged_state(layout_, kSteps, kSeed, DType::f32);
    }
    return realistic_;
  }

  // The same values staged in bf16: synthetic_staged_state rounds to nearest even exactly
  // so, and the conv state does not depend on the staged dtype.
  [[nodiscard]] std::vector<std::byte> realistic_bf16() {
    const auto& f32 = realistic();
    std::vector<std::byte> out(page().staged_bytes(DType::bf16));
    for (std::size_t k = 0; k < values(); ++k) {
      float v = 0.0f;
      std::memcpy(&v, f32.data() + 4 * k, 4);
      const std::uint16_t b = float_to_bf16_bits(v);
      std::memcpy(out.data() + 2 * k, &b, 2);
    }
    std::copy(f32.end() - static_cast<std::ptrdiff_t>(page().conv_bytes()), f32.end(),
              out.begin() + static_cast<std::ptrdiff_t>(2 * values()));
    return out;
  }

  // Heavy-tailed f32 values x = N * exp(spread N) in the recurrent part; the realistic
  // conv state.
  [[nodiscard]] std::vector<std::byte> heavy_tailed(std::uint32_t seed, float spread) {
    std::vector<std::byte> staged =
        float_bytes(synthetic::heavy_tailed_values<std::mt19937>(values(), seed, spread));
    const auto conv = conv_of_staged(realistic());
    staged.insert(staged.end(), conv.begin(), conv.end());
    return staged;
  }

  [[nodiscard]] std::vector<std::byte> encode(std::span<const std::byte> staged,
                                              DType dtype = DType::f32) const {
    std::vector<std::byte> bytes(page().page_bytes());
    page().encode(staged, dtype, bytes);
    return bytes;
  }

  [[nodiscard]] std::vector<std::byte> decode(std::span<const std::byte> bytes,
                                              DType dtype = DType::f32) const {
    std::vector<std::byte> staged(page().staged_bytes(dtype), std::byte{0x5A});
    page().decode(bytes, dtype, staged);
    return staged;
  }

  [[nodiscard]] std::vector<float> recurrent(std::span<const std::byte> staged_f32) const {
    return bytes_to_floats(staged_f32.first(4 * values()));
  }

  [[nodiscard]] std::span<const std::byte> head_of(std::span<const std::byte> bytes,
                                                   std::uint32_t l, std::uint32_t h) const {
    return bytes.subspan(page().head_offset(l, h), page().codec().head_bytes(l, h));
  }

  [[nodiscard]] std::span<const std::byte> conv_of_staged(std::span<const std::byte> staged) const {
    return staged.subspan(staged.size() - page().conv_bytes());
  }

  // Every value of y = decode(bytes) finite and within the codec's bound of x.
  void expect_within_bound(std::span<const float> x, std::span<const std::byte> bytes,
                           std::span<const float> y, const std::string& what) const {
    for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
        const std::size_t base = (std::size_t{l} * layout_.num_heads + h) * n_;
        const HeadBound bound(layout_, head_of(bytes, l, h), l, h, x.subspan(base, n_));
        for (std::size_t k = 0; k < n_; ++k) {
          const float xv = x[base + k];
          const float yv = y[base + k];
          ASSERT_TRUE(std::isfinite(yv)) << what << " layer " << l << " head " << h << " i " << k;
          ASSERT_LE(std::fabs(static_cast<double>(xv) - yv), bound(k, xv))
              << what << " layer " << l << " head " << h << " i " << k << " x " << xv << " x_hat "
              << yv;
        }
      }
    }
  }

  // Every value of y = decode(bytes) equal to the codec's oracle: the scalar reference
  // (reference.hpp) for the float and int codecs, which must also give the same bytes;
  // reconstruct(fit) of stepquant/fit.hpp for the STEPQuant family.
  void expect_oracle(std::span<const float> x, std::span<const std::byte> bytes,
                     std::span<const float> y) const {
    std::vector<float> expect(n_);
    for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
        const std::size_t base = (std::size_t{l} * layout_.num_heads + h) * n_;
        const auto head = x.subspan(base, n_);
        const auto got = head_of(bytes, l, h);
        if (plan_codec()) {
          const HeadFit fit = fit_of(layout_, l, h, head);
          stepquant::reconstruct(is_dsq_codec(id()) ? Arch::gdn : layout_.arch, fit,
                                 row_widths(layout_, l, h), expect);
        } else {
          std::vector<std::byte> ref(got.size(), std::byte{0x5A});
          reference::encode_head(layout_.codec, layout_.key_dim, layout_.value_dim, head, ref);
          ASSERT_EQ(first_difference(got, ref), -1) << "layer " << l << " head " << h;
          reference::decode_head(layout_.codec, layout_.key_dim, layout_.value_dim, ref, expect);
        }
        for (std::size_t k = 0; k < n_; ++k) {
          ASSERT_EQ(float_bits(y[base + k]), float_bits(expect[k]))
              << "layer " << l << " head " << h << " i " << k;
        }
      }
    }
  }

  // The contract, one check at a time (grouped into a few tests below: every test is a
  // process of its own under ctest, and ASan makes each start cost).
  void page_is_exactly_its_heads_then_the_conv_state();
  void encode_writes_every_page_byte_only_those_and_always_the_same();
  void decode_is_its_oracle_within_the_codec_bound_and_the_conv_state_raw();
  void re_encoding_a_decoded_page_is_stable_where_documented();
  void non_finite_values_are_refused_naming_where_and_the_page_is_unchanged();
  void zeros_decode_to_zeros_and_float_denormals_stay_within_their_magnitude();
  void staging_in_f32_or_bf16_aligned_or_not_gives_the_same_bytes();
  void wrong_buffer_sizes_are_refused();
  void light_encodes_from_any_previous_bytes();

  StateLayout layout_;
  std::unique_ptr<PageCodec> page_;
  std::size_t n_ = 0;
  std::size_t heads_ = 0;
  std::vector<std::byte> realistic_;
};

void CodecConformance::page_is_exactly_its_heads_then_the_conv_state() {
  const Codec& codec = page().codec();
  EXPECT_EQ(codec.id(), id());
  std::size_t offset = 0;
  for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
      SCOPED_TRACE("layer " + std::to_string(l) + " head " + std::to_string(h));
      const std::size_t bytes = codec.head_bytes(l, h);
      EXPECT_EQ(bytes % 4, 0u);
      EXPECT_EQ(bytes, round_up4(unpadded_head_bytes(layout_, l, h)));
      EXPECT_EQ(page().head_offset(l, h), offset);
      EXPECT_EQ(page().head_offset(l, h) % 4, 0u);
      if (is_stepquant_codec(id())) {
        EXPECT_EQ(bytes, stepquant::head_bytes(*layout_.plan, layout_.codec.variant, l, h));
      } else {
        // One size for every head, as format.hpp and the reference compute it.
        EXPECT_EQ(bytes, head_bytes_for(layout_.codec, layout_.key_dim, layout_.value_dim));
        EXPECT_EQ(bytes, codec.head_bytes(0, 0));
        if (!is_dsq_codec(id())) {
          EXPECT_EQ(bytes,
                    reference::head_bytes(layout_.codec, layout_.key_dim, layout_.value_dim));
        }
      }
      offset += bytes;
    }
  }
  const std::size_t conv_values =
      std::size_t{layout_.num_layers} * layout_.conv_channels * layout_.conv_width;
  EXPECT_EQ(page().conv_offset(), offset);
  EXPECT_EQ(page().conv_bytes(), conv_values * dtype_bytes(layout_.conv_dtype));
  EXPECT_EQ(page().page_bytes(), offset + page().conv_bytes());
  EXPECT_EQ(page().fp32_bytes(), 4 * (values() + conv_values));
  EXPECT_EQ(page().staged_bytes(DType::f32), 4 * values() + page().conv_bytes());
  EXPECT_EQ(page().staged_bytes(DType::bf16), 2 * values() + page().conv_bytes());
  EXPECT_DOUBLE_EQ(page().compression_ratio(), static_cast<double>(page().fp32_bytes()) /
                                                   static_cast<double>(page().page_bytes()));
  EXPECT_EQ(realistic().size(), page().staged_bytes(DType::f32));
  const auto bf16 = synthetic::synthetic_staged_state(layout_, kSteps, kSeed, DType::bf16);
  EXPECT_EQ(bf16.size(), page().staged_bytes(DType::bf16));
  EXPECT_EQ(bf16, realistic_bf16());  // what the other tests rely on
}

void CodecConformance::encode_writes_every_page_byte_only_those_and_always_the_same() {
  const auto& a = realistic();
  constexpr std::size_t kGuard = 16;
  const std::size_t size = page().page_bytes();
  std::vector<std::vector<std::byte>> results;
  for (const std::byte fill : {std::byte{0x00}, std::byte{0xFF}, std::byte{0xA5}}) {
    std::vector<std::byte> buffer(size + 2 * kGuard, fill);
    page().encode(a, DType::f32, std::span<std::byte>(buffer).subspan(kGuard, size));
    for (std::size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(buffer[i], fill) << "byte " << i << " before the page";
      ASSERT_EQ(buffer[kGuard + size + i], fill) << "byte " << i << " after the page";
    }
    results.emplace_back(buffer.begin() + kGuard, buffer.begin() + kGuard + size);
  }
  // Nothing of the old contents survives: every byte is written.
  EXPECT_EQ(first_difference(results[0], results[1]), -1);
  EXPECT_EQ(first_difference(results[0], results[2]), -1);
  // The padding after each head's data is zero, so a page is a pure function of the state.
  for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
      const auto head = head_of(results[1], l, h);
      for (std::size_t i = unpadded_head_bytes(layout_, l, h); i < head.size(); ++i) {
        EXPECT_EQ(head[i], std::byte{0}) << "layer " << l << " head " << h << " byte " << i;
      }
    }
  }

  // Deterministic: the same bytes again, from another codec made for the same layout, and
  // on other threads while this one decodes (codecs are immutable, codec.hpp).
  const auto b = heavy_tailed(17, 1.0f);
  const auto& page_a = results[0];
  const auto page_b = encode(b);
  EXPECT_EQ(encode(a), page_a);
  const PageCodec again(layout_);
  std::vector<std::byte> other(again.page_bytes());
  again.encode(a, DType::f32, other);
  EXPECT_EQ(other, page_a);
  std::vector<std::byte> on_thread_a;
  std::vector<std::byte> on_thread_b;
  std::vector<std::byte> decoded_b;
  std::thread t1([&] {
    for (int i = 0; i < 3; ++i) on_thread_a = encode(a);
  });
  std::thread t2([&] {
    for (int i = 0; i < 3; ++i) {
      on_thread_b = encode(b);
      decoded_b = decode(on_thread_b);
    }
  });
  t1.join();
  t2.join();
  EXPECT_EQ(on_thread_a, page_a);
  EXPECT_EQ(on_thread_b, page_b);
  EXPECT_EQ(decoded_b, decode(page_b));
}

void CodecConformance::decode_is_its_oracle_within_the_codec_bound_and_the_conv_state_raw() {
  struct Input {
    std::string what;
    std::vector<std::byte> staged;
    bool bounded;  // fp16 saturates beyond 65504: the bound is for spreads up to 1
  };
  const Input inputs[] = {{"realistic", realistic(), true},
                          {"heavy-tailed 0.5", heavy_tailed(1, 0.5f), true},
                          {"heavy-tailed 1", heavy_tailed(99, 1.0f), true},
                          {"heavy-tailed 4", heavy_tailed(2, 4.0f), false}};
  for (const Input& input : inputs) {
    SCOPED_TRACE(input.what);
    const auto bytes = encode(input.staged);
    const auto out = decode(bytes);
    const auto x = recurrent(input.staged);
    const auto y = recurrent(out);
    expect_oracle(x, bytes, y);
    if (input.bounded) {
      expect_within_bound(x, bytes, y, input.what);
    }
    // The conv state is raw bytes, both ways.
    EXPECT_EQ(first_difference(std::span<const std::byte>(bytes).subspan(page().conv_offset()),
                               conv_of_staged(input.staged)),
              -1);
    EXPECT_EQ(first_difference(conv_of_staged(out), conv_of_staged(input.staged)), -1);
    if (id() == CodecId::fp32) {
      EXPECT_EQ(out, input.staged);  // a copy
    }
  }
}

void CodecConformance::re_encoding_a_decoded_page_is_stable_where_documented() {
  const auto first = encode(realistic());
  const auto decoded = decode(first);
  const auto second = encode(decoded);
  if (reencode_is_byte_stable(id())) {
    // A state that comes back unchanged must not drift when it is stored again.
    EXPECT_EQ(first_difference(first, second), -1);
  } else {
    // The scales are refitted to the decoded values: other bytes, but a decoded state is
    // an input like any other and stays within the codec's bound.
    const auto x = recurrent(decoded);
    expect_within_bound(x, second, recurrent(decode(second)), "re-encoded");
  }
}

struct NonFiniteCase {
  DType dtype;
  std::uint32_t bits;  // f32 bits or bf16 bits
  const char* text;
};

void CodecConformance::non_finite_values_are_refused_naming_where_and_the_page_is_unchanged() {
  const NonFiniteCase cases[] = {
      {DType::f32, 0x7FC00000u, "nan"},  {DType::f32, 0x7F800000u, "inf"},
      {DType::f32, 0xFF800000u, "-inf"}, {DType::f32, 0xFFC00001u, "nan"},
      {DType::bf16, 0x7FC0u, "nan"},     {DType::bf16, 0x7F80u, "inf"},
      {DType::bf16, 0xFF80u, "-inf"},
  };
  const std::uint32_t layer = std::min(1u, layout_.num_layers - 1);
  const std::uint32_t head = std::min(2u, layout_.num_heads - 1);
  const std::uint32_t row = std::min(3u, layout_.key_dim - 1);
  const std::uint32_t col = std::min(4u, layout_.value_dim - 1);
  const std::size_t index = (std::size_t{layer} * layout_.num_heads + head) * n_ +
                            std::size_t{row} * layout_.value_dim + col;
  const std::size_t later = values() - 1;  // a second bad value, never the one reported
  const std::vector<std::byte> staged_f32 = realistic();
  const std::vector<std::byte> staged_bf16 = realistic_bf16();
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.text) + (c.dtype == DType::f32 ? " in f32" : " in bf16"));
    auto staged = c.dtype == DType::f32 ? staged_f32 : staged_bf16;
    const std::size_t width = dtype_bytes(c.dtype);
    std::memcpy(staged.data() + index * width, &c.bits, width);
    std::memcpy(staged.data() + later * width, &c.bits, width);
    std::vector<std::byte> bytes(page().page_bytes());
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::byte>(i * 31 + 7);
    }
    const std::vector<std::byte> before = bytes;
    try {
      page().encode(staged, c.dtype, bytes);
      ADD_FAILURE() << "accepted " << c.text;
    } catch (const NonFiniteError& e) {
      EXPECT_EQ(e.layer(), layer);
      EXPECT_EQ(e.head(), head);
      EXPECT_EQ(e.index(), std::size_t{row} * layout_.value_dim + col);
      EXPECT_EQ(std::string(e.what()), "non-finite value " + std::string(c.text) + " at layer " +
                                           std::to_string(layer) + " head " + std::to_string(head) +
                                           " row " + std::to_string(row) + " col " +
                                           std::to_string(col));
    }
    EXPECT_THROW(page().encode(staged, c.dtype, bytes), std::invalid_argument);
    EXPECT_EQ(bytes, before) << "page changed after a rejected encode";
    // encode_heads (what executors run, on a scratch page or after check_finite) checks
    // what it encodes: it names the same value, having written the heads before it.
    const std::size_t bad_head = std::size_t{layer} * layout_.num_heads + head;
    std::vector<std::byte> heads_only = bytes;
    try {
      page().encode_heads(staged, c.dtype, heads_only, 0, heads_);
      ADD_FAILURE() << "encode_heads accepted " << c.text;
    } catch (const NonFiniteError& e) {
      EXPECT_EQ(e.layer(), layer);
      EXPECT_EQ(e.head(), head);
      EXPECT_EQ(e.index(), std::size_t{row} * layout_.value_dim + col);
      // The value as read (bf16 widened exactly).
      EXPECT_EQ(float_bits(e.value()), c.dtype == DType::f32 ? c.bits : c.bits << 16);
    }
    EXPECT_NO_THROW(page().encode_heads(staged, c.dtype, heads_only, 0, bad_head))
        << "a range before the bad head is finite";
  }
  {  // A finite state: the heads, then the conv state, are the bytes of encode().
    std::vector<std::byte> pieces(page().page_bytes());
    page().encode_heads(staged_f32, DType::f32, pieces, 0, heads_);
    page().encode_conv(staged_f32, DType::f32, pieces);
    EXPECT_EQ(pieces, encode(staged_f32));
  }

  // The conv state is opaque bytes: a NaN pattern there is stored as it is.
  if (page().conv_bytes() != 0) {
    auto staged = staged_f32;
    const std::uint32_t nan_bits = layout_.conv_dtype == DType::f32 ? 0x7FC00001u : 0x7FC1u;
    const std::size_t width = dtype_bytes(layout_.conv_dtype);
    std::memcpy(staged.data() + staged.size() - width, &nan_bits, width);
    const auto bytes = encode(staged);
    EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - width, &nan_bits, width), 0);
  }

  // Codec::encode_head does not check (the page functions do, on a copy of the head):
  // for NaN/Inf it writes unspecified bytes, but only its own (and ASan watches).
  const Codec& codec = page().codec();
  std::vector<float> x(n_, 1.0f);
  x[3 % n_] = std::numeric_limits<float>::quiet_NaN();
  x[40 % n_] = -std::numeric_limits<float>::infinity();
  for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
      constexpr std::size_t kGuard = 8;
      const std::size_t size = codec.head_bytes(l, h);
      std::vector<std::byte> buffer(size + 2 * kGuard, std::byte{0xC3});
      codec.encode_head(l, h, x, std::span<std::byte>(buffer).subspan(kGuard, size));
      for (std::size_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(buffer[i], std::byte{0xC3});
        ASSERT_EQ(buffer[kGuard + size + i], std::byte{0xC3});
      }
      // encode_head_checked says so, and still writes only its own bytes.
      EXPECT_FALSE(
          codec.encode_head_checked(l, h, x, std::span<std::byte>(buffer).subspan(kGuard, size)));
      for (std::size_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(buffer[i], std::byte{0xC3});
        ASSERT_EQ(buffer[kGuard + size + i], std::byte{0xC3});
      }
      std::vector<float> out(n_);
      codec.decode_head(l, h, std::span<const std::byte>(buffer).subspan(kGuard, size), out);
    }
  }
  // One non-finite value anywhere is found, whatever finds it (a scan, an absmax, a fit's
  // row sums); huge finite values whose sums overflow are finite.
  std::vector<std::byte> bytes0(codec.head_bytes(0, 0));
  for (const std::size_t at : {std::size_t{0}, n_ / 2, n_ - 1}) {
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> y(n_, 0.5f);
      y[at] = bad;
      EXPECT_FALSE(codec.encode_head_checked(0, 0, y, bytes0)) << "value " << at << " = " << bad;
    }
  }
  std::vector<float> huge(n_);
  for (std::size_t i = 0; i < n_; ++i) huge[i] = i % 2 == 0 ? 3.0e38f : -3.0e38f;
  EXPECT_TRUE(codec.encode_head_checked(0, 0, huge, bytes0));
}

void CodecConformance::zeros_decode_to_zeros_and_float_denormals_stay_within_their_magnitude() {
  const auto round_trip = [&](const std::vector<float>& x) {
    auto staged = float_bytes(x);
    staged.resize(page().staged_bytes(DType::f32), std::byte{0});
    return recurrent(decode(encode(staged)));
  };
  // +0 decodes to +0 (every codec), -0 to a zero.
  for (const float v : round_trip(std::vector<float>(values(), 0.0f))) {
    ASSERT_EQ(float_bits(v), 0u);
  }
  for (const float v : round_trip(std::vector<float>(values(), -0.0f))) {
    ASSERT_EQ(v, 0.0f);
  }
  // FP32 denormals: finite, and never further from the input than the input is from zero
  // (the int codecs' scales underflow to 0; STEPQuant rows below ~1e-15 decode to 0 or
  // within |x|; the float codecs round to nearest).
  std::vector<float> tiny(values());
  for (std::size_t k = 0; k < tiny.size(); ++k) {
    tiny[k] = (k % 2 == 0 ? 1.0f : -1.0f) * std::numeric_limits<float>::denorm_min() *
              static_cast<float>(k % 97 + 1);
  }
  const auto back = round_trip(tiny);
  for (std::size_t k = 0; k < values(); ++k) {
    ASSERT_TRUE(std::isfinite(back[k])) << "value " << k;
    ASSERT_LE(std::fabs(static_cast<double>(tiny[k]) - back[k]), std::fabs(tiny[k]))
        << "value " << k;
  }
}

void CodecConformance::staging_in_f32_or_bf16_aligned_or_not_gives_the_same_bytes() {
  // bf16 staging is widened exactly: it encodes like the same values staged in f32.
  const auto staged16 = realistic_bf16();
  std::vector<float> widened(values());
  for (std::size_t k = 0; k < values(); ++k) {
    std::uint16_t b = 0;
    std::memcpy(&b, staged16.data() + 2 * k, 2);
    widened[k] = bf16_bits_to_float(b);
  }
  auto staged32 = float_bytes(widened);
  const auto conv = conv_of_staged(staged16);
  staged32.insert(staged32.end(), conv.begin(), conv.end());
  const auto from_bf16 = encode(staged16, DType::bf16);
  EXPECT_EQ(first_difference(from_bf16, encode(staged32)), -1);

  // Decoding to bf16 is decoding to f32, then rounding each value to nearest even.
  const auto out16 = decode(from_bf16, DType::bf16);
  const auto out32 = recurrent(decode(from_bf16, DType::f32));
  for (std::size_t k = 0; k < values(); ++k) {
    std::uint16_t b = 0;
    std::memcpy(&b, out16.data() + 2 * k, 2);
    ASSERT_EQ(b, float_to_bf16_bits(out32[k])) << "value " << k;
  }
  EXPECT_EQ(first_difference(conv_of_staged(out16), conv_of_staged(staged16)), -1);
  if (id() == CodecId::fp32 || id() == CodecId::bf16) {
    EXPECT_EQ(out16, staged16) << "lossless for bf16 input";
  }

  // Staging buffers need no alignment: one byte off gives the same page and state.
  const std::vector<std::byte> by_dtype[] = {realistic(), staged16};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(to_string(dtype));
    const auto& staged = by_dtype[dtype == DType::f32 ? 0 : 1];
    std::vector<std::byte> shifted(staged.size() + 1);
    std::memcpy(shifted.data() + 1, staged.data(), staged.size());
    const auto misaligned = std::span<std::byte>(shifted).subspan(1);
    const auto aligned_page = encode(staged, dtype);
    std::vector<std::byte> bytes(page().page_bytes());
    page().encode(misaligned, dtype, bytes);
    EXPECT_EQ(bytes, aligned_page);
    const auto out = decode(aligned_page, dtype);
    std::fill(misaligned.begin(), misaligned.end(), std::byte{0});
    page().decode(aligned_page, dtype, misaligned);
    EXPECT_EQ(std::memcmp(out.data(), misaligned.data(), out.size()), 0);
  }

  // f16 staging is refused both ways.
  std::vector<std::byte> f16(page().staged_bytes(DType::f16));
  std::vector<std::byte> bytes(page().page_bytes());
  EXPECT_THROW(page().encode(f16, DType::f16, bytes), std::invalid_argument);
  EXPECT_THROW(page().decode(from_bf16, DType::f16, f16), std::invalid_argument);
}

void CodecConformance::wrong_buffer_sizes_are_refused() {
  const auto& staged = realistic();
  const std::size_t size = page().page_bytes();
  std::vector<std::byte> bytes(size, std::byte{0x11});
  const std::vector<std::byte> before = bytes;
  const std::span<const std::byte> in(staged);
  EXPECT_THROW(page().encode(in.first(in.size() - 1), DType::f32, bytes), std::invalid_argument);
  EXPECT_THROW(page().encode(staged, DType::bf16, bytes), std::invalid_argument);  // f32-sized
  std::vector<std::byte> long_page(size + 1);
  EXPECT_THROW(page().encode(staged, DType::f32, long_page), std::invalid_argument);
  EXPECT_THROW(page().encode(staged, DType::f32, std::span<std::byte>(bytes).first(size - 1)),
               std::invalid_argument);
  EXPECT_EQ(bytes, before);
  try {
    page().encode(in.first(3), DType::f32, bytes);
    ADD_FAILURE() << "accepted 3 staged bytes";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "staged state must be " +
                                         std::to_string(page().staged_bytes(DType::f32)) +
                                         " bytes for this layout, got 3");
  }

  std::vector<std::byte> out(page().staged_bytes(DType::f32));
  EXPECT_THROW(page().decode(std::span<const std::byte>(bytes).first(size - 1), DType::f32, out),
               std::invalid_argument);
  EXPECT_THROW(page().decode(bytes, DType::bf16, out), std::invalid_argument);
  out.push_back(std::byte{0});
  EXPECT_THROW(page().decode(bytes, DType::f32, out), std::invalid_argument);

  // One head through the Codec interface: values and bytes must both fit exactly.
  const Codec& codec = page().codec();
  const std::uint32_t l = layout_.num_layers - 1;
  const std::uint32_t h = layout_.num_heads - 1;
  const std::size_t head = codec.head_bytes(l, h);
  std::vector<float> v(n_ + 1, 1.0f);
  std::vector<std::byte> b(head + 4);
  const std::span<float> exact_v = std::span<float>(v).first(n_);
  const std::span<std::byte> exact_b = std::span<std::byte>(b).first(head);
  EXPECT_NO_THROW(codec.encode_head(l, h, exact_v, exact_b));
  EXPECT_NO_THROW(codec.decode_head(l, h, exact_b, exact_v));
  EXPECT_THROW(codec.encode_head(l, h, v, exact_b), std::invalid_argument);
  EXPECT_THROW(codec.encode_head(l, h, exact_v, b), std::invalid_argument);
  EXPECT_THROW(codec.decode_head(l, h, b, exact_v), std::invalid_argument);
  EXPECT_THROW(codec.decode_head(l, h, exact_b, v), std::invalid_argument);
}

// The light step's encode (StepMode::light): the previous bytes of a head are client
// memory, so any bytes must do (scales read as numbers, never as sizes); a codec without
// a light form encodes as encode_head; a light fit decodes finite and near the head; a
// non-finite head is reported; only the head's own bytes are written.
void CodecConformance::light_encodes_from_any_previous_bytes() {
  const Codec& codec = page().codec();
  const auto staged = synthetic::synthetic_staged_state(layout_, kSteps, kSeed, DType::f32);
  std::mt19937 noise(11);
  for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
    const std::size_t size = codec.head_bytes(0, h);
    std::vector<float> x(n_);
    std::memcpy(x.data(), staged.data() + h * n_ * sizeof(float), n_ * sizeof(float));
    std::vector<std::byte> plain(size);
    codec.encode_head(0, h, x, plain);
    std::vector<std::byte> fitted(size);
    codec.encode_head(0, h, x, fitted);
    std::vector<float> decoded(n_);
    codec.decode_head(0, h, plain, decoded);
    double plain_err = 0.0;
    for (std::size_t i = 0; i < n_; ++i) {
      plain_err += (static_cast<double>(decoded[i]) - x[i]) * (static_cast<double>(decoded[i]) - x[i]);
    }
    std::vector<std::byte> garbage(size);
    for (auto& b : garbage) b = static_cast<std::byte>(noise());
    std::vector<float> k(layout_.key_dim, 0.5f);
    std::vector<float> u(layout_.value_dim, -2.0f);
    const StepUpdate update{0.9f, k, u};
    for (const auto& previous : {fitted, garbage}) {
      for (const LightFit fit : {LightFit::no_refit, LightFit::carried, LightFit::grown}) {
        LightOptions options;
        options.fit = fit;
        constexpr std::size_t kGuard = 8;
        std::vector<std::byte> buffer(size + 2 * kGuard, std::byte{0xC3});
        const auto dst = std::span<std::byte>(buffer).subspan(kGuard, size);
        const LightEncode how = codec.encode_head_light(0, h, x, previous, dst, options, update);
        for (std::size_t i = 0; i < kGuard; ++i) {
          ASSERT_EQ(buffer[i], std::byte{0xC3});
          ASSERT_EQ(buffer[kGuard + size + i], std::byte{0xC3});
        }
        ASSERT_NE(how, LightEncode::non_finite) << "head " << h;
        if (how == LightEncode::full_fit || how == LightEncode::fell_back) {
          EXPECT_TRUE(std::equal(dst.begin(), dst.end(), plain.begin())) << "head " << h;
        }
        std::vector<float> out(n_);
        codec.decode_head(0, h, dst, out);
        double err = 0.0;
        for (std::size_t i = 0; i < n_; ++i) {
          ASSERT_TRUE(std::isfinite(out[i])) << "head " << h << " value " << i;
          err += (static_cast<double>(out[i]) - x[i]) * (static_cast<double>(out[i]) - x[i]);
        }
        // The fit without the refit reads nothing of the previous bytes and codes the head
        // about as well as the full fit (the carried fits' accuracy is eval/step-modes'
        // to measure).
        if (fit == LightFit::no_refit) {
          EXPECT_LE(std::sqrt(err), 2.0 * std::sqrt(plain_err) + 1e-30) << "head " << h;
        }
      }
    }
  }
  std::vector<float> bad(n_, 1.0f);
  bad[n_ / 3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> dst(codec.head_bytes(0, 0));
  std::vector<std::byte> previous(codec.head_bytes(0, 0));
  codec.encode_head(0, 0, std::vector<float>(n_, 0.25f), previous);
  const std::vector<float> k(layout_.key_dim, 1.0f);
  const std::vector<float> u(layout_.value_dim, 1.0f);
  for (const LightFit fit : {LightFit::no_refit, LightFit::carried, LightFit::grown}) {
    LightOptions options;
    options.fit = fit;
    EXPECT_EQ(codec.encode_head_light(0, 0, bad, previous, dst, options, {1.0f, k, u}),
              LightEncode::non_finite);
  }
}

// ---------------------------------------------------------------------------------------
// The tests: what the page's bytes are, what decoding gives back, what is refused, and
// how states may be staged.

TEST_P(CodecConformance, PageBytesAreExactCompleteAndDeterministic) {
  page_is_exactly_its_heads_then_the_conv_state();
  encode_writes_every_page_byte_only_those_and_always_the_same();
}

TEST_P(CodecConformance, DecodedValuesAreTheOracleWithinTheBound) {
  decode_is_its_oracle_within_the_codec_bound_and_the_conv_state_raw();
  re_encoding_a_decoded_page_is_stable_where_documented();
  zeros_decode_to_zeros_and_float_denormals_stay_within_their_magnitude();
}

TEST_P(CodecConformance, BadInputIsRefusedAndThePageLeftUnchanged) {
  non_finite_values_are_refused_naming_where_and_the_page_is_unchanged();
  wrong_buffer_sizes_are_refused();
}

TEST_P(CodecConformance, LightStepEncodesFromAnyPreviousBytes) {
  light_encodes_from_any_previous_bytes();
}

TEST_P(CodecConformance, StagingInF32OrBf16AlignedOrNotGivesTheSameBytes) {
  staging_in_f32_or_bf16_aligned_or_not_gives_the_same_bytes();
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecConformance, ::testing::ValuesIn(instances()), instance_name);

}  // namespace
}  // namespace statepool::kernels
