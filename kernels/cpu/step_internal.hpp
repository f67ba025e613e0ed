#pragma once
// The gated delta rule of one head (recurrence.hpp) in the one order of operations every
// caller shares, compiled as AVX2 and baseline clones (simd.hpp) for every host caller:
// gdn_step / kda_step and the fused step. Both clones perform the same IEEE operations,
// so they compute the same bits. Internal to statepool_kernels (built with
// -ffp-contract=off); no checks.

#include <cstddef>
#include <cstdint>

namespace statepool::kernels::detail {

/// One step of one head, in place, on raw buffers: `S` K*V floats, q and k K floats, v V
/// floats, `u` V floats of scratch (receives the residual), `o` V floats or null to skip
/// the readout. decay(i) returns exp(g) for row i (a constant for GDN). No checks.
template <class Decay>
inline void step_head(float* S, std::uint32_t key_dim, std::uint32_t value_dim, const float* q,
                      const float* k, const float* v, const Decay& decay, float beta, float* u,
                      float* o) {
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

/// step_head with the decay exp(log_decay) for every row (GDN).
void step_head_gdn(float* state, std::uint32_t key_dim, std::uint32_t value_dim, const float* q,
                   const float* k, const float* v, float log_decay, float beta, float* residual,
                   float* out) noexcept;

/// step_head with the decay exp(log_decay[i]) for row i (KDA).
void step_head_kda(float* state, std::uint32_t key_dim, std::uint32_t value_dim, const float* q,
                   const float* k, const float* v, const float* log_decay, float beta,
                   float* residual, float* out) noexcept;

}  // namespace statepool::kernels::detail
