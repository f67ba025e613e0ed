#pragma once
// Per-value and per-group math of the KV-cache codecs (kv.hpp), shared by the CPU
// encoder (kernels/cpu/kv_codecs.cpp) and the CUDA kernels (kernels/cuda/kv_kernels.cu),
// so that the format has one definition. docs/codecs.md, "KV-cache codecs", states the
// same rules with the byte layouts and the error bound.
//
// Asymmetric B-bit group (L = 2^B - 1 levels above the offset; lo, hi the group's
// smallest and largest value):
//   offset bits = fp16 rounded DOWN (toward -inf) from lo, saturating at -65504 (below
//                 -65504) and 65504 (above 65504); a zero offset is stored as +0
//   a           = the float value of those bits          (a <= lo unless saturated)
//   t           = (hi - a) / L                           binary32, round to nearest even
//   scale bits  = fp16(t), round to nearest even, saturating at 65504, when t > 0; else 0
//   s           = the float value of those bits
//   inv         = 1 / s (one division per group, correctly rounded) when s > 0; else 0
//   code q      = clamp(round_half_even((x - a) * inv), 0, L)
//   x_hat       = q * s + a                              (q * s is exact in binary32)
// What is stored is what is used: the codes are computed with the stored fp16 values.
// Rounding the offset down keeps every value at or above it (no value clips at the
// bottom, so the error stays within about half a step even for a narrow group far from
// zero); the scale, from hi - a, then spans the group, and rounding it to nearest moves
// the top code by at most L * 2^-11 of a step, which still rounds to L.
//
// The codes multiply by the group's reciprocal instead of dividing per value (format
// v2's rule, STEPQUANT.md: one reciprocal per row or column, then multiplications); the
// earlier encoder computed round_half_even((x - a) / s). Decoding is unchanged, so
// records of either encoder decode alike. (x - a) * inv carries three roundings (x - a,
// 1 / s, the product: a relative error up to about 3 * 2^-24) where the quotient
// carried two, so the two encoders differ, by one level, only where (x - a) / s lies
// within about 3 (L + 1/2) 2^-24 of a half-integer. docs/codecs.md ("Group
// quantization") derives the bound |x - x_hat| <= s/2 + 2^-22 L s + L 2^-24 + 2^-24 |x|.
// With s = 0, inv = 0 and every finite x gets code 0 ((x - a) * 0 = +-0; x - a is
// finite for finite x since |a| <= 65504). Non-finite values (which kv_encode rejects
// and the device scan skips) get the codes the division gave: NaN 0, -Inf 0, +Inf L
// when s > 0 and 0 when s = 0.
//
// Every operation is a correctly rounded binary32 operation or exact integer work, one
// rounding each: through numeric.hpp's add_f32, mul_f32 and div_rn (the _rn intrinsics
// on the device, which nvcc never fuses into a multiply-add; the host builds with
// -ffp-contract=off) and rintf. So the host and the device give the same bytes.
//
// OCP FP8 E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 15 with
// mantissa 7 is NaN, there is no Inf; max finite 448 (0x7E); subnormals m * 2^-9.
//
// Thread-safety: pure functions.

#include <cstdint>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels {

inline constexpr std::uint16_t kHalfLowestBits = 0xFBFFu;  // -65504

/// The largest fp16 value <= x, as bits: -65504 for x < -65504, 65504 for x > 65504,
/// +0 (0x0000) for x = +-0. Finite x only (NaN and Inf give unspecified bits).
STATEPOOL_HD inline std::uint16_t float_to_half_bits_down(float x) noexcept {
  std::uint16_t h = float_to_half_bits(x);  // nearest even, finite values saturating
  if (half_bits_to_float(h) > x) {
    // One fp16 step toward -inf: smaller magnitude for positive h, larger for negative h
    // (a negative h here is never 0x8000 = -0 with x = -0, and -65504 stays put).
    if ((h & 0x8000u) == 0u) {
      h = static_cast<std::uint16_t>(h - 1u);
    } else if (h != kHalfLowestBits) {
      h = static_cast<std::uint16_t>(h + 1u);
    }
  }
  return h == 0x8000u ? std::uint16_t{0} : h;
}

/// 2^bits - 1: the largest code of a `bits`-bit asymmetric group.
STATEPOOL_HD constexpr std::uint32_t kv_levels(std::uint32_t bits) noexcept {
  return (1u << bits) - 1u;
}

