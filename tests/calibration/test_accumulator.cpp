// The FP32 recurrence (recurrence.hpp) and the streaming statistics (accumulator.hpp).

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "statepool/calibration/accumulator.hpp"
#include "statepool/kernels/recurrence.hpp"

namespace statepool::calibration {
namespace {
using kernels::gdn_step;
using kernels::kda_step;
using kernels::normalize_qk;

TEST(Recurrence, GdnStepByHand) {
  // K = V = 2, S = [[1, 2], [3, 4]], g = log 0.5, k = (1, 0), q = (0, 1), v = (10, 20),
  // beta = 0.5: S' = [[.5, 1], [1.5, 2]], S'^T k = (.5, 1), u = .5 (9.5, 19) = (4.75, 9.5),
  // S = S' + k u^T = [[5.25, 10.5], [1.5, 2]], o = S^T q = (1.5, 2).
  std::vector<float> s = {1, 2, 3, 4};
  std::vector<float> u(2);
  std::vector<float> o(2);
  gdn_step(s, 2, 2, std::vector<float>{0, 1}, std::vector<float>{1, 0}, std::vector<float>{10, 20},
           std::log(0.5f), 0.5f, u, o);
  EXPECT_FLOAT_EQ(s[0], 5.25f);
  EXPECT_FLOAT_EQ(s[1], 10.5f);
  EXPECT_FLOAT_EQ(s[2], 1.5f);
  EXPECT_FLOAT_EQ(s[3], 2.0f);
  EXPECT_FLOAT_EQ(u[0], 4.75f);
  EXPECT_FLOAT_EQ(u[1], 9.5f);
  EXPECT_FLOAT_EQ(o[0], 1.5f);
  EXPECT_FLOAT_EQ(o[1], 2.0f);
}

TEST(Recurrence, KdaWithEqualGatesIsGdnAndPerRowGatesDecayRows) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  const std::uint32_t K = 8;
  const std::uint32_t V = 4;
  std::vector<float> a(K * V);
  for (float& x : a) x = normal(rng);
  std::vector<float> b = a;
  std::vector<float> q(K), k(K), v(V);
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  normalize_qk(q, k);
  std::vector<float> u(V), oa(V), ob(V);
  gdn_step(a, K, V, q, k, v, -0.3f, 0.7f, u, oa);
  kda_step(b, K, V, q, k, v, std::vector<float>(K, -0.3f), 0.7f, u, ob);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(a[i], b[i]);
  for (std::size_t j = 0; j < V; ++j) EXPECT_FLOAT_EQ(oa[j], ob[j]);

  // A row with k_i = 0 only decays, by its own gate.
  std::vector<float> s(K * V, 1.0f);
  std::vector<float> gates(K, -0.1f);
  gates[3] = -2.0f;
  std::vector<float> k0 = k;
  k0[3] = 0.0f;
  kda_step(s, K, V, q, k0, v, gates, 0.7f, u, {});
  for (std::uint32_t j = 0; j < V; ++j) EXPECT_FLOAT_EQ(s[3 * V + j], std::exp(-2.0f));
  EXPECT_THROW(kda_step(s, K, V, q, k, v, std::vector<float>(K - 1, 0.0f), 0.5f, u, {}),
               std::invalid_argument);
}

TEST(Recurrence, NormalizeIsIdempotent) {
  std::vector<float> q = {3, 4, 0, 0};
  std::vector<float> k = {0, 0, 6, 8};
  normalize_qk(q, k);
  EXPECT_FLOAT_EQ(q[0], 0.6f / 2.0f);  // |q| = 1 / sqrt(4)
  EXPECT_FLOAT_EQ(k[3], 0.8f);
  const std::vector<float> q1 = q;
  const std::vector<float> k1 = k;
  normalize_qk(q, k);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(q[i], q1[i], 1e-7);
    EXPECT_NEAR(k[i], k1[i], 1e-7);
  }
  std::vector<float> zero(4, 0.0f);
  std::vector<float> k2 = k1;
  normalize_qk(zero, k2);
  EXPECT_EQ(zero, std::vector<float>(4, 0.0f));
}

