// kernels/recurrence.hpp's decay_factor: exp(g) from IEEE single operations only (the
// host and the device compute the same bits), checked against the correctly rounded
// exp over every range the gates of an engine can produce and the edges of float.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/recurrence.hpp"

namespace statepool::kernels {
namespace {

// Distance in units in the last place between two non-negative finite floats.
std::int64_t ulps(float a, float b) {
  return std::llabs(static_cast<std::int64_t>(float_bits(a)) -
                    static_cast<std::int64_t>(float_bits(b)));
}

TEST(DecayFactor, WithinTwoUlpOfExpEverywhere) {
  std::int64_t worst = 0;
  float worst_at = 0;
  // Every 97th float bit pattern from -104 to 89 (about 20 million values) ...
  const auto check = [&](float g) {
    const auto exact = static_cast<float>(std::exp(static_cast<double>(g)));
    const float got = decay_factor(g);
    const std::int64_t d = ulps(got, exact);
    if (d > worst) {
      worst = d;
      worst_at = g;
    }
  };
  for (std::uint32_t bits = float_bits(0.0f); bits <= float_bits(89.0f); bits += 97) {
    check(bits_float(bits));
  }
  for (std::uint32_t bits = float_bits(-0.0f); bits <= float_bits(-104.0f); bits += 97) {
    check(bits_float(bits));
  }
  // ... and the gates engines produce: g = -exp(A) softplus(a) in [-30, 0], densely.
  for (float g = -30.0f; g < 0.0f; g += 1.0e-4f) check(g);
  EXPECT_LE(worst, 2) << "at g = " << worst_at;
  std::printf("decay_factor: worst error %lld ulp (at g = %.9g)\n", static_cast<long long>(worst),
              static_cast<double>(worst_at));
}

TEST(DecayFactor, EdgesAndSpecialValues) {
  EXPECT_EQ(float_bits(decay_factor(0.0f)), float_bits(1.0f));
  EXPECT_EQ(float_bits(decay_factor(-0.0f)), float_bits(1.0f));
  EXPECT_TRUE(std::isnan(decay_factor(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(decay_factor(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(decay_factor(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(decay_factor(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isfinite(decay_factor(88.72f)));
  EXPECT_EQ(decay_factor(-200.0f), 0.0f);
  // Subnormal results stay within 2 of the exact value's subnormal units.
  for (const float g : {-87.5f, -95.0f, -100.0f, -103.0f}) {
    const double exact = std::exp(static_cast<double>(g));
    EXPECT_NEAR(decay_factor(g), exact,
                2.0 * std::numeric_limits<float>::denorm_min() + exact * 3.0e-7)
        << g;
  }
  // Monotone where gates live.
  float previous = 0.0f;
  for (float g = -20.0f; g <= 0.0f; g += 1.0e-3f) {
    const float d = decay_factor(g);
    ASSERT_GE(d, previous) << g;
    previous = d;
  }
}

}  // namespace
}  // namespace statepool::kernels
