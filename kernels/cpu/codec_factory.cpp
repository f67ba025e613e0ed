#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

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
      index_(index),
      value_(value) {}

NonFiniteError::NonFiniteError(std::uint32_t layer, std::uint32_t head, std::size_t index,
                               float value, std::uint32_t value_dim)
    : std::invalid_argument(non_finite_message(
          layer, head,
          "row " + std::to_string(value_dim == 0 ? 0 : index / value_dim) + " col " +
              std::to_string(value_dim == 0 ? index : index % value_dim),
          value)),
      layer_(layer),
      head_(head),
      index_(index),
      value_(value) {}

namespace detail {

namespace {

// Memory another process may rewrite while it is scanned (a client's staging buffer) must
// give an answer that one reading of each value supports. A block is tested where it lies
// (a vectorized OR, no copy: the common all-finite case costs one read); a block that
// looks bad is copied out, and the index and value reported both come from that copy. A
// block whose copy is all finite (its bad value was rewritten meanwhile) counts as finite:
// each value's verdict comes from one reading. Every loop is bounded by n.
constexpr std::size_t kScanBlockBytes = 1024;

template <class Word, bool (*IsBad)(Word), float (*ToFloat)(Word)>
STATEPOOL_FORCE_INLINE std::size_t first_bad(const std::byte* src, std::size_t n, float& value) {
  constexpr std::size_t kBlock = kScanBlockBytes / sizeof(Word);
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t count = std::min(kBlock, n - base);
    const std::byte* p = src + base * sizeof(Word);
    std::uint32_t any = 0;
    for (std::size_t j = 0; j < count; ++j) {
      Word w;
      std::memcpy(&w, p + j * sizeof(Word), sizeof w);
      any |= static_cast<std::uint32_t>(IsBad(w));
    }
    if (any == 0) continue;
    Word block[kBlock];
    std::memcpy(block, p, count * sizeof(Word));
    for (std::size_t j = 0; j < count; ++j) {
      if (IsBad(block[j])) {
        value = ToFloat(block[j]);
        return base + j;
      }
    }
  }
  return n;
}

bool bad_f32(std::uint32_t bits) {
  return is_non_finite_bits(bits);
}
float f32_value(std::uint32_t bits) {
  return bits_float(bits);
}

}  // namespace

STATEPOOL_SIMD_CLONES std::size_t first_non_finite(const std::byte* src, std::size_t n, DType dtype,
                                                   float& value) noexcept {
  switch (dtype) {
    case DType::f32: return first_bad<std::uint32_t, bad_f32, f32_value>(src, n, value);
    case DType::bf16:
      return first_bad<std::uint16_t, is_non_finite_bf16, bf16_bits_to_float>(src, n, value);
    case DType::f16:
      return first_bad<std::uint16_t, is_non_finite_half, half_bits_to_float>(src, n, value);
  }
  return n;
}

STATEPOOL_SIMD_CLONES std::size_t copy_finite(const std::byte* src, std::size_t n, DType dtype,
                                              float* dst, float& value) noexcept {
  return copy_finite_block(src, n, dtype, dst, value);
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

LightEncode Codec::encode_head_light(std::uint32_t layer, std::uint32_t head,
                                     std::span<const float> src, std::span<const std::byte>,
                                     std::span<std::byte> dst, const LightOptions&,
                                     const StepUpdate&) const {
  return encode_head_checked(layer, head, src, dst) ? LightEncode::full_fit
                                                    : LightEncode::non_finite;
}

std::size_t Codec::encode_staged_head(std::uint32_t layer, std::uint32_t head, const std::byte* src,
                                      DType dtype, std::span<std::byte> dst, float& bad) const {
  // A fit reads its values several times: from a copy of this thread's own.
  detail::check_staged_dtype(dtype);
  thread_local std::vector<float> values;
  const std::size_t n = head_values();
  if (values.size() < n) values.resize(n);
  const std::size_t at = detail::copy_finite(src, n, dtype, values.data(), bad);
  if (at == n) encode_head(layer, head, {values.data(), n}, dst);
  return at;
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

void check_staged_dtype(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16) {
    throw std::invalid_argument(std::string("staged states are f32 or bf16, got ") +
                                to_string(dtype));
  }
}

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