/// The stored metadata of one group.
struct KvGroupScale {
  std::uint16_t scale_bits = 0;
  std::uint16_t offset_bits = 0;
};

/// Scale and offset of a group whose smallest and largest values are lo <= hi.
STATEPOOL_HD inline KvGroupScale kv_group_scale(float lo, float hi, std::uint32_t levels) noexcept {
  KvGroupScale g;
  g.offset_bits = float_to_half_bits_down(lo);
  const float a = half_bits_to_float(g.offset_bits);
  const float t = div_rn(hi - a, static_cast<float>(levels));
  g.scale_bits = t > 0.0f ? float_to_half_bits(t) : std::uint16_t{0};
  return g;
}

/// The factor of a group's codes: 1 / s correctly rounded (the group's one division),
/// or 0 when s == 0 (then every finite value gets code 0).
STATEPOOL_HD inline float kv_inverse_scale(float s) noexcept {
  return reciprocal_or_zero(s);  // branch-free: the host loops vectorize
}

/// Code of x under the group's offset a and inverse scale inv = kv_inverse_scale(s):
/// clamp(round_half_even((x - a) * inv), 0, L), each operation one binary32 rounding
/// (add_f32 / mul_f32: never fused). Branch-free, so that the host loops vectorize.
STATEPOOL_HD inline std::uint32_t kv_group_code(float x, float inv, float a,
                                                std::uint32_t levels) noexcept {
  // round_half_even_small is exact where it matters; far outside [0, L] (only below a
  // saturated offset, or for +-Inf) the clamp decides; NaN fails r > 0 and gives 0.
  // x + (-a) is IEEE's x - a, bit for bit (signed zeros too).
  float r = round_half_even_small(mul_f32(add_f32(x, -a), inv));
  const float top = static_cast<float>(levels);
  r = r > 0.0f ? r : 0.0f;
  r = r < top ? r : top;
  return static_cast<std::uint32_t>(r);
}

/// Reconstruction of code q: q * s (exact) + a, one rounding.
STATEPOOL_HD inline float kv_value(std::uint32_t q, float s, float a) noexcept {
  return static_cast<float>(q) * s + a;
}

// ---------------------------------------------------------------------------------------
// FP8 E4M3

inline constexpr std::uint8_t kE4m3MaxBits = 0x7Eu;  // 448

/// float -> E4M3 bits, round to nearest even; finite values beyond +-448 (and +-Inf)
/// saturate to +-448; NaN gives 0x7F with the sign kept. Branch-free (select_u32), like
/// float_to_half_bits, so that the host loops vectorize.
STATEPOOL_HD inline std::uint8_t float_to_e4m3_bits(float value) noexcept {
  const std::uint32_t x = float_bits(value);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  const auto sax = static_cast<std::int32_t>(ax);
  // |value| >= 2^-6, a normal E4M3 (or beyond 448): re-bias the exponent (127 -> 7) and
  // round the 23-bit mantissa to 3 bits, ties to even; a carry out of the mantissa bumps
  // the exponent. (Wraps for small ax: not selected then.)
  const std::uint32_t rebased = ax - 0x3C000000u;
  std::uint32_t normal = (rebased + 0x7FFFFu + ((rebased >> 20) & 1u)) >> 20;
  normal = select_u32(static_cast<std::int32_t>(normal) > static_cast<std::int32_t>(kE4m3MaxBits),
                      kE4m3MaxBits, normal);
  // Subnormal or zero: round(|value| * 2^9), ties to even (the product is exact; adding
  // 2^23 rounds it into the low mantissa bits). 8 is the smallest normal: right.
  const float scaled = bits_float(ax) * 512.0f;
  const std::uint32_t subnormal = float_bits(scaled + 8388608.0f) - 0x4B000000u;
  std::uint32_t code = select_u32(sax >= 0x3C800000, normal, subnormal);
  code = select_u32(sax > 0x7F800000, 0x7Fu, code);
  return static_cast<std::uint8_t>(sign | code);
}

