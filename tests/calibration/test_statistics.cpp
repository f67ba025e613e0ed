// Derived calibration quantities (statistics.hpp): lifetime weight, impact factors, default
// pivot counts.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "statepool/calibration/statistics.hpp"

namespace statepool::calibration {
namespace {

// sum_{t<T} exp(2 g)^t by plain summation in long double.
long double geometric_sum(double g, std::uint32_t horizon) {
  const long double r = std::exp(2.0L * g);
  long double term = 1.0L;
  long double sum = 0.0L;
  for (std::uint32_t t = 0; t < horizon; ++t) {
    sum += term;
    term *= r;
  }
  return sum;
}

TEST(LifetimeWeight, ExactlyTheHorizonWithoutDecay) {
  EXPECT_EQ(lifetime_weight(0.0, 2048), 2048.0);
  EXPECT_EQ(lifetime_weight(-0.0, 2048), 2048.0);
  EXPECT_EQ(lifetime_weight(0.0, 1), 1.0);
  EXPECT_EQ(lifetime_weight(-0.3, 0), 0.0);
  EXPECT_EQ(lifetime_weight(0.5, 100), 100.0);  // growth is not a gate: treated as none
  EXPECT_EQ(lifetime_weight(-std::numeric_limits<double>::infinity(), 2048), 1.0);
}

TEST(LifetimeWeight, MatchesTheGeometricSum) {
  for (const double g : {-1e-12, -1e-9, -1e-6, -5e-4, -0.01, -0.1, -0.5, -3.0, -30.0}) {
    for (const std::uint32_t horizon : {1u, 7u, 2048u}) {
      const long double expected = geometric_sum(g, horizon);
      EXPECT_NEAR(lifetime_weight(g, horizon), static_cast<double>(expected),
                  1e-10 * static_cast<double>(expected))
          << "g " << g << " T " << horizon;
    }
  }
}

TEST(LifetimeWeight, ContinuousAndDecreasingTowardFastDecay) {
  double previous = lifetime_weight(0.0, 2048);
  for (double g = -1e-15; g > -10.0; g *= 3.0) {
    const double value = lifetime_weight(g, 2048);
    EXPECT_LE(value, previous) << g;
    EXPECT_GE(value, 1.0);
    previous = value;
  }
  EXPECT_NEAR(lifetime_weight(-1e-15, 2048), 2048.0, 1e-6);
}

double log_product(const std::vector<float>& w) {
  double sum = 0.0;
  for (const float value : w) {
    sum += std::log(static_cast<double>(value));
  }
  return sum;
}

TEST(LogDecayStatistic, EqualsTheMeanWithoutOutliers) {
  LogDecayStatistic none;
  EXPECT_EQ(none.value(), 0.0);
  LogDecayStatistic same;
  for (int i = 0; i < 1000; ++i) same.add(-1e-4);
  EXPECT_NEAR(same.value(), -1e-4, 1e-12);
  // Values spread over five decades: the trimmed mean of a symmetric sample is its mean.
  LogDecayStatistic spread;
  double sum = 0;
  for (int i = 0; i < 2001; ++i) {
    const double g = -(0.01 + 0.02 * std::sin(0.001 * i) * std::sin(0.001 * i));
    spread.add(g);
    sum += g;
  }
  EXPECT_NEAR(spread.value(), sum / 2001, 0.05 * std::fabs(sum / 2001));
  LogDecayStatistic zero;
  zero.add(0.0);
  zero.add(-0.0);
  EXPECT_EQ(zero.value(), 0.0);
}

// One reset (g = -inf, allowed in traces) or one outlier gate does not move a slow unit's
// typical decay: the plain mean would be -inf or -0.156.
TEST(LogDecayStatistic, OneResetOrOutlierCannotDominate) {
  for (const double outlier : {-std::numeric_limits<double>::infinity(), -80.0, -1e30}) {
    LogDecayStatistic s;
    for (int i = 0; i < 511; ++i) s.add(-1e-4);
    s.add(outlier);
    EXPECT_TRUE(std::isfinite(s.value())) << outlier;
    EXPECT_NEAR(s.value(), -1e-4, 1e-9) << outlier;
  }
  // Resets on most tokens are a short lifetime, and the value stays finite.
  LogDecayStatistic resets;
  for (int i = 0; i < 100; ++i) resets.add(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(resets.value(), -kMaxLogDecay);
  EXPECT_EQ(lifetime_weight(resets.value(), 2048), 1.0);
}

TEST(ImpactFactors, GeometricMeanNormalisedAndMonotone) {
  const std::vector<double> omega = {0.01, 0.5, 2.0, 0.0003, 7.5, 0.02, 1.0, 0.2};
  std::vector<float> w(omega.size());
  impact_factors(omega, 0.25, w);
  EXPECT_NEAR(log_product(w), 0.0, 1e-5);  // prod w_i = 1
  for (std::size_t a = 0; a < omega.size(); ++a) {
    for (std::size_t b = 0; b < omega.size(); ++b) {
      if (omega[a] < omega[b]) {
        EXPECT_LT(w[a], w[b]);
      }
    }
  }
  // w_a / w_b = (omega_a / omega_b)^(gamma / 2).
  EXPECT_NEAR(w[4] / w[0], std::pow(7.5 / 0.01, 0.125), 1e-5);
}

TEST(ImpactFactors, FloorsZeroAndTinyRows) {
  const std::vector<double> omega = {0.0, 1.0, 4.0, 1e-30};
  std::vector<float> w(omega.size());
  impact_factors(omega, 0.25, w);
  for (const float value : w) {
    EXPECT_TRUE(std::isfinite(value));
    EXPECT_GT(value, 0.0f);
  }
  EXPECT_FLOAT_EQ(w[0], w[3]);  // both at the floor, 1e-6 of the largest
  EXPECT_NEAR(w[2] / w[0], std::pow(4.0 / (4.0 * kImpactFloorRatio), 0.125), 1e-4);
  EXPECT_NEAR(log_product(w), 0.0, 1e-5);
}

TEST(ImpactFactors, OnesWithoutSignalOrWithoutTheSpatialAxis) {
  std::vector<float> w(4);
  impact_factors(std::vector<double>{0, 0, 0, 0}, 0.25, w);
  EXPECT_EQ(w, std::vector<float>(4, 1.0f));
  impact_factors(std::vector<double>{1, 2, 3, 4}, 0.0, w);
  EXPECT_EQ(w, std::vector<float>(4, 1.0f));
  EXPECT_THROW(impact_factors(std::vector<double>{1, -1, 3, 4}, 0.25, w), std::invalid_argument);
  EXPECT_THROW(impact_factors(std::vector<double>{1, 2}, 0.25, w), std::invalid_argument);
}

}  // namespace
}  // namespace statepool::calibration
