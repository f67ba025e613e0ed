#pragma once
// Seeded random numbers for synthetic data and tests.
//
// Two kinds, on purpose:
//   - PortableNormal: Box-Muller on the raw std::mt19937_64 output, the same numbers with
//     every standard library (std::normal_distribution is implementation-defined). The
//     synthetic states and traces use it, so a seed names the same state everywhere.
//   - heavy_tailed_values / gaussian_values: std::normal_distribution on an engine the
//     caller picks, the generators the tests have always used; their numbers depend on
//     the standard library, which a test that only asserts bounds does not mind.
//
// Thread-safety: a PortableNormal belongs to one thread; the functions are pure.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace statepool::synthetic {

class PortableNormal {
 public:
  explicit PortableNormal(std::uint64_t seed) : rng_(seed) {}

  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  /// N(0, 1); the two values of one Box-Muller draw are returned one after the other.
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    spare_ = static_cast<float>(r * std::sin(angle));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(angle));
  }

  /// Uniform in [0, n) (modulo bias is irrelevant at the sizes used here).
  std::uint64_t below(std::uint64_t n) { return rng_() % n; }

 private:
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

/// `n` values x = N(0,1) * exp(spread * N(0,1)) drawn from Engine(seed): Gaussian at
/// spread 0, log-normally heavy-tailed above (spread 4 spans many binades).
template <class Engine = std::mt19937_64>
[[nodiscard]] std::vector<float> heavy_tailed_values(std::size_t n,
                                                     typename Engine::result_type seed,
                                                     float spread) {
  Engine rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (auto& v : values) {
    v = normal(rng) * std::exp(spread * normal(rng));
  }
  return values;
}

/// `n` values N(0, sigma^2) drawn from Engine(seed).
template <class Engine = std::mt19937_64>
[[nodiscard]] std::vector<float> gaussian_values(std::size_t n, typename Engine::result_type seed,
                                                 float sigma) {
  Engine rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(n);
  for (auto& v : values) {
    v = normal(rng);
  }
  return values;
}

/// Fills `out` with N(0, sigma^2) from PortableNormal(seed): the same values everywhere
/// (the benchmarks' stand-in for a state whose recurrence does not matter to the timing).
inline void fill_gaussian(std::span<float> out, std::uint64_t seed, float sigma) {
  PortableNormal normal(seed);
  for (float& v : out) v = sigma * normal.next();
}

/// tokens x channels values (token-major) shaped like attention keys or values: N(0, 1)
/// times a per-channel scale 2^U(-2, 2), and every 61st channel (from 7) 20x larger, the
/// outlier channels of keys. From PortableNormal(seed).
[[nodiscard]] inline std::vector<float> channel_scaled_values(std::size_t tokens,
                                                              std::size_t channels,
                                                              std::uint64_t seed) {
  PortableNormal normal(seed);
  std::vector<float> scale(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    const double e = 4.0 * normal.uniform() - 2.0;
    scale[c] = (c % 61 == 7 ? 20.0f : 1.0f) * static_cast<float>(std::exp2(e));
  }
  std::vector<float> out(tokens * channels);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = normal.next() * scale[i % channels];
  return out;
}

}  // namespace statepool::synthetic
