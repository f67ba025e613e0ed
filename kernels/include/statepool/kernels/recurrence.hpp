#pragma once
// The gated delta rule of one head, in FP32 (../../../../shared/STEPQUANT.md, "The
// recurrence"): the one implementation that calibration runs over traces, that the fused
// decode step (fused_step.hpp) runs between unpacking and repacking a page's head, and
// that the tests use as the reference.
//
// Per token, with the state S a row-major K x V matrix (key rows, value columns):
//   S' = diag(exp(g)) S          decay: g is one scalar per head (GDN) or one per key row (KDA)
//   u  = beta (v - S'^T k)       delta-rule residual (length V)
//   S  = S' + k u^T              rank-1 write
//   o  = S^T q                   readout (length V)
// q and k are expected L2-normalised with q scaled by 1/sqrt(K) (normalize_qk does that).
//
// The order of the floating-point operations is fixed (below, in step_head) so that every
// caller computes the same bits: S'^T k and S^T q accumulate over rows in row order, one
// rounding per multiply and per add (the kernels build without FMA contraction).
//
// Thread-safety: pure functions on caller-owned buffers.

#include <cstddef>
#include <cstdint>
#include <span>

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {

/// One step of one head, in place, on raw buffers: `S` K*V floats, q and k K floats, v V
/// floats, `u` V floats of scratch (receives the residual), `o` V floats or null to skip
/// the readout. decay(i) returns exp(g) for row i (a constant for GDN). No checks.
template <class Decay>
STATEPOOL_HD inline void step_head(float* S, std::uint32_t key_dim, std::uint32_t value_dim,
                                   const float* q, const float* k, const float* v,
                                   const Decay& decay, float beta, float* u, float* o) {
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  for (std::size_t j = 0; j < V; ++j) u[j] = 0.0f;
  // S' = diag(d) S; S'^T k accumulated row by row.
  for (std::size_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    const float d = decay(i);
    const float ki = k[i];
    for (std::size_t j = 0; j < V; ++j) {
      row[j] *= d;
      u[j] += row[j] * ki;
    }
  }
  for (std::size_t j = 0; j < V; ++j) u[j] = beta * (v[j] - u[j]);
  if (o != nullptr) {
    for (std::size_t j = 0; j < V; ++j) o[j] = 0.0f;
  }
  // S = S' + k u^T, then o = S^T q.
  for (std::size_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    const float ki = k[i];
    for (std::size_t j = 0; j < V; ++j) row[j] += ki * u[j];
    if (o != nullptr) {
      const float qi = q[i];
      for (std::size_t j = 0; j < V; ++j) o[j] += row[j] * qi;
    }
  }
}

/// One GDN step of one head, in place. `state` holds K*V floats; q, k have K values, v has
/// V; `residual` (V floats) receives u; `out` receives o (V floats) or is empty to skip
/// the readout. The decay is std::exp(log_decay). Throws std::invalid_argument on a size
/// mismatch.
void gdn_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              float log_decay, float beta, std::span<float> residual, std::span<float> out);

/// One KDA step of one head: as gdn_step with one log-decay per key row (K values).
void kda_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> log_decay, float beta, std::span<float> residual,
              std::span<float> out);

/// q <- q / |q| / sqrt(K), k <- k / |k| (K = q.size()). Idempotent: inputs that are
/// already normalised and scaled come out unchanged (up to rounding). A zero vector
/// stays zero.
void normalize_qk(std::span<float> q, std::span<float> k);

}  // namespace statepool::kernels
