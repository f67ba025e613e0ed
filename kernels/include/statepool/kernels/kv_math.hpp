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
//   code q      = clamp(round_half_even((x - a) / s), 0, L)   when s > 0;  0 otherwise
//   x_hat       = q * s + a                              (q * s is exact in binary32)
// What is stored is what is used: the codes are computed with the stored fp16 values.
// Rounding the offset down keeps every value at or above it (no value clips at the
// bottom, so the error stays within half a step even for a narrow group far from zero);
// the scale, from hi - a, then spans the group, and rounding it to nearest moves the top
// code by at most L * 2^-11 of a step, which still rounds to L.
//
// Every operation is a correctly rounded binary32 operation or exact integer work, and
// none is a multiply-add candidate whose fusion would change a bit (q * s is exact), so
// the host and the device (rintf, __fdiv_rn) give the same bytes.
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

/// Code of x under a divisor d: the stored scale s when s > 0. d = +Inf gives 0 for any
/// finite x (and a), which is kv_code's code for s == 0: the CPU loops pass +Inf for a
/// zero scale instead of branching per value.
STATEPOOL_HD inline std::uint32_t kv_code_divisor(float x, float d, float a,
                                                  std::uint32_t levels) noexcept {
  // round_half_even_small is exact where it matters; far outside [0, L] (only below a
  // saturated offset) the clamp decides.
  float r = round_half_even_small(div_rn(x - a, d));
  const float top = static_cast<float>(levels);
  r = r > 0.0f ? r : 0.0f;
  r = r < top ? r : top;
  return static_cast<std::uint32_t>(r);
}

