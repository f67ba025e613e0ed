// The STEPQuant dual-axis fit (stepquant/fit.hpp) pinned against the specification:
// an independent scalar transcription of the formulas must give the same bits; the refit
// is the impact-weighted least-squares column scale up to fp16 rounding; codes stay in
// range; every scale is an fp16 value; pivots are exact; KDA rows of different widths
// share one column grid; 2-bit GDN heads use levels {-3,-1,1,3}; DSQ follows its formula.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/stepquant/fit.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels::stepquant {
namespace {

using testing::fp16;
using testing::is_fp16_exact;

// ---------------------------------------------------------------------------------------
// An independent, one-value-at-a-time transcription of the fit formulas (fit.hpp, format
// v2: binary32, the lane sum, reciprocals per row and column).

float fp16_sat(float y) {
  return fp16(std::min(y, 65504.0f));
}

// The lane sum: lane l adds values l, l + 32, ...; then the tree of strides 16 .. 1.
float lane_sum(const float* x, std::size_t n) {
  float p[32] = {};
  for (std::size_t j = 0; j < n; ++j) {
    p[j % 32] += std::fabs(x[j]);
  }
  for (std::size_t s = 16; s > 0; s /= 2) {
    for (std::size_t l = 0; l < s; ++l) {
      p[l] += p[l + s];
    }
  }
  return p[0];
}

// The level of quotient q in a b-bit unit: the nearest of {-3, -1, 1, 3} at 2 bits (ties
// to the even (z + 3) / 2), else the nearest integer within +-(2^(b-1) - 1).
int code(float q, int bits) {
  if (bits == 2) {
    const float u = std::clamp(std::nearbyint((q + 3.0f) * 0.5f), 0.0f, 3.0f);
    return 2 * static_cast<int>(u) - 3;
  }
  const int qmax = (1 << (bits - 1)) - 1;
  return static_cast<int>(
      std::clamp(std::nearbyint(q), -static_cast<float>(qmax), static_cast<float>(qmax)));
}

// L_b and, on the 8-bit grid, g_b: the largest power of two with L_b g_b <= 127.
int level_limit(int bits) {
  return bits == 2 ? 3 : (1 << (bits - 1)) - 1;
}
int grid_of(int bits) {
  int g = 1;
  while (level_limit(bits) * g * 2 <= 127) g *= 2;
  return g;
}

struct Naive {
  std::vector<float> r;
  std::vector<float> c_first;  // step 2
  std::vector<int> z_first;    // step 3 with c_first
  std::vector<float> c;        // after the refit
  std::vector<int> z_fitted;   // the codes the last refit round was fitted to
  std::vector<int> z;          // final codes
  std::vector<float> pivots;
};

Naive naive_dual(const std::vector<float>& x, std::uint32_t K, std::uint32_t V,
                 const std::vector<std::uint8_t>& widths, const std::vector<float>& impact,
                 bool grid8, bool refit) {
  Naive n;
  n.r.assign(K, 0.0f);
  const auto pivot = [&](std::size_t i) { return widths[i] == kPivotWidth; };
  const auto qmax = [&](std::size_t i) { return level_limit(widths[i]); };
  const auto g = [&](std::size_t i) { return grid8 ? grid_of(widths[i]) : 1; };
  const auto recip = [](float y) { return y > 0.0f ? 1.0f / y : 0.0f; };
  for (std::size_t i = 0; i < K; ++i) {
    if (pivot(i)) {
      for (std::size_t j = 0; j < V; ++j) {
        n.pivots.push_back(fp16(x[i * V + j]));
      }
      continue;
    }
    const float s = lane_sum(&x[i * V], V);
    const float r = fp16_sat(std::sqrt(s / (static_cast<float>(V) * impact[i])));
    n.r[i] = r == 0.0f ? (widths[i] == 2 ? 0.0f : 1.0f) : r;
  }
  n.c_first.assign(V, 0.0f);
  for (std::size_t j = 0; j < V; ++j) {
    float m = 0.0f;
    for (std::size_t i = 0; i < K; ++i) {
      if (!pivot(i)) {
        const float e = recip(n.r[i] * static_cast<float>(qmax(i) * g(i)));
        m = std::max(m, std::fabs(x[i * V + j]) * e);
      }
    }
    n.c_first[j] = fp16_sat(m);
  }
  const auto codes = [&](const std::vector<float>& c) {
    std::vector<int> z(std::size_t{K} * V, 0);
    for (std::size_t i = 0; i < K; ++i) {
      const float a = pivot(i) ? 0.0f : recip(n.r[i] * static_cast<float>(g(i)));
      for (std::size_t j = 0; j < V && !pivot(i); ++j) {
        z[i * V + j] = code((x[i * V + j] * a) * recip(c[j]), widths[i]);
      }
    }
    return z;
  };
  n.z_first = codes(n.c_first);
  n.c = n.c_first;
  n.z_fitted = n.z_first;
  // Two rounds when a row has 2 bits or the non-pivot rows average 4 bits or fewer.
  int rows = 0;
  int width_sum = 0;
  bool two_bit = false;
  for (const std::uint8_t b : widths) {
    if (b == kPivotWidth) continue;
    ++rows;
    width_sum += b;
    two_bit = two_bit || b == 2;
  }
  const bool coarse = two_bit || (rows > 0 && width_sum <= 4 * rows);
  const int rounds = refit ? (coarse ? 2 : 1) : 0;
  for (int round = 0; round < rounds; ++round) {
    if (round > 0) n.z_fitted = codes(n.c);
    for (std::size_t j = 0; j < V; ++j) {
      float num = 0.0f;
      float den = 0.0f;
      for (std::size_t i = 0; i < K; ++i) {
        if (!pivot(i)) {
          const float v =
              n.r[i] * static_cast<float>(g(i)) * static_cast<float>(n.z_fitted[i * V + j]);
          const float t = (impact[i] * impact[i]) * v;
          num += t * x[i * V + j];
          den += t * v;
        }
      }
      const float q = num / den;
      if (den > 0.0f && q > 0.0f && std::isfinite(q) && fp16_sat(q) > 0.0f) {
        n.c[j] = fp16_sat(q);
      }
    }
  }
  n.z = codes(n.c);
  return n;
}

// ---------------------------------------------------------------------------------------

std::vector<float> gdn_head(std::uint32_t K, std::uint32_t V, std::uint64_t seed,
                            std::uint32_t steps = 300) {
  std::vector<float> x(std::size_t{K} * V);
  synthetic::synthetic_gdn_state(K, V, steps, seed, x);
  return x;
}

std::vector<float> kda_head(std::uint32_t K, std::uint32_t V, std::uint64_t seed) {
  std::vector<float> x(std::size_t{K} * V);
  synthetic::synthetic_kda_state(K, V, 300, seed, x);
  return x;
}

std::vector<float> heavy_tailed(std::size_t n, std::uint64_t seed, float spread) {
  return synthetic::heavy_tailed_values(n, seed, spread);
}

std::vector<float> impacts(std::uint32_t K, std::uint64_t seed) {
  auto draw = testing::random_impact(seed);
  std::vector<float> w(K);
  for (std::size_t i = 0; i < K; ++i) {
    w[i] = draw(i);
  }
  return w;
}

// Mixed KDA widths: a deterministic pattern with every width and a few pivots.
std::vector<std::uint8_t> kda_widths(std::uint32_t K, bool budget4, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> w(K);
  const std::uint8_t options6[] = {4, 6, 6, 6, 8, 16};
  const std::uint8_t options4[] = {2, 4, 4, 6, 8, 16};
  const std::uint8_t* options = budget4 ? options4 : options6;
  for (auto& b : w) {
    const std::size_t pick = static_cast<std::size_t>(rng() % 6);
    b = options[pick];
  }
  return w;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(float_bits(a[i]), float_bits(b[i]))
        << what << "[" << i << "] " << a[i] << " vs " << b[i];
  }
}

