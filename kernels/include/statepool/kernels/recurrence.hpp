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
// The order of the floating-point operations is fixed (kernels/cpu/step_internal.hpp's
// step_head; the CUDA block body of cuda/block_step.hpp repeats it) so that every caller
// computes the same bits: S'^T k and S^T q accumulate over rows in row order, one
// rounding per multiply and per add, and the decay exp(g) is decay_factor(g), which uses
// IEEE single operations only (no libm, whose exp differs between the host's and the
// device's), so the CPU and the CUDA fused steps agree bit for bit. On the host these are
// functions of the library, built without multiply-add contraction whatever the flags of
// the code that calls them; in CUDA code decay_factor is inline (the kernels build with
// --fmad=false).
//
// Thread-safety: pure functions on caller-owned buffers.

#include <cstddef>
#include <cstdint>
#include <span>

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {

namespace detail {

/// decay_factor's arithmetic (below); call decay_factor.
STATEPOOL_HD inline float decay_factor_body(float g) noexcept {
  if (!(g == g)) return g;                                 // NaN
  if (g > 88.72283f) return bits_float(0x7F800000u);       // exp(g) > FLT_MAX: +Inf
  if (g < -103.97208f) return 0.0f;                        // below half the least subnormal
  const float n = round_half_even_small(g * 1.44269502f);  // |n| <= 150
  const float r = (g - n * 0.693145751953125f) - n * 1.42860677e-06f;  // ln2 = hi + lo
  float p = 1.98412698e-4f;                                            // 1/7!
  p = p * r + 1.38888889e-3f;                                          // 1/6!
  p = p * r + 8.33333333e-3f;                                          // 1/5!
  p = p * r + 4.16666667e-2f;                                          // 1/4!
  p = p * r + 1.66666667e-1f;                                          // 1/3!
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n = 2^a 2^b with a, b in [-75, 64]: both factors are normal floats.
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t a = ni / 2;
  const std::int32_t b = ni - a;
  const float scale_a = bits_float(static_cast<std::uint32_t>(a + 127) << 23);
  const float scale_b = bits_float(static_cast<std::uint32_t>(b + 127) << 23);
  return (p * scale_a) * scale_b;
}

}  // namespace detail

/// exp(g) within 2 ulp (1 ulp measured, over every 97th float from -104 to 89 and densely
/// over the gates' range [-30, 0]), from IEEE single multiplies and adds only: Cody-Waite reduction
/// g = n ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor polynomial in Horner form, and 2^n
/// applied as two exact power-of-two factors. NaN stays NaN, exp(+Inf) = +Inf,
/// exp(-Inf) = 0, results below the smallest subnormal are 0. The same bits on every host
/// and device (tests/kernels/test_recurrence.cpp).
#if defined(__CUDACC__)
STATEPOOL_HD inline float decay_factor(float g) noexcept {
  return detail::decay_factor_body(g);
}
#else
float decay_factor(float g) noexcept;
#endif

/// One GDN step of one head, in place. `state` holds K*V floats; q, k have K values, v has
/// V; `residual` (V floats) receives u; `out` receives o (V floats) or is empty to skip
/// the readout. The decay is decay_factor(log_decay). Throws std::invalid_argument on a size
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
