#pragma once
// Layouts and byte helpers of the codec tests: one-head layouts of any shape, the
// Qwen3-Next page, fp16 scales as stored, float <-> byte copies.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::testing {

/// One layer, one head of key_dim x value_dim, codec `id` with `group` (0 = default), no
/// conv state, arch GDN.
inline kernels::StateLayout head_layout(kernels::CodecId id, std::uint32_t group,
                                        std::uint32_t key_dim, std::uint32_t value_dim) {
  kernels::StateLayout layout;
  layout.name = "test";
  layout.num_layers = 1;
  layout.num_heads = 1;
  layout.key_dim = key_dim;
  layout.value_dim = value_dim;
  layout.codec = {id, group};
  return layout;
}

/// Qwen3-Next-80B-A3B: 36 linear layers x 32 heads x 128 x 128, conv 8192 x 3 in bf16.
inline kernels::StateLayout qwen3_next_layout(kernels::CodecId id) {
  kernels::StateLayout layout;
  layout.name = "qwen3-next-80b-a3b";
  layout.arch = kernels::Arch::gdn;
  layout.num_layers = 36;
  layout.num_heads = 32;
  layout.key_dim = 128;
  layout.value_dim = 128;
  layout.conv_channels = 8192;
  layout.conv_width = 3;
  layout.conv_dtype = kernels::DType::bf16;
  layout.codec = {id, 0};
  return layout;
}

/// Bits of the fp16 scale of group `group` of an encoded uniform head (int4/6/8: the
/// scales are stored first, little-endian).
inline std::uint16_t stored_scale_bits(std::span<const std::byte> head, std::size_t group) {
  const auto lo = std::to_integer<std::uint16_t>(head[2 * group]);
  const auto hi = std::to_integer<std::uint16_t>(head[2 * group + 1]);
  return static_cast<std::uint16_t>(lo | (hi << 8));
}

/// The same scale as a float.
inline float stored_scale(std::span<const std::byte> head, std::size_t group) {
  return kernels::half_bits_to_float(stored_scale_bits(head, group));
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

/// Index of the first differing byte, or -1 (0 when the sizes differ).
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

}  // namespace statepool::testing
