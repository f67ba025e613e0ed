#pragma once
// The scalar pieces of the STEPQuant / DSQ / temporal-only fits (fit.hpp states the
// arithmetic to the last rounding), shared by the CPU fit (kernels/cpu/stepquant_fit.cpp)
// and the CUDA kernels (cuda/block_codec.hpp). One definition of every rounding step is
// what makes the GPU bytes equal to the CPU bytes; the CPU tests of the fit therefore
// cover this math for both.
//
// What each side owns is the loop order around these pieces, and the fit (format v2)
// fixes it: every reduction over a row's values is the lane sum of row_abs_sum below (32
// strided lane partials, then a fixed tree: what a warp's shuffle reduction and CPU SIMD
// both compute cheaply); the refit sums over rows run in row order (one column per lane
// on either side); the maxima are order-free; everything else is per value.
//
// Format v2 is binary32 only, and divides once per row or column, never per value:
// per-row and per-column reciprocals, then multiplications. Every operation goes through
// add_f32 / mul_f32 / div_rn / sqrt_f32: on the device those are the _rn intrinsics,
// which nvcc never fuses into a multiply-add (a fused t*x + num would round once instead
// of twice and change the refit); the host library builds with -ffp-contract=off, so
// plain operators round each operation there, and the CUDA library builds with
// --fmad=false besides. The specification does not use a fused multiply-add anywhere.
//
// Thread-safety: pure functions.

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"
#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::kernels::stepquant {

// --- binary32 arithmetic, one rounding per operation ---------------------------------

STATEPOOL_HD inline float add_f32(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

STATEPOOL_HD inline float mul_f32(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

STATEPOOL_HD inline float sqrt_f32(float a) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

/// |x| in binary32 (exact).
STATEPOOL_HD inline float abs_f32(float x) noexcept {
  return bits_float(abs_bits(x));
}

/// Largest finite binary32 (numeric_limits is host-only).
inline constexpr float kFloatMax = 3.40282347e38f;

// --- the lane sum: every reduction over the values of a row ----------------------------

/// Lanes of a lane sum: a CUDA warp's width, and four AVX / eight SSE registers.
inline constexpr std::uint32_t kSumLanes = 32;

/// The fixed tree of a lane sum: for s = 16, 8, 4, 2, 1, p[l] = p[l] + p[l + s] for
/// l < s; returns p[0]. (A warp's shuffle-down reduction adds in exactly this order.)
STATEPOOL_HD inline float lane_tree(float* p) noexcept {
  for (std::uint32_t s = kSumLanes / 2; s > 0; s /= 2) {
    for (std::uint32_t l = 0; l < s; ++l) {
      p[l] = add_f32(p[l], p[l + s]);
    }
  }
  return p[0];
}

/// sum_j |x[j]|, j < n, in binary32 as the lane sum: lane l (0..31) adds the values
/// j = l, l + 32, l + 64, ... in increasing j, from +0; then lane_tree. `Row` is anything
/// with x[j] -> float (a pointer, or a converting accessor on the device).
template <class Row>
STATEPOOL_HD inline float row_abs_sum(const Row& x, std::uint32_t n) noexcept {
  float p[kSumLanes];
  for (std::uint32_t l = 0; l < kSumLanes; ++l) {
    p[l] = 0.0f;
  }
  for (std::uint32_t j0 = 0; j0 < n; j0 += kSumLanes) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::uint32_t l = 0; l < kSumLanes; ++l) {
      if (j0 + l < n) {
        p[l] = add_f32(p[l], abs_f32(x[j0 + l]));
      }
    }
  }
  return lane_tree(p);
}

// --- fp16 ------------------------------------------------------------------------------

/// fp16 value of y >= 0 (or +Inf), saturating at 65504: every stored scale. (min(y,
/// 65504) as an integer minimum of the bits, which order like the values for y >= 0:
/// masks rather than a float select, so the host loops vectorize.)
STATEPOOL_HD inline float fp16_sat(float y) noexcept {
  const std::uint32_t bits = float_bits(y);
  const std::uint32_t max_bits = float_bits(kHalfMax);
  return half_bits_to_float(float_to_half_bits(bits_float(bits < max_bits ? bits : max_bits)));
}

/// fp16(x) of a pivot value, as a float (round to nearest even, saturating).
STATEPOOL_HD inline float fp16_value(float x) noexcept {
  return half_bits_to_float(float_to_half_bits(x));
}

// --- per-row constants -------------------------------------------------------------------

/// q_i: the row's largest code, on the shared 8-bit grid for KDA (grid8) heads.
STATEPOOL_HD constexpr std::uint32_t row_code_limit(bool grid8, std::uint32_t bits) noexcept {
  return grid8 ? grid_qmax(bits) : code_qmax(bits);
}

/// g_i: the factor from the row's code to its grid code (1 unless grid8).
STATEPOOL_HD constexpr std::uint32_t row_grid(bool grid8, std::uint32_t bits) noexcept {
  return grid8 ? grid_factor(bits) : 1u;
}

// --- step 1: row scales ------------------------------------------------------------------

