// Edge inputs of the float and int codecs, the rules docs/codecs.md states for their
// formats: exact scale bits, constant groups, denormals, saturation, short last groups,
// partial quads and padding, rounding with the stored scale. What every codec promises
// for zeros, denormals, NaN/Inf and re-encoding is test_codec_conformance.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/reference.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::kernels {
namespace {

const CodecId kUniform[] = {CodecId::int4, CodecId::int6, CodecId::int8};

struct Head {
  std::unique_ptr<Codec> codec;
  std::vector<std::byte> bytes;
  std::vector<float> out;
};

Head round_trip(CodecId id, std::uint32_t group, std::uint32_t key_dim, std::uint32_t value_dim,
                const std::vector<float>& values) {
  Head h;
  h.codec = make_codec(testing::head_layout(id, group, key_dim, value_dim));
  h.bytes.resize(h.codec->head_bytes(0, 0));
  h.codec->encode_head(0, 0, values, h.bytes);
  h.out.resize(values.size());
  h.codec->decode_head(0, 0, h.bytes, h.out);
  return h;
}

TEST(UniformEdges, ZerosGiveZeroScales) {
  // +0 and -0 alike: absmax is taken over |x| bits. (That zeros decode to +0 is the
  // conformance suite's, for every codec.)
  for (const CodecId id : kUniform) {
    for (const float zero : {0.0f, -0.0f}) {
      const Head h = round_trip(id, 32, 8, 8, std::vector<float>(64, zero));
      for (std::size_t g = 0; g < 2; ++g) {
        EXPECT_EQ(testing::stored_scale_bits(h.bytes, g), 0u) << to_string(id) << " " << zero;
      }
    }
  }
}

TEST(UniformEdges, ConstantGroupReconstructsToScaleTimesQmax) {
  for (const CodecId id : kUniform) {
    const std::uint32_t qmax = code_qmax(codec_code_bits(id));
    for (const float c : {0.37f, -5.1f, 1.0f, 1234.5f, 3.0e-2f, 3.0e-3f}) {
      const Head h = round_trip(id, 16, 4, 8, std::vector<float>(32, c));
      const float s =
          half_bits_to_float(float_to_half_bits(std::fabs(c) / static_cast<float>(qmax)));
      for (std::size_t g = 0; g < 2; ++g) {
        EXPECT_EQ(testing::stored_scale(h.bytes, g), s);
      }
      const float expected = std::copysign(s * static_cast<float>(qmax), c);
      for (const float v : h.out) {
        ASSERT_EQ(v, expected) << to_string(id) << " c " << c;
        // Relative 2^-11 while the scale is a normal fp16 (|c| / qmax >= 2^-14); below
        // that the scale's absolute rounding error (2^-25) times qmax bounds it.
        const double tol = std::max(std::ldexp(std::fabs(static_cast<double>(c)), -11),
                                    std::ldexp(static_cast<double>(qmax), -25));
        ASSERT_LE(std::fabs(static_cast<double>(v) - c), tol);
      }
    }
  }
}

TEST(UniformEdges, FloatDenormalsGiveZeroScaleAndBoundedError) {
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = (i % 2 == 0 ? 1.0f : -1.0f) * std::numeric_limits<float>::denorm_min() *
                static_cast<float>(i + 1);
  }
  for (const CodecId id : kUniform) {
    const Head h = round_trip(id, 32, 8, 8, values);
    EXPECT_EQ(testing::stored_scale_bits(h.bytes, 0), 0u);
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(h.out[i], 0.0f);
    }
  }
}

TEST(UniformEdges, TinyGroupsUseSubnormalScalesWithErrorBoundedByAbsmax) {
  // absmax / qmax lands in the fp16 subnormal range (< 2^-14): the scale keeps few
  // significant bits; each value's error stays below the group absmax.
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(static_cast<float>(i)) * 3.0e-6f;
  }
  for (const CodecId id : kUniform) {
    const Head h = round_trip(id, 64, 8, 8, values);
    const std::uint16_t sb = testing::stored_scale_bits(h.bytes, 0);
    EXPECT_LT(sb, 0x0400u) << to_string(id);  // subnormal or zero
    float absmax = 0.0f;
    for (const float v : values) {
      absmax = std::max(absmax, std::fabs(v));
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_LE(std::fabs(values[i] - h.out[i]), absmax) << to_string(id) << " i " << i;
      ASSERT_TRUE(std::isfinite(h.out[i]));
    }
  }
}

