#pragma once
// Factories of the concrete CPU codecs (internal to statepool_kernels).

#include <cstddef>
#include <memory>
#include <span>

#include "statepool/kernels/codec.hpp"

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
/// little-endian, any alignment), or n. A vectorized OR over the bits first.
[[nodiscard]] std::size_t first_non_finite(const std::byte* src, std::size_t n,
                                           DType dtype) noexcept;

/// True when no value of `values` is NaN or +-Inf (an OR over the bits; vectorized).
[[nodiscard]] bool all_finite(std::span<const float> values) noexcept;

/// Throws std::invalid_argument unless the buffers of one head have the expected sizes.
void check_head_buffers(const char* codec, std::size_t values, std::size_t expected_values,
                        std::size_t bytes, std::size_t expected_bytes);

}  // namespace statepool::kernels::detail
