#pragma once
// The gated delta rule of one head (recurrence.hpp's step_head) compiled as AVX2 and
// baseline clones (simd.hpp), for every host caller: gdn_step / kda_step and the fused
// step. Both clones perform the same IEEE operations, so they compute the same bits.
// Internal to statepool_kernels; no checks.

#include <cstdint>

namespace statepool::kernels::detail {

/// step_head with the decay exp(log_decay) for every row (GDN).
void step_head_gdn(float* state, std::uint32_t key_dim, std::uint32_t value_dim, const float* q,
                   const float* k, const float* v, float log_decay, float beta, float* residual,
                   float* out) noexcept;

/// step_head with the decay exp(log_decay[i]) for row i (KDA).
void step_head_kda(float* state, std::uint32_t key_dim, std::uint32_t value_dim, const float* q,
                   const float* k, const float* v, const float* log_decay, float beta,
                   float* residual, float* out) noexcept;

}  // namespace statepool::kernels::detail
