#pragma once
// The byte format of one STEPQuant or DSQ head, as formulas (host C++ and CUDA), and the
// per-value reconstruction shared by the fit (fit.hpp), the CPU codecs and any future
// kernel. docs/codecs.md describes the same format in prose.
//
// K = key_dim, V = value_dim, b = a row's width, L_b = level_max(b), packed(n, b) =
// packed_bytes(n, b) of packing.hpp (quads of four codes u, little-endian), every head
// zero-padded to a multiple of 4 bytes. A b-bit unit's level z is an integer: b = 4, 6, 8
// store the 2^b - 1 levels |z| <= 2^(b-1) - 1 as u = z + L_b; b = 2 stores the four levels
// {-3, -1, 1, 3} as u = (z + 3) / 2 (format 2; format 1 stored ternary {-1, 0, 1}):
//
//   GDN head, b in {2,4,6,8}   fp16 r[K], fp16 c[V], packed(K*V, b)
//   GDN head, pivot (16)       fp16 x[K*V]
//   KDA head                   fp16 r[K], fp16 c[V], then per row i in order:
//                              packed(V, b_i) for b_i in {2,4,6,8}, or fp16 x[V] (pivot)
//   temporal_only, GDN         fp16 s[K], packed(K*V, b); a pivot head as above
//   temporal_only, KDA         fp16 s[K], then per row packed(V, b_i) or fp16 x[V]
//   dsq4 / dsq6 (any arch)     fp16 r[K], fp16 c[V], packed(K*V, b), b = 4 / 6
//
// Scales of pivot rows (and every column scale of a head whose rows are all pivots) are
// stored as zero.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>

#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels::stepquant {

/// The STEPQuant page format this build writes and reads: 2 since 2026-12-05 (the binary32
/// fit of fit_math.hpp and four-level 2-bit units). Format 1 pages differ only in their
/// 2-bit units (ternary levels); plans, page files and snapshot values name the format.
inline constexpr std::uint32_t kPageFormat = 2;

/// Width value that marks a pivot unit, stored as fp16 values.
inline constexpr std::uint8_t kPivotWidth = 16;
/// Width of the shared column grid of KDA heads: a b-bit row's codes are multiplied by
/// 2^(kGridBits - b).
inline constexpr std::uint32_t kGridBits = 8;

/// A code width a unit may have: 2, 4, 6, 8 or kPivotWidth.
STATEPOOL_HD constexpr bool is_stored_width(std::uint32_t bits) noexcept {
  return is_supported_code_bits(bits) || bits == kPivotWidth;
}

/// L_b: the largest level of a b-bit unit (3 for the four-level 2-bit unit, else
/// 2^(b-1) - 1).
STATEPOOL_HD constexpr std::uint32_t level_max(std::uint32_t bits) noexcept {
  return bits == 2 ? 3u : code_qmax(bits);
}

/// log2 of the step between a b-bit unit's levels: 1 for the four-level 2-bit unit (levels
/// 2 apart), else 0.
STATEPOOL_HD constexpr std::uint32_t level_shift(std::uint32_t bits) noexcept {
  return bits == 2 ? 1u : 0u;
}

/// Level z of the stored code u of a b-bit unit: (u << shift_b) - L_b (2u - 3 at 2 bits,
/// u - L_b otherwise).
STATEPOOL_HD constexpr std::int32_t unit_level(std::uint32_t u, std::uint32_t bits) noexcept {
  return static_cast<std::int32_t>(u << level_shift(bits)) -
         static_cast<std::int32_t>(level_max(bits));
}

/// Stored code u of level z of a b-bit unit, (z + L_b) >> shift_b: the inverse of
/// unit_level.
STATEPOOL_HD constexpr std::uint32_t unit_code(std::int32_t z, std::uint32_t bits) noexcept {
  return static_cast<std::uint32_t>(z + static_cast<std::int32_t>(level_max(bits))) >>
         level_shift(bits);
}

/// g_b: the factor that puts a b-bit row's levels on the 8-bit column grid of KDA heads,
/// the largest power of two with L_b g_b <= 127: 2^(8-b) for b = 4, 6, 8, and 32 for the
/// four-level 2-bit unit (3 * 64 would not fit).
STATEPOOL_HD constexpr std::uint32_t grid_factor(std::uint32_t bits) noexcept {
  return bits == 2 ? 32u : 1u << (kGridBits - bits);
}

/// Largest grid level of a b-bit row on the 8-bit grid: L_b g_b (127, 124, 112, 96 for
/// b = 8, 6, 4, 2).
STATEPOOL_HD constexpr std::uint32_t grid_qmax(std::uint32_t bits) noexcept {
  return level_max(bits) * grid_factor(bits);
}

