#pragma once
// The scalar pieces of the STEPQuant / DSQ / temporal-only fits (fit.hpp states the
// arithmetic to the last rounding), shared by the CPU fit (kernels/cpu/stepquant_fit.cpp)
// and the CUDA kernels (cuda/block_codec.hpp). One definition of every rounding step is
// what makes the GPU bytes equal to the CPU bytes; the CPU tests of the fit therefore
// cover this math for both.
//
// What each side owns is the loop order around these pieces, and the fit (format v2)
// fixes it: every reduction over a row's values is the lane sum below (32 strided lane
// partials, lane_partial, then a fixed tree, lane_tree: what a warp and CPU SIMD both
// compute cheaply); the refit sums over rows run in row order (one column per lane
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

#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"
#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::kernels::stepquant {

// add_f32, mul_f32, sqrt_f32, div_rn and reciprocal_or_zero (numeric.hpp): binary32, one
// rounding per operation, never fused.

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

/// Lane l's partial of the lane sum of sum_j |x[j]|, j < n: the values j = l, l + 32,
/// l + 64, ... added in increasing j, from +0, in binary32. The lane sum of a row is
/// lane_tree of its 32 partials. `Row` is anything with x[j] -> float (a pointer, or a
/// converting accessor on the device). The device computes the partials of a row with
/// a warp (one lane each: 32 consecutive values per step) and the CPU with four 8-float
/// vectors (kernels/cpu/stepquant_fit.cpp): the same additions in the same order.
template <class Row>
STATEPOOL_HD inline float lane_partial(const Row& x, std::uint32_t l, std::uint32_t n) noexcept {
  float p = 0.0f;
  // kernel-report: dual-rows 1 x4 io
  STATEPOOL_UNROLL_BY(4)
  for (std::uint32_t j = l; j < n; j += kSumLanes) {
    p = add_f32(p, abs_f32(x[j]));
  }
  return p;
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

/// q_i: the row's largest level, on the shared 8-bit grid for KDA (grid8) heads.
STATEPOOL_HD constexpr std::uint32_t row_code_limit(bool grid8, std::uint32_t bits) noexcept {
  return grid8 ? grid_qmax(bits) : level_max(bits);
}

/// g_i: the factor from the row's code to its grid code (1 unless grid8).
STATEPOOL_HD constexpr std::uint32_t row_grid(bool grid8, std::uint32_t bits) noexcept {
  return grid8 ? grid_factor(bits) : 1u;
}

// --- step 1: row scales ------------------------------------------------------------------

/// r = fp16(sqrt(abs_sum / (n w))), each operation rounded to binary32. When r rounds to 0:
/// 1 for rows of 4, 6 or 8 bits (whose codes are then 0), and 0 for a 2-bit row (which
/// has no zero level, and so reconstructs as 0 through r). (n <= 2^24 is exact in
/// binary32.)
STATEPOOL_HD inline float row_scale_from_sum(float abs_sum, std::uint32_t n, float w,
                                             std::uint32_t bits) noexcept {
  const float r = fp16_sat(sqrt_f32(div_rn(abs_sum, mul_f32(static_cast<float>(n), w))));
  const std::uint32_t r_bits = float_bits(r);
  const std::uint32_t zero = select_u32(bits == 2, 0u, float_bits(1.0f));
  return bits_float(select_u32(r_bits != 0, r_bits, zero));
}

// --- per-row reciprocals ------------------------------------------------------------------

/// e_i = 1 / (r_i q_i), the row's factor in step 2 (r_i q_i is exact: an fp16 value
/// times an integer below 2^7); 0 when r_i = 0.
STATEPOOL_HD inline float column_ratio_factor(float r, std::uint32_t q) noexcept {
  return reciprocal_or_zero(r * static_cast<float>(q));
}

/// a_i = 1 / (r_i g_i), the row's factor in step 3 (r_i g_i is exact: g_i is a power
/// of two); 0 when r_i = 0.
STATEPOOL_HD inline float code_row_factor(float r, std::uint32_t g) noexcept {
  return reciprocal_or_zero(r * static_cast<float>(g));
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
  return reciprocal_or_zero(c);
}

/// Stored code u of a 2-bit unit's quotient t: the nearest of the levels {-3, -1, 1, 3}
/// = 2u - 3, as u = clamp(round_half_even((t + 3) * 0.5), 0, 3) (t + 3 rounded to
/// binary32; * 0.5 is exact). An even t ties to the even u: 0 and 2 give level 1, -2
/// gives -3. A NaN quotient gives u = 0.
STATEPOOL_HD inline std::uint32_t four_level_code(float t) noexcept {
  const float r = round_half_even_small(mul_f32(add_f32(t, 3.0f), 0.5f));
  // Masks rather than float selects, so host loops vectorize (select_u32); the first
  // also maps NaN to 0.
  const float low = bits_float(select_u32(r > 0.0f, float_bits(r), 0u));
  const float u = bits_float(select_u32(low < 3.0f, float_bits(low), float_bits(3.0f)));
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(u));
}

