#pragma once
// Helpers shared by the codec tests.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::test {

inline StateLayout head_layout(CodecId id, std::uint32_t group, std::uint32_t key_dim,
                               std::uint32_t value_dim) {
  StateLayout layout;
  layout.name = "test";
  layout.num_layers = 1;
  layout.num_heads = 1;
  layout.key_dim = key_dim;
  layout.value_dim = value_dim;
  layout.codec = {id, group};
  return layout;
}

inline StateLayout qwen3_next_layout(CodecId id) {
  StateLayout layout;
  layout.name = "qwen3-next-80b-a3b";
  layout.arch = Arch::gdn;
  layout.num_layers = 36;
  layout.num_heads = 32;
  layout.key_dim = 128;
  layout.value_dim = 128;
  layout.conv_channels = 8192;
  layout.conv_width = 3;
  layout.conv_dtype = DType::bf16;
  layout.codec = {id, 0};
  return layout;
}

/// fp16 scale g of an encoded uniform head (scales are stored first, little-endian).
inline float stored_scale(std::span<const std::byte> head, std::size_t group) {
  const auto lo = std::to_integer<std::uint16_t>(head[2 * group]);
  const auto hi = std::to_integer<std::uint16_t>(head[2 * group + 1]);
  return half_bits_to_float(static_cast<std::uint16_t>(lo | (hi << 8)));
}

inline std::uint16_t stored_scale_bits(std::span<const std::byte> head, std::size_t group) {
  const auto lo = std::to_integer<std::uint16_t>(head[2 * group]);
  const auto hi = std::to_integer<std::uint16_t>(head[2 * group + 1]);
  return static_cast<std::uint16_t>(lo | (hi << 8));
}

inline std::vector<std::byte> float_bytes(std::span<const float> values) {
  std::vector<std::byte> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

inline std::vector<float> bytes_to_floats(std::span<const std::byte> bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

/// Index of the first differing byte, or -1.
inline long first_difference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) {
    return 0;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

}  // namespace statepool::kernels::test
