#include "statepool/kernels/reference.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "bytes.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels::reference {
namespace {

void check_sizes(std::size_t head, std::size_t expected_head, std::size_t values,
                 std::size_t expected_values) {
  if (head != expected_head) {
    throw std::invalid_argument("reference codec: head buffer has " + std::to_string(head) +
                                " bytes, expected " + std::to_string(expected_head));
  }
  if (values != expected_values) {
    throw std::invalid_argument("reference codec: value buffer has " + std::to_string(values) +
                                " floats, expected " + std::to_string(expected_values));
  }
}

}  // namespace

std::size_t head_bytes(CodecSpec spec, std::uint32_t key_dim, std::uint32_t value_dim) {
  // The reference covers the float and uniform codecs; the STEPQuant family's oracle is
  // stepquant/fit.hpp (fit + reconstruct).
  const bool covered = is_float_codec(spec.id) || is_uniform_codec(spec.id);
  const std::size_t bytes = covered ? head_bytes_for(spec, key_dim, value_dim) : 0;
  if (bytes == 0) {
    throw std::invalid_argument("reference codec: unknown codec " +
                                std::to_string(static_cast<int>(spec.id)) +
                                " or invalid group_size " + std::to_string(spec.group_size));
  }
  return bytes;
}

void encode_head(CodecSpec spec, std::uint32_t key_dim, std::uint32_t value_dim,
                 std::span<const float> src, std::span<std::byte> dst) {
  const std::size_t n = static_cast<std::size_t>(key_dim) * value_dim;
  check_sizes(dst.size(), head_bytes(spec, key_dim, value_dim), src.size(), n);
  std::fill(dst.begin(), dst.end(), std::byte{0});

  switch (spec.id) {
    case CodecId::fp32:
      for (std::size_t i = 0; i < n; ++i) {
        detail::store_u32(dst.data() + 4 * i, float_bits(src[i]));
      }
      return;
    case CodecId::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        detail::store_u16_le(dst.data() + 2 * i, float_to_bf16_bits(src[i]));
      }
      return;
    case CodecId::fp16:
      for (std::size_t i = 0; i < n; ++i) {
        detail::store_u16_le(dst.data() + 2 * i, float_to_half_bits(src[i]));
      }
      return;
    default: break;
  }

  const std::uint32_t bits = codec_code_bits(spec.id);
  const std::uint32_t qmax = code_qmax(bits);
  const std::uint32_t group = effective_group_size(spec.group_size);
  const std::size_t groups = uniform_group_count(n, group);
  std::uint8_t* codes = detail::as_u8(dst.data() + 2 * groups);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * group;
    const std::size_t end = std::min(n, begin + group);
    float absmax = 0.0f;
    for (std::size_t i = begin; i < end; ++i) {
      absmax = std::max(absmax, std::fabs(src[i]));
    }
    const std::uint16_t scale_bits = float_to_half_bits(absmax / static_cast<float>(qmax));
    detail::store_u16_le(dst.data() + 2 * g, scale_bits);
    const float s = half_bits_to_float(scale_bits);
    const auto limit = static_cast<float>(qmax);
    for (std::size_t i = begin; i < end; ++i) {
      float z = 0.0f;
      if (s > 0.0f) {
        z = std::clamp(std::nearbyint(src[i] / s), -limit, limit);
      }
      set_code(codes, i, bits,
               static_cast<std::uint32_t>(static_cast<std::int32_t>(z) +
                                          static_cast<std::int32_t>(qmax)));
    }
  }
}

void decode_head(CodecSpec spec, std::uint32_t key_dim, std::uint32_t value_dim,
                 std::span<const std::byte> src, std::span<float> dst) {
  const std::size_t n = static_cast<std::size_t>(key_dim) * value_dim;
  check_sizes(src.size(), head_bytes(spec, key_dim, value_dim), dst.size(), n);

  switch (spec.id) {
    case CodecId::fp32:
      for (std::size_t i = 0; i < n; ++i) {
        dst[i] = bits_float(detail::load_u32(src.data() + 4 * i));
      }
      return;
    case CodecId::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        dst[i] = bf16_bits_to_float(detail::load_u16_le(src.data() + 2 * i));
      }
      return;
    case CodecId::fp16:
      for (std::size_t i = 0; i < n; ++i) {
        dst[i] = half_bits_to_float(detail::load_u16_le(src.data() + 2 * i));
      }
      return;
    default: break;
  }

  const std::uint32_t bits = codec_code_bits(spec.id);
  const std::uint32_t qmax = code_qmax(bits);
  const std::uint32_t group = effective_group_size(spec.group_size);
  const std::size_t groups = uniform_group_count(n, group);
  const std::uint8_t* codes = detail::as_u8(src.data() + 2 * groups);
  for (std::size_t i = 0; i < n; ++i) {
    const float s = half_bits_to_float(detail::load_u16_le(src.data() + 2 * (i / group)));
    const auto z =
        static_cast<std::int32_t>(get_code(codes, i, bits)) - static_cast<std::int32_t>(qmax);
    dst[i] = s * static_cast<float>(z);
  }
}

}  // namespace statepool::kernels::reference