void expect_codes_equal(const std::vector<std::int32_t>& a, const std::vector<int>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], b[i]) << "code " << i;
  }
}

struct Shape {
  std::uint32_t K;
  std::uint32_t V;
};
// {21, 13}: two groups of eight rows of the row sums and a tail of five.
const Shape kShapes[] = {{128, 128}, {64, 96}, {21, 13}, {7, 5}, {3, 33}, {1, 1}};

TEST(StepQuantFit, GdnMatchesTheFormulasBitForBit) {
  for (const Shape s : kShapes) {
    for (const std::uint8_t b : {std::uint8_t{4}, std::uint8_t{6}, std::uint8_t{8}}) {
      for (int data = 0; data < 2; ++data) {
        const auto x = data == 0 ? gdn_head(s.K, s.V, 11 + b) : heavy_tailed(s.K * s.V, b, 1.5f);
        const auto w = impacts(s.K, 5 + data);
        const std::vector<std::uint8_t> widths(s.K, b);
        HeadFit fit;
        fit_head(Arch::gdn, x, s.K, s.V, widths, w, fit);
        const Naive n = naive_dual(x, s.K, s.V, widths, w, false, true);
        SCOPED_TRACE(std::to_string(s.K) + "x" + std::to_string(s.V) + " b" + std::to_string(b) +
                     " data " + std::to_string(data));
        EXPECT_EQ(fit.kind, FitKind::dual_axis);
        expect_bits_equal(fit.row_scale, n.r, "r");
        expect_bits_equal(fit.col_scale, n.c, "c");
        expect_codes_equal(fit.codes, n.z);
        EXPECT_TRUE(fit.pivot_values.empty());
      }
    }
  }
}

TEST(StepQuantFit, KdaMixedWidthsMatchTheFormulasBitForBit) {
  for (const Shape s : kShapes) {
    for (const bool budget4 : {false, true}) {
      const auto x = kda_head(s.K, s.V, 3 + s.K);
      const auto w = impacts(s.K, 9);
      const auto widths = kda_widths(s.K, budget4, s.K * 31 + s.V);
      HeadFit fit;
      fit_head(Arch::kda, x, s.K, s.V, widths, w, fit);
      const Naive n = naive_dual(x, s.K, s.V, widths, w, true, true);
      SCOPED_TRACE(std::to_string(s.K) + "x" + std::to_string(s.V));
      EXPECT_EQ(fit.kind, FitKind::dual_axis_grid8);
      expect_bits_equal(fit.row_scale, n.r, "r");
      expect_bits_equal(fit.col_scale, n.c, "c");
      expect_codes_equal(fit.codes, n.z);
      expect_bits_equal(fit.pivot_values, n.pivots, "pivot");
    }
  }
}

