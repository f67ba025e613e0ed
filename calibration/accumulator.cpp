#include "statepool/calibration/accumulator.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "statepool/calibration/seed.hpp"

namespace statepool::calibration {

SnapshotReservoir::SnapshotReservoir(std::size_t capacity, std::size_t values_per_snapshot,
                                     std::uint64_t seed)
    : capacity_(capacity), values_(values_per_snapshot), rng_(seed) {
  if (capacity == 0 || values_per_snapshot == 0) {
    throw std::invalid_argument("snapshot reservoir: capacity and snapshot size must be positive");
  }
}

void SnapshotReservoir::offer(std::span<const float> values) {
  if (values.size() != values_) {
    throw std::invalid_argument("snapshot reservoir: snapshot of " + std::to_string(values.size()) +
                                " values, expected " + std::to_string(values_));
  }
  ++offered_;
  std::size_t slot = stored_;
  if (stored_ == capacity_) {
    // Keep the new snapshot with probability capacity / offered, in a uniform slot.
    const std::uint64_t j = std::uniform_int_distribution<std::uint64_t>(0, offered_ - 1)(rng_);
    if (j >= capacity_) {
      return;
    }
    slot = static_cast<std::size_t>(j);
  } else {
    data_.resize((stored_ + 1) * values_);
    ++stored_;
  }
  std::copy(values.begin(), values.end(),
            data_.begin() + static_cast<std::ptrdiff_t>(slot * values_));
}

std::span<const float> SnapshotReservoir::snapshot(std::size_t index) const {
  if (index >= stored_) {
    throw std::out_of_range("snapshot " + std::to_string(index) + " of " + std::to_string(stored_));
  }
  return std::span<const float>(data_).subspan(index * values_, values_);
}

LayerAccumulator::LayerAccumulator(kernels::Arch arch, std::uint32_t layer, std::uint32_t heads,
                                   std::uint32_t key_dim, std::uint32_t value_dim,
                                   AccumulatorOptions options)
    : arch_(arch),
      layer_(layer),
      heads_(heads),
      key_dim_(key_dim),
      value_dim_(value_dim),
      options_(options) {
  if (heads == 0 || key_dim == 0 || value_dim == 0) {
    throw std::invalid_argument("accumulator: heads, key_dim and value_dim must be positive");
  }
  if (options.snapshot_every == 0 || options.reservoir == 0) {
    throw std::invalid_argument("accumulator: snapshot_every and reservoir must be positive");
  }
  if (options.probe_every != 0 && options.probe_horizon == 0) {
    throw std::invalid_argument("accumulator: probe_horizon must be positive");
  }
  per_head_.reserve(heads);
  for (std::uint32_t h = 0; h < heads; ++h) {
    const std::uint64_t seed = mix_seed(options.seed ^ mix_seed((std::uint64_t{layer} << 32) | h));
    Head head(units_per_head(), key_dim,
              SnapshotReservoir(options.reservoir, std::size_t{key_dim} * value_dim, seed));
    per_head_.push_back(std::move(head));
  }
}

namespace {

/// A probe whose matrix has this fraction of its starting energy (K) left is done: what
/// it would still add is below the noise of the other probes.
constexpr double kFadedProbe = 1e-6;

}  // namespace

void LayerAccumulator::follow_probes(Head& h, std::span<const float> q, std::span<const float> k,
                                     std::span<const float> log_decay, float beta) const {
  const std::size_t K = key_dim_;
  std::vector<double> w(K);
  std::vector<double> r(K);
  for (std::size_t n = 0; n < h.probes.size();) {
    Probe& probe = h.probes[n];
    std::vector<double>& p = probe.p;
    // P <- D P, then P <- P - beta k (k^T P); r = P^T q.
    std::fill(w.begin(), w.end(), 0.0);
    for (std::size_t i = 0; i < K; ++i) {
      const double d =
          std::exp(static_cast<double>(log_decay.size() == 1 ? log_decay[0] : log_decay[i]));
      const double ki = k[i];
      double* row = p.data() + i * K;
      for (std::size_t j = 0; j < K; ++j) {
        row[j] *= d;
        w[j] += ki * row[j];
      }
    }
    std::fill(r.begin(), r.end(), 0.0);
    double energy = 0.0;
    for (std::size_t i = 0; i < K; ++i) {
      const double bk = static_cast<double>(beta) * k[i];
      const double qi = q[i];
      double* row = p.data() + i * K;
      for (std::size_t j = 0; j < K; ++j) {
        row[j] -= bk * w[j];
        r[j] += qi * row[j];
        energy += row[j] * row[j];
      }
    }
    for (std::size_t j = 0; j < K; ++j) h.readout_sum[j] += r[j] * r[j];
    ++probe.age;
    if (probe.age >= options_.probe_horizon || energy < kFadedProbe * static_cast<double>(K)) {
      h.spare.push_back(std::move(probe.p));
      h.probes[n] = std::move(h.probes.back());
      h.probes.pop_back();
    } else {
      ++n;
    }
  }
}

std::uint32_t LayerAccumulator::units_per_head() const noexcept {
  return arch_ == kernels::Arch::gdn ? 1u : key_dim_;
}

void LayerAccumulator::add(std::uint32_t head, std::span<const float> q, std::span<const float> k,
                           std::span<const float> log_decay, float beta,
                           std::span<const float> state) {
  if (head >= heads_) {
    throw std::out_of_range("accumulator: head " + std::to_string(head) + " of " +
                            std::to_string(heads_));
  }
  const std::size_t K = key_dim_;
  if (q.size() != K || k.size() != K || log_decay.size() != units_per_head() ||
      state.size() != K * value_dim_) {
    throw std::invalid_argument("accumulator: input sizes do not match the layer's shape");
  }
  Head& h = per_head_[head];
  double kq = 0.0;
  for (std::size_t i = 0; i < K; ++i) {
    kq += static_cast<double>(k[i]) * q[i];
  }
  for (std::size_t u = 0; u < log_decay.size(); ++u) {
    h.log_decay[u].add(log_decay[u]);
  }
  for (std::size_t i = 0; i < K; ++i) {
    const double g = log_decay.size() == 1 ? log_decay[0] : log_decay[i];
    const double c = std::exp(g) * (q[i] - static_cast<double>(beta) * k[i] * kq);
    h.omega_sum[i] += c * c;
  }
  // With probes: the ones started before this token follow it; then this token's output
  // (both only for the output cost, which is the one that reads them).
  if (options_.probe_every != 0) {
    follow_probes(h, q, k, log_decay, beta);
    double out_energy = 0.0;
    for (std::size_t j = 0; j < value_dim_; ++j) {
      double o = 0.0;
      for (std::size_t i = 0; i < K; ++i) {
        o += static_cast<double>(state[i * value_dim_ + j]) * q[i];
      }
      out_energy += o * o;
    }
    h.output_energy_sum += out_energy;
  }
  ++h.tokens;
  if (h.tokens % options_.snapshot_every == 0) {
    h.reservoir.offer(state);
  }
  // A probe of the error in the state this token stored.
  if (options_.probe_every != 0 && h.sequence_tokens % options_.probe_every == 0) {
    Probe probe;
    if (!h.spare.empty()) {
      probe.p = std::move(h.spare.back());
      h.spare.pop_back();
    }
    probe.p.assign(K * K, 0.0);
    for (std::size_t i = 0; i < K; ++i) probe.p[i * K + i] = 1.0;
    h.probes.push_back(std::move(probe));
    ++h.probes_started;
  }
  ++h.sequence_tokens;
}

void LayerAccumulator::end_sequence() {
  for (Head& h : per_head_) {
    for (Probe& probe : h.probes) h.spare.push_back(std::move(probe.p));
    h.probes.clear();
    h.sequence_tokens = 0;
  }
}

const LayerAccumulator::Head& LayerAccumulator::head_at(std::uint32_t head) const {
  if (head >= heads_) {
    throw std::out_of_range("accumulator: head " + std::to_string(head) + " of " +
                            std::to_string(heads_));
  }
  return per_head_[head];
}

std::uint64_t LayerAccumulator::tokens(std::uint32_t head) const {
  return head_at(head).tokens;
}

double LayerAccumulator::mean_log_decay(std::uint32_t head, std::uint32_t unit) const {
  const Head& h = head_at(head);
  if (unit >= h.log_decay.size()) {
    throw std::out_of_range("accumulator: unit " + std::to_string(unit) + " of " +
                            std::to_string(h.log_decay.size()));
  }
  return h.log_decay[unit].value();
}

std::vector<double> LayerAccumulator::omega(std::uint32_t head) const {
  const Head& h = head_at(head);
  std::vector<double> out(h.omega_sum);
  if (h.tokens > 0) {
    for (double& value : out) {
      value /= static_cast<double>(h.tokens);
    }
  }
  return out;
}

std::uint64_t LayerAccumulator::probes(std::uint32_t head) const {
  return head_at(head).probes_started;
}

std::vector<double> LayerAccumulator::readout_weight(std::uint32_t head) const {
  const Head& h = head_at(head);
  if (h.probes_started == 0) return {};
  std::vector<double> out(h.readout_sum);
  for (double& value : out) value /= static_cast<double>(h.probes_started);
  return out;
}

double LayerAccumulator::output_energy(std::uint32_t head) const {
  const Head& h = head_at(head);
  return h.tokens == 0 ? 0.0 : h.output_energy_sum / static_cast<double>(h.tokens);
}

const SnapshotReservoir& LayerAccumulator::snapshots(std::uint32_t head) const {
  return head_at(head).reservoir;
}

std::size_t LayerAccumulator::stored_snapshots() const noexcept {
  std::size_t n = 0;
  for (const Head& h : per_head_) {
    n += h.reservoir.size();
  }
  return n;
}

std::size_t LayerAccumulator::memory_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const Head& h : per_head_) {
    bytes += h.reservoir.stored_bytes() + h.log_decay.size() * sizeof(LogDecayStatistic) +
             (h.omega_sum.size() + h.readout_sum.size()) * sizeof(double) +
             (h.probes.size() + h.spare.size()) * std::size_t{key_dim_} * key_dim_ * sizeof(double);
  }
  return bytes;
}

}  // namespace statepool::calibration
