// Conformance suite run against every codec: the same contract for fp32, bf16, fp16,
// int4, int6 and int8, over head shapes that exercise full groups, a short last group
// and partial code quads. The fast codecs (make_codec) must match the scalar reference
// byte for byte.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/reference.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/random.hpp"
#include "statepool/testing/synthetic_state.hpp"

namespace statepool::kernels {

// Readable test parameters in ctest listings.
static void PrintTo(CodecId id, std::ostream* os) {
  *os << to_string(id);
}

namespace {

struct Shape {
  std::uint32_t key_dim;
  std::uint32_t value_dim;
  std::uint32_t group;  // ignored by the float codecs
};

const Shape kShapes[] = {
    {128, 128, 0},   // Qwen/Kimi heads, default group 128
    {64, 128, 256},  // group spans two rows
    {16, 24, 32},    // n = 384: 12 full groups
    {10, 10, 32},    // n = 100: last group of 4
    {7, 5, 12},      // n = 35: last group of 11, partial quad of 3
    {3, 3, 4},       // n = 9: last group of 1
    {1, 1, 4},       // a single value
};

const CodecId kCodecs[] = {CodecId::fp32, CodecId::bf16, CodecId::fp16,
                           CodecId::int4, CodecId::int6, CodecId::int8};

using Param = std::tuple<CodecId, Shape>;

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.key_dim << "x" << s.value_dim << " group " << s.group;
}

// Realistic values: the gated delta rule run for a few hundred steps (cached per shape).
const std::vector<float>& realistic_head(std::uint32_t key_dim, std::uint32_t value_dim) {
  static std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<float>> cache;
  auto& values = cache[{key_dim, value_dim}];
  if (values.empty()) {
    values.resize(std::size_t{key_dim} * value_dim);
    testing::synthetic_gdn_state(key_dim, value_dim, 300, 1234 + key_dim * 7919ull + value_dim,
                                 values);
  }
  return values;
}

class CodecConformance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const auto& [id, shape] = GetParam();
    id_ = id;
    shape_ = shape;
    layout_ = testing::head_layout(id, shape.group, shape.key_dim, shape.value_dim);
    codec_ = make_codec(layout_);
    n_ = std::size_t{shape.key_dim} * shape.value_dim;
  }

  [[nodiscard]] std::vector<std::byte> encode(std::span<const float> values,
                                              std::byte fill = std::byte{0}) const {
    std::vector<std::byte> out(codec_->head_bytes(0, 0), fill);
    codec_->encode_head(0, 0, values, out);
    return out;
  }

  [[nodiscard]] std::vector<float> decode(std::span<const std::byte> bytes) const {
    std::vector<float> out(n_);
    codec_->decode_head(0, 0, bytes, out);
    return out;
  }

  [[nodiscard]] std::vector<float> random_values(std::uint32_t seed, float spread) const {
    return testing::heavy_tailed_values<std::mt19937>(n_, seed, spread);
  }

  // Per-value error bound of the codec for the encoded head `bytes`.
  [[nodiscard]] double bound(std::span<const std::byte> bytes, std::size_t i, float x) const {
    const double ax = std::fabs(static_cast<double>(x));
    switch (id_) {
      case CodecId::fp32: return 0.0;
      case CodecId::bf16: return ax * std::ldexp(1.0, -8);
      case CodecId::fp16: return ax * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
      default: {
        // Rounding to the grid costs at most s/2; the float quotient x / s adds at most
        // qmax ulps of 2^-24 relative (tiny).
        const double s = testing::stored_scale(bytes, i / group());
        const double qmax = code_qmax(codec_code_bits(id_));
        return 0.5 * s + s * qmax * std::ldexp(1.0, -22);
      }
    }
  }

  [[nodiscard]] std::uint32_t group() const { return effective_group_size(shape_.group); }

  CodecId id_ = CodecId::fp32;
  Shape shape_{};
  StateLayout layout_;
  std::unique_ptr<Codec> codec_;
  std::size_t n_ = 0;
};