// The no_refit ablation: steps 1-3 only, with the impact and (KDA) the shared grid.
TEST(StepQuantFit, NoRefitStopsAfterStepThree) {
  for (const Shape s : kShapes) {
    for (const Arch arch : {Arch::gdn, Arch::kda}) {
      const bool kda = arch == Arch::kda;
      const auto x = kda ? kda_head(s.K, s.V, 7 + s.K) : gdn_head(s.K, s.V, 17 + s.V);
      const auto w = impacts(s.K, 13);
      const auto widths =
          kda ? kda_widths(s.K, true, s.K + s.V) : std::vector<std::uint8_t>(s.K, 6);
      HeadFit fit;
      fit_head(arch, x, s.K, s.V, widths, w, fit, Refit::off);
      const Naive n = naive_dual(x, s.K, s.V, widths, w, kda, false);
      SCOPED_TRACE(std::to_string(s.K) + "x" + std::to_string(s.V) + (kda ? " kda" : " gdn"));
      expect_bits_equal(fit.row_scale, n.r, "r");
      expect_bits_equal(fit.col_scale, n.c_first, "c");
      expect_codes_equal(fit.codes, n.z_first);
      expect_bits_equal(fit.pivot_values, n.pivots, "pivot");
    }
  }
}

TEST(StepQuantFit, DsqMatchesItsFormula) {
  for (const Shape s : kShapes) {
    for (const std::uint32_t b : {4u, 6u}) {
      const auto x = gdn_head(s.K, s.V, 21 + b);
      HeadFit fit;
      fit_head_dsq(x, s.K, s.V, b, fit);
      const std::vector<std::uint8_t> widths(s.K, static_cast<std::uint8_t>(b));
      const Naive n = naive_dual(x, s.K, s.V, widths, std::vector<float>(s.K, 1.0f), false, false);
      EXPECT_EQ(fit.kind, FitKind::dual_axis);
      expect_bits_equal(fit.row_scale, n.r, "r");
      expect_bits_equal(fit.col_scale, n.c_first, "c");
      expect_codes_equal(fit.codes, n.z_first);
      // No refit: every value of the column with the largest |x / r| sits at +-qmax or
      // within rounding of it, i.e. c_j is the max-based scale.
      std::vector<float> out(x.size());
      reconstruct(Arch::gdn, fit, widths, out);
      for (std::size_t j = 0; j < s.V; ++j) {
        for (std::size_t i = 0; i < s.K; ++i) {
          const std::size_t k = i * s.V + j;
          ASSERT_EQ(float_bits(out[k]), float_bits((fit.row_scale[i] * fit.col_scale[j]) *
                                                   static_cast<float>(fit.codes[k])));
        }
      }
    }
  }
}

// Impact-weighted squared error of column j for codes z and scale c (non-pivot rows).
long double column_error(const std::vector<float>& x, const HeadFit& fit, const std::vector<int>& z,
                         const std::vector<std::uint8_t>& widths, const std::vector<float>& w,
                         bool grid8, std::size_t j, long double c) {
  const std::size_t V = fit.value_dim;
  long double e = 0.0L;
  for (std::size_t i = 0; i < fit.key_dim; ++i) {
    if (widths[i] == kPivotWidth) {
      continue;
    }
    const long double g = grid8 ? grid_of(widths[i]) : 1.0L;
    const long double v = static_cast<long double>(fit.row_scale[i]) * g * z[i * V + j];
    const long double d = x[i * V + j] - c * v;
    e += static_cast<long double>(w[i]) * w[i] * d * d;
  }
  return e;
}

float next_half_up(float h) {
  return half_bits_to_float(static_cast<std::uint16_t>(float_to_half_bits(h) + 1));
}
float next_half_down(float h) {
  return half_bits_to_float(static_cast<std::uint16_t>(float_to_half_bits(h) - 1));
}

