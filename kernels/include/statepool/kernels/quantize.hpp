#pragma once
// Per-value math of the uniform (symmetric, absmax per group, fp16 scale) int codecs,
// shared by the CPU codecs, the CPU reference and the CUDA kernels.
//
//   scale bits  = fp16(absmax / qmax)                  (round to nearest even, saturating)
//   s           = the float value of those bits         (what is stored is what is used)
//   code u      = clamp(round_half_even(x / s), -qmax, qmax) + qmax   when s > 0
//               = qmax (z = 0)                                          otherwise
//   x_hat       = s * (u - qmax)                         (exact in float)
//
// Defined for finite inputs. Non-finite inputs produce unspecified codes without
// undefined behaviour (a NaN quotient maps to -qmax); PageCodec rejects them first.
//
// Thread-safety: pure functions.

#include <cstdint>

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {

/// |x| as bits: for finite x, integer order of these bits equals the order of |x|, so an
/// integer max over them is the absmax (and vectorizes without fast-math).
STATEPOOL_HD inline std::uint32_t abs_bits(float x) noexcept {
  return float_bits(x) & 0x7FFFFFFFu;
}

/// fp16 scale bits for a group whose absmax has the bits `absmax_bits`.
STATEPOOL_HD inline std::uint16_t uniform_scale_bits(std::uint32_t absmax_bits,
                                                     std::uint32_t qmax) noexcept {
  return float_to_half_bits(div_rn(bits_float(absmax_bits), static_cast<float>(qmax)));
}

/// Offset-binary code of a quotient q (x over its step): clamp(round_half_even(q),
/// -qmax, qmax) + qmax; a NaN quotient gives 0 (z = -qmax).
STATEPOOL_HD inline std::uint32_t code_from_quotient(float q, std::uint32_t qmax) noexcept {
  const float qmaxf = static_cast<float>(qmax);
  // Round, then clamp: equal to clamp-then-round for integer bounds, and this order lets
  // GCC vectorize the host loops. round_half_even_small is exact where it matters
  // (|q| < 2^22); beyond, it stays far outside [-qmax, qmax] and the clamp decides.
  float r = round_half_even_small(q);
  // Strict compares: the same results as >= / <= (at equality both sides are the bound),
  // and exactly the max/min instructions' semantics, so the host loops compile to
  // vmaxps/vminps rather than compare-and-blend.
  r = r > -qmaxf ? r : -qmaxf;  // also maps NaN to -qmax
  r = r < qmaxf ? r : qmaxf;
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(r) + static_cast<std::int32_t>(qmax));
}

/// Code of x for a scale s > 0 (callers handle s == 0 with uniform_code).
STATEPOOL_HD inline std::uint32_t uniform_code_positive_scale(float x, float s,
                                                              std::uint32_t qmax) noexcept {
  return code_from_quotient(div_rn(x, s), qmax);
}

/// Code of x for any stored scale s (s == 0, or a NaN scale, gives z = 0).
STATEPOOL_HD inline std::uint32_t uniform_code(float x, float s, std::uint32_t qmax) noexcept {
  return s > 0.0f ? uniform_code_positive_scale(x, s, qmax) : qmax;
}

/// Reconstruction s * z of code u (exact: |z| < 2^7 and s has an 11-bit significand).
STATEPOOL_HD inline float uniform_value(std::uint32_t u, float s, std::uint32_t qmax) noexcept {
  return s * static_cast<float>(static_cast<std::int32_t>(u) - static_cast<std::int32_t>(qmax));
}

}  // namespace statepool::kernels