/// Stored code u of quotient t in a b-bit unit: four_level_code at 2 bits, otherwise
/// z + qmax_b with z = clamp(round_half_even(t), -qmax_b, qmax_b).
STATEPOOL_HD inline std::uint32_t unit_code_of(float t, std::uint32_t bits) noexcept {
  return bits == 2 ? four_level_code(t) : code_from_quotient(t, code_qmax(bits));
}

/// Stored code u of x in a b-bit row for the row factor a = a_i and the column factor
/// b = b_j: unit_code_of((x a) b, bits).
STATEPOOL_HD inline std::uint32_t dual_code(float x, float a, float b,
                                            std::uint32_t bits) noexcept {
  return unit_code_of(mul_f32(mul_f32(x, a), b), bits);
}

// --- step 4: the refit -------------------------------------------------------------------

/// One row's term of the column sums N_j and D_j (call in row order): v = r g z (exact
/// in binary32), t = ww v, N += t x, D += t v, each operation rounded to binary32.
/// ww = w_i w_i (refit_weight). refit_accumulate_value takes v itself.
STATEPOOL_HD inline void refit_accumulate_value(float x, float v, float ww, float& num,
                                                float& den) noexcept {
  const float t = mul_f32(ww, v);
  num = add_f32(num, mul_f32(t, x));
  den = add_f32(den, mul_f32(t, v));
}
STATEPOOL_HD inline void refit_accumulate(float x, std::int32_t z, float rg, float ww, float& num,
                                          float& den) noexcept {
  refit_accumulate_value(x, rg * static_cast<float>(z), ww, num, den);  // v exact
}

/// What the number of refit rounds depends on: a head's non-pivot row widths, added one
/// row at a time (in any order).
struct RowWidths {
  std::uint32_t rows = 0;  // non-pivot rows
  std::uint32_t sum = 0;   // their widths
  bool two_bit = false;    // any of them at 2 bits
  STATEPOOL_HD void add(std::uint32_t bits) noexcept {
    if (bits != kPivotWidth) {
      ++rows;
      sum += bits;
      two_bit = two_bit || bits == 2;
    }
  }
};

/// Rounds of steps 4 and 3 a dual-axis head runs: 0 without the refit; 2 when any of its
/// rows has 2 bits or its non-pivot rows average 4 bits or fewer (coarse grids, whose
/// levels move with c_j: a second round measurably helped the 4-bit plans, and changed
/// nothing at 6 bits; docs/codecs.md); otherwise 1.
STATEPOOL_HD constexpr std::uint32_t refit_rounds(bool refit, const RowWidths& w) noexcept {
  const bool coarse = w.two_bit || (w.rows > 0 && w.sum <= 4 * w.rows);
  return refit ? (coarse ? 2u : 1u) : 0u;
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

// --- the carried step ---------------------------------------------------------------------

/// The carried row scale from m = max_j |x_ij| b_j (its bits; the row's largest quotient
/// against the page's column scales): r = fp16(m / q), so that the row's largest value
/// takes its largest level. When r rounds to 0 it is 1, or 0 at 2 bits (as
/// row_scale_from_sum). A NaN or +Inf m (a value that overflows the quotient) gives
/// 65504.
STATEPOOL_HD inline float carried_row_scale(std::uint32_t max_bits, std::uint32_t q,
                                            std::uint32_t bits) noexcept {
  const float r = fp16_sat(div_rn(bits_float(max_bits), static_cast<float>(q)));
  const std::uint32_t r_bits = float_bits(r);
  const std::uint32_t zero = select_u32(bits == 2, 0u, float_bits(1.0f));
  return bits_float(select_u32(r_bits != 0, r_bits, zero));
}

/// Whether quotient t clamps in a b-bit unit: |t| > L_b + 1/2, or |t| > 4 at 2 bits
/// (levels 2 apart). `limit` is clamp_limit(bits).
STATEPOOL_HD constexpr float clamp_limit(std::uint32_t bits) noexcept {
  return bits == 2 ? 4.0f : static_cast<float>(level_max(bits)) + 0.5f;
}

// --- temporal_only -----------------------------------------------------------------------

/// s_i = fp16(absmax_i / L_b) as a float, from the bits of the row's absmax.
STATEPOOL_HD inline float absmax_row_scale(std::uint32_t absmax_bits, std::uint32_t bits) noexcept {
  return half_bits_to_float(uniform_scale_bits(absmax_bits, level_max(bits)));
}

/// Stored code of x in a temporal_only row of scale s: unit_code_of(x (1 / s), bits), with
/// 1 / s taken as 0 when s = 0 (the row then reconstructs as 0). `inv` is
/// absmax_code_factor(s).
STATEPOOL_HD inline float absmax_code_factor(float s) noexcept {
  return reciprocal_or_zero(s);
}
STATEPOOL_HD inline std::uint32_t absmax_code(float x, float inv, std::uint32_t bits) noexcept {
  return unit_code_of(mul_f32(x, inv), bits);
}

}  // namespace statepool::kernels::stepquant
