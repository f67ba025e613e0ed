// Synthetic gated-delta-rule states (testing/synthetic_state.hpp): deterministic, finite,
// shaped like real states (decayed, bounded, with outlier rows and columns); and the
// portable Gaussian they are drawn from (random.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::synthetic {
namespace {

using kernels::CodecId;
using kernels::DType;
using kernels::PageCodec;
using kernels::StateLayout;

TEST(Synthetic, DeterministicPerSeed) {
  std::vector<float> a(64 * 32);
  std::vector<float> b(64 * 32);
  std::vector<float> c(64 * 32);
  synthetic_gdn_state(64, 32, 100, 42, a);
  synthetic_gdn_state(64, 32, 100, 42, b);
  synthetic_gdn_state(64, 32, 100, 43, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Synthetic, FiniteNonTrivialAndBounded) {
  for (const bool kda : {false, true}) {
    std::vector<float> s(128 * 128);
    if (kda) {
      synthetic_kda_state(128, 128, 300, 5, s);
    } else {
      synthetic_gdn_state(128, 128, 300, 5, s);
    }
    double sum2 = 0.0;
    float absmax = 0.0f;
    for (const float v : s) {
      ASSERT_TRUE(std::isfinite(v));
      sum2 += static_cast<double>(v) * v;
      absmax = std::max(absmax, std::fabs(v));
    }
    EXPECT_GT(sum2, 0.0);
    EXPECT_LT(absmax, 1e4f);  // the delta rule keeps the state bounded
  }
}

TEST(Synthetic, HasOutlierColumns) {
  std::vector<float> s(128 * 128);
  synthetic_gdn_state(128, 128, 300, 8, s);
  std::vector<double> column(128, 0.0);
  for (std::size_t i = 0; i < 128; ++i) {
    for (std::size_t j = 0; j < 128; ++j) {
      column[j] = std::max(column[j], std::fabs(static_cast<double>(s[i * 128 + j])));
    }
  }
  std::vector<double> sorted = column;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(sorted.back(), 2.0 * sorted[64]);
}

TEST(Synthetic, RejectsWrongOutputSize) {
  std::vector<float> s(10);
  EXPECT_THROW(synthetic_gdn_state(4, 4, 1, 0, s), std::invalid_argument);
}

TEST(Synthetic, StagedStateHasTheStagedSize) {
  StateLayout layout = testing::head_layout(CodecId::int6, 0, 16, 8);
  layout.num_layers = 2;
  layout.num_heads = 3;
  layout.conv_channels = 5;
  layout.conv_width = 2;
  layout.conv_dtype = DType::f32;
  const PageCodec page(layout);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const auto staged = synthetic_staged_state(layout, 10, 1, dtype);
    EXPECT_EQ(staged.size(), page.staged_bytes(dtype));
  }
  EXPECT_THROW((void)synthetic_staged_state(layout, 10, 1, DType::f16), std::invalid_argument);
  layout.key_dim = 0;
  EXPECT_THROW((void)synthetic_staged_state(layout, 10, 1, DType::f32), std::invalid_argument);
}

// PortableNormal is what makes "seed S" name one synthetic state on every toolchain: its
// numbers come from the raw mt19937_64 output and libm, never from
// std::normal_distribution. Pinned here so that a change of generator cannot slip in.
TEST(PortableNormal, PinnedValuesForSeedOne) {
  PortableNormal rng(1);
  EXPECT_FLOAT_EQ(rng.next(), 0x1.676a94p-2f);
  EXPECT_FLOAT_EQ(rng.next(), 0x1.9f0464p-2f);  // the spare of the same Box-Muller draw
  EXPECT_FLOAT_EQ(rng.next(), 0x1.16007cp+0f);
  EXPECT_FLOAT_EQ(rng.next(), 0x1.2782e8p-3f);
  EXPECT_EQ(rng.uniform(), 0x1.6751d5cbb3f18p-2);  // integer arithmetic only: exact
  EXPECT_EQ(rng.below(1000), 409u);
}

TEST(PortableNormal, IsStandardNormal) {
  PortableNormal rng(7);
  double sum = 0.0;
  double sum2 = 0.0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const double x = rng.next();
    sum += x;
    sum2 += x * x;
  }
  EXPECT_NEAR(sum / kDraws, 0.0, 0.02);
  EXPECT_NEAR(sum2 / kDraws, 1.0, 0.02);
}

}  // namespace
}  // namespace statepool::synthetic
