#pragma once
// Factories of the concrete CPU codecs (internal to statepool_kernels).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "simd.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::detail {

/// fp32 / bf16 / fp16. `layout` is valid and names a float codec.
std::unique_ptr<Codec> make_float_codec(const StateLayout& layout);
/// int4 / int6 / int8. `layout` is valid and names a uniform codec.
std::unique_ptr<Codec> make_uniform_codec(const StateLayout& layout);
/// stepquant4 / stepquant6. `layout` is valid (so its plan is valid and matches).
std::unique_ptr<Codec> make_stepquant_codec(const StateLayout& layout);
/// dsq4 / dsq6. `layout` is valid.
std::unique_ptr<Codec> make_dsq_codec(const StateLayout& layout);

/// FP32 values <-> 16-bit values (bfloat16 / IEEE fp16, little-endian, any alignment of
/// `dst` / `src`), rounding to nearest even as float_to_bf16_bits / float_to_half_bits do
/// (numeric.hpp); cloned loops (simd.hpp), in float_codecs.cpp.
void encode_bf16(const float* src, std::size_t n, std::byte* dst);
void encode_fp16(const float* src, std::size_t n, std::byte* dst);
void decode_bf16(const std::byte* src, std::size_t n, float* dst);
void decode_fp16(const std::byte* src, std::size_t n, float* dst);

/// Index of the first NaN / +-Inf among n values in `dtype` (f32, bf16 or f16;
/// little-endian, any alignment), or n; `value` is then that value as a float. Blocks are
/// tested in place (a vectorized OR over their bits); one that looks bad is copied out and
/// the index and value come from the copy, so a buffer another process rewrites meanwhile
/// gives a consistent answer: an index below n is always that of a value read as NaN /
/// +-Inf, and never more than n values are read.
[[nodiscard]] std::size_t first_non_finite(const std::byte* src, std::size_t n, DType dtype,
                                           float& value) noexcept;

/// Copies n values in `dtype` (f32 or bf16, any alignment) to `dst` as FP32, checking them
/// on the way: returns the index of the first NaN / +-Inf (its value in `value`), or n.
/// One read of `src` (a load, a test and a store per value, vectorized), so the copy and
/// the answer agree whoever rewrites `src` meanwhile. For loops over small blocks inside
/// cloned functions (simd.hpp): forced inline.
STATEPOOL_FORCE_INLINE std::size_t copy_finite_block(const std::byte* src, std::size_t n,
                                                     DType dtype, float* dst,
                                                     float& value) noexcept {
  std::uint32_t any = 0;
  if (dtype == DType::f32) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t w;
      std::memcpy(&w, src + 4 * i, 4);
      any |= static_cast<std::uint32_t>(is_non_finite_bits(w));
      std::memcpy(dst + i, &w, 4);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;  // bf16 -> FP32, exact
      any |= static_cast<std::uint32_t>(is_non_finite_bits(w));
      std::memcpy(dst + i, &w, 4);
    }
  }
  if (any == 0) return n;
  // Where: in `dst`, which is the caller's own (the check and the report agree).
  return first_non_finite(reinterpret_cast<const std::byte*>(dst), n, DType::f32, value);
}
/// The same over a whole head or more (cloned: a function of its own).
[[nodiscard]] std::size_t copy_finite(const std::byte* src, std::size_t n, DType dtype, float* dst,
                                      float& value) noexcept;
/// True when no value of `values` is NaN or +-Inf (an OR over the bits; vectorized).
[[nodiscard]] bool all_finite(std::span<const float> values) noexcept;

/// bf16 values kept as they are (the bf16 KV codec from bf16 values): each value read once,
/// tested and stored to `out`; the first NaN / +-Inf is found in `out` (the caller's
/// memory), so the check and the report agree. Returns its index (its value in `value`),
/// or n; `out` then holds the values up to the end of that value's block. kv_codecs.cpp.
[[nodiscard]] std::size_t copy_bf16_checked(const std::byte* in, std::size_t n, std::byte* out,
                                            float& value) noexcept;
/// bf16 values -> bf16 values exactly as widening to FP32 and rounding back does
/// (float_to_bf16_bits of bf16_bits_to_float): a copy that sets the quiet bit of NaNs.
/// The bf16 KV codec's decode into bf16. kv_codecs.cpp.
void copy_bf16_quieting(const std::byte* in, std::size_t n, std::byte* out) noexcept;

/// Throws std::invalid_argument unless `dtype` is a staged state's: f32 or bf16.
void check_staged_dtype(DType dtype);
/// Throws std::invalid_argument unless the buffers of one head have the expected sizes.
void check_head_buffers(const char* codec, std::size_t values, std::size_t expected_values,
                        std::size_t bytes, std::size_t expected_bytes);

}  // namespace statepool::kernels::detail
