#pragma once
// Per-element numeric conversions shared by the CPU codecs and the CUDA kernels, so that
// the storage format has exactly one definition. Everything here is branch-light integer
// or IEEE single-precision arithmetic that gives the same bits on the host and on the
// device (no fast-math, no contraction-sensitive expressions).
//
// Conversions:
//   float -> fp16 bits: round to nearest even; a finite input whose rounded magnitude
//     would be >= 2^16 (Inf) saturates to +-65504; fp16 subnormals are produced; Inf
//     stays Inf; NaN becomes a quiet NaN with the sign kept.
//   float -> bf16 bits: round to nearest even; a finite input that would round to Inf
//     saturates to +-max finite bf16 (0x7F7F); NaN becomes a quiet NaN with the sign kept.
//   fp16 / bf16 bits -> float: exact.
//
// Thread-safety: pure functions.

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cmath>
#endif

#if defined(__CUDACC__)
#define STATEPOOL_HD __host__ __device__
#else
#define STATEPOOL_HD
#endif

// Loop unrolling asked of the device compiler only (host loops are the host compiler's
// to vectorize): STATEPOOL_UNROLL unrolls a loop of constant trip count fully, so the
// arrays it indexes stay in registers; STATEPOOL_UNROLL_BY(n) unrolls n trips (the
// hot loops whose trips scripts/kernel-report counts, marked "xN").
#if defined(__CUDA_ARCH__)
#define STATEPOOL_PRAGMA(x) _Pragma(#x)
#define STATEPOOL_UNROLL STATEPOOL_PRAGMA(unroll)
#define STATEPOOL_UNROLL_BY(n) STATEPOOL_PRAGMA(unroll n)
#else
#define STATEPOOL_UNROLL
#define STATEPOOL_UNROLL_BY(n)
#endif

