#pragma once
// The derived calibration quantities of STEPQUANT.md ("Calibration statistics").
//
// Thread-safety: pure functions.

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
