#pragma once
// The gated delta rule of one head, in FP32: the reference recurrence calibration runs to
// turn a trace of inputs into states (../../../../shared/STEPQUANT.md, "The recurrence").
//
// Per token, with the state S a row-major K x V matrix (key rows, value columns):
//   S' = diag(exp(g)) S          decay: g is one scalar per head (GDN) or one per key row (KDA)
//   u  = beta (v - S'^T k)       delta-rule residual (length V)
//   S  = S' + k u^T              rank-1 write
//   o  = S^T q                   readout (length V)
// q and k are expected L2-normalised with q scaled by 1/sqrt(K) (normalize_qk does that).
//
// Thread-safety: pure functions on caller-owned buffers.

#include <cstdint>
#include <span>

namespace statepool::calibration {

/// One GDN step of one head, in place. `state` holds K*V floats; q, k have K values, v has
/// V; `residual` (V floats) receives u; `out` receives o (V floats) or is empty to skip
/// the readout. Throws std::invalid_argument on a size mismatch.
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

}  // namespace statepool::calibration
