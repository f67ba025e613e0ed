#include <cmath>
#include <stdexcept>
#include <string>

#include "bytes.hpp"
#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {
namespace {

std::string value_text(float value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  return std::to_string(value);
}

std::string non_finite_message(std::uint32_t layer, std::uint32_t head, const std::string& where,
                               float value) {
  return "non-finite value " + value_text(value) + " at layer " + std::to_string(layer) + " head " +
         std::to_string(head) + " " + where;
}

}  // namespace

NonFiniteError::NonFiniteError(std::uint32_t layer, std::uint32_t head, std::size_t index,
                               float value)
    : std::invalid_argument(
          non_finite_message(layer, head, "index " + std::to_string(index), value)),
      layer_(layer),
      head_(head),
      index_(index) {}

NonFiniteError::NonFiniteError(std::uint32_t layer, std::uint32_t head, std::size_t index,
                               float value, std::uint32_t value_dim)
    : std::invalid_argument(non_finite_message(
          layer, head,
          "row " + std::to_string(value_dim == 0 ? 0 : index / value_dim) + " col " +
              std::to_string(value_dim == 0 ? index : index % value_dim),
          value)),
      layer_(layer),
      head_(head),
      index_(index) {}

namespace detail {

namespace {
template <class IsBad>
STATEPOOL_FORCE_INLINE std::size_t first_bad(std::size_t n, const IsBad& bad) {
  // A cheap OR-reduction first (vectorizes); the exact position only when needed.
  std::uint32_t any = 0;
  for (std::size_t i = 0; i < n; ++i) any |= static_cast<std::uint32_t>(bad(i));
  if (any == 0) return n;
  std::size_t i = 0;
  while (!bad(i)) ++i;
  return i;
}
}  // namespace

STATEPOOL_SIMD_CLONES std::size_t first_non_finite(const std::byte* src, std::size_t n,
                                                   DType dtype) noexcept {
  switch (dtype) {
    case DType::f32:
      return first_bad(n, [&](std::size_t i) { return is_non_finite_bits(load_u32(src + 4 * i)); });
    case DType::bf16:
      return first_bad(n,
                       [&](std::size_t i) { return is_non_finite_bf16(load_u16_le(src + 2 * i)); });
    case DType::f16:
      return first_bad(n,
                       [&](std::size_t i) { return is_non_finite_half(load_u16_le(src + 2 * i)); });
  }
  return n;
}

STATEPOOL_SIMD_CLONES bool all_finite(std::span<const float> values) noexcept {
  std::uint32_t any = 0;
  for (const float v : values) any |= static_cast<std::uint32_t>(is_non_finite_bits(float_bits(v)));
  return any == 0;
}

}  // namespace detail

bool Codec::encode_head_checked(std::uint32_t layer, std::uint32_t head, std::span<const float> src,
                                std::span<std::byte> dst) const {
  if (!detail::all_finite(src)) return false;
  encode_head(layer, head, src, dst);
  return true;
}

std::unique_ptr<Codec> make_codec(const StateLayout& layout) {
  const std::string problem = validate(layout);
  if (!problem.empty()) {
    throw std::invalid_argument("invalid layout: " + problem);
  }
  if (is_float_codec(layout.codec.id)) {
    return detail::make_float_codec(layout);
  }
  if (is_stepquant_codec(layout.codec.id)) {
    return detail::make_stepquant_codec(layout);
  }
  if (is_dsq_codec(layout.codec.id)) {
    return detail::make_dsq_codec(layout);
  }
  return detail::make_uniform_codec(layout);
}

namespace detail {

void check_head_buffers(const char* codec, std::size_t values, std::size_t expected_values,
                        std::size_t bytes, std::size_t expected_bytes) {
  if (values != expected_values || bytes != expected_bytes) {
    throw std::invalid_argument(
        std::string(codec) + " codec: a head takes " + std::to_string(expected_values) +
        " values and " + std::to_string(expected_bytes) + " bytes, got " + std::to_string(values) +
        " values and " + std::to_string(bytes) + " bytes");
  }
}

}  // namespace detail
}  // namespace statepool::kernels