/// Code of x under the stored scale s and offset a (0 when s == 0).
STATEPOOL_HD inline std::uint32_t kv_code(float x, float s, float a,
                                          std::uint32_t levels) noexcept {
  if (!(s > 0.0f)) {
    return 0;
  }
  return kv_code_divisor(x, s, a, levels);
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

/// The independent pieces of work of one stream, as the CPU loop and the CUDA grid share
/// them: bf16 / fp8 one per value (row-major index); group codecs one per group record
/// (items [0, groups)), then KIVI one per value of the residual window (items
/// [groups, groups + residual * channels), row-major from the oldest residual token).
/// Items write disjoint bytes.
STATEPOOL_HD constexpr std::uint64_t kv_work_items(const KvGeometry& g) noexcept {
  return g.group_bytes == 0 ? g.tokens * g.channels : g.groups + g.residual * g.channels;
}

/// The values of one group: `count` (1..32) values at row-major indices first + i * stride.
struct KvGroupSpan {
  std::uint64_t first = 0;
  std::uint64_t stride = 1;
  std::uint32_t count = 0;
};

/// Group record `group` (< g.groups) of a group codec's stream. Per channel (KIVI keys):
/// record j * channels + c holds tokens [32 j, min(32 j + 32, quantized)) of channel c.
/// Per token: record t * groups_per_row + k holds channels [32 k, min(32 k + 32,
/// channels)) of token t.
STATEPOOL_HD constexpr KvGroupSpan kv_group_span(const KvGeometry& g,
                                                 std::uint64_t group) noexcept {
  KvGroupSpan span;
  if (g.per_channel) {
    const std::uint64_t t0 = group / g.channels * kKvGroupSize;
    const std::uint64_t left = g.quantized - t0;
    span.first = t0 * g.channels + group % g.channels;
    span.stride = g.channels;
    span.count = static_cast<std::uint32_t>(left < kKvGroupSize ? left : kKvGroupSize);
  } else {
    const std::uint64_t t = group / g.groups_per_row;
    const std::uint64_t c0 = group % g.groups_per_row * kKvGroupSize;
    const std::uint64_t left = g.channels - c0;
    span.first = t * g.channels + c0;
    span.stride = 1;
    span.count = static_cast<std::uint32_t>(left < kKvGroupSize ? left : kKvGroupSize);
  }
  return span;
}

/// Encodes one group into its record: fp16 scale, fp16 offset (little-endian), then 32
/// codes packed as packing.hpp's quads (4 bits: low nibble first; 2 bits: lowest bits
/// first); slots past span.count hold zero bits. load(i) gives the value at row-major i.
template <std::uint32_t Bits, class Load>
STATEPOOL_HD inline void kv_encode_group(const Load& load, const KvGroupSpan& span,
                                         std::uint8_t* record) noexcept {
  static_assert(Bits == 2 || Bits == 4);
  constexpr std::uint32_t levels = kv_levels(Bits);
  float lo = load(span.first);
  float hi = lo;
  for (std::uint32_t i = 1; i < span.count; ++i) {
    const float v = load(span.first + i * span.stride);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  const KvGroupScale g = kv_group_scale(lo, hi, levels);
  kv_put16(record, g.scale_bits);
  kv_put16(record + 2, g.offset_bits);
  const float s = half_bits_to_float(g.scale_bits);
  const float a = half_bits_to_float(g.offset_bits);
  std::uint8_t* codes = record + 4;
  for (std::uint32_t q = 0; q < kKvGroupSize / 4; ++q) {
    std::uint32_t u[4];
    for (std::uint32_t k = 0; k < 4; ++k) {
      const std::uint32_t i = 4 * q + k;
      u[k] = i < span.count ? kv_code(load(span.first + i * span.stride), s, a, levels) : 0u;
    }
    pack_quad<Bits>(u[0], u[1], u[2], u[3], codes + q * quad_bytes(Bits));
  }
}

/// Decodes one group record: store(i, x_hat) for the span's values.
template <std::uint32_t Bits, class Store>
STATEPOOL_HD inline void kv_decode_group(const std::uint8_t* record, const KvGroupSpan& span,
                                         const Store& store) noexcept {
  static_assert(Bits == 2 || Bits == 4);
  const float s = half_bits_to_float(kv_get16(record));
  const float a = half_bits_to_float(kv_get16(record + 2));
  const std::uint8_t* codes = record + 4;
  for (std::uint32_t q = 0; q * 4 < span.count; ++q) {
    std::uint32_t u[4];
    unpack_quad<Bits>(codes + q * quad_bytes(Bits), u);
    for (std::uint32_t k = 0; k < 4 && 4 * q + k < span.count; ++k) {
      store(span.first + (4 * q + k) * span.stride, kv_value(u[k], s, a));
    }
  }
}

/// Encodes work item `item` (< kv_work_items(g)) of a stream of `codec` into `out`, the
/// whole encoded stream. load(i): the input value at row-major index i, as a float.
template <class Load>
STATEPOOL_HD inline void kv_encode_item(KvCodecId codec, const KvGeometry& g, std::uint64_t item,
                                        const Load& load, std::uint8_t* out) noexcept {
  switch (codec) {
    case KvCodecId::bf16: kv_put16(out + 2 * item, float_to_bf16_bits(load(item))); return;
    case KvCodecId::fp8: out[item] = float_to_e4m3_bits(load(item)); return;
    case KvCodecId::kivi2:
    case KvCodecId::kivi4:
    case KvCodecId::flexgen4: break;
  }
  if (item < g.groups) {
    std::uint8_t* record = out + item * g.group_bytes;
    if (g.bits == 2) {
      kv_encode_group<2>(load, kv_group_span(g, item), record);
    } else {
      kv_encode_group<4>(load, kv_group_span(g, item), record);
    }
    return;
  }
  const std::uint64_t r = item - g.groups;  // residual window, FP16
  kv_put16(out + g.residual_offset + 2 * r, float_to_half_bits(load(g.quantized * g.channels + r)));
}

/// Decodes work item `item` of an encoded stream `in`: store(i, x_hat) for its values.
template <class Store>
STATEPOOL_HD inline void kv_decode_item(KvCodecId codec, const KvGeometry& g, std::uint64_t item,
                                        const std::uint8_t* in, const Store& store) noexcept {
  switch (codec) {
    case KvCodecId::bf16: store(item, bf16_bits_to_float(kv_get16(in + 2 * item))); return;
    case KvCodecId::fp8: store(item, e4m3_bits_to_float(in[item])); return;
    case KvCodecId::kivi2:
    case KvCodecId::kivi4:
    case KvCodecId::flexgen4: break;
  }
  if (item < g.groups) {
    const std::uint8_t* record = in + item * g.group_bytes;
    if (g.bits == 2) {
      kv_decode_group<2>(record, kv_group_span(g, item), store);
    } else {
      kv_decode_group<4>(record, kv_group_span(g, item), store);
    }
    return;
  }
  const std::uint64_t r = item - g.groups;
  store(g.quantized * g.channels + r, half_bits_to_float(kv_get16(in + g.residual_offset + 2 * r)));
}

}  // namespace statepool::kernels