/// E4M3 bits -> float (exact; 0x7F / 0xFF give NaN).
STATEPOOL_HD inline float e4m3_bits_to_float(std::uint8_t b) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(b) & 0x80u) << 24;
  const std::uint32_t em = static_cast<std::uint32_t>(b) & 0x7Fu;  // exponent | mantissa
  const std::uint32_t m = em & 0x7u;
  const std::uint32_t normal = (em << 20) + (120u << 23);  // re-bias 7 -> 127
  const auto mf = static_cast<float>(static_cast<std::int32_t>(m));
  const std::uint32_t subnormal = float_bits(mf * 0.001953125f);  // m * 2^-9, exact
  std::uint32_t bits = select_u32(em < 8u, subnormal, normal);
  bits = select_u32(em == 0x7Fu, 0x7FC00000u, bits);
  return bits_float(sign | bits);
}

// ---------------------------------------------------------------------------------------
// Streams: work items, groups, records

STATEPOOL_HD inline void kv_put16(std::uint8_t* dst, std::uint16_t v) noexcept {
  dst[0] = static_cast<std::uint8_t>(v);
  dst[1] = static_cast<std::uint8_t>(v >> 8);
}
STATEPOOL_HD inline std::uint16_t kv_get16(const std::uint8_t* src) noexcept {
  return static_cast<std::uint16_t>(src[0] | (static_cast<std::uint32_t>(src[1]) << 8));
}

// How the CUDA kernels (kv_kernels.cu) split a stream, and the per-item functions they
// run (test_device_kv_emulation.cpp runs the same on the host against the CPU codecs).
//
// Alignment. An encoded stream is moved as little-endian 32-bit words counted from its
// first byte; every item reads or writes whole words of its own, except the stream's
// last, partial word (the tail). What the layout guarantees, relative to the stream's
// first byte:
//   - group records (kivi2 12 B, kivi4 / flexgen4 20 B: kv_group_bytes, a multiple of 4)
//     lie back to back from byte 0: record r is words [r (1 + B), (r + 1) (1 + B)) for B
//     bits per code. Its word 0 is scale | offset << 16; then B words of codes, 32 / B
//     codes per word, code i of the word at bits [B i, B i + B) (packing.hpp's quads, two
//     or four per word, little-endian). Records are 4-byte aligned, never 16 in general
//     (20 B apart), so 32-bit words are the widest access they allow.
//   - the flat part (bf16 or fp8 values; the KIVI FP16 residual window) starts at byte
//     residual_offset = groups * kv_group_bytes (a multiple of 4; 0 for bf16 / fp8): word
//     w holds its values [w V, w V + V), V = 2 (2-byte values) or 4 (fp8), lowest first.
//   - the tail: the flat part's last values % V values (one 2-byte value, or 1-3 fp8
//     values) in a partial word, written and read by the byte.
// So a stream whose first byte is 4-byte aligned takes only 32-bit accesses, its tail
// aside; the kernels check that per stream and otherwise run the same items through
// KvBytesOut / KvBytesIn. The plain side is accessed a value at a time (aligned to the
// element size: kv_kernels.hpp).

/// Format of the flat part's values.
enum class KvFlatFormat : std::uint8_t { bf16, fp16, e4m3 };

/// Values per 32-bit word of the flat part: 2 (bf16, fp16) or 4 (e4m3).
STATEPOOL_HD constexpr std::uint32_t kv_flat_per_word(KvFlatFormat f) noexcept {
  return f == KvFlatFormat::e4m3 ? 4u : 2u;
}

/// The items of one stream. Items write disjoint bytes.
struct KvItems {
  std::uint64_t groups = 0;      ///< group records: kv_encode_group / kv_decode_group
  std::uint64_t words = 0;       ///< whole words of the flat part
  std::uint64_t flat_word = 0;   ///< the flat part's first word (residual_offset / 4)
  std::uint64_t flat_value = 0;  ///< row-major index of the flat part's first value
  std::uint32_t tail = 0;        ///< values in the partial last word (< values per word)
  KvFlatFormat format = KvFlatFormat::fp16;
};

