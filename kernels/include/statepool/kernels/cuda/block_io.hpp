#pragma once
// What the block bodies of the page kernels (block_codec.hpp) share: the staged values'
// types, page bytes (fp16 halves, 128-bit words, zeroing and copying), quads and 16-code
// chunks of packed codes (packing.hpp), and the accessors and cursors a rank walks a head
// with. Every function runs on the GPU and the host alike (STATEPOOL_HD); on the host a
// 128-bit access is a memcpy of the same little-endian bytes.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>
#include <cstring>

#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels::cuda {

/// The codec families, each with its own kernels (codec_kernels.cu, step_kernels.cu): a
/// kernel compiled for one family holds none of the others' code, so its registers are
/// what that family needs (one kernel for all needed the most any codec needs), and
/// scripts/kernel-report sees each family's loops apart. `stepquant`: heads of one width
/// (STEPQuant GDN heads, DSQ on either arch); `stepquant_rows`: STEPQuant KDA heads, whose
/// rows have their own widths. `any` dispatches at run time (the host emulation may use
/// either).
enum class CodecFamily : std::uint8_t { any, floats, uniform, stepquant, stepquant_rows };

/// The family of `f`'s codec and arch.
STATEPOOL_HD inline CodecFamily codec_family(const PageFormatView& f) noexcept {
  if (is_float_codec(f.codec)) return CodecFamily::floats;
  if (is_uniform_codec(f.codec)) return CodecFamily::uniform;
  if (f.arch == Arch::kda && !is_dsq_codec(f.codec)) return CodecFamily::stepquant_rows;
  return CodecFamily::stepquant;
}

STATEPOOL_HD constexpr bool is_stepquant_family(CodecFamily family) noexcept {
  return family == CodecFamily::stepquant || family == CodecFamily::stepquant_rows;
}

// ---------------------------------------------------------------------------------------
// Staged values (row-major [head][K][V] from the start of the staged state)

// Each kind of staged values says where value i is (address) and how wide an element is
// (kBytes), for the vector paths below.
struct StagedF32 {
  static constexpr std::uint32_t kBytes = 4;
  STATEPOOL_HD static const void* address(const void* base, std::uint64_t i) noexcept {
    return static_cast<const float*>(base) + i;
  }
  STATEPOOL_HD static void* address(void* base, std::uint64_t i) noexcept {
    return static_cast<float*>(base) + i;
  }
  STATEPOOL_HD static float load(const void* base, std::uint64_t i) noexcept {
    return static_cast<const float*>(base)[i];
  }
  STATEPOOL_HD static void store(void* base, std::uint64_t i, float v) noexcept {
    static_cast<float*>(base)[i] = v;
  }
  STATEPOOL_HD static bool non_finite(const void* base, std::uint64_t i) noexcept {
    return is_non_finite_bits(float_bits(load(base, i)));
  }
};