TEST(StepQuantFit, RefitIsTheWeightedLeastSquaresScaleUpToFp16Rounding) {
  int checked = 0;
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      const std::uint32_t K = 64;
      const std::uint32_t V = 48;
      const auto x = arch == Arch::gdn ? gdn_head(K, V, 100 + seed) : kda_head(K, V, 100 + seed);
      const auto w = impacts(K, 200 + seed);
      const auto widths = arch == Arch::gdn ? std::vector<std::uint8_t>(K, 6)
                                            : kda_widths(K, seed == 2, 300 + seed);
      const bool grid8 = arch == Arch::kda;
      HeadFit fit;
      fit_head(arch, x, K, V, widths, w, fit);
      // The codes the (last round of the) refit was fitted to.
      const Naive n = naive_dual(x, K, V, widths, w, grid8, true);
      for (std::size_t j = 0; j < V; ++j) {
        long double num = 0.0L;
        long double den = 0.0L;
        for (std::size_t i = 0; i < K; ++i) {
          if (widths[i] == kPivotWidth) {
            continue;
          }
          const long double g = grid8 ? grid_of(widths[i]) : 1.0L;
          const long double v =
              static_cast<long double>(fit.row_scale[i]) * g * n.z_fitted[i * V + j];
          num += static_cast<long double>(w[i]) * w[i] * v * x[i * V + j];
          den += static_cast<long double>(w[i]) * w[i] * v * v;
        }
        if (den == 0.0L) {
          continue;
        }
        const long double exact = num / den;
        const float c = fit.col_scale[j];
        ASSERT_TRUE(is_fp16_exact(c));
        // The stored scale is the fp16 value nearest the exact LS solution: no fp16
        // neighbour is closer. Slack: the quotient is rounded to binary32 before fp16
        // (fit.hpp), which can move a near-tie by 2^-24 relative, i.e. < 2^-12 ulp.
        const long double dist = std::fabs(static_cast<long double>(c) - exact);
        const long double e0 = column_error(x, fit, n.z_fitted, widths, w, grid8, j, c);
        for (const float other : {next_half_up(c), next_half_down(c)}) {
          const long double ulp = std::fabs(static_cast<long double>(other) - c);
          EXPECT_LE(dist, std::fabs(static_cast<long double>(other) - exact) + 1e-3L * ulp)
              << "column " << j;
          // Equivalently: a one-ulp perturbation never lowers the weighted error E (a
          // parabola den (c - exact)^2 + const), beyond that rounding.
          const long double e1 = column_error(x, fit, n.z_fitted, widths, w, grid8, j, other);
          EXPECT_LE(e0, e1 + 1e-3L * den * ulp * ulp + 1e-15L * e1) << "column " << j;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(StepQuantFit, FinalCodesAreTheNearestCodesForTheRefittedScales) {
  const std::uint32_t K = 32;
  const std::uint32_t V = 40;
  const auto x = kda_head(K, V, 77);
  const auto w = impacts(K, 78);
  const auto widths = kda_widths(K, true, 79);
  HeadFit fit;
  fit_head(Arch::kda, x, K, V, widths, w, fit);
  for (std::size_t i = 0; i < K; ++i) {
    if (widths[i] == kPivotWidth) {
      continue;
    }
    const int qmax = level_limit(widths[i]);
    const int spacing = widths[i] == 2 ? 2 : 1;  // four-level units: levels 2 apart
    const double step = static_cast<double>(fit.row_scale[i]) * grid_of(widths[i]);
    for (std::size_t j = 0; j < V; ++j) {
      const int z = fit.codes[i * V + j];
      ASSERT_LE(std::abs(z), qmax);
      const double d = step * fit.col_scale[j];
      if (d == 0.0) {
        ASSERT_EQ(z, widths[i] == 2 ? 1 : 0);
        continue;
      }
      // No other level in range reconstructs x closer.
      const double err = std::fabs(x[i * V + j] - d * z);
      for (const int other : {z - spacing, z + spacing}) {
        if (std::abs(other) <= qmax) {
          ASSERT_LE(err, std::fabs(x[i * V + j] - d * other) * (1 + 1e-6) + 1e-30)
              << "row " << i << " col " << j;
        }
      }
    }
  }
}

TEST(StepQuantFit, RefitDoesNotIncreaseTheWeightedError) {
  // Versus the same fit without a refit (the first pass): the refitted column minimises
  // the weighted error for the first-pass codes and re-encoding can only lower it further,
  // up to fp16 rounding of the new scale.
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::uint32_t K = 128;
    const std::uint32_t V = 128;
    const auto x = gdn_head(K, V, 500 + seed);
    const auto w = impacts(K, 600 + seed);
    const std::vector<std::uint8_t> widths(K, 6);
    HeadFit fit;
    fit_head(Arch::gdn, x, K, V, widths, w, fit);
    const Naive n = naive_dual(x, K, V, widths, w, false, true);
    long double before = 0.0L;
    long double after = 0.0L;
    for (std::size_t i = 0; i < K; ++i) {
      for (std::size_t j = 0; j < V; ++j) {
        const std::size_t k = i * V + j;
        const long double w2 = static_cast<long double>(w[i]) * w[i];
        const long double d0 =
            x[k] - static_cast<long double>(n.r[i]) * n.c_first[j] * n.z_first[k];
        const long double d1 =
            x[k] - static_cast<long double>(fit.row_scale[i]) * fit.col_scale[j] * fit.codes[k];
        before += w2 * d0 * d0;
        after += w2 * d1 * d1;
      }
    }
    EXPECT_LE(after, before * 1.001L) << "seed " << seed;
    RecordProperty("refit_error_ratio_seed" + std::to_string(seed),
                   std::to_string(static_cast<double>(after / before)));
  }
}

TEST(StepQuantFit, EveryScaleIsAnFp16ValueAndCodesAreInRange) {
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (int data = 0; data < 3; ++data) {
      const std::uint32_t K = 48;
      const std::uint32_t V = 70;
      const float spread = data == 0 ? 0.5f : data == 1 ? 3.0f : 6.0f;
      const auto x = heavy_tailed(K * V, 40 + data, spread);
      const auto w = impacts(K, 41 + data);
      for (const std::uint8_t b :
           {std::uint8_t{2}, std::uint8_t{4}, std::uint8_t{6}, std::uint8_t{8}}) {
        const auto widths =
            arch == Arch::gdn ? std::vector<std::uint8_t>(K, b) : kda_widths(K, b == 2, b);
        HeadFit fit;
        fit_head(arch, x, K, V, widths, w, fit);
        for (const float s : fit.row_scale) {
          ASSERT_TRUE(std::isfinite(s) && s >= 0.0f && is_fp16_exact(s)) << s;
        }
        for (const float s : fit.col_scale) {
          ASSERT_TRUE(std::isfinite(s) && s >= 0.0f && is_fp16_exact(s)) << s;
        }
        for (std::size_t i = 0; i < K; ++i) {
          const std::uint32_t bits = widths[i];
          for (std::size_t j = 0; j < V; ++j) {
            const int z = fit.codes[i * V + j];
            if (bits == kPivotWidth) {
              ASSERT_EQ(z, 0);
            } else {
              ASSERT_LE(std::abs(z), static_cast<int>(level_max(bits)));
              if (bits == 2) {
                ASSERT_EQ(std::abs(z) % 2, 1) << "four-level units have odd levels";
              }
            }
          }
        }
        std::vector<float> out(x.size());
        reconstruct(arch, fit, widths, out);
        for (const float v : out) {
          ASSERT_TRUE(std::isfinite(v));
        }
      }
    }
  }
}

TEST(StepQuantFit, PivotRowsAndHeadsAreExactFp16) {
  const std::uint32_t K = 16;
  const std::uint32_t V = 24;
  auto x = heavy_tailed(K * V, 3, 4.0f);
  x[5] = 1e6f;     // saturates to 65504
  x[6] = -1e-30f;  // underflows to -0
  const auto w = impacts(K, 4);
  // KDA: rows 0, 3, 15 pivots.
  std::vector<std::uint8_t> widths(K, 6);
  widths[0] = widths[3] = widths[15] = kPivotWidth;
  HeadFit fit;
  fit_head(Arch::kda, x, K, V, widths, w, fit);
  std::vector<float> out(x.size());
  reconstruct(Arch::kda, fit, widths, out);
  ASSERT_EQ(fit.pivot_values.size(), 3u * V);
  for (const std::size_t i : {0u, 3u, 15u}) {
    EXPECT_EQ(fit.row_scale[i], 0.0f);
    for (std::size_t j = 0; j < V; ++j) {
      ASSERT_EQ(float_bits(out[i * V + j]), float_bits(fp16(x[i * V + j])));
    }
  }
  EXPECT_EQ(out[5], 65504.0f);
  EXPECT_EQ(float_bits(out[6]), float_bits(-0.0f));
  // A GDN pivot head: every value.
  const std::vector<std::uint8_t> all(K, kPivotWidth);
  fit_head(Arch::gdn, x, K, V, all, w, fit);
  reconstruct(Arch::gdn, fit, all, out);
  for (std::size_t k = 0; k < x.size(); ++k) {
    ASSERT_EQ(float_bits(out[k]), float_bits(fp16(x[k])));
  }
  // Pivot rows do not take part in the column scales: a huge pivot row changes nothing
  // in the other rows.
  auto y = x;
  widths.assign(K, 8);
  widths[2] = kPivotWidth;
  HeadFit a;
  fit_head(Arch::kda, y, K, V, widths, w, a);
  for (std::size_t j = 0; j < V; ++j) {
    y[2 * V + j] = 1e5f * static_cast<float>(j + 1);
  }
  HeadFit b;
  fit_head(Arch::kda, y, K, V, widths, w, b);
  expect_bits_equal(a.col_scale, b.col_scale, "c");
  expect_codes_equal(a.codes, std::vector<int>(b.codes.begin(), b.codes.end()));
}

TEST(StepQuantFit, KdaRowsShareOneColumnGrid) {
  // Rows of width 8, 6, 4, 2 (independent values of one distribution) share one c_j;
  // each row's reconstruction is r_i c_j z_ij 2^(8-b_i): x̂ / (r_i c_j) is a multiple of
  // 2^(8-b_i) within +-qmax_b 2^(8-b_i).
  const std::uint32_t K = 32;
  const std::uint32_t V = 64;
  const auto x = heavy_tailed(std::size_t{K} * V, 8, 0.5f);
  std::vector<std::uint8_t> widths(K);
  for (std::size_t i = 0; i < K; ++i) {
    widths[i] = static_cast<std::uint8_t>(8 - 2 * (i % 4));
  }
  const std::vector<float> w(K, 1.0f);
  HeadFit fit;
  fit_head(Arch::kda, x, K, V, widths, w, fit);
  std::vector<float> out(x.size());
  reconstruct(Arch::kda, fit, widths, out);
  ASSERT_EQ(fit.col_scale.size(), V);
  double err[9] = {};
  for (std::size_t i = 0; i < K; ++i) {
    const auto g = static_cast<std::int32_t>(grid_factor(widths[i]));
    for (std::size_t j = 0; j < V; ++j) {
      const std::size_t k = i * V + j;
      ASSERT_EQ(float_bits(out[k]), float_bits((fit.row_scale[i] * fit.col_scale[j]) *
                                               static_cast<float>(fit.codes[k] * g)));
      err[widths[i]] += std::fabs(static_cast<double>(x[k]) - out[k]);
    }
  }
  // The shared grid serves every width: errors grow as the width shrinks.
  EXPECT_LT(err[8], err[6]);
  EXPECT_LT(err[6], err[4]);
  EXPECT_LT(err[4], err[2]);
  // 2-bit KDA rows have the four levels -3, -1, 1, 3 (times 32 on the grid).
  for (std::size_t j = 0; j < V; ++j) {
    const std::int32_t z = fit.codes[3 * V + j];
    EXPECT_TRUE(z == -3 || z == -1 || z == 1 || z == 3) << z;
  }
}

// A 2-bit GDN head is the dual-axis fit with the four levels {-3, -1, 1, 3} and two rounds
// of the refit: the same reconstruction as a KDA head whose rows are all 2-bit (there the
// levels sit on the 8-bit grid, times 32, and the column scales are 32 times smaller:
// both exact in fp16).
TEST(StepQuantFit, TwoBitGdnHeadsAreFourLevelDualAxis) {
  const std::uint32_t K = 5;
  const std::uint32_t V = 70;
  const auto x = heavy_tailed(K * V, 12, 1.0f);
  const std::vector<std::uint8_t> widths(K, 2);
  const std::vector<float> w = {1.0f, 2.0f, 0.5f, 1.0f, 1.5f};
  HeadFit gdn, kda;
  fit_head(Arch::gdn, x, K, V, widths, w, gdn);
  fit_head(Arch::kda, x, K, V, widths, w, kda);
  EXPECT_EQ(gdn.kind, FitKind::dual_axis);
  ASSERT_EQ(gdn.row_scale.size(), K);
  ASSERT_EQ(gdn.col_scale.size(), V);
  for (const std::int32_t z : gdn.codes) ASSERT_TRUE(z == -3 || z == -1 || z == 1 || z == 3) << z;
  std::vector<float> a(x.size()), b(x.size());
  reconstruct(Arch::gdn, gdn, widths, a);
  reconstruct(Arch::kda, kda, widths, b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(gdn.row_scale, kda.row_scale);
  for (std::size_t j = 0; j < V; ++j) EXPECT_EQ(gdn.col_scale[j], 32.0f * kda.col_scale[j]) << j;
}

// One outlier in an N(0, 1)-like head: x[17][33] = 1000. The format of the paper (one
// scale per 32 values of a row, levels {-3,-1,1,3} without zero) decoded its 31 row
// neighbours to about +-76. Four-level dual-axis units have no zero level either: the
// outlier's column scale and its row's scale reach the other 2-bit values of its column
// (mean error 30 here) and row (0.5, against 0.07 without the outlier), the trade stated in
// docs/codecs.md, "2-bit heads and rows". Every other value decodes as well as without the
// outlier, and the outlier itself is kept.
TEST(StepQuantFit, TwoBitOutlierSpoilsOnlyItsRowAndColumn) {
  const std::uint32_t K = 64;
  const std::uint32_t V = 64;
  const std::vector<float> clean = gdn_head(K, V, 5);
  std::vector<float> x = clean;
  x[17 * V + 33] = 1000.0f;
  const std::vector<std::uint8_t> widths(K, 2);
  const auto decode = [&](const std::vector<float>& head) {
    HeadFit fit;
    fit_head(Arch::gdn, head, K, V, widths, std::vector<float>(K, 1.0f), fit);
    std::vector<float> out(head.size());
    reconstruct(Arch::gdn, fit, widths, out);
    return out;
  };
  const std::vector<float> out = decode(x);
  const std::vector<float> base = decode(clean);
  double rest = 0, rest_base = 0;
  for (std::uint32_t i = 0; i < K; ++i) {
    for (std::uint32_t j = 0; j < V; ++j) {
      const std::size_t k = i * V + j;
      if (i == 17 || j == 33) continue;
      rest += std::fabs(out[k] - x[k]);
      rest_base += std::fabs(base[k] - clean[k]);
    }
  }
  EXPECT_LT(rest, 1.1 * rest_base);
  EXPECT_NEAR(out[17 * V + 33], 1000.0f, 100.0f);
}

TEST(StepQuantFit, ImportantRowsGetFinerSteps) {
  const std::uint32_t K = 32;
  const std::uint32_t V = 128;
  const auto x = gdn_head(K, V, 42);
  const std::vector<std::uint8_t> widths(K, 6);
  std::vector<float> w(K, 1.0f);
  HeadFit plain;
  fit_head(Arch::gdn, x, K, V, widths, w, plain);
  for (std::size_t i = 0; i < K; i += 2) {
    w[i] = 4.0f;  // r_i halves: sqrt(m / 4) = sqrt(m) / 2
  }
  HeadFit weighted;
  fit_head(Arch::gdn, x, K, V, widths, w, weighted);
  double err_plain = 0.0;
  double err_weighted = 0.0;
  std::vector<float> a(x.size());
  std::vector<float> b(x.size());
  reconstruct(Arch::gdn, plain, widths, a);
  reconstruct(Arch::gdn, weighted, widths, b);
  for (std::size_t i = 0; i < K; i += 2) {
    EXPECT_EQ(weighted.row_scale[i], fp16(plain.row_scale[i] / 2.0f)) << i;
    for (std::size_t j = 0; j < V; ++j) {
      err_plain += std::pow(static_cast<double>(x[i * V + j]) - a[i * V + j], 2);
      err_weighted += std::pow(static_cast<double>(x[i * V + j]) - b[i * V + j], 2);
    }
  }
  EXPECT_LT(err_weighted, err_plain);
}

TEST(StepQuantFit, EdgeInputs) {
  const std::uint32_t K = 8;
  const std::uint32_t V = 16;
  const std::vector<float> w(K, 1.0f);
  const std::vector<std::uint8_t> widths(K, 6);
  HeadFit fit;
  std::vector<float> out(std::size_t{K} * V);

  // Zeros: row scales fall back to 1, column scales 0, codes 0, exact zeros out.
  fit_head(Arch::gdn, std::vector<float>(out.size(), 0.0f), K, V, widths, w, fit);
  for (const float r : fit.row_scale) {
    EXPECT_EQ(r, 1.0f);
  }
  for (const float c : fit.col_scale) {
    EXPECT_EQ(c, 0.0f);
  }
  reconstruct(Arch::gdn, fit, widths, out);
  for (const float v : out) {
    EXPECT_EQ(v, 0.0f);
  }

  // A zero row among ordinary rows decodes to zeros; the others are unaffected.
  auto x = heavy_tailed(out.size(), 9, 0.3f);
  std::fill(x.begin() + V, x.begin() + 2 * V, 0.0f);
  fit_head(Arch::gdn, x, K, V, widths, w, fit);
  EXPECT_EQ(fit.row_scale[1], 1.0f);
  reconstruct(Arch::gdn, fit, widths, out);
  for (std::size_t j = 0; j < V; ++j) {
    EXPECT_EQ(out[V + j], 0.0f);
  }

  // Constant rows: reconstructed within one half-step.
  std::vector<float> c(out.size());
  for (std::size_t i = 0; i < K; ++i) {
    std::fill(c.begin() + static_cast<std::ptrdiff_t>(i * V),
              c.begin() + static_cast<std::ptrdiff_t>((i + 1) * V),
              0.25f * static_cast<float>(i + 1));
  }
  fit_head(Arch::gdn, c, K, V, widths, w, fit);
  reconstruct(Arch::gdn, fit, widths, out);
  for (std::size_t k = 0; k < c.size(); ++k) {
    EXPECT_NEAR(out[k], c[k], 0.5 * fit.row_scale[k / V] * fit.col_scale[k % V] + 1e-7);
  }

  // FP32 denormals and tiny values: finite, and each error bounded by |x| (the codes may
  // all be zero).
  std::vector<float> tiny(out.size());
  for (std::size_t k = 0; k < tiny.size(); ++k) {
    tiny[k] = std::ldexp(static_cast<float>(k % 7) - 3.0f, -130 + static_cast<int>(k % 20));
  }
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    fit_head(arch, tiny, K, V, widths, w, fit);
    reconstruct(arch, fit, widths, out);
    for (std::size_t k = 0; k < tiny.size(); ++k) {
      ASSERT_TRUE(std::isfinite(out[k]));
      ASSERT_LE(std::fabs(out[k] - tiny[k]), std::fabs(tiny[k]) + 1e-38f);
    }
  }

  // Huge values: scales saturate at 65504, nothing becomes Inf or NaN, signs are kept.
  std::vector<float> huge(out.size());
  for (std::size_t k = 0; k < huge.size(); ++k) {
    huge[k] = (k % 2 == 0 ? 1.0f : -1.0f) * 3e38f / static_cast<float>(k + 1);
  }
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    fit_head(arch, huge, K, V, widths, std::vector<float>(K, 1e-30f), fit);
    for (const float r : fit.row_scale) {
      EXPECT_EQ(r, 65504.0f);
    }
    reconstruct(arch, fit, widths, out);
    for (std::size_t k = 0; k < huge.size(); ++k) {
      ASSERT_TRUE(std::isfinite(out[k]));
      ASSERT_EQ(std::signbit(out[k]), std::signbit(huge[k]));
    }
  }

  // Extreme impact factors (finite, > 0) never produce Inf/NaN scales.
  x = heavy_tailed(out.size(), 10, 2.0f);
  for (const float big : {1e-38f, 1e38f, 3.4e38f, 1.4e-45f}) {
    fit_head(Arch::kda, x, K, V, widths, std::vector<float>(K, big), fit);
    for (const float r : fit.row_scale) {
      ASSERT_TRUE(std::isfinite(r) && r > 0.0f && is_fp16_exact(r)) << big;
    }
    reconstruct(Arch::kda, fit, widths, out);
    for (const float v : out) {
      ASSERT_TRUE(std::isfinite(v)) << big;
    }
  }
}

