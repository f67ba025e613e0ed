#include "statepool/calibration/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace statepool::calibration {

double lifetime_weight(double mean_log_decay, std::uint32_t horizon) noexcept {
  if (horizon == 0) {
    return 0.0;
  }
  if (!(mean_log_decay < 0.0)) {  // 0, positive or NaN: no decay
    return static_cast<double>(horizon);
  }
  if (std::isinf(mean_log_decay)) {
    return 1.0;
  }
  const double x = 2.0 * mean_log_decay;
  const double denominator = std::expm1(x);
  if (denominator == 0.0) {  // |x| below the smallest subnormal ratio: no decay
    return static_cast<double>(horizon);
  }
  return std::expm1(x * horizon) / denominator;
}

void LogDecayStatistic::add(double log_decay) noexcept {
  // x = -g in [0, kMaxLogDecay]; NaN (refused by the trace reader) counts as no decay.
  const double x = log_decay < 0.0 ? std::min(-log_decay, kMaxLogDecay) : 0.0;
  std::size_t bin = 0;
  if (x >= kMaxLogDecay) {
    bin = kBins - 1;
  } else if (x >= std::pow(10.0, kLowestDecade)) {
    const double position = (std::log10(x) - kLowestDecade) * kBinsPerDecade;
    bin = 1 + std::min(static_cast<std::size_t>(position), kBins - 3);
  }
  ++counts_[bin];
  sums_[bin] += x;
  ++count_;
}

double LogDecayStatistic::value() const noexcept {
  if (count_ == 0) return 0.0;
  const double n = static_cast<double>(count_);
  const double lo = kDecayTrim * n;
  const double hi = n - lo;
  double below = 0.0;  // tokens in the bins before this one
  double total = 0.0;
  for (std::size_t bin = 0; bin < kBins; ++bin) {
    const double c = counts_[bin];
    if (c == 0) continue;
    const double overlap = std::min(hi, below + c) - std::max(lo, below);
    if (overlap > 0.0) total += overlap * (sums_[bin] / c);
    below += c;
  }
  return -total / (hi - lo);
}

void impact_factors(std::span<const double> omega, double gamma, std::span<float> out) {
  if (omega.size() != out.size()) {
    throw std::invalid_argument("impact_factors: " + std::to_string(omega.size()) +
                                " omega values for " + std::to_string(out.size()) + " rows");
  }
  double largest = 0.0;
  for (const double value : omega) {
    if (!std::isfinite(value) || value < 0.0) {
      throw std::invalid_argument("impact_factors: omega must be finite and >= 0");
    }
    largest = std::max(largest, value);
  }
  if (omega.empty()) {
    return;
  }
  if (largest <= 0.0 || gamma == 0.0) {
    std::fill(out.begin(), out.end(), 1.0f);
    return;
  }
  const double floor = largest * kImpactFloorRatio;
  double mean_log = 0.0;
  for (const double value : omega) {
    mean_log += std::log(std::max(value, floor));
  }
  mean_log /= static_cast<double>(omega.size());
  for (std::size_t i = 0; i < omega.size(); ++i) {
    out[i] = static_cast<float>(
        std::exp(0.5 * gamma * (std::log(std::max(omega[i], floor)) - mean_log)));
  }
}

}  // namespace statepool::calibration