struct StagedBf16 {
  static constexpr std::uint32_t kBytes = 2;
  STATEPOOL_HD static const void* address(const void* base, std::uint64_t i) noexcept {
    return static_cast<const std::uint16_t*>(base) + i;
  }
  STATEPOOL_HD static void* address(void* base, std::uint64_t i) noexcept {
    return static_cast<std::uint16_t*>(base) + i;
  }
  STATEPOOL_HD static float load(const void* base, std::uint64_t i) noexcept {
    return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  STATEPOOL_HD static void store(void* base, std::uint64_t i, float v) noexcept {
    static_cast<std::uint16_t*>(base)[i] = float_to_bf16_bits(v);
  }
  STATEPOOL_HD static bool non_finite(const void* base, std::uint64_t i) noexcept {
    return is_non_finite_bf16(static_cast<const std::uint16_t*>(base)[i]);
  }
};

namespace detail {

// ---------------------------------------------------------------------------------------
// Page bytes. fp16 slots of KDA rows can start at odd offsets (a 6-bit row of 5 values
// is 6 bytes, a 4-bit row of 5 values 3), so halves go through bytes.

STATEPOOL_HD inline void store_half(std::uint8_t* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}

STATEPOOL_HD inline std::uint16_t load_half(const std::uint8_t* p) noexcept {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

STATEPOOL_HD inline float load_half_float(const std::uint8_t* p) noexcept {
  return half_bits_to_float(load_half(p));
}

// Sixteen bytes at a 16-byte aligned address, in one access on the GPU (a 128-bit load or
// store); on the host through memcpy (the same little-endian bytes).
struct Words4 {
  std::uint32_t w[4];
};

STATEPOOL_HD inline bool aligned16(const void* p) noexcept {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

STATEPOOL_HD inline Words4 load16(const void* p) noexcept {
#if defined(__CUDA_ARCH__)
  const uint4 v = *static_cast<const uint4*>(p);
  return {{v.x, v.y, v.z, v.w}};
#else
  Words4 v;
  std::memcpy(v.w, p, 16);
  return v;
#endif
}

STATEPOOL_HD inline void store16(void* p, const Words4& v) noexcept {
#if defined(__CUDA_ARCH__)
  *static_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
#else
  std::memcpy(p, v.w, 16);
#endif
}

// Eight staged values from value i (16-byte aligned: the caller checked), as floats.
template <class Staged>
STATEPOOL_HD inline void load8(const void* base, std::uint64_t i, float* v) noexcept {
  const auto* p = static_cast<const std::uint8_t*>(Staged::address(base, i));
  if constexpr (Staged::kBytes == 4) {
    const Words4 a = load16(p);
    const Words4 b = load16(p + 16);
    for (std::uint32_t k = 0; k < 4; ++k) {
      v[k] = bits_float(a.w[k]);
      v[4 + k] = bits_float(b.w[k]);
    }
  } else {
    const Words4 a = load16(p);
    for (std::uint32_t k = 0; k < 4; ++k) {
      v[2 * k] = bf16_bits_to_float(static_cast<std::uint16_t>(a.w[k]));
      v[2 * k + 1] = bf16_bits_to_float(static_cast<std::uint16_t>(a.w[k] >> 16));
    }
  }
}

// Eight values stored as Staged::store stores them, from value i (16-byte aligned).
template <class Staged>
STATEPOOL_HD inline void store8(void* base, std::uint64_t i, const float* v) noexcept {
  auto* p = static_cast<std::uint8_t*>(Staged::address(base, i));
  if constexpr (Staged::kBytes == 4) {
    Words4 a;
    Words4 b;
    for (std::uint32_t k = 0; k < 4; ++k) {
      a.w[k] = float_bits(v[k]);
      b.w[k] = float_bits(v[4 + k]);
    }
    store16(p, a);
    store16(p + 16, b);
  } else {
    Words4 a;
    for (std::uint32_t k = 0; k < 4; ++k) {
      a.w[k] = std::uint32_t{float_to_bf16_bits(v[2 * k])} |
               (std::uint32_t{float_to_bf16_bits(v[2 * k + 1])} << 16);
    }
    store16(p, a);
  }
}

template <class Team>
STATEPOOL_HD void zero_bytes(const Team& t, std::uint8_t* p, std::uint64_t begin,
                             std::uint64_t end) noexcept {
  // kernel-report: padding 1
  for (std::uint64_t i = begin + t.rank(); i < end; i += t.size()) {
    p[i] = 0;
  }
}

// n <= kConvChunkBytes bytes of the conv state: 16 per rank where both sides start
// 16-byte aligned (the planned layouts: the staged conv part follows K V values per head,
// the page's follows heads of multiples of 16 bytes), then the last n % 16 one per rank;
// otherwise byte by byte.
template <class Team>
STATEPOOL_HD void copy_bytes(const Team& t, const std::uint8_t* src, std::uint8_t* dst,
                             std::uint32_t n) noexcept {
  std::uint32_t done = 0;
  if (aligned16(src) && aligned16(dst)) {
    done = n / 16 * 16;
    // kernel-report: conv-copy 16 io
    for (std::uint32_t i = 16 * t.rank(); i < done; i += 16 * t.size()) {
      store16(dst + i, load16(src + i));
    }
  }
  // kernel-report: conv-bytes 1 fallback
  for (std::uint32_t i = done + t.rank(); i < n; i += t.size()) {
    dst[i] = src[i];
  }
}

// One quad (rest = 1..4 codes u[0..rest)) at a runtime width: exactly
// packed_bytes(rest, bits) bytes are written (a full quad: bits / 2).
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack_rest(const std::uint8_t* u, std::uint32_t rest,
                                   std::uint8_t* dst) noexcept {
  if (rest == 4) {
    pack_quad<Bits>(u[0], u[1], u[2], u[3], dst);
  } else {
    pack_partial_quad<Bits>(u, rest, dst);
  }
}

STATEPOOL_HD inline void pack_quad_at(std::uint32_t bits, const std::uint8_t* u, std::uint32_t rest,
                                      std::uint8_t* dst) noexcept {
  switch (bits) {
    case 2: pack_rest<2>(u, rest, dst); break;
    case 4: pack_rest<4>(u, rest, dst); break;
    case 6: pack_rest<6>(u, rest, dst); break;
    default: pack_rest<8>(u, rest, dst); break;
  }
}

template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack_rest(const std::uint8_t* src, std::uint32_t rest,
                                     std::uint32_t* u) noexcept {
  if (rest == 4) {
    unpack_quad<Bits>(src, u);
  } else {
    unpack_partial_quad<Bits>(src, rest, u);
  }
}

STATEPOOL_HD inline void unpack_quad_at(std::uint32_t bits, const std::uint8_t* src,
                                        std::uint32_t rest, std::uint32_t* u) noexcept {
  switch (bits) {
    case 2: unpack_rest<2>(src, rest, u); break;
    case 4: unpack_rest<4>(src, rest, u); break;
    case 6: unpack_rest<6>(src, rest, u); break;
    default: unpack_rest<8>(src, rest, u); break;
  }
}

// Values of one head of the staged state.
template <class Staged>
struct HeadValues {
  const void* base;
  std::uint64_t first;  // index of the head's value (0, 0)
  std::uint32_t value_dim;

  STATEPOOL_HD float at(std::uint32_t i, std::uint32_t j) const noexcept {
    return Staged::load(base, first + std::uint64_t{i} * value_dim + j);
  }
  STATEPOOL_HD float flat(std::uint64_t index) const noexcept {
    return Staged::load(base, first + index);
  }
};

// x[j] of `count` values starting at a flat index: the Row of fit_math.hpp's sums.
template <class Staged>
struct StagedRun {
  const void* base;
  std::uint64_t first;

  STATEPOOL_HD float operator[](std::uint32_t j) const noexcept {
    return Staged::load(base, first + j);
  }
};

template <class Staged>
struct HeadOut {
  void* base;
  std::uint64_t first;

  STATEPOOL_HD void store(std::uint64_t index, float v) const noexcept {
    Staged::store(base, first + index, v);
  }
};

// (row, column) of the flat indices first, first + stride, ... of a row-major grid of
// `width` columns, kept without a division per step: first and stride are divided once.
// A rank walks the values of its quads (first 4 rank, stride 4 size, width V), its
// (row, quad) items (first rank, stride size, width quads per row) or the groups of its
// quads (first 4 rank, stride 4 size, width group size) with it.
struct GridCursor {
  std::uint32_t i = 0;  // row of the current index
  std::uint32_t j = 0;  // its column
  std::uint32_t di = 0;
  std::uint32_t dj = 0;
  std::uint32_t width = 1;

  STATEPOOL_HD GridCursor(std::uint32_t first, std::uint32_t stride, std::uint32_t w) noexcept
      : i(first / w), j(first % w), di(stride / w), dj(stride % w), width(w) {}
  /// Row and column of the current index + k (k <= 3).
  STATEPOOL_HD void at(std::uint32_t k, std::uint32_t& row, std::uint32_t& col) const noexcept {
    row = i;
    col = j + k;
    while (col >= width) {  // at most 3 times (width < 4), else at most once
      col -= width;
      ++row;
    }
  }
  STATEPOOL_HD void next() noexcept {
    i += di;
    j += dj;
    if (j >= width) {
      j -= width;
      ++i;
    }
  }
};

// Sixteen codes of `Bits` bits into Bits / 2 little-endian words (unpack16's inverse).
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack16(const std::uint32_t* u, std::uint32_t* w) noexcept {
  constexpr std::uint32_t kWords = Bits / 2;
  for (std::uint32_t m = 0; m < kWords; ++m) {
    w[m] = 0;
  }
  STATEPOOL_UNROLL
  for (std::uint32_t n = 0; n < 16; ++n) {
    const std::uint32_t bit = n * Bits;
    const std::uint32_t word = bit / 32;
    const std::uint32_t shift = bit % 32;
    w[word] |= u[n] << shift;
    if (shift + Bits > 32) w[word + 1] |= u[n] >> (32 - shift);
  }
}

// Sixteen consecutive codes of `Bits` bits from Bits / 2 little-endian words: code n is
// bits [n Bits, n Bits + Bits) of the words' concatenation (the packing of packing.hpp).
template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack16(const std::uint32_t* w, std::uint32_t* u) noexcept {
  constexpr std::uint32_t kWords = Bits / 2;
  constexpr std::uint32_t kMask = (1u << Bits) - 1u;
  STATEPOOL_UNROLL
  for (std::uint32_t n = 0; n < 16; ++n) {
    const std::uint32_t bit = n * Bits;
    const std::uint32_t word = bit / 32;
    const std::uint64_t pair =
        w[word] | (word + 1 < kWords ? std::uint64_t{w[word + 1]} << 32 : std::uint64_t{0});
    u[n] = static_cast<std::uint32_t>(pair >> (bit % 32)) & kMask;
  }
}

}  // namespace detail

}  // namespace statepool::kernels::cuda
