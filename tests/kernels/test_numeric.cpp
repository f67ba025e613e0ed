// fp16 / bf16 conversions and rounding helpers (numeric.hpp): the storage format's
// per-value definition, checked against an independent double-precision oracle.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {
namespace {

// Round |f| to a binary floating-point grid with `mantissa_bits` explicit bits and
// minimum normal exponent `min_exp`, ties to even, in double (exact for float inputs).
double oracle_round(float f, int mantissa_bits, int min_exp, double max_finite) {
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) {
    return static_cast<double>(f);
  }
  int e = 0;
  (void)std::frexp(a, &e);                    // a = m * 2^e, m in [0.5, 1)
  const int lead = std::max(e - 1, min_exp);  // exponent of the leading bit (or subnormal)
  const double ulp = std::ldexp(1.0, lead - mantissa_bits);
  double v = std::nearbyint(a / ulp) * ulp;
  if (v > max_finite) {
    v = max_finite;  // saturation for finite inputs
  }
  return std::copysign(v, static_cast<double>(f));
}

double oracle_half(float f) {
  return oracle_round(f, 10, -14, 65504.0);
}
double oracle_bf16(float f) {
  return oracle_round(f, 7, -126, static_cast<double>(bf16_bits_to_float(kBf16MaxBits)));
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(0.5f), 0x3800);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0).
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3C02);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  // Subnormal ties: 2^-25 is halfway between 0 and 2^-24 -> 0; 3 * 2^-25 -> 2 * 2^-24.
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -25)), 0x0001);
  // Rounding up out of the subnormal range gives the smallest normal.
  EXPECT_EQ(float_to_half_bits(std::ldexp(1023.5f, -24)), 0x0400);
}

TEST(Fp16, FiniteOverflowSaturates) {
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7BFF);  // rounds to 65504 anyway
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7BFF);  // would round to Inf
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(-1e30f), 0xFBFF);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::max()), 0x7BFF);
}

TEST(Fp16, NonFiniteInputs) {
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  const std::uint16_t nan = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(half_bits_to_float(nan)));
  EXPECT_TRUE(std::isinf(half_bits_to_float(0x7C00)));
}

TEST(Fp16, TinyAndFloatDenormalInputsFlushToSignedZero) {
  EXPECT_EQ(float_to_half_bits(1e-40f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-1e-40f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half_bits(1e-9f), 0x0000);
}

TEST(Fp16, EveryFiniteHalfRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7C00) == 0x7C00) {
      continue;
    }
    const float f = half_bits_to_float(bits);
    ASSERT_EQ(float_to_half_bits(f), bits) << "half bits " << h;
    ASSERT_EQ(static_cast<double>(f), oracle_half(f)) << "half bits " << h;
  }
}

TEST(Fp16, MatchesOracleOnRandomFloats) {
  std::mt19937_64 rng(7);
  // Exponents from deep below the fp16 subnormals to beyond its range.
  std::uniform_int_distribution<std::uint32_t> exponent(90, 150);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, (1u << 23) - 1);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t sign = (i & 1) != 0 ? 0x80000000u : 0u;
    const float f = bits_float(sign | (exponent(rng) << 23) | mantissa(rng));
    ASSERT_EQ(static_cast<double>(half_bits_to_float(float_to_half_bits(f))), oracle_half(f))
        << "float " << f;
  }
}

TEST(Bf16, KnownValues) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  // 1 + 2^-8 ties to 1.0 (even); 1 + 3 * 2^-8 ties to 1 + 2^-6 (even).
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
}

TEST(Bf16, SaturatesAndKeepsNonFinite) {
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), kBf16MaxBits);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0x8000 | kBf16MaxBits);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  const std::uint16_t nan = float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(nan)));
  // A signalling NaN whose payload sits only in the low 16 bits must stay a NaN.
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(bits_float(0x7F800001u)))));
}

TEST(Bf16, EveryFiniteBf16RoundTripsAndRandomFloatsMatchOracle) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (is_non_finite_bf16(bits)) {
      continue;
    }
    ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(bits)), bits) << "bf16 bits " << b;
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float f = bits_float(bits);
    if (is_non_finite_bits(bits)) {
      continue;
    }
    ASSERT_EQ(static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(f))), oracle_bf16(f))
        << "float bits " << bits;
  }
}

TEST(Rounding, HalfEvenSmall) {
  EXPECT_EQ(round_half_even_small(0.5f), 0.0f);
  EXPECT_EQ(round_half_even_small(1.5f), 2.0f);
  EXPECT_EQ(round_half_even_small(2.5f), 2.0f);
  EXPECT_EQ(round_half_even_small(-2.5f), -2.0f);
  EXPECT_EQ(round_half_even_small(-3.5f), -4.0f);
  EXPECT_EQ(round_half_even_small(2.49999f), 2.0f);
  EXPECT_EQ(round_half_even_small(-127.0f), -127.0f);
  EXPECT_EQ(round_half_even_small(126.6f), 127.0f);
  for (float x = -130.0f; x <= 130.0f; x += 0.125f) {
    ASSERT_EQ(round_half_even_small(x), std::nearbyint(x)) << x;
  }
}

TEST(Bits, NonFiniteDetection) {
  EXPECT_TRUE(is_non_finite_bits(float_bits(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(is_non_finite_bits(float_bits(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_FALSE(is_non_finite_bits(float_bits(std::numeric_limits<float>::max())));
  EXPECT_FALSE(is_non_finite_bits(float_bits(std::numeric_limits<float>::denorm_min())));
  EXPECT_TRUE(is_non_finite_bf16(0x7F80));
  EXPECT_TRUE(is_non_finite_bf16(0xFFC1));
  EXPECT_FALSE(is_non_finite_bf16(0x7F7F));
}

}  // namespace
}  // namespace statepool::kernels
