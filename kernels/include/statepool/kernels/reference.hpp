#pragma once
// Plain, obviously-correct scalar reference of every codec's head format: one value at a
// time, random-access code packing, no chunking. It is the oracle the fast CPU codecs
// (make_codec) and the CUDA kernels are tested against; it is not meant to be fast.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <span>

#include "statepool/kernels/layout.hpp"

namespace statepool::kernels::reference {

/// Bytes of one encoded head (same value as head_bytes_for in format.hpp). Throws
/// std::invalid_argument for an unknown codec or an invalid group size.
[[nodiscard]] std::size_t head_bytes(CodecSpec spec, std::uint32_t key_dim,
                                     std::uint32_t value_dim);

/// Encodes one row-major key_dim x value_dim head. `dst.size()` must equal head_bytes();
/// every byte of `dst` is written. Throws std::invalid_argument on wrong sizes.
void encode_head(CodecSpec spec, std::uint32_t key_dim, std::uint32_t value_dim,
                 std::span<const float> src, std::span<std::byte> dst);

/// Decodes one head written by encode_head.
void decode_head(CodecSpec spec, std::uint32_t key_dim, std::uint32_t value_dim,
                 std::span<const std::byte> src, std::span<float> dst);

}  // namespace statepool::kernels::reference
