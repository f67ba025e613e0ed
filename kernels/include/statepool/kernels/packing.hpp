#pragma once
// Bit packing of quantization codes, shared by the CPU codecs and the CUDA kernels.
//
// A b-bit code (b in {2, 4, 6, 8}) holds a signed value z in [-qmax, qmax],
// qmax = 2^(b-1) - 1, stored unsigned as u = z + qmax (so u <= 2^b - 2).
// Codes go in "quads" of four consecutive codes: the quad is the little-endian word
//     W = u0 | u1 << b | u2 << 2b | u3 << 3b
// of 4b bits, stored as its b/2 bytes, lowest byte first. That is exactly:
//   8-bit: one code per byte;
//   6-bit: four codes in three bytes (24-bit word u0 | u1<<6 | u2<<12 | u3<<18);
//   4-bit: two codes per byte, low nibble first;
//   2-bit: four codes per byte, lowest bits first.
// A run of `count` codes takes packed_bytes(count, b) bytes: ceil(count * b / 8) for
// b = 2, 4, 8 (the run ends at the last byte that holds a code), and 3 * ceil(count / 4)
// for b = 6 (6-bit runs always end on a whole 3-byte quad). The unused code slots of a
// final partial quad are zero bits. A code index that is a multiple of 4 always starts
// on a byte boundary, so groups whose size is a multiple of 4 pack independently.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {

/// True for the code widths the packing supports.
STATEPOOL_HD constexpr bool is_supported_code_bits(std::uint32_t bits) noexcept {
  return bits == 2 || bits == 4 || bits == 6 || bits == 8;
}

/// Largest code magnitude of a symmetric b-bit code: 2^(b-1) - 1.
STATEPOOL_HD constexpr std::uint32_t code_qmax(std::uint32_t bits) noexcept {
  return (1u << (bits - 1u)) - 1u;
}

/// Bytes of one quad (four codes) at width `bits`.
STATEPOOL_HD constexpr std::uint32_t quad_bytes(std::uint32_t bits) noexcept {
  return bits / 2u;
}

/// Bytes taken by `count` packed codes of width `bits`.
STATEPOOL_HD constexpr std::size_t packed_bytes(std::size_t count, std::uint32_t bits) noexcept {
  return bits == 6 ? 3u * ((count + 3u) / 4u) : (count * bits + 7u) / 8u;
}

/// Packs one quad. Codes are masked to `Bits` bits.
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack_quad(std::uint32_t u0, std::uint32_t u1, std::uint32_t u2,
                                   std::uint32_t u3, std::uint8_t* dst) noexcept {
  static_assert(is_supported_code_bits(Bits));
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  const std::uint32_t word = (u0 & mask) | ((u1 & mask) << Bits) | ((u2 & mask) << (2u * Bits)) |
                             ((u3 & mask) << (3u * Bits));
  for (std::uint32_t i = 0; i < Bits / 2u; ++i) {
    dst[i] = static_cast<std::uint8_t>(word >> (8u * i));
  }
}

/// Unpacks one quad into u[0..3].
template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack_quad(const std::uint8_t* src, std::uint32_t* u) noexcept {
  static_assert(is_supported_code_bits(Bits));
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  std::uint32_t word = 0;
  for (std::uint32_t i = 0; i < Bits / 2u; ++i) {
    word |= static_cast<std::uint32_t>(src[i]) << (8u * i);
  }
  u[0] = word & mask;
  u[1] = (word >> Bits) & mask;
  u[2] = (word >> (2u * Bits)) & mask;
  u[3] = (word >> (3u * Bits)) & mask;
}

/// Packs the first `rest` (1..3) codes of a final quad; the missing codes are zero bits.
/// Writes exactly packed_bytes(rest, Bits) bytes.
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack_partial_quad(const std::uint8_t* u, std::size_t rest,
                                           std::uint8_t* dst) noexcept {
  std::uint8_t bytes[4];
  pack_quad<Bits>(u[0], rest > 1 ? u[1] : 0u, rest > 2 ? u[2] : 0u, 0u, bytes);
  const std::size_t n = packed_bytes(rest, Bits);
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = bytes[i];
  }
}