TEST_P(CodecConformance, HeadBytesMatchTheFormula) {
  const std::size_t bytes = codec_->head_bytes(0, 0);
  EXPECT_EQ(bytes % 4, 0u);
  EXPECT_EQ(bytes, head_bytes_for(layout_.codec, shape_.key_dim, shape_.value_dim));
  EXPECT_EQ(bytes, reference::head_bytes(layout_.codec, shape_.key_dim, shape_.value_dim));
  EXPECT_EQ(codec_->id(), id_);
  if (is_uniform_codec(id_)) {
    const std::uint32_t bits = codec_code_bits(id_);
    const std::size_t groups = (n_ + group() - 1) / group();
    const std::size_t codes = bits == 6 ? 3 * ((n_ + 3) / 4) : (n_ * bits + 7) / 8;
    EXPECT_EQ(bytes, (2 * groups + codes + 3) / 4 * 4);
  } else {
    EXPECT_EQ(bytes, (n_ * (id_ == CodecId::fp32 ? 4 : 2) + 3) / 4 * 4);
  }
}

TEST_P(CodecConformance, FastPathMatchesReferenceByteForByte) {
  for (int variant = 0; variant < 3; ++variant) {
    const std::vector<float> values =
        variant == 0
            ? realistic_head(shape_.key_dim, shape_.value_dim)
            : random_values(static_cast<std::uint32_t>(variant), variant == 1 ? 0.5f : 4.0f);
    const std::vector<std::byte> fast = encode(values);
    std::vector<std::byte> ref(fast.size(), std::byte{0x5A});
    reference::encode_head(layout_.codec, shape_.key_dim, shape_.value_dim, values, ref);
    ASSERT_EQ(testing::first_difference(fast, ref), -1) << "variant " << variant;

    const std::vector<float> fast_out = decode(fast);
    std::vector<float> ref_out(n_);
    reference::decode_head(layout_.codec, shape_.key_dim, shape_.value_dim, ref, ref_out);
    for (std::size_t i = 0; i < n_; ++i) {
      ASSERT_EQ(float_bits(fast_out[i]), float_bits(ref_out[i]))
          << "variant " << variant << " i " << i;
    }
  }
}

TEST_P(CodecConformance, WritesEveryByteOfTheHead) {
  const auto& values = realistic_head(shape_.key_dim, shape_.value_dim);
  EXPECT_EQ(
      testing::first_difference(encode(values, std::byte{0x00}), encode(values, std::byte{0xFF})),
      -1);
}

TEST_P(CodecConformance, RoundTripWithinTheCodecBound) {
  for (int variant = 0; variant < 2; ++variant) {
    const std::vector<float> values =
        variant == 0 ? realistic_head(shape_.key_dim, shape_.value_dim) : random_values(99, 1.0f);
    const std::vector<std::byte> bytes = encode(values);
    const std::vector<float> out = decode(bytes);
    for (std::size_t i = 0; i < n_; ++i) {
      ASSERT_TRUE(std::isfinite(out[i]));
      const double err = std::fabs(static_cast<double>(values[i]) - out[i]);
      ASSERT_LE(err, bound(bytes, i, values[i]))
          << to_string(id_) << " i " << i << " x " << values[i] << " x_hat " << out[i];
    }
  }
}

TEST_P(CodecConformance, ReEncodingADecodedHeadIsStable) {
  // A state that comes back unchanged must not drift when it is stored again.
  const auto& values = realistic_head(shape_.key_dim, shape_.value_dim);
  const auto first = encode(values);
  const auto second = encode(decode(first));
  EXPECT_EQ(testing::first_difference(first, second), -1);
}

TEST_P(CodecConformance, EncodeIsDeterministic) {
  const auto values = random_values(17, 1.0f);
  EXPECT_EQ(encode(values), encode(values));
}

TEST_P(CodecConformance, RejectsWrongBufferSizes) {
  std::vector<float> values(n_ + 1, 1.0f);
  std::vector<std::byte> bytes(codec_->head_bytes(0, 0) + 4);
  EXPECT_THROW(codec_->encode_head(0, 0, std::span<const float>(values).first(n_ + 1),
                                   std::span<std::byte>(bytes).first(bytes.size() - 4)),
               std::invalid_argument);
  EXPECT_THROW(codec_->encode_head(0, 0, std::span<const float>(values).first(n_), bytes),
               std::invalid_argument);
  EXPECT_THROW(codec_->decode_head(0, 0, bytes, std::span<float>(values).first(n_)),
               std::invalid_argument);
  EXPECT_THROW(
      codec_->decode_head(0, 0, std::span<const std::byte>(bytes).first(bytes.size() - 4), values),
      std::invalid_argument);
}