/// r = fp16(sqrt(abs_sum / (n w))), each operation rounded to binary32; 1 when r rounds
/// to 0. (n <= 2^24 is exact in binary32.)
STATEPOOL_HD inline float row_scale_from_sum(float abs_sum, std::uint32_t n, float w) noexcept {
  const float r = fp16_sat(sqrt_f32(div_rn(abs_sum, mul_f32(static_cast<float>(n), w))));
  const std::uint32_t bits = float_bits(r);
  return bits_float(select_u32(bits != 0, bits, float_bits(1.0f)));
}

// --- per-row reciprocals ------------------------------------------------------------------

/// e_i = 1 / (r_i q_i), the row's factor in step 2 (r_i q_i is exact: an fp16 value
/// times an integer below 2^7).
STATEPOOL_HD inline float column_ratio_factor(float r, std::uint32_t q) noexcept {
  return div_rn(1.0f, r * static_cast<float>(q));
}

/// a_i = 1 / (r_i g_i), the row's factor in step 3 (r_i g_i is exact: g_i is a power
/// of two).
STATEPOOL_HD inline float code_row_factor(float r, std::uint32_t g) noexcept {
  return div_rn(1.0f, r * static_cast<float>(g));
}

// --- step 2: column scales ---------------------------------------------------------------

/// Bits of |x| e_i: non-negative floats order like their bits, so the column maximum is
/// an integer maximum (order-free).
STATEPOOL_HD inline std::uint32_t column_ratio_bits(float x, float e) noexcept {
  return float_bits(mul_f32(abs_f32(x), e));
}

/// c_j = fp16 of the column maximum whose bits are `max_bits` (0 for a zero column).
STATEPOOL_HD inline float column_scale_from_max(std::uint32_t max_bits) noexcept {
  return fp16_sat(bits_float(max_bits));
}

// --- step 3: codes -----------------------------------------------------------------------

/// b_j = 1 / c_j, the column's factor in step 3, or 0 when c_j = 0 (every code of the
/// column is then 0: x a_i is finite where c_j = 0, see docs/codecs.md).
STATEPOOL_HD inline float column_code_factor(float c) noexcept {
  // 1 / c is computed for c = 0 too (+Inf, not selected): masks, so host loops vectorize.
  return bits_float(select_u32(c > 0.0f, float_bits(div_rn(1.0f, c)), 0u));
}

/// Offset-binary code u = z + qmax of x for the row factor a = a_i and the column
/// factor b = b_j: z = clamp(round_half_even((x a) b), -qmax, qmax).
STATEPOOL_HD inline std::uint32_t dual_code(float x, float a, float b,
                                            std::uint32_t qmax) noexcept {
  return code_from_quotient(mul_f32(mul_f32(x, a), b), qmax);
}

// --- step 4: the refit -------------------------------------------------------------------

/// One row's term of the column sums N_j and D_j (call in row order): v = r g z (exact
/// in binary32), t = ww v, N += t x, D += t v, each operation rounded to binary32.
/// ww = w_i w_i (refit_weight).
STATEPOOL_HD inline void refit_accumulate(float x, std::int32_t z, float rg, float ww, float& num,
                                          float& den) noexcept {
  const float v = rg * static_cast<float>(z);  // exact
  const float t = mul_f32(ww, v);
  num = add_f32(num, mul_f32(t, x));
  den = add_f32(den, mul_f32(t, v));
}

/// ww_i = w_i w_i, rounded to binary32.
STATEPOOL_HD inline float refit_weight(float w) noexcept {
  return mul_f32(w, w);
}

/// The refitted c_j = fp16(N / D) when D > 0 and N / D is finite and > 0 (NaN and Inf
/// fail the test); otherwise the step-2 value `c`.
STATEPOOL_HD inline float refit_column_scale(float num, float den, float c) noexcept {
  // Every quantity is computed whatever the tests say (a NaN or Inf quotient is not
  // selected): masks, so host loops vectorize.
  const float q = div_rn(num, den);
  const float refit = fp16_sat(q);
  const bool use = (den > 0.0f) & (q > 0.0f) & (q <= kFloatMax) & (refit > 0.0f);
  return bits_float(select_u32(use, float_bits(refit), float_bits(c)));
}

// --- temporal_only -----------------------------------------------------------------------

/// s_i = fp16(absmax_i / qmax) as a float, from the bits of the row's absmax.
STATEPOOL_HD inline float absmax_row_scale(std::uint32_t absmax_bits, std::uint32_t qmax) noexcept {
  return half_bits_to_float(uniform_scale_bits(absmax_bits, qmax));
}

/// Offset-binary code of x in a temporal_only row of scale s: z = clamp(round_half_even(
/// x (1 / s)), -qmax, qmax), 0 when s = 0. `inv` is absmax_code_factor(s).
STATEPOOL_HD inline float absmax_code_factor(float s) noexcept {
  return column_code_factor(s);
}
STATEPOOL_HD inline std::uint32_t absmax_code(float x, float inv, std::uint32_t qmax) noexcept {
  return code_from_quotient(mul_f32(x, inv), qmax);
}

}  // namespace statepool::kernels::stepquant
