#pragma once
// The derived calibration quantities of STEPQUANT.md ("Calibration statistics").
//
// Thread-safety: pure functions.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "statepool/kernels/layout.hpp"

namespace statepool::calibration {

/// Default lifetime horizon T (tokens) and impact exponent gamma of the paper.
inline constexpr std::uint32_t kDefaultHorizon = 2048;
inline constexpr float kDefaultGamma = 0.25f;

/// Lifetime weight L = sum_{t=0}^{T-1} exp(2 g)^t = expm1(2 g T) / expm1(2 g): the summed
/// squared retention of an error injected now, for mean log-decay g <= 0. Exactly T at
/// g = 0, numerically stable near 0 (expm1 on both sides), 1 for g = -inf. A positive g
/// (growth; not a valid gate) is treated as 0. T = 0 gives 0.
[[nodiscard]] double lifetime_weight(double mean_log_decay, std::uint32_t horizon) noexcept;

/// The typical log-decay g_bar of one unit over a stream of tokens: the trimmed mean of
/// its per-token log-decays g <= 0 with kDecayTrim of the tokens cut off at each end, so
/// that rare resets (g = -inf, allowed in traces) and outlier gates cannot dominate it:
/// one reset among 512 tokens of a head that otherwise decays by -1e-4 leaves g_bar at
/// -1e-4 (a plain mean would be -inf; one gate of -80 would make it -0.156). Values are
/// clamped to [-kMaxLogDecay, 0] first (exp(-1e4) is already a full reset). Streaming,
/// with memory independent of the token count: a histogram over log10(-g) (8 bins per
/// decade from 1e-8 to 1e4, one bin below, one above) that keeps each bin's count and
/// exact sum, so the trimmed mean is exact except in the two bins the cuts fall in, where
/// the bin's own mean stands for its values (within 1/8 decade of them).
inline constexpr double kDecayTrim = 0.05;
inline constexpr double kMaxLogDecay = 1e4;

class LogDecayStatistic {
 public:
  void add(double log_decay) noexcept;
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  /// g_bar (<= 0, finite); 0 before any token.
  [[nodiscard]] double value() const noexcept;

  static constexpr int kBinsPerDecade = 8;
  static constexpr int kLowestDecade = -8;  ///< first log10(-g) with its own bins
  static constexpr int kDecades = 12;       ///< 1e-8 .. 1e4
  static constexpr std::size_t kBins = kBinsPerDecade * kDecades + 2;

 private:
  std::uint64_t count_ = 0;
  std::array<std::uint32_t, kBins> counts_{};
  std::array<double, kBins> sums_{};  ///< of -g
};

/// Relative floor of the row impact: rows with omega_i below kImpactFloorRatio * max_i
/// omega_i (zero included) are raised to that floor before taking logs, so that a row
/// that is never read gets a small but finite impact factor. A head whose rows are all
/// zero (never read) gets all ones.
inline constexpr double kImpactFloorRatio = 1e-6;

/// Impact factors of one head: w_i = exp((gamma / 2) (log omega_i - mean_r log omega_r)),
/// after the floor above. Geometric-mean normalised: prod_i w_i = 1. gamma = 0 gives all
/// ones. `omega` and `out` have one value per key row. Throws std::invalid_argument on a
/// size mismatch or a negative / non-finite omega.
void impact_factors(std::span<const double> omega, double gamma, std::span<float> out);

}  // namespace statepool::calibration
