#pragma once
// Streaming calibration statistics of one layer (STEPQUANT.md, "Calibration statistics"):
// fed one token of one head at a time (its normalised inputs and the FP32 state after the
// step), it keeps
//   - the mean log-decay per unit (per head for GDN, per key row for KDA),
//   - the row impact omega_i = mean over tokens of (d_i (q_i - beta k_i (k^T q)))^2,
//     d = exp(g): the weight with which an error in row i of the stored state reaches the
//     next output (o_next = S_next^T q = S^T diag(d) (I - beta k k^T) q + ...),
//   - a reservoir of state snapshots per head: every `snapshot_every`-th token of the head
//     is offered; the reservoir keeps a uniform sample of at most `reservoir` of them
//     (Algorithm R with a seeded RNG per head),
//   - the readout weight W_i of every key row: how much of an error in row i of the stored
//     state reaches the outputs over the error's whole life, summed over the later tokens.
//     An error E in the state after token t evolves as the state does without its input,
//     E <- (I - beta k k^T) D E (D = diag(exp(g)): the decay; the delta rule then erases
//     the part along the key it writes), and is read as E^T q at every later token. A
//     probe P (K x K, the identity when it starts) follows that product; W_i sums
//     ((P^T q)_i)^2 over the probe's life (at most `probe_horizon` tokens, to the end of
//     its sequence, or until P has faded below 1e-6 of its start in energy), averaged over
//     the probes started every `probe_every` tokens of a sequence. With decay alone (beta
//     = 0) W_i is the lifetime weight of statistics.hpp times the mean q_i^2; the delta
//     rule makes it shorter for the rows of keys that are written often,
//   - the output energy of the head, the mean of ||S^T q||^2.
// Memory is O(heads * (reservoir * K * V + (probe_horizon / probe_every) * K * K)),
// independent of the number of tokens. A whole model is calibrated one layer at a time
// (calibrate.hpp), so at most one layer's snapshots are held at once.
//
// Thread-safety: one accumulator per thread, or external locking; different heads of one
// accumulator may be fed from different threads concurrently (per-head state only).

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "statepool/calibration/statistics.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::calibration {

/// A bounded uniform sample of fixed-size snapshots (Algorithm R).
class SnapshotReservoir {
 public:
  SnapshotReservoir(std::size_t capacity, std::size_t values_per_snapshot, std::uint64_t seed);

  /// Offers one snapshot (values_per_snapshot floats); it is kept with probability
  /// capacity / offered().
  void offer(std::span<const float> values);

  [[nodiscard]] std::size_t size() const noexcept { return stored_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t offered() const noexcept { return offered_; }
  [[nodiscard]] std::span<const float> snapshot(std::size_t index) const;
  /// Bytes held by the stored snapshots (never more than capacity * values * 4).
  [[nodiscard]] std::size_t stored_bytes() const noexcept { return data_.size() * sizeof(float); }

 private:
  std::size_t capacity_;
  std::size_t values_;
  std::size_t stored_ = 0;
  std::uint64_t offered_ = 0;
  std::mt19937_64 rng_;
  std::vector<float> data_;
};

struct AccumulatorOptions {
  /// Offer every n-th state of a head to its reservoir.
  std::uint32_t snapshot_every = 8;
  /// Snapshots kept per head.
  std::uint32_t reservoir = 64;
  /// Seed of the reservoir RNGs (each head derives its own from it and its position).
  std::uint64_t seed = 0x5EED;
  /// Start a readout probe every n-th token of a sequence (0: no probes, no readout
  /// weights and no output energy).
  std::uint32_t probe_every = 256;
  /// Tokens a probe follows its error at most (the plan's horizon).
  std::uint32_t probe_horizon = 2048;
};

class LayerAccumulator {
 public:
  /// Throws std::invalid_argument on zero dimensions, snapshot_every 0 or reservoir 0.
  LayerAccumulator(kernels::Arch arch, std::uint32_t layer, std::uint32_t heads,
                   std::uint32_t key_dim, std::uint32_t value_dim, AccumulatorOptions options);