/// Bytes of one KDA row: packed(V, b), or 2V for a pivot row.
STATEPOOL_HD constexpr std::size_t row_bytes(std::uint32_t value_dim, std::uint32_t bits) noexcept {
  return bits == kPivotWidth ? 2u * std::size_t{value_dim} : packed_bytes(value_dim, bits);
}

/// Bytes of a GDN head at width `bits` (2, 4, 6, 8 or kPivotWidth), full or spatial_only.
STATEPOOL_HD constexpr std::size_t gdn_head_bytes(std::uint32_t key_dim, std::uint32_t value_dim,
                                                  std::uint32_t bits) noexcept {
  const std::size_t n = std::size_t{key_dim} * value_dim;
  if (bits == kPivotWidth) {
    return round_up4(2u * n);
  }
  return round_up4(2u * std::size_t{key_dim} + 2u * std::size_t{value_dim} + packed_bytes(n, bits));
}

/// Bytes of a GDN head of the temporal_only variant.
STATEPOOL_HD constexpr std::size_t gdn_absmax_head_bytes(std::uint32_t key_dim,
                                                         std::uint32_t value_dim,
                                                         std::uint32_t bits) noexcept {
  const std::size_t n = std::size_t{key_dim} * value_dim;
  return bits == kPivotWidth ? round_up4(2u * n)
                             : round_up4(2u * std::size_t{key_dim} + packed_bytes(n, bits));
}

/// Bytes of a KDA head with row widths widths[0..key_dim) (full or spatial_only).
STATEPOOL_HD constexpr std::size_t kda_head_bytes(std::uint32_t key_dim, std::uint32_t value_dim,
                                                  const std::uint8_t* widths) noexcept {
  std::size_t bytes = 2u * std::size_t{key_dim} + 2u * std::size_t{value_dim};
  for (std::uint32_t i = 0; i < key_dim; ++i) {
    bytes += row_bytes(value_dim, widths[i]);
  }
  return round_up4(bytes);
}

/// Bytes of a KDA head of the temporal_only variant.
STATEPOOL_HD constexpr std::size_t kda_absmax_head_bytes(std::uint32_t key_dim,
                                                         std::uint32_t value_dim,
                                                         const std::uint8_t* widths) noexcept {
  std::size_t bytes = 2u * std::size_t{key_dim};
  for (std::uint32_t i = 0; i < key_dim; ++i) {
    bytes += row_bytes(value_dim, widths[i]);
  }
  return round_up4(bytes);
}

/// Bytes of a dsq4 / dsq6 head (bits 4 / 6).
STATEPOOL_HD constexpr std::size_t dsq_head_bytes(std::uint32_t key_dim, std::uint32_t value_dim,
                                                  std::uint32_t bits) noexcept {
  return dsq_head_bytes_for(key_dim, value_dim, bits);  // = gdn_head_bytes at 4/6 bits
}

/// Reconstruction of a dual-axis level: (r * c) * z, where z is the grid level (KDA: the
/// row's level times g_b). r * c of two fp16 values is exact in binary32, so this is
/// the correctly rounded value of the exact product r c z. A NaN result is the quiet NaN
/// 0x7FC00000: when r and c are both NaN (hostile page bytes), which payload a product
/// keeps depends on the order the compiler gives the operands, so the bytes of vector
/// and scalar code, CPU and device, would otherwise differ.
STATEPOOL_HD inline float dual_axis_value(float r, float c, std::int32_t z) noexcept {
  const float v = (r * c) * static_cast<float>(z);
  return bits_float(select_u32(v == v, float_bits(v), 0x7FC00000u));
}

static_assert(gdn_head_bytes(128, 128, 6) == 12800);  // 256 + 256 + 12,288 (STEPQUANT.md)
static_assert(gdn_head_bytes(128, 128, 4) == 8704);   // 256 + 256 + 8,192
static_assert(gdn_head_bytes(128, 128, 8) == 16896);  // 256 + 256 + 16,384
static_assert(gdn_head_bytes(128, 128, 2) == 4608);   // 256 + 256 + 4,096
static_assert(gdn_head_bytes(128, 128, kPivotWidth) == 32768);
static_assert(dsq_head_bytes(7, 5, 6) == gdn_head_bytes(7, 5, 6));
static_assert(grid_qmax(8) == 127 && grid_qmax(6) == 124 && grid_qmax(4) == 112 &&
              grid_qmax(2) == 96);
static_assert(unit_level(0, 2) == -3 && unit_level(3, 2) == 3 && unit_code(-1, 2) == 1 &&
              unit_code(1, 2) == 2 && unit_level(0, 6) == -31 && unit_code(31, 6) == 62);

}  // namespace statepool::kernels::stepquant
