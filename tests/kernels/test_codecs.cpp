// Codec-specific properties beyond the shared contract (test_codec_conformance.cpp): fp32
// is exact for every finite bit pattern, and on realistic states the relative error falls
// with the width as the formats predict.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::kernels {
namespace {

const CodecId kCodecs[] = {CodecId::fp32, CodecId::bf16, CodecId::fp16,
                           CodecId::int4, CodecId::int6, CodecId::int8};

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
      synthetic::synthetic_gdn_state(128, 128, 400, 77 + seed, values);
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