  /// One token of one head: q, k normalised (K values each), log_decay (1 value for GDN, K
  /// for KDA), beta, and the FP32 state after this token's step (K * V values).
  void add(std::uint32_t head, std::span<const float> q, std::span<const float> k,
           std::span<const float> log_decay, float beta, std::span<const float> state);
  /// The sequence ends (the state is reset to zero before the next token): every probe
  /// of every head ends with it.
  void end_sequence();

  [[nodiscard]] kernels::Arch arch() const noexcept { return arch_; }
  [[nodiscard]] std::uint32_t layer() const noexcept { return layer_; }
  [[nodiscard]] std::uint32_t heads() const noexcept { return heads_; }
  [[nodiscard]] std::uint32_t key_dim() const noexcept { return key_dim_; }
  [[nodiscard]] std::uint32_t value_dim() const noexcept { return value_dim_; }
  /// Units per head: 1 (GDN) or K (KDA).
  [[nodiscard]] std::uint32_t units_per_head() const noexcept;
  /// Tokens seen by `head`.
  [[nodiscard]] std::uint64_t tokens(std::uint32_t head) const;
  /// Typical log-decay g_bar of unit `unit` of `head` (unit 0 for GDN): the trimmed mean of
  /// LogDecayStatistic (statistics.hpp), which one reset cannot dominate; 0 before any token.
  [[nodiscard]] double mean_log_decay(std::uint32_t head, std::uint32_t unit = 0) const;
  /// omega of every key row of `head` (K values); zeros before any token.
  [[nodiscard]] std::vector<double> omega(std::uint32_t head) const;
  /// Probes started in `head` (each one's weights count, whether it has ended or not).
  [[nodiscard]] std::uint64_t probes(std::uint32_t head) const;
  /// W_i of every key row of `head` (K values): the mean over its probes of their summed
  /// squared readouts; empty when no probe has started.
  [[nodiscard]] std::vector<double> readout_weight(std::uint32_t head) const;
  /// Mean of ||S^T q||^2 over the head's tokens (0 before any token, and without probes:
  /// probe_every 0 measures neither).
  [[nodiscard]] double output_energy(std::uint32_t head) const;
  [[nodiscard]] const SnapshotReservoir& snapshots(std::uint32_t head) const;
  /// Snapshots stored over all heads.
  [[nodiscard]] std::size_t stored_snapshots() const noexcept;
  /// Bytes held: snapshots plus the per-row statistics.
  [[nodiscard]] std::size_t memory_bytes() const noexcept;

 private:
  struct Probe {
    std::vector<double> p;  // K x K, row-major: the error rows now from the rows at its start
    std::uint32_t age = 0;  // tokens followed
  };
  struct Head {
    Head(std::uint32_t units, std::uint32_t key_dim, SnapshotReservoir snapshots)
        : log_decay(units),
          omega_sum(key_dim, 0.0),
          reservoir(std::move(snapshots)),
          readout_sum(key_dim, 0.0) {}
    std::uint64_t tokens = 0;
    std::vector<LogDecayStatistic> log_decay;  // units_per_head
    std::vector<double> omega_sum;             // key_dim
    SnapshotReservoir reservoir;
    std::uint64_t sequence_tokens = 0;       // tokens of the current sequence
    std::vector<Probe> probes;               // live
    std::vector<std::vector<double>> spare;  // ended probes' matrices, reused
    std::vector<double> readout_sum;         // key_dim
    std::uint64_t probes_started = 0;
    double output_energy_sum = 0.0;
  };

  void follow_probes(Head& h, std::span<const float> q, std::span<const float> k,
                     std::span<const float> log_decay, float beta) const;

  [[nodiscard]] const Head& head_at(std::uint32_t head) const;

  kernels::Arch arch_;
  std::uint32_t layer_;
  std::uint32_t heads_;
  std::uint32_t key_dim_;
  std::uint32_t value_dim_;
  AccumulatorOptions options_;
  std::vector<Head> per_head_;
};

}  // namespace statepool::calibration
