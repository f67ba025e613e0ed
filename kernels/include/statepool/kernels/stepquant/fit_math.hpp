#pragma once
// The scalar pieces of the STEPQuant / DSQ / temporal-only fits (fit.hpp states the
// arithmetic to the last rounding), shared by the CPU fit (kernels/cpu/stepquant_fit.cpp)
// and the CUDA kernels (cuda/block_codec.hpp). One definition of every rounding step is
// what makes the GPU bytes equal to the CPU bytes; the CPU tests of the fit therefore
// cover this math for both.
//
// What each side owns is the loop order around these pieces, and the fit fixes it: the
// row sum of step 1 is row_abs_sum below (four interleaved partial sums); the refit sums
// run over rows in row order; the maxima are order-free; everything else is per value.
//
// binary64 operations go through mul_f64 / add_f64 / div_f64 / sqrt_f64: on the device
// those are the _rn intrinsics, which nvcc never fuses into a multiply-add (a fused
// w*v*x + num would round once instead of twice and change the refit); the host library
// builds with -ffp-contract=off, so plain operators round each operation there. The
// binary32 operations used here cannot be contracted in a way that changes bits (single
// products of exact factors, or divisions through div_rn), and the CUDA library builds
// with --fmad=false besides.
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

// --- binary64 arithmetic, one rounding per operation ----------------------------------

STATEPOOL_HD inline double mul_f64(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

STATEPOOL_HD inline double add_f64(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

STATEPOOL_HD inline double div_f64(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

STATEPOOL_HD inline double sqrt_f64(double a) noexcept {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

/// |x| widened to binary64 (exact).
STATEPOOL_HD inline double abs_f64(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return fabs(static_cast<double>(x));
#else
  return std::fabs(static_cast<double>(x));
#endif
}

/// |x| in binary32 (exact).
STATEPOOL_HD inline float abs_f32(float x) noexcept {
  return bits_float(abs_bits(x));
}

// --- fp16 ------------------------------------------------------------------------------

/// fp16 value of y >= 0 (or +Inf), saturating at 65504: every stored scale.
STATEPOOL_HD inline float fp16_sat(float y) noexcept {
  return half_bits_to_float(float_to_half_bits(y < kHalfMax ? y : kHalfMax));
}

/// The same for a binary64 y: saturate, round to binary32, then to fp16.
STATEPOOL_HD inline float fp16_sat(double y) noexcept {
  return fp16_sat(static_cast<float>(y < 65504.0 ? y : 65504.0));
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

/// sum_j |x[j]| in binary64, j < n: four interleaved partial sums (j mod 4; a tail of
/// n mod 4 values goes to lanes 0, 1, 2 in order), then (s0 + s1) + (s2 + s3). `Row` is
/// anything with x[j] -> float (a pointer, or a converting accessor on the device).
template <class Row>
STATEPOOL_HD inline double row_abs_sum(const Row& x, std::uint32_t n) noexcept {
  double s0 = 0.0;
  double s1 = 0.0;
  double s2 = 0.0;
  double s3 = 0.0;
  std::uint32_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 = add_f64(s0, abs_f64(x[j]));
    s1 = add_f64(s1, abs_f64(x[j + 1]));
    s2 = add_f64(s2, abs_f64(x[j + 2]));
    s3 = add_f64(s3, abs_f64(x[j + 3]));
  }
  if (j < n) {
    s0 = add_f64(s0, abs_f64(x[j]));
  }
  if (j + 1 < n) {
    s1 = add_f64(s1, abs_f64(x[j + 1]));
  }
  if (j + 2 < n) {
    s2 = add_f64(s2, abs_f64(x[j + 2]));
  }
  return add_f64(add_f64(s0, s1), add_f64(s2, s3));
}

/// r = fp16(float(sqrt((abs_sum / n) / w))), 1 when that rounds to 0.
STATEPOOL_HD inline float row_scale_from_sum(double abs_sum, std::uint32_t n, double w) noexcept {
  const double mean = div_f64(abs_sum, static_cast<double>(n));
  const float r = fp16_sat(sqrt_f64(div_f64(mean, w)));
  return r > 0.0f ? r : 1.0f;
}

// --- step 2: column scales ---------------------------------------------------------------

/// Bits of |x| / dq (dq = r_i q_i > 0): non-negative floats order like their bits, so
/// the column maximum is an integer maximum (order-free).
STATEPOOL_HD inline std::uint32_t column_ratio_bits(float x, float dq) noexcept {
  return float_bits(div_rn(abs_f32(x), dq));
}

/// c_j = fp16 of the column maximum whose bits are `max_bits` (0 for a zero column).
STATEPOOL_HD inline float column_scale_from_max(std::uint32_t max_bits) noexcept {
  return fp16_sat(bits_float(max_bits));
}

// --- step 3: codes -----------------------------------------------------------------------

/// The divisor that stands for c_j in a code: c_j, or +Inf when c_j = 0, so that
/// x / (r g Inf) = 0 gives z = 0 without a branch (x finite).
STATEPOOL_HD inline float column_divisor(float c) noexcept {
  return c > 0.0f ? c : bits_float(0x7F800000u);  // +Inf (numeric_limits is host-only)
}

/// Offset-binary code u = z + qmax of x for the row factor rg = r_i g_i and the column
/// divisor of c_j (rg * divisor is exact, or +Inf).
STATEPOOL_HD inline std::uint32_t dual_code(float x, float rg, float divisor,
                                            std::uint32_t qmax) noexcept {
  return uniform_code_positive_scale(x, rg * divisor, qmax);
}

// --- step 4: the refit -------------------------------------------------------------------

/// One row's term of the column sums N_j and D_j (call in row order): v = r g z
/// (exact in binary32), N += (w^2 v) x, D += (w^2 v) v, each operation rounded.
STATEPOOL_HD inline void refit_accumulate(float x, std::int32_t z, float rg, double ww, double& num,
                                          double& den) noexcept {
  const auto v = static_cast<double>(rg * static_cast<float>(z));  // exact
  const double wv = mul_f64(ww, v);
  num = add_f64(num, mul_f64(wv, static_cast<double>(x)));
  den = add_f64(den, mul_f64(wv, v));
}

/// The refitted c_j = fp16(float(N / D)), or the step-2 value `c` when D = 0 or the
/// refit rounds to 0 (or below).
STATEPOOL_HD inline float refit_column_scale(double num, double den, float c) noexcept {
  if (den > 0.0) {
    const float refit = fp16_sat(div_f64(num, den));
    if (refit > 0.0f) {
      return refit;
    }
  }
  return c;
}

// --- temporal_only -----------------------------------------------------------------------

/// s_i = fp16(absmax_i / qmax) as a float, from the bits of the row's absmax.
STATEPOOL_HD inline float absmax_row_scale(std::uint32_t absmax_bits, std::uint32_t qmax) noexcept {
  return half_bits_to_float(uniform_scale_bits(absmax_bits, qmax));
}

}  // namespace statepool::kernels::stepquant