TEST(Reservoir, NeverHoldsMoreThanItsCapacity) {
  SnapshotReservoir reservoir(64, 3, 9);
  const std::size_t cap_bytes = 64 * 3 * sizeof(float);
  double kept_sum = 0.0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const float x = static_cast<float>(i);
    reservoir.offer(std::vector<float>{x, x, x});
    ASSERT_LE(reservoir.size(), 64u);
    ASSERT_LE(reservoir.stored_bytes(), cap_bytes);
  }
  EXPECT_EQ(reservoir.offered(), 100000u);
  EXPECT_EQ(reservoir.size(), 64u);
  for (std::size_t s = 0; s < reservoir.size(); ++s) {
    kept_sum += reservoir.snapshot(s)[0];
  }
  // A uniform sample of 0..99999: mean 50000, standard error ~3600 for 64 draws.
  EXPECT_NEAR(kept_sum / 64.0, 50000.0, 15000.0);
  EXPECT_THROW((void)reservoir.snapshot(64), std::out_of_range);
  EXPECT_THROW(reservoir.offer(std::vector<float>{1.0f}), std::invalid_argument);
}

TEST(Accumulator, MemoryIndependentOfTraceLength) {
  const std::uint32_t K = 4;
  const std::uint32_t V = 4;
  const std::uint32_t H = 3;
  LayerAccumulator acc(kernels::Arch::kda, 0, H, K, V, AccumulatorOptions{8, 64, 1});
  std::vector<float> q(K, 0.5f), k(K, 0.5f), g(K, -0.1f), state(K * V, 1.0f);
  std::size_t bytes_at_10k = 0;
  for (std::uint64_t t = 1; t <= 100000; ++t) {
    for (std::uint32_t h = 0; h < H; ++h) {
      acc.add(h, q, k, g, 0.5f, state);
    }
    ASSERT_LE(acc.stored_snapshots(), std::size_t{64} * H);
    if (t == 10000) bytes_at_10k = acc.memory_bytes();
  }
  EXPECT_EQ(acc.stored_snapshots(), std::size_t{64} * H);
  EXPECT_EQ(acc.memory_bytes(), bytes_at_10k);
  EXPECT_EQ(acc.snapshots(0).offered(), 100000u / 8);
  EXPECT_EQ(acc.tokens(2), 100000u);
}

TEST(Accumulator, OmegaAndMeanDecayByHand) {
  // GDN, K = 2, two tokens:
  //  t1: q = (.6, .8), k = (1, 0), beta = .5, d = .5: k.q = .6,
  //      c = d (q - beta k (k.q)) = .5 (.6 - .3, .8) = (.15, .4)
  //  t2: q = (0, 1), k = (0, 1), beta = 1, d = 1: k.q = 1, c = (0, 1 - 1) = (0, 0)
  //  omega = mean c^2 = (.0225 / 2, .16 / 2); mean g = (log .5 + 0) / 2.
  LayerAccumulator acc(kernels::Arch::gdn, 2, 1, 2, 1, AccumulatorOptions{1, 4, 0});
  const std::vector<float> state = {1.0f, 2.0f};
  acc.add(0, std::vector<float>{0.6f, 0.8f}, std::vector<float>{1, 0},
          std::vector<float>{std::log(0.5f)}, 0.5f, state);
  acc.add(0, std::vector<float>{0, 1}, std::vector<float>{0, 1}, std::vector<float>{0.0f}, 1.0f,
          state);
  const std::vector<double> omega = acc.omega(0);
  EXPECT_NEAR(omega[0], 0.0225 / 2, 1e-7);
  EXPECT_NEAR(omega[1], 0.16 / 2, 1e-7);
  EXPECT_NEAR(acc.mean_log_decay(0), std::log(0.5) / 2, 1e-7);
  EXPECT_EQ(acc.snapshots(0).size(), 2u);

  // KDA: the same first token with per-row gates (log .5, log .25): c = (.15, .2).
  LayerAccumulator kda(kernels::Arch::kda, 0, 1, 2, 1, AccumulatorOptions{});
  kda.add(0, std::vector<float>{0.6f, 0.8f}, std::vector<float>{1, 0},
          std::vector<float>{std::log(0.5f), std::log(0.25f)}, 0.5f, state);
  EXPECT_NEAR(kda.omega(0)[0], 0.0225, 1e-7);
  EXPECT_NEAR(kda.omega(0)[1], 0.04, 1e-7);
  EXPECT_NEAR(kda.mean_log_decay(0, 1), std::log(0.25), 1e-6);
  EXPECT_EQ(kda.snapshots(0).size(), 0u);  // every 8th token only
  EXPECT_THROW(kda.add(1, std::vector<float>{0, 0}, std::vector<float>{0, 0},
                       std::vector<float>{0, 0}, 0.5f, state),
               std::out_of_range);
  EXPECT_THROW(kda.add(0, std::vector<float>{0, 0}, std::vector<float>{0, 0}, std::vector<float>{0},
                       0.5f, state),
               std::invalid_argument);
}