/// The items of a stream of `codec` with geometry g (codec must be in the enum).
STATEPOOL_HD constexpr KvItems kv_items(KvCodecId codec, const KvGeometry& g) noexcept {
  KvItems it;
  std::uint64_t flat = 0;  // values of the flat part
  if (codec == KvCodecId::bf16 || codec == KvCodecId::fp8) {
    it.format = codec == KvCodecId::bf16 ? KvFlatFormat::bf16 : KvFlatFormat::e4m3;
    flat = g.tokens * g.channels;
  } else {
    it.groups = g.groups;
    it.flat_word = g.residual_offset / 4u;  // groups * (12 or 20) bytes
    it.flat_value = g.quantized * g.channels;
    flat = g.residual * g.channels;
  }
  const std::uint32_t per_word = kv_flat_per_word(it.format);
  it.words = flat / per_word;
  it.tail = static_cast<std::uint32_t>(flat % per_word);
  return it;
}

/// The values of one group: `count` (1..32) values at row-major indices first + i * stride.
struct KvGroupSpan {
  std::uint64_t first = 0;
  std::uint64_t stride = 1;
  std::uint32_t count = 0;
};

/// A group record's place in the stream, without a division per record. Per channel
/// (KIVI keys): record major * channels + minor holds tokens [32 major, min(32 major + 32,
/// quantized)) of channel minor. Per token: record major * groups_per_row + minor holds
/// channels [32 minor, min(32 minor + 32, channels)) of token major.
struct KvGroupCursor {
  std::uint64_t major = 0;
  std::uint32_t minor = 0;
};

/// A walk over records item, item + step, ...: the step as a (major, minor) pair.
/// Needs channels < 2^32 (kv_view_problem bounds them at kKvMaxChannels); every division
/// is 32-bit, once per walk.
struct KvGroupWalk {
  std::uint32_t minors = 1;  ///< records per major: channels or groups_per_row
  std::uint32_t major_step = 0;
  std::uint32_t minor_step = 0;
};

STATEPOOL_HD constexpr KvGroupWalk kv_group_walk(const KvGeometry& g, std::uint32_t step) noexcept {
  KvGroupWalk w;
  const std::uint64_t minors = g.per_channel ? g.channels : g.groups_per_row;
  w.minors = minors == 0 ? 1u : static_cast<std::uint32_t>(minors);  // 0: no records
  w.major_step = step / w.minors;
  w.minor_step = step % w.minors;
  return w;
}

/// The cursor of record `item` (< 2^32: the kernels start at their thread's index).
STATEPOOL_HD constexpr KvGroupCursor kv_group_cursor(const KvGroupWalk& w,
                                                     std::uint32_t item) noexcept {
  return KvGroupCursor{item / w.minors, item % w.minors};
}

/// Moves the cursor on by the walk's step.
STATEPOOL_HD constexpr void kv_group_advance(KvGroupCursor& c, const KvGroupWalk& w) noexcept {
  c.major += w.major_step;
  c.minor += w.minor_step;  // < 2 minors: no overflow
  if (c.minor >= w.minors) {
    c.minor -= w.minors;
    ++c.major;
  }
}

/// The values of the record at cursor c.
STATEPOOL_HD constexpr KvGroupSpan kv_group_span(const KvGeometry& g,
                                                 const KvGroupCursor& c) noexcept {
  KvGroupSpan span;
  if (g.per_channel) {
    const std::uint64_t t0 = c.major * kKvGroupSize;
    const std::uint64_t left = g.quantized - t0;
    span.first = t0 * g.channels + c.minor;
    span.stride = g.channels;
    span.count = static_cast<std::uint32_t>(left < kKvGroupSize ? left : kKvGroupSize);
  } else {
    const std::uint64_t c0 = std::uint64_t{c.minor} * kKvGroupSize;
    const std::uint64_t left = g.channels - c0;
    span.first = c.major * g.channels + c0;
    span.stride = 1;
    span.count = static_cast<std::uint32_t>(left < kKvGroupSize ? left : kKvGroupSize);
  }
  return span;
}

/// Byte-wise access to an encoded stream of any alignment (little-endian words): the
/// tails, and the kernels' path for a stream that is not 4-byte aligned.
struct KvBytesOut {
  std::uint8_t* p;
  STATEPOOL_HD void word(std::uint64_t i, std::uint32_t w) const noexcept {
    store_le32(p + 4 * i, w);
  }
  STATEPOOL_HD void byte(std::uint64_t i, std::uint32_t b) const noexcept {
    p[i] = static_cast<std::uint8_t>(b);
  }
};
struct KvBytesIn {
  const std::uint8_t* p;
  STATEPOOL_HD std::uint32_t word(std::uint64_t i) const noexcept { return load_le32(p + 4 * i); }
  STATEPOOL_HD std::uint32_t byte(std::uint64_t i) const noexcept { return p[i]; }
};