/// Unpacks a final quad of `rest` (1..3) codes, reading only packed_bytes(rest, Bits)
/// bytes; u[rest..3] are unspecified.
template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack_partial_quad(const std::uint8_t* src, std::size_t rest,
                                             std::uint32_t* u) noexcept {
  std::uint8_t bytes[4] = {0, 0, 0, 0};
  const std::size_t n = packed_bytes(rest, Bits);
  for (std::size_t i = 0; i < n; ++i) {
    bytes[i] = src[i];
  }
  unpack_quad<Bits>(bytes, u);
}

/// Little-endian 32-bit load / store through bytes (compilers emit one move).
STATEPOOL_HD inline std::uint32_t load_le32(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
STATEPOOL_HD inline void store_le32(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v >> 16);
  p[3] = static_cast<std::uint8_t>(v >> 24);
}

/// Four byte-sized codes (u0 in the lowest byte of `bytes`) -> the quad word.
template <std::uint32_t Bits>
STATEPOOL_HD constexpr std::uint32_t compress_quad(std::uint32_t bytes) noexcept {
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  return (bytes & mask) | ((bytes >> (8u - Bits)) & (mask << Bits)) |
         ((bytes >> (16u - 2u * Bits)) & (mask << (2u * Bits))) |
         ((bytes >> (24u - 3u * Bits)) & (mask << (3u * Bits)));
}

/// The quad word -> four byte-sized codes (u0 in the lowest byte).
template <std::uint32_t Bits>
STATEPOOL_HD constexpr std::uint32_t expand_quad(std::uint32_t word) noexcept {
  constexpr std::uint32_t mask = (1u << Bits) - 1u;
  return (word & mask) | ((word << (8u - Bits)) & (mask << 8u)) |
         ((word << (16u - 2u * Bits)) & (mask << 16u)) |
         ((word << (24u - 3u * Bits)) & (mask << 24u));
}

/// Packs `count` codes u[0..count) into packed_bytes(count, Bits) bytes at dst. Codes are
/// masked to `Bits` bits. Writes nothing past the run.
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack_codes(const std::uint8_t* u, std::size_t count,
                                    std::uint8_t* dst) noexcept {
  static_assert(is_supported_code_bits(Bits));
  const std::size_t full = count / 4u;
  if constexpr (Bits == 6) {
    // 4 codes -> 3 bytes: store 4 bytes and let the next quad overwrite the 4th, except
    // for the last full quad, which must not write past its 3 bytes.
    for (std::size_t q = 0; q + 1 < full; ++q) {
      store_le32(dst + 3 * q, compress_quad<6>(load_le32(u + 4 * q)));
    }
    if (full != 0) {
      const std::uint32_t w = compress_quad<6>(load_le32(u + 4 * (full - 1)));
      std::uint8_t* d = dst + 3 * (full - 1);
      d[0] = static_cast<std::uint8_t>(w);
      d[1] = static_cast<std::uint8_t>(w >> 8);
      d[2] = static_cast<std::uint8_t>(w >> 16);
    }
  } else {
    for (std::size_t q = 0; q < full; ++q) {
      const std::uint32_t w = compress_quad<Bits>(load_le32(u + 4 * q));
      for (std::uint32_t i = 0; i < Bits / 2u; ++i) {
        dst[q * (Bits / 2u) + i] = static_cast<std::uint8_t>(w >> (8u * i));
      }
    }
  }
  const std::size_t rest = count - 4u * full;
  if (rest != 0) {
    pack_partial_quad<Bits>(u + 4 * full, rest, dst + full * (Bits / 2u));
  }
}