TEST(StepQuantFit, RejectsBadArguments) {
  const std::vector<float> x(12, 1.0f);
  const std::vector<float> w(3, 1.0f);
  HeadFit fit;
  const auto widths = [](std::vector<std::uint8_t> v) { return v; };
  EXPECT_THROW(fit_head(Arch::gdn, x, 3, 5, widths({6, 6, 6}), w, fit), std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::gdn, x, 3, 4, widths({6, 6}), w, fit), std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::gdn, x, 3, 4, widths({6, 8, 6}), w, fit), std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::kda, x, 3, 4, widths({6, 5, 6}), w, fit), std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::kda, x, 3, 4, widths({6, 6, 6}), std::vector<float>{1, 0, 1}, fit),
               std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::kda, x, 3, 4, widths({6, 6, 6}),
                        std::vector<float>{1, std::numeric_limits<float>::quiet_NaN(), 1}, fit),
               std::invalid_argument);
  EXPECT_THROW(fit_head(Arch::kda, x, 3, 4, widths({6, 6, 6}), std::vector<float>{1, 1}, fit),
               std::invalid_argument);
  EXPECT_THROW(fit_head_dsq(x, 3, 4, 5, fit), std::invalid_argument);
  EXPECT_NO_THROW(fit_head(Arch::kda, x, 3, 4, widths({6, 8, 16}), w, fit));
  std::vector<float> out(12);
  EXPECT_THROW(reconstruct(Arch::gdn, fit, widths({6, 8, 16}), out), std::invalid_argument);
  EXPECT_THROW(reconstruct(Arch::kda, fit, widths({6, 8, 8}), out), std::invalid_argument);
  std::vector<float> short_out(11);
  EXPECT_THROW(reconstruct(Arch::kda, fit, widths({6, 8, 16}), short_out), std::invalid_argument);
}