/// Encodes one group into record words [word, word + 1 + Bits): fp16 scale | fp16 offset
/// << 16, then the codes (slots past span.count hold zero bits). load(i) gives the value
/// at row-major i; each is read once. out.word(i, w) writes word i of the stream.
template <std::uint32_t Bits, class Load, class Out>
STATEPOOL_HD inline void kv_encode_group(const Load& load, const KvGroupSpan& span, const Out& out,
                                         std::uint64_t word) noexcept {
  static_assert(Bits == 2 || Bits == 4);
  constexpr std::uint32_t levels = kv_levels(Bits);
  constexpr std::uint32_t per_word = 32u / Bits;
  float x[kKvGroupSize];
  x[0] = load(span.first);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t i = 1; i < kKvGroupSize; ++i) {  // slots past count repeat x[0]
    x[i] = i < span.count ? load(span.first + i * span.stride) : x[0];
  }
  float lo = x[0];
  float hi = lo;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t i = 1; i < kKvGroupSize; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  const KvGroupScale g = kv_group_scale(lo, hi, levels);
  out.word(word, g.scale_bits | (static_cast<std::uint32_t>(g.offset_bits) << 16));
  const float inv = kv_inverse_scale(half_bits_to_float(g.scale_bits));
  const float a = half_bits_to_float(g.offset_bits);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t k = 0; k < Bits; ++k) {
    std::uint32_t w = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::uint32_t j = 0; j < per_word; ++j) {
      const std::uint32_t i = k * per_word + j;
      const std::uint32_t q = i < span.count ? kv_group_code(x[i], inv, a, levels) : 0u;
      w |= q << (Bits * j);
    }
    out.word(word + 1 + k, w);
  }
}

/// Decodes the record at words [word, word + 1 + Bits): store(i, x_hat) for the span's
/// values. in.word(i) reads word i of the stream.
template <std::uint32_t Bits, class In, class Store>
STATEPOOL_HD inline void kv_decode_group(const In& in, std::uint64_t word, const KvGroupSpan& span,
                                         const Store& store) noexcept {
  static_assert(Bits == 2 || Bits == 4);
  constexpr std::uint32_t mask = kv_levels(Bits);
  constexpr std::uint32_t per_word = 32u / Bits;
  const std::uint32_t head = in.word(word);
  const float s = half_bits_to_float(static_cast<std::uint16_t>(head));
  const float a = half_bits_to_float(static_cast<std::uint16_t>(head >> 16));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t k = 0; k < Bits; ++k) {
    const std::uint32_t w = in.word(word + 1 + k);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::uint32_t j = 0; j < per_word; ++j) {
      const std::uint32_t i = k * per_word + j;
      if (i < span.count) {
        store(span.first + i * span.stride, kv_value((w >> (Bits * j)) & mask, s, a));
      }
    }
  }
}

/// The stored bits of one flat value.
template <KvFlatFormat F>
STATEPOOL_HD inline std::uint32_t kv_flat_bits(float x) noexcept {
  if constexpr (F == KvFlatFormat::bf16) {
    return float_to_bf16_bits(x);
  } else if constexpr (F == KvFlatFormat::fp16) {
    return float_to_half_bits(x);
  } else {
    return float_to_e4m3_bits(x);
  }
}
template <KvFlatFormat F>
STATEPOOL_HD inline float kv_flat_value(std::uint32_t bits) noexcept {
  if constexpr (F == KvFlatFormat::bf16) {
    return bf16_bits_to_float(static_cast<std::uint16_t>(bits));
  } else if constexpr (F == KvFlatFormat::fp16) {
    return half_bits_to_float(static_cast<std::uint16_t>(bits));
  } else {
    return e4m3_bits_to_float(static_cast<std::uint8_t>(bits));
  }
}

/// One word of the flat part: values [value, value + count) (count <= values per word;
/// the missing ones are zero bits), each read once.
template <KvFlatFormat F, class Load>
STATEPOOL_HD inline std::uint32_t kv_encode_flat_word(
    const Load& load, std::uint64_t value, std::uint32_t count = kv_flat_per_word(F)) noexcept {
  constexpr std::uint32_t per_word = kv_flat_per_word(F);
  constexpr std::uint32_t shift = 32u / per_word;
  std::uint32_t w = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t k = 0; k < per_word; ++k) {
    if (k < count) {
      w |= kv_flat_bits<F>(load(value + k)) << (shift * k);
    }
  }
  return w;
}