namespace statepool::kernels {

/// IEEE-754 binary32 bits of `value`.
STATEPOOL_HD inline std::uint32_t float_bits(float value) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

/// The float whose IEEE-754 binary32 bits are `bits`.
STATEPOOL_HD inline float bits_float(std::uint32_t bits) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

/// True for NaN and +-Inf (exponent field all ones).
STATEPOOL_HD inline bool is_non_finite_bits(std::uint32_t bits) noexcept {
  return (bits & 0x7F800000u) == 0x7F800000u;
}

/// True for a bf16 NaN or +-Inf.
STATEPOOL_HD inline bool is_non_finite_bf16(std::uint16_t bits) noexcept {
  return (bits & 0x7F80u) == 0x7F80u;
}

/// True for an IEEE fp16 NaN or +-Inf.
STATEPOOL_HD inline bool is_non_finite_half(std::uint16_t bits) noexcept {
  return (bits & 0x7C00u) == 0x7C00u;
}

/// IEEE correctly rounded a / b (also under --use_fast_math on the device).
STATEPOOL_HD inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Binary32 operations rounded once each and never fused into a multiply-add: on the
// device the _rn intrinsics, which nvcc never contracts; on the host plain operators
// (the libraries build with -ffp-contract=off). The codecs whose bytes the host and the
// device must both produce use these.
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

/// Rounds to the nearest integer, ties to even, exactly for |x| < 2^22. For larger |x|
/// the host result is within 2 of x (and keeps its sign; +-Inf stays +-Inf), the device
/// result is exact: callers that clamp to a small range afterwards get identical codes.
STATEPOOL_HD inline float round_half_even_small(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  // Adding 1.5 * 2^23 pushes the fraction bits out under the current (default,
  // round-to-nearest-even) rounding mode; vectorizes where rint() would be a call.
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
#endif
}

/// cond ? a : b as a bit mask. GCC (with the default -ftrapping-math) turns ternaries
/// near float operations into branches it then refuses to vectorize; masks stay masks.
/// (Comparisons below are on int32 where the values fit in 31 bits: SSE2 has signed
/// but not unsigned 32-bit compares.)
STATEPOOL_HD inline std::uint32_t select_u32(bool cond, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

/// 1 / y, or 0 when y = 0 (e.g. a zero scale).
STATEPOOL_HD inline float reciprocal_or_zero(float y) noexcept {
  // 1 / y is computed for y = 0 too (+Inf, not selected): masks, so host loops vectorize.
  return bits_float(select_u32(y > 0.0f, float_bits(div_rn(1.0f, y)), 0u));
}

// ---------------------------------------------------------------------------------------
// fp16

inline constexpr std::uint16_t kHalfMaxBits = 0x7BFFu;  // 65504
inline constexpr float kHalfMax = 65504.0f;

/// float -> IEEE binary16 bits (see the header comment for the exact rules).
/// Branch-free (every path computed, then selected) so that host loops vectorize.
STATEPOOL_HD inline std::uint16_t float_to_half_bits(float value) noexcept {
  const std::uint32_t x = float_bits(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  const auto sax = static_cast<std::int32_t>(ax);

  // |value| >= 2^-14, a normal fp16 (or overflow): re-bias the exponent (127 -> 15) and
  // round the 23-bit mantissa to 10 bits, ties to even; a carry out of the mantissa
  // correctly bumps the exponent; finite overflow saturates to 65504.
  const std::uint32_t rebased = ax - 0x38000000u;  // wraps for small ax: unused then
  std::uint32_t normal = (rebased + 0x0FFFu + ((rebased >> 13) & 1u)) >> 13;
  normal = select_u32(static_cast<std::int32_t>(normal) < 0x7C00, normal, kHalfMaxBits);

  // |value| < 2^-14, a subnormal fp16 or zero: the code is round(|value| * 2^24), ties to
  // even. The product is exact (a power-of-two scaling) and adding 2^23 rounds it to an
  // integer in the low mantissa bits. (For larger inputs this lane is computed but not
  // selected; no select feeds the float ops, which keeps GCC's vectorizer happy.)
  const float scaled = bits_float(ax) * 16777216.0f;                              // * 2^24
  const std::uint32_t subnormal = float_bits(scaled + 8388608.0f) - 0x4B000000u;  // + 2^23
  // (subnormal == 0x400 after rounding up is the smallest normal: right.)

  // Inf stays Inf; NaN becomes a quiet NaN keeping the top payload bits.
  const std::uint32_t special =
      0x7C00u | select_u32(sax > 0x7F800000, 0x200u | ((ax >> 13) & 0x3FFu), 0u);

  std::uint32_t h = select_u32(sax >= 0x38800000, normal, subnormal);
  h = select_u32(sax >= 0x7F800000, special, h);
  return static_cast<std::uint16_t>(sign | h);
}

/// IEEE binary16 bits -> float (exact). Branch-free, like float_to_half_bits.
STATEPOOL_HD inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h) & 0x7FFFu;  // exponent | mantissa
  const auto sem = static_cast<std::int32_t>(em);
  const std::uint32_t normal = (em << 13) + 0x38000000u;   // re-bias 15 -> 127
  const std::uint32_t special = (em << 13) | 0x7F800000u;  // Inf / NaN
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const std::uint32_t subnormal = float_bits(static_cast<float>(sem) * 5.9604644775390625e-08f);
  std::uint32_t r = select_u32(sem >= 0x7C00, special, normal);
  r = select_u32(sem < 0x0400, subnormal, r);
  return bits_float(sign | r);
}

// ---------------------------------------------------------------------------------------
// bf16

inline constexpr std::uint16_t kBf16MaxBits = 0x7F7Fu;

/// float -> bfloat16 bits (see the header comment for the exact rules). Branch-free.
STATEPOOL_HD inline std::uint16_t float_to_bf16_bits(float value) noexcept {
  const std::uint32_t x = float_bits(value);
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  const auto sax = static_cast<std::int32_t>(ax);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t r = (ax + 0x7FFFu + ((x >> 16) & 1u)) >> 16;               // round to nearest even
  r = select_u32(static_cast<std::int32_t>(r) < 0x7F80, r, kBf16MaxBits);  // finite: no Inf
  r = select_u32(sax == 0x7F800000, 0x7F80u, r);                           // Inf stays Inf
  r = select_u32(sax > 0x7F800000, (ax >> 16) | 0x0040u, r);               // quiet NaN
  return static_cast<std::uint16_t>(sign | r);
}

/// bfloat16 bits -> float (exact).
STATEPOOL_HD inline float bf16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace statepool::kernels