// --- the carried fit (step modes, issue 47) -------------------------------------------------

// With the column scales of the same head's fit before its refit, the row-impact rule
// finds the same row scales, so the carried fit is that fit, bit for bit.
TEST(StepQuantFit, CarriedImpactFitWithItsOwnFirstPassColumnsIsTheFirstPass) {
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      const std::uint32_t K = 64;
      const std::uint32_t V = 48;
      const auto x = arch == Arch::gdn ? gdn_head(K, V, 900 + seed) : kda_head(K, V, 900 + seed);
      const auto w = impacts(K, 910 + seed);
      const auto widths =
          arch == Arch::gdn ? std::vector<std::uint8_t>(K, 4) : kda_widths(K, true, 920 + seed);
      HeadFit first;
      fit_head(arch, x, K, V, widths, w, first, Refit::off);
      HeadFit carried;
      const CarriedStats stats =
          fit_head_carried(arch, x, K, V, widths, w, first.col_scale, RowRule::impact, carried);
      EXPECT_EQ(stats.lost_values, 0u);
      expect_bits_equal(carried.row_scale, first.row_scale, "row scales");
      expect_bits_equal(carried.col_scale, first.col_scale, "column scales");
      EXPECT_EQ(carried.codes, first.codes);
      EXPECT_TRUE(carried.finite);
    }
  }
}