/// Unpacks `count` codes from src (packed_bytes(count, Bits) bytes, nothing read past
/// them) into u[0..count).
template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack_codes(const std::uint8_t* src, std::size_t count,
                                      std::uint8_t* u) noexcept {
  static_assert(is_supported_code_bits(Bits));
  const std::size_t full = count / 4u;
  for (std::size_t q = 0; q < full; ++q) {
    const std::uint8_t* s = src + q * (Bits / 2u);
    std::uint32_t w = 0;
    if (Bits == 6 && q + 1 < full) {
      w = load_le32(s);  // the 4th byte belongs to the next quad; expand ignores it
    } else {
      for (std::uint32_t i = 0; i < Bits / 2u; ++i) {
        w |= static_cast<std::uint32_t>(s[i]) << (8u * i);
      }
    }
    store_le32(u + 4 * q, expand_quad<Bits>(w));
  }
  const std::size_t rest = count - 4u * full;
  if (rest != 0) {
    std::uint32_t quad[4];
    unpack_partial_quad<Bits>(src + full * (Bits / 2u), rest, quad);
    for (std::size_t k = 0; k < rest; ++k) {
      u[4 * full + k] = static_cast<std::uint8_t>(quad[k]);
    }
  }
}

/// Random access: the code at `index` of a packed run (reference / debugging path).
/// Reads only the bytes that hold bits of that code.
STATEPOOL_HD inline std::uint32_t get_code(const std::uint8_t* src, std::size_t index,
                                           std::uint32_t bits) noexcept {
  const std::size_t first_bit = index * bits;
  const std::size_t first = first_bit / 8u;
  const std::size_t last = (first_bit + bits - 1u) / 8u;
  std::uint32_t word = 0;
  for (std::size_t i = first; i <= last; ++i) {
    word |= static_cast<std::uint32_t>(src[i]) << (8u * static_cast<std::uint32_t>(i - first));
  }
  return (word >> static_cast<std::uint32_t>(first_bit % 8u)) & ((1u << bits) - 1u);
}

/// Random access: overwrites the code at `index` (read-modify-write of the bytes that
/// hold it; other codes are unchanged).
STATEPOOL_HD inline void set_code(std::uint8_t* dst, std::size_t index, std::uint32_t bits,
                                  std::uint32_t code) noexcept {
  const std::size_t first_bit = index * bits;
  const std::size_t first = first_bit / 8u;
  const std::size_t last = (first_bit + bits - 1u) / 8u;
  const std::uint32_t shift = static_cast<std::uint32_t>(first_bit % 8u);
  std::uint32_t word = 0;
  for (std::size_t i = first; i <= last; ++i) {
    word |= static_cast<std::uint32_t>(dst[i]) << (8u * static_cast<std::uint32_t>(i - first));
  }
  const std::uint32_t mask = ((1u << bits) - 1u) << shift;
  word = (word & ~mask) | ((code << shift) & mask);
  for (std::size_t i = first; i <= last; ++i) {
    dst[i] = static_cast<std::uint8_t>(word >> (8u * static_cast<std::uint32_t>(i - first)));
  }
}

}  // namespace statepool::kernels

namespace statepool::kernels {

// --- whole runs on the host ------------------------------------------------------------
// The CPU codecs pack and unpack through these (kernels/cpu/packing.cpp): the same bytes
// and codes as pack_codes<bits> / unpack_codes<bits>, with AVX2 loops for the 4- and
// 6-bit widths where the CPU has AVX2 (docs/codecs.md). Like the templates, they write
// nothing past the run and read nothing past it. `bits` is 2, 4, 6 or 8 (anything else
// packs as 8).

void pack_run(std::uint32_t bits, const std::uint8_t* u, std::size_t count,
              std::uint8_t* dst) noexcept;
void unpack_run(std::uint32_t bits, const std::uint8_t* src, std::size_t count,
                std::uint8_t* u) noexcept;

}  // namespace statepool::kernels