TEST_P(CodecConformance, ZerosDecodeToExactZeros) {
  const std::vector<float> zeros(n_, 0.0f);
  const auto bytes = encode(zeros);
  for (const float v : decode(bytes)) {
    ASSERT_EQ(v, 0.0f);
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [id, shape] = info.param;
  return std::string(to_string(id)) + "_" + std::to_string(shape.key_dim) + "x" +
         std::to_string(shape.value_dim) + "_g" + std::to_string(shape.group);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecConformance,
                         ::testing::Combine(::testing::ValuesIn(kCodecs),
                                            ::testing::ValuesIn(kShapes)),
                         param_name);

TEST(CodecFp32, IsExactForEveryFiniteValue) {
  const auto codec = make_codec(testing::head_layout(CodecId::fp32, 0, 64, 64));
  std::mt19937_64 rng(5);
  std::vector<float> values(64 * 64);
  for (auto& v : values) {
    do {
      v = bits_float(static_cast<std::uint32_t>(rng()));
    } while (!std::isfinite(v));
  }
  std::vector<std::byte> bytes(codec->head_bytes(0, 0));
  codec->encode_head(0, 0, values, bytes);
  std::vector<float> out(values.size());
  codec->decode_head(0, 0, bytes, out);
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(float_bits(out[i]), float_bits(values[i]));
  }
}

// Realistic states: relative RMS error falls with the width and stays within what the
// format promises (uniform: about s / sqrt(12) per value).
TEST(CodecAccuracy, RealisticStatesErrorOrdering) {
  std::map<CodecId, double> rel;
  for (const CodecId id : kCodecs) {
    const StateLayout layout = testing::head_layout(id, 0, 128, 128);
    const auto codec = make_codec(layout);
    double err2 = 0.0;
    double ref2 = 0.0;
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      std::vector<float> values(128 * 128);
      testing::synthetic_gdn_state(128, 128, 400, 77 + seed, values);
      std::vector<std::byte> bytes(codec->head_bytes(0, 0));
      codec->encode_head(0, 0, values, bytes);
      std::vector<float> out(values.size());
      codec->decode_head(0, 0, bytes, out);
      for (std::size_t i = 0; i < values.size(); ++i) {
        const double d = static_cast<double>(values[i]) - out[i];
        err2 += d * d;
        ref2 += static_cast<double>(values[i]) * values[i];
      }
    }
    rel[id] = std::sqrt(err2 / ref2);
  }
  EXPECT_EQ(rel[CodecId::fp32], 0.0);
  EXPECT_LT(rel[CodecId::fp16], 1e-3);
  EXPECT_LT(rel[CodecId::bf16], 5e-3);
  EXPECT_LT(rel[CodecId::fp16], rel[CodecId::bf16]);
  EXPECT_LT(rel[CodecId::int8], rel[CodecId::int6]);
  EXPECT_LT(rel[CodecId::int6], rel[CodecId::int4]);
  // The synthetic states have outlier columns (about 10x the row RMS), which is what
  // makes plain per-group absmax scaling lose precision; the errors scale as 1 / qmax.
  EXPECT_LT(rel[CodecId::int8], 0.05);
  EXPECT_LT(rel[CodecId::int6], 0.2);
  EXPECT_LT(rel[CodecId::int4], 0.5);
  const double r86 = rel[CodecId::int6] / rel[CodecId::int8];  // ~ 127 / 31
  const double r64 = rel[CodecId::int4] / rel[CodecId::int6];  // ~ 31 / 7, less with clamping
  EXPECT_GT(r86, 3.0);
  EXPECT_LT(r86, 5.5);
  EXPECT_GT(r64, 2.0);
  EXPECT_LT(r64, 5.5);
  for (const auto& [id, r] : rel) {
    RecordProperty(std::string("rel_rms_") + to_string(id), std::to_string(r));
  }
}

}  // namespace
}  // namespace statepool::kernels