// The absmax rule puts each row's largest quotient at its top level: nothing clamps, and
// on the head the columns were fitted for, the rows are no coarser than the first pass's
// (whose columns bound every |x_ij| / (r_i q_i)), so the error is no larger.
TEST(StepQuantFit, CarriedAbsmaxRowsNeverClampAndAreNoCoarserOnTheSameHead) {
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    const std::uint32_t K = 64;
    const std::uint32_t V = 64;
    const auto x = gdn_head(K, V, 940 + seed);
    const auto w = impacts(K, 950 + seed);
    const std::vector<std::uint8_t> widths(K, seed % 2 == 0 ? 6 : 4);
    HeadFit first;
    fit_head(Arch::gdn, x, K, V, widths, w, first, Refit::off);
    HeadFit carried;
    const CarriedStats stats =
        fit_head_carried(Arch::gdn, x, K, V, widths, w, first.col_scale, RowRule::absmax, carried);
    EXPECT_EQ(stats.worst_row_clamps, 0u);
    EXPECT_EQ(stats.lost_values, 0u);
    std::vector<float> a(std::size_t{K} * V);
    std::vector<float> b(std::size_t{K} * V);
    reconstruct(Arch::gdn, first, widths, a);
    reconstruct(Arch::gdn, carried, widths, b);
    double ea = 0.0;
    double eb = 0.0;
    for (std::size_t i = 0; i < K; ++i) {
      // fp16 rounding of r may round the absmax scale up by half an ulp.
      EXPECT_LE(carried.row_scale[i], first.row_scale[i] * (1.0f + 1.0f / 1024)) << "row " << i;
      for (std::size_t j = 0; j < V; ++j) {
        const std::size_t k = i * V + j;
        ea += (a[k] - x[k]) * (a[k] - x[k]);
        eb += (b[k] - x[k]) * (b[k] - x[k]);
      }
    }
    EXPECT_LE(eb, ea * 1.01) << "seed " << seed;
  }
}