/// store(value + k, x_hat) for the first `count` values of flat word w.
template <KvFlatFormat F, class Store>
STATEPOOL_HD inline void kv_decode_flat_word(std::uint32_t w, std::uint64_t value,
                                             const Store& store,
                                             std::uint32_t count = kv_flat_per_word(F)) noexcept {
  constexpr std::uint32_t per_word = kv_flat_per_word(F);
  constexpr std::uint32_t shift = 32u / per_word;
  constexpr std::uint32_t mask = (1u << shift) - 1u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t k = 0; k < per_word; ++k) {
    if (k < count) {
      store(value + k, kv_flat_value<F>((w >> (shift * k)) & mask));
    }
  }
}

/// Flat word item w (< it.words).
template <KvFlatFormat F, class Load, class Out>
STATEPOOL_HD inline void kv_encode_flat(const KvItems& it, std::uint64_t w, const Load& load,
                                        const Out& out) noexcept {
  out.word(it.flat_word + w, kv_encode_flat_word<F>(load, it.flat_value + w * kv_flat_per_word(F)));
}
template <KvFlatFormat F, class In, class Store>
STATEPOOL_HD inline void kv_decode_flat(const KvItems& it, std::uint64_t w, const In& in,
                                        const Store& store) noexcept {
  kv_decode_flat_word<F>(in.word(it.flat_word + w), it.flat_value + w * kv_flat_per_word(F), store);
}

template <KvFlatFormat F, class Load, class Out>
STATEPOOL_HD inline void kv_encode_tail_t(const KvItems& it, const Load& load,
                                          const Out& out) noexcept {
  constexpr std::uint32_t per_word = kv_flat_per_word(F);
  const std::uint32_t w =
      kv_encode_flat_word<F>(load, it.flat_value + it.words * per_word, it.tail);
  const std::uint64_t at = 4u * (it.flat_word + it.words);
  for (std::uint32_t b = 0; b < it.tail * (4u / per_word); ++b) {
    out.byte(at + b, w >> (8u * b));
  }
}
template <KvFlatFormat F, class In, class Store>
STATEPOOL_HD inline void kv_decode_tail_t(const KvItems& it, const In& in,
                                          const Store& store) noexcept {
  constexpr std::uint32_t per_word = kv_flat_per_word(F);
  const std::uint64_t at = 4u * (it.flat_word + it.words);
  std::uint32_t w = 0;
  for (std::uint32_t b = 0; b < it.tail * (4u / per_word); ++b) {
    w |= in.byte(at + b) << (8u * b);
  }
  kv_decode_flat_word<F>(w, it.flat_value + it.words * per_word, store, it.tail);
}

/// The tail item (nothing when it.tail == 0): the flat part's last, partial word, by the
/// byte (out.byte(i, b) writes byte i of the stream).
template <class Load, class Out>
STATEPOOL_HD inline void kv_encode_tail(const KvItems& it, const Load& load,
                                        const Out& out) noexcept {
  if (it.tail == 0) {
    return;
  }
  switch (it.format) {
    case KvFlatFormat::bf16: kv_encode_tail_t<KvFlatFormat::bf16>(it, load, out); return;
    case KvFlatFormat::fp16: kv_encode_tail_t<KvFlatFormat::fp16>(it, load, out); return;
    case KvFlatFormat::e4m3: kv_encode_tail_t<KvFlatFormat::e4m3>(it, load, out); return;
  }
}
template <class In, class Store>
STATEPOOL_HD inline void kv_decode_tail(const KvItems& it, const In& in,
                                        const Store& store) noexcept {
  if (it.tail == 0) {
    return;
  }
  switch (it.format) {
    case KvFlatFormat::bf16: kv_decode_tail_t<KvFlatFormat::bf16>(it, in, store); return;
    case KvFlatFormat::fp16: kv_decode_tail_t<KvFlatFormat::fp16>(it, in, store); return;
    case KvFlatFormat::e4m3: kv_decode_tail_t<KvFlatFormat::e4m3>(it, in, store); return;
  }
}

}  // namespace statepool::kernels