// Readout weights by hand. With decay alone (beta = 0) an error in row i is read at every
// later token as d^tau q_i: W_i = sum over tau = 1..n-1 of d^(2 tau) q_i^2 (one probe, at the
// first token of an n-token sequence, followed to the sequence's end).
TEST(Accumulator, ReadoutWeightWithDecayAloneIsTheLifetimeSum) {
  constexpr std::uint32_t n = 50;
  AccumulatorOptions options;
  options.probe_every = n;
  options.probe_horizon = 4096;
  LayerAccumulator acc(kernels::Arch::gdn, 0, 1, 2, 2, options);
  const std::vector<float> q = {0.6f, 0.8f}, k = {1.0f, 0.0f}, state(4, 0.0f);
  const float g = std::log(0.9f);
  for (std::uint32_t t = 0; t < n; ++t) acc.add(0, q, k, std::vector<float>{g}, 0.0f, state);
  double lifetime = 0.0;
  for (std::uint32_t tau = 1; tau < n; ++tau) lifetime += std::pow(0.9, 2.0 * tau);
  ASSERT_EQ(acc.probes(0), 1u);
  const std::vector<double> w = acc.readout_weight(0);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NEAR(w[0], lifetime * 0.36, 1e-5);
  EXPECT_NEAR(w[1], lifetime * 0.64, 1e-5);
}

// The delta rule erases an error along the key it writes: with beta = 1 and k = e0 at every
// token, an error in row 0 is gone after one token, while row 1's lives on undecayed.
// KDA's per-row gates decay each row on its own.
TEST(Accumulator, ReadoutWeightSeesTheDeltaRuleEraseErrors) {
  constexpr std::uint32_t n = 11;
  AccumulatorOptions options;
  options.probe_every = 1000;
  LayerAccumulator acc(kernels::Arch::kda, 0, 1, 2, 1, options);
  const float r = std::sqrt(0.5f);
  const std::vector<float> q = {r, r}, k = {1.0f, 0.0f}, state(2, 0.0f);
  for (std::uint32_t t = 0; t < n; ++t) {
    acc.add(0, q, k, std::vector<float>{0.0f, std::log(0.5f)}, 1.0f, state);
  }
  double row1 = 0.0;  // q_1^2 sum over tau of 0.25^tau
  for (std::uint32_t tau = 1; tau < n; ++tau) row1 += 0.5 * std::pow(0.25, tau);
  const std::vector<double> w = acc.readout_weight(0);
  EXPECT_EQ(w[0], 0.0);
  EXPECT_NEAR(w[1], row1, 1e-6);
}

// A probe ends with its sequence (the state is reset), at its horizon, and probes start
// every probe_every tokens of a sequence; W is their mean. No probes: no weights.
TEST(Accumulator, ProbesEndWithTheirSequenceAndHorizon) {
  AccumulatorOptions options;
  options.probe_every = 4;
  options.probe_horizon = 3;
  LayerAccumulator acc(kernels::Arch::gdn, 0, 1, 1, 1, options);
  const std::vector<float> one = {1.0f}, zero = {0.0f};
  const auto token = [&] { acc.add(0, one, zero, zero, 0.0f, one); };
  // Sequence 1: 6 tokens, probes at tokens 0 and 4; the first reads 3 tokens (its
  // horizon), the second 1 (the sequence ends). Sequence 2: 2 tokens, one probe, 1 read.
  for (int t = 0; t < 6; ++t) token();
  acc.end_sequence();
  for (int t = 0; t < 2; ++t) token();
  EXPECT_EQ(acc.probes(0), 3u);
  EXPECT_NEAR(acc.readout_weight(0)[0], (3.0 + 1.0 + 1.0) / 3.0, 1e-12);
  EXPECT_NEAR(acc.output_energy(0), 1.0, 1e-12);  // S^T q = 1 at every token

  options.probe_every = 0;
  LayerAccumulator none(kernels::Arch::gdn, 0, 1, 1, 1, options);
  none.add(0, one, zero, zero, 0.0f, one);
  EXPECT_TRUE(none.readout_weight(0).empty());
  EXPECT_EQ(none.probes(0), 0u);
  EXPECT_EQ(none.output_energy(0), 0.0);
}

}  // namespace
}  // namespace statepool::calibration
