#pragma once
// The byte format of one encoded head, as formulas. Usable from host C++ and CUDA.
//
// Float codecs (no metadata):
//   fp32: n values as little-endian binary32                    -> 4n bytes
//   bf16, fp16: n values as little-endian 16-bit words          -> round_up(2n, 4) bytes
// Uniform int codecs int4 / int6 / int8 (b bits, qmax = 2^(b-1) - 1, group size G):
//   [ceil(n/G) fp16 scales, little-endian] [packed codes, packing.hpp] [zero padding]
//   -> round_up(2 * ceil(n/G) + packed_bytes(n, b), 4) bytes
// where n = key_dim * value_dim and values are taken row-major. Group g covers values
// [g*G, min((g+1)*G, n)); only the last group of a head may be shorter.
//
// Per value of a uniform codec (same function on CPU and GPU, quantize.hpp):
//   s = fp16(absmax(group) / qmax); z = clamp(round_half_even(x / s), -qmax, qmax);
//   s == 0 -> z = 0; x_hat = s * z.
//
// Thread-safety: pure functions.

#include <bit>
#include <cstddef>
#include <cstdint>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels {

static_assert(std::endian::native == std::endian::little,
              "statepool pages are little-endian and the codecs assume a little-endian host");

/// Smallest and largest valid group size of the uniform int codecs (a multiple of 4).
inline constexpr std::uint32_t kMinGroupSize = 4;
inline constexpr std::uint32_t kMaxGroupSize = 65536;

/// True for int4, int6, int8.
STATEPOOL_HD constexpr bool is_uniform_codec(CodecId id) noexcept {
  return id == CodecId::int4 || id == CodecId::int6 || id == CodecId::int8;
}

/// True for fp32, bf16, fp16.
STATEPOOL_HD constexpr bool is_float_codec(CodecId id) noexcept {
  return id == CodecId::fp32 || id == CodecId::bf16 || id == CodecId::fp16;
}

/// True for stepquant4, stepquant6 (plan-driven: sizes vary per head, see
/// stepquant/format.hpp and stepquant::head_bytes).
STATEPOOL_HD constexpr bool is_stepquant_codec(CodecId id) noexcept {
  return id == CodecId::stepquant4 || id == CodecId::stepquant6;
}

/// True for dsq4, dsq6 (dual-scale baselines, one size for every head).
STATEPOOL_HD constexpr bool is_dsq_codec(CodecId id) noexcept {
  return id == CodecId::dsq4 || id == CodecId::dsq6;
}

/// Code width of a uniform codec (4, 6, 8); 0 for the float codecs.
STATEPOOL_HD constexpr std::uint32_t codec_code_bits(CodecId id) noexcept {
  switch (id) {
    case CodecId::int4: return 4;
    case CodecId::int6: return 6;
    case CodecId::int8: return 8;
    default: return 0;
  }
}

/// Bytes per value of a float codec (4 or 2); 0 for the others.
STATEPOOL_HD constexpr std::uint32_t float_codec_value_bytes(CodecId id) noexcept {
  switch (id) {
    case CodecId::fp32: return 4;
    case CodecId::bf16:
    case CodecId::fp16: return 2;
    default: return 0;
  }
}

/// group_size with 0 replaced by kDefaultGroupSize.
STATEPOOL_HD constexpr std::uint32_t effective_group_size(std::uint32_t group_size) noexcept {
  return group_size == 0 ? kDefaultGroupSize : group_size;
}

/// A valid (effective) group size: a multiple of 4 in [4, 65536].
STATEPOOL_HD constexpr bool is_valid_group_size(std::uint32_t effective) noexcept {
  return effective >= kMinGroupSize && effective <= kMaxGroupSize && effective % 4u == 0;
}

STATEPOOL_HD constexpr std::size_t round_up4(std::size_t bytes) noexcept {
  return (bytes + 3u) & ~static_cast<std::size_t>(3u);
}

/// Number of fp16 scales of a uniform-codec head of n values with (effective) group G.
STATEPOOL_HD constexpr std::size_t uniform_group_count(std::size_t n,
                                                       std::uint32_t group) noexcept {
  return (n + group - 1u) / group;
}

/// Bytes of a uniform-codec head: scales, packed codes, zero padding to 4 bytes.
STATEPOOL_HD constexpr std::size_t uniform_head_bytes(std::size_t n, std::uint32_t group,
                                                      std::uint32_t bits) noexcept {
  return round_up4(2u * uniform_group_count(n, group) + packed_bytes(n, bits));
}

/// Bytes of a float-codec head.
STATEPOOL_HD constexpr std::size_t float_head_bytes(std::size_t n, CodecId id) noexcept {
  return round_up4(n * float_codec_value_bytes(id));
}

/// Bytes of a dsq4 / dsq6 head: fp16 row scales [K], fp16 column scales [V], packed codes,
/// zero padding (the same as stepquant::dsq_head_bytes).
STATEPOOL_HD constexpr std::size_t dsq_head_bytes_for(std::uint32_t key_dim,
                                                      std::uint32_t value_dim,
                                                      std::uint32_t bits) noexcept {
  return round_up4(2u * std::size_t{key_dim} + 2u * std::size_t{value_dim} +
                   packed_bytes(std::size_t{key_dim} * value_dim, bits));
}

/// Bytes of one encoded key_dim x value_dim head for `spec` (0 for an unknown codec, an
/// invalid group size, or a stepquant codec, whose sizes come from its plan).
STATEPOOL_HD constexpr std::size_t head_bytes_for(CodecSpec spec, std::uint32_t key_dim,
                                                  std::uint32_t value_dim) noexcept {
  const std::size_t n = static_cast<std::size_t>(key_dim) * value_dim;
  if (is_float_codec(spec.id)) {
    return float_head_bytes(n, spec.id);
  }
  if (is_uniform_codec(spec.id)) {
    const std::uint32_t group = effective_group_size(spec.group_size);
    return is_valid_group_size(group) ? uniform_head_bytes(n, group, codec_code_bits(spec.id)) : 0;
  }
  if (is_dsq_codec(spec.id)) {
    return dsq_head_bytes_for(key_dim, value_dim, spec.id == CodecId::dsq4 ? 4u : 6u);
  }
  return 0;
}

static_assert(uniform_head_bytes(128 * 128, 128, 6) == 12544);
static_assert(uniform_head_bytes(128 * 128, 128, 4) == 8448);
static_assert(uniform_head_bytes(128 * 128, 128, 8) == 16640);
static_assert(float_head_bytes(128 * 128, CodecId::fp32) == 65536);
static_assert(float_head_bytes(128 * 128, CodecId::bf16) == 32768);
static_assert(dsq_head_bytes_for(128, 128, 6) == 12800);

}  // namespace statepool::kernels