TEST(UniformEdges, HugeValuesSaturateToTheLargestMagnitude) {
  std::vector<float> values = {1e30f, -3e38f, 5.0f, -1e20f, std::numeric_limits<float>::max(),
                               0.0f,  1e6f,   -2e9f};
  for (const CodecId id : kUniform) {
    const std::uint32_t qmax = code_qmax(codec_code_bits(id));
    const Head h = round_trip(id, 8, 2, 4, values);
    EXPECT_EQ(testing::stored_scale_bits(h.bytes, 0), kHalfMaxBits);
    const float largest = kHalfMax * static_cast<float>(qmax);
    EXPECT_EQ(h.out[0], largest);
    EXPECT_EQ(h.out[1], -largest);
    EXPECT_EQ(h.out[4], largest);
    EXPECT_EQ(h.out[5], 0.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(std::isfinite(h.out[i]));
      ASSERT_LE(std::fabs(h.out[i]), largest);
      if (values[i] != 0.0f && std::fabs(h.out[i]) > 0.0f) {
        ASSERT_EQ(std::signbit(values[i]), std::signbit(h.out[i]));
      }
    }
  }
}

TEST(FloatEdges, HugeValuesSaturate) {
  const std::vector<float> values = {1e30f, -1e30f, std::numeric_limits<float>::max(), 70000.0f};
  const Head half = round_trip(CodecId::fp16, 0, 2, 2, values);
  EXPECT_EQ(half.out, (std::vector<float>{65504.0f, -65504.0f, 65504.0f, 65504.0f}));
  const Head bf = round_trip(CodecId::bf16, 0, 2, 2, values);
  const float bf_max = bf16_bits_to_float(kBf16MaxBits);
  EXPECT_EQ(bf.out[2], bf_max);
  EXPECT_TRUE(std::isfinite(bf.out[2]));
  EXPECT_EQ(bf.out[0], bf16_bits_to_float(float_to_bf16_bits(1e30f)));
}

TEST(UniformEdges, ShortLastGroupHasItsOwnScale) {
  // K = V = 10, G = 32: groups of 32, 32, 32 and a last group of 4 values. The last
  // group is 1e5 times smaller than the rest and must keep its own precision.
  std::vector<float> values(100);
  for (std::size_t i = 0; i < 96; ++i) {
    values[i] = 100.0f * std::cos(static_cast<float>(i));
  }
  const std::vector<float> tail = {1e-3f, -2e-3f, 5e-4f, 1.5e-3f};
  std::copy(tail.begin(), tail.end(), values.begin() + 96);
  for (const CodecId id : kUniform) {
    const std::uint32_t qmax = code_qmax(codec_code_bits(id));
    const Head h = round_trip(id, 32, 10, 10, values);
    const std::uint32_t bits = codec_code_bits(id);
    const std::size_t codes = bits == 6 ? 3 * 25 : 100 * bits / 8;
    EXPECT_EQ(h.bytes.size(), (8 + codes + 3) / 4 * 4);
    const float s_last = testing::stored_scale(h.bytes, 3);
    EXPECT_EQ(s_last, half_bits_to_float(float_to_half_bits(2e-3f / static_cast<float>(qmax))));
    for (std::size_t i = 96; i < 100; ++i) {
      EXPECT_LE(std::fabs(values[i] - h.out[i]), 0.5 * s_last * 1.001) << to_string(id);
    }
  }
}

TEST(UniformEdges, PartialQuadAndPaddingAreZero) {
  // n = 9, G = 4: scales 6 B; codes end inside a quad; trailing bytes are zero.
  std::vector<float> values(9, 1.0f);
  for (const CodecId id : kUniform) {
    const Head h = round_trip(id, 4, 3, 3, values);
    const std::uint32_t bits = codec_code_bits(id);
    const std::uint32_t qmax = code_qmax(bits);
    // Code bits after the 9th code, and padding bytes, are all zero.
    const std::uint8_t* codes = reinterpret_cast<const std::uint8_t*>(h.bytes.data()) + 6;
    for (std::size_t slot = 9; slot < 12; ++slot) {
      if ((slot * bits + bits - 1) / 8 < h.bytes.size() - 6) {
        EXPECT_EQ(get_code(codes, slot, bits), 0u) << to_string(id) << " slot " << slot;
      }
    }
    const std::size_t used = 6 + packed_bytes(9, bits);
    for (std::size_t i = used; i < h.bytes.size(); ++i) {
      EXPECT_EQ(h.bytes[i], std::byte{0}) << to_string(id) << " byte " << i;
    }
    for (std::size_t i = 0; i < 9; ++i) {
      EXPECT_EQ(get_code(codes, i, bits), 2 * qmax);  // z = +qmax
    }
  }
}

TEST(UniformEdges, RoundingUsesTheStoredScale) {
  // x / s with the fp16-rounded scale, ties to even: values exactly on k + 1/2 steps.
  const float s = 0.25f;  // exact in fp16; absmax = 31 * 0.25 = 7.75 for int6
  std::vector<float> values = {7.75f, 0.125f, 0.375f, -0.125f, -0.375f, 0.625f, 1.0f, -7.75f};
  const Head h = round_trip(CodecId::int6, 8, 2, 4, values);
  EXPECT_EQ(testing::stored_scale(h.bytes, 0), s);
  EXPECT_EQ(h.out, (std::vector<float>{7.75f, 0.0f, 0.5f, -0.0f, -0.5f, 0.5f, 1.0f, -7.75f}));
}

}  // namespace
}  // namespace statepool::kernels