// A value in a column whose carried scale is 0 (a column that was all zeros) has no
// code that reaches it: counted, so that the codec runs the full fit instead.
TEST(StepQuantFit, CarriedFitCountsValuesItWouldLose) {
  const std::uint32_t K = 8;
  const std::uint32_t V = 8;
  auto x = gdn_head(K, V, 970);
  const std::vector<float> w(K, 1.0f);
  const std::vector<std::uint8_t> widths(K, 6);
  std::vector<float> columns(V, 1.0f);
  columns[3] = 0.0f;
  columns[5] = std::numeric_limits<float>::infinity();
  columns[6] = -2.0f;
  x[2 * V + 5] = 0.0f;  // one value the bad column would have lost is zero anyway
  HeadFit fit;
  const CarriedStats stats =
      fit_head_carried(Arch::gdn, x, K, V, widths, w, columns, RowRule::absmax, fit);
  EXPECT_EQ(stats.lost_values, 3 * K - 1);
  EXPECT_EQ(fit.col_scale[3], 0.0f);
  EXPECT_EQ(fit.col_scale[5], 0.0f);  // stored as 0, never as Inf
  EXPECT_EQ(fit.col_scale[6], 0.0f);  // nor negative
  EXPECT_THROW(fit_head_carried(Arch::gdn, x, K, V, widths, w, std::vector<float>(V - 1, 1.0f),
                                RowRule::absmax, fit),
               std::invalid_argument);
}

}  // namespace
}  // namespace statepool::kernels::stepquant
