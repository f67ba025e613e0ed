#pragma once
// The work of one block of the page kernels, written once for a "team" of threads so that
// the GPU and the host run the same code: kernels/cuda/codec_kernels.cu instantiates it
// with a CUDA thread block, host_team.hpp with one host thread or several host threads
// and a barrier (the CPU tests compare those runs with PageCodec, byte for byte). This
// header needs no CUDA: under g++ STATEPOOL_HD is empty.
//
// A Team is any type with
//   unsigned rank() const, unsigned size() const    this thread's rank in [0, size())
//   void sync() const                               barrier of the team's ranks (every rank
//                                                   calls it equally often: the calls below
//                                                   are never inside rank-dependent code)
//   void atomic_min(unsigned long long* p, unsigned long long v) const
//                                                   *p = min(*p, v) atomically, across teams
// Every loop below hands item k to rank k mod size(), so any team size computes the same
// bytes; nothing is shared between ranks but the page itself (a rank writes scales into
// the page, sync(), then every rank reads them back: the page is the block's scratch, so
// no head is too large for shared memory).
//
// Grid: one block per (slot, x) with x in [0, page_blocks(view)): x < head_count encodes
// or decodes head x; the others copy one kConvChunkBytes piece of the conv state. Within
// a head (K rows, V columns, n = K V values, page order = row-major):
//   float codecs      rank per 8 values (128-bit accesses) where the head is aligned,
//                     else rank per value
//   int4/6/8          rank per group (absmax, fp16 scale), sync, rank per quad (codes)
//   dual axis (GDN at 2/4/6/8 bits, KDA, dsq4/6)
//                     rank per row (r_i from the lane sum of fit_math.hpp; e_i and a_i
//                     into the block scratch), sync, rank per column (c_j: max over rows,
//                     then the refit sums over rows in row order, binary32; b_j into the
//                     scratch), sync, codes: rank per 16 values of a row (run16_fits,
//                     rows16_fits), else rank per quad
//   temporal_only     rank per row (absmax scale, its reciprocal into the scratch), sync,
//                     codes as above
//   pivot GDN head    rank per value (fp16)
//   decode            float codecs as encode; STEPQuant / DSQ: the scales into the block
//                     scratch, sync, rank per 16 codes of a row where the head allows,
//                     sync; else (and int4/6/8) rank per quad; pivot heads per value
// docs/kernels.md has the design, the budgets and kernel-report's numbers.
// A quad is four consecutive codes of one packed run, which starts on a byte boundary
// (packing.hpp): GDN and dsq heads pack all K V codes as one run, KDA heads every row as
// its own run at its byte offset (PageFormatView::row_offsets), a pivot row as V fp16
// values. Every byte of a head (scales, codes, the zero bits of a partial quad, the
// zero padding) is written by exactly one rank.
//
// Thread-safety: pure functions of their inputs; blocks of different heads or slots
// write disjoint bytes.

#include <cstdint>
#include <cstring>

#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"
#include "statepool/kernels/stepquant/fit_math.hpp"
#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::kernels::cuda {

/// first_index of a finite state, and the skip value of a slot to encode: UINT64_MAX.
inline constexpr unsigned long long kAllFinite = ~0ull;
/// Conv-state bytes copied by one block.
inline constexpr std::uint64_t kConvChunkBytes = 32 * 1024;

/// Blocks per slot of the conv-state copy.
STATEPOOL_HD inline std::uint32_t conv_blocks(const PageFormatView& f) noexcept {
  return static_cast<std::uint32_t>((f.conv_bytes + kConvChunkBytes - 1) / kConvChunkBytes);
}

/// Blocks per slot of an encode or decode: one per head, then the conv copy.
STATEPOOL_HD inline std::uint32_t page_blocks(const PageFormatView& f) noexcept {
  return f.head_count + conv_blocks(f);
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

template <class Team>
STATEPOOL_HD void copy_bytes(const Team& t, const std::uint8_t* src, std::uint8_t* dst,
                             std::uint64_t n) noexcept {
  // kernel-report: conv-copy 1 io
  for (std::uint64_t i = t.rank(); i < n; i += t.size()) {
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

// ---------------------------------------------------------------------------------------
// Float codecs

// A float head is K V values of 2 or 4 bytes from the head's start (4-byte aligned in the
// page). Vector path, when the staged head and the page head both start 16-byte aligned
// and K V is a multiple of 8 (every real model's shape): a rank per 8 values, 128-bit
// loads and stores on both sides. Otherwise a rank per value with element-wide accesses.

// 8 values into a float page's bytes at `out` (16-byte aligned).
STATEPOOL_HD inline void store_float8(CodecId codec, std::uint8_t* out, const float* v) noexcept {
  if (codec == CodecId::fp32) {
    Words4 a;
    Words4 b;
    for (std::uint32_t k = 0; k < 4; ++k) {
      a.w[k] = float_bits(v[k]);
      b.w[k] = float_bits(v[4 + k]);
    }
    store16(out, a);
    store16(out + 16, b);
    return;
  }
  const bool bf16 = codec == CodecId::bf16;
  Words4 a;
  for (std::uint32_t k = 0; k < 4; ++k) {
    const std::uint32_t lo = bf16 ? float_to_bf16_bits(v[2 * k]) : float_to_half_bits(v[2 * k]);
    const std::uint32_t hi =
        bf16 ? float_to_bf16_bits(v[2 * k + 1]) : float_to_half_bits(v[2 * k + 1]);
    a.w[k] = lo | (hi << 16);
  }
  store16(out, a);
}

// 8 values from a float page's bytes at `in` (16-byte aligned).
STATEPOOL_HD inline void load_float8(CodecId codec, const std::uint8_t* in, float* v) noexcept {
  if (codec == CodecId::fp32) {
    const Words4 a = load16(in);
    const Words4 b = load16(in + 16);
    for (std::uint32_t k = 0; k < 4; ++k) {
      v[k] = bits_float(a.w[k]);
      v[4 + k] = bits_float(b.w[k]);
    }
    return;
  }
  const bool bf16 = codec == CodecId::bf16;
  const Words4 a = load16(in);
  for (std::uint32_t k = 0; k < 4; ++k) {
    const auto lo = static_cast<std::uint16_t>(a.w[k]);
    const auto hi = static_cast<std::uint16_t>(a.w[k] >> 16);
    v[2 * k] = bf16 ? bf16_bits_to_float(lo) : half_bits_to_float(lo);
    v[2 * k + 1] = bf16 ? bf16_bits_to_float(hi) : half_bits_to_float(hi);
  }
}

template <class Staged>
STATEPOOL_HD inline bool float_head_vectors(const PageFormatView& f, const void* base,
                                            std::uint64_t first,
                                            const std::uint8_t* page) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;
  return n % 8 == 0 && aligned16(Staged::address(base, first)) && aligned16(page);
}

template <class Staged, class Team>
STATEPOOL_HD void encode_float_head(const Team& t, const PageFormatView& f,
                                    const HeadValues<Staged>& x, std::uint8_t* out,
                                    std::uint64_t head_bytes) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;  // <= kMaxHeadDim^2 = 2^24
  const std::uint32_t width = float_codec_value_bytes(f.codec);
  if (float_head_vectors<Staged>(f, x.base, x.first, out)) {
    // kernel-report: float-encode 8 io
    for (std::uint32_t c = t.rank(); c < n / 8; c += t.size()) {
      float v[8];
      load8<Staged>(x.base, x.first + 8 * c, v);
      store_float8(f.codec, out + 8 * width * c, v);
    }
  } else {
    for (std::uint32_t i = t.rank(); i < n; i += t.size()) {
      const float v = x.flat(i);
      if (f.codec == CodecId::fp32) {
        reinterpret_cast<std::uint32_t*>(out)[i] = float_bits(v);  // 4-byte aligned head
      } else {
        reinterpret_cast<std::uint16_t*>(out)[i] =
            f.codec == CodecId::bf16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
      }
    }
  }
  zero_bytes(t, out, std::uint64_t{n} * width, head_bytes);
}

template <class Staged, class Team>
STATEPOOL_HD void decode_float_head(const Team& t, const PageFormatView& f, const std::uint8_t* in,
                                    const HeadOut<Staged>& y) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;
  const std::uint32_t width = float_codec_value_bytes(f.codec);
  if (float_head_vectors<Staged>(f, y.base, y.first, in)) {
    // kernel-report: float-decode 8 io
    for (std::uint32_t c = t.rank(); c < n / 8; c += t.size()) {
      float v[8];
      load_float8(f.codec, in + 8 * width * c, v);
      store8<Staged>(y.base, y.first + 8 * c, v);
    }
    return;
  }
  for (std::uint32_t i = t.rank(); i < n; i += t.size()) {
    float v;
    if (f.codec == CodecId::fp32) {
      v = bits_float(reinterpret_cast<const std::uint32_t*>(in)[i]);
    } else {
      const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(in)[i];
      v = f.codec == CodecId::bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
    }
    y.store(i, v);
  }
}

// ---------------------------------------------------------------------------------------
// Uniform int codecs (format.hpp): scales [groups], then one run of n codes

template <class Staged, class Team>
STATEPOOL_HD void encode_uniform_head(const Team& t, const PageFormatView& f,
                                      const HeadValues<Staged>& x, std::uint8_t* out,
                                      std::uint64_t head_bytes) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  const std::uint32_t qmax = code_qmax(bits);
  // 32-bit within a head: K V <= kMaxHeadDim^2 = 2^24.
  const std::uint32_t n = f.key_dim * f.value_dim;
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;  // one division per head
  for (std::uint32_t g = t.rank(); g < groups; g += t.size()) {
    const std::uint32_t begin = g * group;
    const std::uint32_t end = group < n - begin ? begin + group : n;
    std::uint32_t absmax = 0;
    // kernel-report: uniform-scales 1 io
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t a = abs_bits(x.flat(i));
      absmax = a > absmax ? a : absmax;
    }
    store_half(out + 2 * g, uniform_scale_bits(absmax, qmax));
  }
  std::uint8_t* codes = out + 2 * groups;
  zero_bytes(t, out, 2 * std::uint64_t{groups} + packed_bytes(n, bits), head_bytes);
  t.sync();
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);  // .i: the quad's group
  // kernel-report: uniform-encode 4 io
  for (std::uint32_t q = t.rank(); q < quads; q += t.size(), group_of.next()) {
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = n - first < 4 ? n - first : 4;
    const float s = load_half_float(out + 2 * group_of.i);  // a quad is in one group
    std::uint8_t u[4] = {0, 0, 0, 0};
    for (std::uint32_t k = 0; k < rest; ++k) {
      u[k] = static_cast<std::uint8_t>(uniform_code(x.flat(first + k), s, qmax));
    }
    pack_quad_at(bits, u, rest, codes + q * quad_bytes(bits));
  }
}

template <class Staged, class Team>
STATEPOOL_HD void decode_uniform_head(const Team& t, const PageFormatView& f,
                                      const std::uint8_t* in, const HeadOut<Staged>& y) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  const std::uint32_t qmax = code_qmax(bits);
  const std::uint32_t n = f.key_dim * f.value_dim;  // as in encode_uniform_head
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;
  const std::uint8_t* codes = in + 2 * groups;
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);
  // kernel-report: uniform-decode 4 io
  for (std::uint32_t q = t.rank(); q < quads; q += t.size(), group_of.next()) {
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = n - first < 4 ? n - first : 4;
    const float s = load_half_float(in + 2 * group_of.i);
    std::uint32_t u[4];
    unpack_quad_at(bits, codes + q * quad_bytes(bits), rest, u);
    for (std::uint32_t k = 0; k < rest; ++k) {
      y.store(first + k, uniform_value(u[k], s, qmax));
    }
  }
}

// ---------------------------------------------------------------------------------------
// STEPQuant and DSQ heads (stepquant/format.hpp, stepquant/fit.hpp)

enum class SqKind : std::uint8_t {
  pivot_head,  // GDN head of pivots: fp16 x[K V]
  dual,        // fp16 r[K], fp16 c[V], codes (GDN 2/4/6/8, KDA, dsq)
  absmax,      // fp16 s[K], codes (temporal_only)
};

// What one head of a stepquant / dsq page is: its kind, the widths and impact of its rows,
// and where its codes are.
struct SqHead {
  SqKind kind = SqKind::dual;
  bool grid8 = false;        // KDA: rows on the shared 8-bit column grid (q_i, g_i)
  std::uint32_t refits = 0;  // rounds of the refit (stepquant::refit_rounds; 0: temporal_only,
                             // no_refit, dsq)
  std::uint32_t bits = 0;    // width of every row when `widths` is null (dsq)
  const std::uint8_t* widths = nullptr;  // [K]
  const float* impact = nullptr;         // [K], null: all ones
  // KDA: byte offset of every row's run within the head; null: one run of K V codes at
  // `codes_offset` (GDN, dsq).
  const std::uint32_t* row_offsets = nullptr;
  std::uint64_t codes_offset = 0;
  std::uint64_t data_end = 0;  // end of the head's data; zero padding from here

  STATEPOOL_HD std::uint32_t width(std::uint32_t i) const noexcept {
    return widths != nullptr ? widths[i] : bits;
  }
  STATEPOOL_HD float weight(std::uint32_t i) const noexcept {
    return impact != nullptr ? impact[i] : 1.0f;
  }
};

STATEPOOL_HD inline SqHead sq_head(const PageFormatView& f, std::uint32_t head) noexcept {
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const std::uint64_t n = std::uint64_t{K} * V;
  SqHead h;
  if (is_dsq_codec(f.codec)) {
    // The GDN head layout at one width, for either arch; no impact, no refit.
    h.bits = f.codec == CodecId::dsq4 ? 4u : 6u;
    h.codes_offset = 2u * (std::uint64_t{K} + V);
    h.data_end = h.codes_offset + packed_bytes(n, h.bits);
    return h;
  }
  const std::uint64_t row0 = std::uint64_t{head} * K;
  h.widths = f.widths + row0;
  h.bits = h.widths[0];
  const bool temporal = f.variant == StepQuantVariant::temporal_only;
  if (!temporal) {
    h.impact = f.impact + row0;
  }
  const bool refit = !temporal && f.variant != StepQuantVariant::no_refit;
  if (f.arch == Arch::kda) {
    h.kind = temporal ? SqKind::absmax : SqKind::dual;
    h.grid8 = !temporal;
    stepquant::RowWidths rows;
    for (std::uint32_t i = 0; i < K; ++i) {
      rows.add(h.widths[i]);
    }
    h.refits = stepquant::refit_rounds(refit, rows);
    h.row_offsets = f.row_offsets + row0;
    h.data_end = h.row_offsets[K - 1] + stepquant::row_bytes(V, h.widths[K - 1]);
    return h;
  }
  h.widths = nullptr;  // a GDN head has one width
  if (h.bits == stepquant::kPivotWidth) {
    h.kind = SqKind::pivot_head;
    h.data_end = 2 * n;
  } else if (temporal) {
    h.kind = SqKind::absmax;
    h.codes_offset = 2u * std::uint64_t{K};
  } else {
    h.kind = SqKind::dual;
    stepquant::RowWidths rows;
    rows.add(h.bits);  // one width: the mean of K rows is the width
    h.refits = stepquant::refit_rounds(refit, rows);
    h.codes_offset = 2u * (std::uint64_t{K} + V);
  }
  if (h.kind != SqKind::pivot_head) {
    h.data_end = h.codes_offset + packed_bytes(n, h.bits);
  }
  return h;
}

// Writes every code of the head: code(i, j, bits) is the offset-binary code u of value
// (i, j) in a row of width `bits`; pivot rows of KDA heads get fp16 values.
template <class Staged, class Team, class Code>
STATEPOOL_HD void write_codes(const Team& t, const PageFormatView& f, const SqHead& h,
                              const HeadValues<Staged>& x, std::uint8_t* out,
                              const Code& code) noexcept {
  const std::uint32_t V = f.value_dim;
  if (h.row_offsets == nullptr) {
    const std::uint64_t n = std::uint64_t{f.key_dim} * V;
    const std::uint64_t quads = (n + 3) / 4;
    std::uint8_t* codes = out + h.codes_offset;
    GridCursor cursor(4 * t.rank(), 4 * t.size(), V);
    // kernel-report: fallback-codes 4 io
    for (std::uint64_t q = t.rank(); q < quads; q += t.size(), cursor.next()) {
      const std::uint64_t first = 4 * q;
      const auto rest = static_cast<std::uint32_t>(n - first < 4 ? n - first : 4);
      std::uint8_t u[4] = {0, 0, 0, 0};
      for (std::uint32_t k = 0; k < rest; ++k) {
        std::uint32_t i = 0;
        std::uint32_t j = 0;
        cursor.at(k, i, j);
        u[k] = static_cast<std::uint8_t>(code(i, j, h.bits));
      }
      pack_quad_at(h.bits, u, rest, codes + q * quad_bytes(h.bits));
    }
    return;
  }
  const std::uint32_t row_quads = (V + 3) / 4;
  const std::uint64_t items = std::uint64_t{f.key_dim} * row_quads;
  GridCursor cursor(t.rank(), t.size(), row_quads);
  // kernel-report: fallback-codes 4 io
  for (std::uint64_t item = t.rank(); item < items; item += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const std::uint32_t q = cursor.j;
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = V - first < 4 ? V - first : 4;
    const std::uint32_t bits = h.width(i);
    std::uint8_t* row = out + h.row_offsets[i];
    if (bits == stepquant::kPivotWidth) {
      for (std::uint32_t k = 0; k < rest; ++k) {
        store_half(row + 2 * (first + k), float_to_half_bits(x.at(i, first + k)));
      }
      continue;
    }
    std::uint8_t u[4] = {0, 0, 0, 0};
    for (std::uint32_t k = 0; k < rest; ++k) {
      u[k] = static_cast<std::uint8_t>(code(i, first + k, bits));
    }
    pack_quad_at(bits, u, rest, row + q * quad_bytes(bits));
  }
}

// Reads every code of the head back: value(i, j, bits, u) is the decoded value of code u;
// pivot rows of KDA heads are fp16 values.
template <class Staged, class Team, class Value>
STATEPOOL_HD void read_codes(const Team& t, const PageFormatView& f, const SqHead& h,
                             const std::uint8_t* in, const HeadOut<Staged>& y,
                             const Value& value) noexcept {
  const std::uint32_t V = f.value_dim;
  if (h.row_offsets == nullptr) {
    const std::uint64_t n = std::uint64_t{f.key_dim} * V;
    const std::uint64_t quads = (n + 3) / 4;
    const std::uint8_t* codes = in + h.codes_offset;
    GridCursor cursor(4 * t.rank(), 4 * t.size(), V);
    // kernel-report: fallback-decode 4 io
    for (std::uint64_t q = t.rank(); q < quads; q += t.size(), cursor.next()) {
      const std::uint64_t first = 4 * q;
      const auto rest = static_cast<std::uint32_t>(n - first < 4 ? n - first : 4);
      std::uint32_t u[4];
      unpack_quad_at(h.bits, codes + q * quad_bytes(h.bits), rest, u);
      for (std::uint32_t k = 0; k < rest; ++k) {
        std::uint32_t i = 0;
        std::uint32_t j = 0;
        cursor.at(k, i, j);
        y.store(first + k, value(i, j, h.bits, u[k]));
      }
    }
    return;
  }
  const std::uint32_t row_quads = (V + 3) / 4;
  const std::uint64_t items = std::uint64_t{f.key_dim} * row_quads;
  GridCursor cursor(t.rank(), t.size(), row_quads);
  // kernel-report: fallback-decode 4 io
  for (std::uint64_t item = t.rank(); item < items; item += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const std::uint32_t q = cursor.j;
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = V - first < 4 ? V - first : 4;
    const std::uint32_t bits = h.width(i);
    const std::uint8_t* row = in + h.row_offsets[i];
    const std::uint64_t at = std::uint64_t{i} * V + first;
    if (bits == stepquant::kPivotWidth) {
      for (std::uint32_t k = 0; k < rest; ++k) {
        y.store(at + k, load_half_float(row + 2 * (first + k)));
      }
      continue;
    }
    std::uint32_t u[4];
    unpack_quad_at(bits, row + q * quad_bytes(bits), rest, u);
    for (std::uint32_t k = 0; k < rest; ++k) {
      y.store(at + k, value(i, first + k, bits, u[k]));
    }
  }
}

// The block scratch of a stepquant / dsq encode (encode_scratch_floats): per row the
// step-2 factor e_i and the step-3 factor a_i (temporal_only: 1 / s_i), per column the
// step-3 factor b_j. Written by the rank that computes them, read after a sync().
struct SqScratch {
  float* data;
  std::uint32_t key_dim;

  STATEPOOL_HD float* e() const noexcept { return data; }
  STATEPOOL_HD float* a() const noexcept { return data + key_dim; }
  STATEPOOL_HD float* b() const noexcept { return data + 2 * std::uint64_t{key_dim}; }
};

// Step 1 (dual) or the absmax scale (temporal_only) of every row, into the page, and the
// row's factors into the scratch.
template <class Staged, class Team>
STATEPOOL_HD void write_row_scales(const Team& t, const PageFormatView& f, const SqHead& h,
                                   const HeadValues<Staged>& x, std::uint8_t* out,
                                   const SqScratch& scratch) noexcept {
  const std::uint32_t V = f.value_dim;
  for (std::uint32_t i = t.rank(); i < f.key_dim; i += t.size()) {
    const std::uint32_t bits = h.width(i);
    float s = 0.0f;  // pivot rows store 0
    if (bits != stepquant::kPivotWidth) {
      const StagedRun<Staged> row{x.base, x.first + std::uint64_t{i} * V};
      if (h.kind == SqKind::absmax) {
        std::uint32_t absmax = 0;
        // kernel-report: absmax-rows 1 io
        for (std::uint32_t j = 0; j < V; ++j) {
          const std::uint32_t a = abs_bits(row[j]);
          absmax = a > absmax ? a : absmax;
        }
        s = stepquant::absmax_row_scale(absmax, bits);
        scratch.a()[i] = stepquant::absmax_code_factor(s);
      } else {
        s = stepquant::row_scale_from_sum(stepquant::row_abs_sum(row, V), V, h.weight(i), bits);
        scratch.e()[i] =
            stepquant::column_ratio_factor(s, stepquant::row_code_limit(h.grid8, bits));
        scratch.a()[i] = stepquant::code_row_factor(s, stepquant::row_grid(h.grid8, bits));
      }
    }
    store_half(out + 2 * i, float_to_half_bits(s));
  }
}

// Steps 2-4 of one column j: the max-based scale, then each round of the refit (h.refits):
// the levels of step 3 under the column's current scale and the impact-weighted
// least-squares scale from them, sums over rows in row order. A column's rounds read no
// other column, so this equals the CPU's rounds over whole rows.
template <class Staged>
STATEPOOL_HD float column_scale(const PageFormatView& f, const SqHead& h,
                                const HeadValues<Staged>& x, const std::uint8_t* r,
                                const SqScratch& scratch, std::uint32_t j) noexcept {
  std::uint32_t max_bits = 0;
  // kernel-report: dual-columns 1 io
  for (std::uint32_t i = 0; i < f.key_dim; ++i) {
    if (h.width(i) != stepquant::kPivotWidth) {
      const std::uint32_t m = stepquant::column_ratio_bits(x.at(i, j), scratch.e()[i]);
      max_bits = m > max_bits ? m : max_bits;
    }
  }
  float c = stepquant::column_scale_from_max(max_bits);
  for (std::uint32_t round = 0; round < h.refits; ++round) {
    const float b = stepquant::column_code_factor(c);
    float num = 0.0f;
    float den = 0.0f;
    // kernel-report: dual-refit 1 io
    for (std::uint32_t i = 0; i < f.key_dim; ++i) {
      const std::uint32_t bits = h.width(i);
      if (bits != stepquant::kPivotWidth) {
        const float v = x.at(i, j);
        const std::int32_t z =
            stepquant::unit_level(stepquant::dual_code(v, scratch.a()[i], b, bits), bits);
        const float rg =
            load_half_float(r + 2 * i) * static_cast<float>(stepquant::row_grid(h.grid8, bits));
        stepquant::refit_accumulate(v, z, rg, stepquant::refit_weight(h.weight(i)), num, den);
      }
    }
    c = stepquant::refit_column_scale(num, den, c);
  }
  return c;
}

// Whether a GDN / DSQ head is coded by 16-code chunks (write_run16, decode_run16): one
// run of codes at one width starting 4-byte aligned, rows of a multiple of 16 values,
// and a staged head that starts 16-byte aligned (every real model's shape: K = V = 128).
template <class Staged>
STATEPOOL_HD inline bool run16_fits(const PageFormatView& f, const SqHead& h,
                                    const std::uint8_t* in, const void* base,
                                    std::uint64_t first) noexcept {
  return h.kind != SqKind::pivot_head && h.row_offsets == nullptr && f.value_dim % 16 == 0 &&
         (reinterpret_cast<std::uintptr_t>(in + h.codes_offset) & 3u) == 0 &&
         aligned16(Staged::address(base, first));
}

// Whether a KDA head is coded by 16-value chunks of its rows (write_rows16,
// decode_rows16): rows of a multiple of 16 values (every row's bytes are then a multiple
// of 4), the first row starting 4-byte aligned, the staged head 16-byte aligned.
template <class Staged>
STATEPOOL_HD inline bool rows16_fits(const PageFormatView& f, const SqHead& h,
                                     const std::uint8_t* in, const void* base,
                                     std::uint64_t first) noexcept {
  return h.row_offsets != nullptr && f.value_dim % 16 == 0 &&
         (reinterpret_cast<std::uintptr_t>(in + h.row_offsets[0]) & 3u) == 0 &&
         aligned16(Staged::address(base, first));
}

// Sixteen codes of `Bits` bits into Bits / 2 little-endian words (unpack16's inverse).
template <std::uint32_t Bits>
STATEPOOL_HD inline void pack16(const std::uint32_t* u, std::uint32_t* w) noexcept {
  constexpr std::uint32_t kWords = Bits / 2;
  for (std::uint32_t m = 0; m < kWords; ++m) {
    w[m] = 0;
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t n = 0; n < 16; ++n) {
    const std::uint32_t bit = n * Bits;
    const std::uint32_t word = bit / 32;
    const std::uint32_t shift = bit % 32;
    w[word] |= u[n] << shift;
    if (shift + Bits > 32) w[word + 1] |= u[n] >> (32 - shift);
  }
}

// The codes of such a head (run16_fits) by 16-value chunks: a rank loads 16 staged values
// with 128-bit loads, codes them (code(v, i, j, Bits)), packs them and stores Bits / 2
// 32-bit words.
template <std::uint32_t Bits, class Staged, class Team, class Code>
STATEPOOL_HD void write_run16(const Team& t, const PageFormatView& f, const SqHead& h,
                              const HeadValues<Staged>& x, std::uint8_t* out,
                              const Code& code) noexcept {
  const std::uint32_t per_row = f.value_dim / 16;
  const std::uint32_t chunks = f.key_dim * per_row;
  auto* words = reinterpret_cast<std::uint32_t*>(out + h.codes_offset);
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: dual-codes 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    float v[16];
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k}, v);
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k} + 8, v + 8);
    std::uint32_t u[16];
    for (std::uint32_t n = 0; n < 16; ++n) {
      u[n] = code(v[n], cursor.i, 16 * cursor.j + n, Bits);
    }
    std::uint32_t w[Bits / 2];
    pack16<Bits>(u, w);
    for (std::uint32_t m = 0; m < Bits / 2; ++m) {
      words[k * (Bits / 2) + m] = w[m];
    }
  }
}

// Chunk n (16 values) of a row of `bits` bits: codes of 16 staged values, or (a pivot
// row) their fp16 bits, as Bits / 2 (8) 32-bit words at `dst`.
template <std::uint32_t Bits, class Code>
STATEPOOL_HD inline void write_chunk16(const float* v, std::uint32_t i, std::uint32_t j0,
                                       std::uint32_t* dst, const Code& code) noexcept {
  std::uint32_t u[16];
  for (std::uint32_t n = 0; n < 16; ++n) {
    u[n] = code(v[n], i, j0 + n, Bits);
  }
  std::uint32_t w[Bits / 2];
  pack16<Bits>(u, w);
  for (std::uint32_t m = 0; m < Bits / 2; ++m) {
    dst[m] = w[m];
  }
}

// The rows of a KDA head (rows16_fits) by 16-value chunks: a rank per (row, chunk), the
// row's width read per chunk (ranks of one warp may take rows of other widths).
template <class Staged, class Team, class Code>
STATEPOOL_HD void write_rows16(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out,
                               const Code& code) noexcept {
  const std::uint32_t per_row = f.value_dim / 16;
  const std::uint32_t chunks = f.key_dim * per_row;
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: kda-codes 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const std::uint32_t bits = h.width(i);
    float v[16];
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k}, v);
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k} + 8, v + 8);
    // A chunk takes 2 bits bytes: bits / 2 words.
    auto* dst = reinterpret_cast<std::uint32_t*>(out + h.row_offsets[i]) + cursor.j * (bits / 2);
    switch (bits) {
      case 2: write_chunk16<2>(v, i, 16 * cursor.j, dst, code); break;
      case 4: write_chunk16<4>(v, i, 16 * cursor.j, dst, code); break;
      case 6: write_chunk16<6>(v, i, 16 * cursor.j, dst, code); break;
      case 8: write_chunk16<8>(v, i, 16 * cursor.j, dst, code); break;
      default:  // a pivot row: fp16 values
        for (std::uint32_t m = 0; m < 8; ++m) {
          dst[m] = std::uint32_t{float_to_half_bits(v[2 * m])} |
                   (std::uint32_t{float_to_half_bits(v[2 * m + 1])} << 16);
        }
        break;
    }
  }
}

// Every code of a dual or absmax head: code(v, i, j, bits) is the code of value v at
// (i, j). By 16-value chunks where the head allows (run16_fits, rows16_fits), else per
// quad.
template <class Staged, class Team, class Code>
STATEPOOL_HD void encode_codes(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out,
                               const Code& code) noexcept {
  if (run16_fits<Staged>(f, h, out, x.base, x.first)) {
    switch (h.bits) {
      case 2: write_run16<2>(t, f, h, x, out, code); return;
      case 4: write_run16<4>(t, f, h, x, out, code); return;
      case 6: write_run16<6>(t, f, h, x, out, code); return;
      default: write_run16<8>(t, f, h, x, out, code); return;
    }
  }
  if (rows16_fits<Staged>(f, h, out, x.base, x.first)) {
    write_rows16(t, f, h, x, out, code);
    return;
  }
  write_codes(t, f, h, x, out, [&](std::uint32_t i, std::uint32_t j, std::uint32_t bits) {
    return code(x.at(i, j), i, j, bits);
  });
}

template <class Staged, class Team>
STATEPOOL_HD void encode_sq_head(const Team& t, const PageFormatView& f, std::uint32_t head,
                                 const HeadValues<Staged>& x, std::uint8_t* out,
                                 std::uint64_t head_bytes, float* scratch_floats) noexcept {
  const SqHead h = sq_head(f, head);
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const SqScratch scratch{scratch_floats, K};
  zero_bytes(t, out, h.data_end, head_bytes);
  if (h.kind == SqKind::pivot_head) {
    const std::uint64_t n = std::uint64_t{K} * V;
    // kernel-report: pivot-encode 1 io
    for (std::uint64_t i = t.rank(); i < n; i += t.size()) {
      store_half(out + 2 * i, float_to_half_bits(x.flat(i)));
    }
    return;
  }
  t.sync();  // the team's previous head is done with the scratch
  write_row_scales(t, f, h, x, out, scratch);
  t.sync();
  if (h.kind == SqKind::absmax) {
    encode_codes(t, f, h, x, out, [&](float v, std::uint32_t i, std::uint32_t, std::uint32_t bits) {
      return stepquant::absmax_code(v, scratch.a()[i], bits);
    });
    return;
  }
  std::uint8_t* c = out + 2 * std::uint64_t{K};
  for (std::uint32_t j = t.rank(); j < V; j += t.size()) {
    const float cj = column_scale(f, h, x, out, scratch, j);
    store_half(c + 2 * j, float_to_half_bits(cj));
    scratch.b()[j] = stepquant::column_code_factor(cj);
  }
  t.sync();
  encode_codes(t, f, h, x, out, [&](float v, std::uint32_t i, std::uint32_t j, std::uint32_t bits) {
    return stepquant::dual_code(v, scratch.a()[i], scratch.b()[j], bits);
  });
}

// Sixteen consecutive codes of `Bits` bits from Bits / 2 little-endian words: code n is
// bits [n Bits, n Bits + Bits) of the words' concatenation (the packing of packing.hpp).
template <std::uint32_t Bits>
STATEPOOL_HD inline void unpack16(const std::uint32_t* w, std::uint32_t* u) noexcept {
  constexpr std::uint32_t kWords = Bits / 2;
  constexpr std::uint32_t kMask = (1u << Bits) - 1u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t n = 0; n < 16; ++n) {
    const std::uint32_t bit = n * Bits;
    const std::uint32_t word = bit / 32;
    const std::uint64_t pair =
        w[word] | (word + 1 < kWords ? std::uint64_t{w[word + 1]} << 32 : std::uint64_t{0});
    u[n] = static_cast<std::uint32_t>(pair >> (bit % 32)) & kMask;
  }
}

// The row scales (r[K], or s[K] of an absmax head) and the column scales (c[V], dual
// heads) as floats into block scratch, then sync: what the chunked decodes read.
template <class Team>
STATEPOOL_HD void load_scales(const Team& t, const PageFormatView& f, const SqHead& h,
                              const std::uint8_t* in, float* scratch) noexcept {
  const std::uint32_t count = f.key_dim + (h.kind == SqKind::dual ? f.value_dim : 0);
  const auto* halves = reinterpret_cast<const std::uint16_t*>(in);  // the head starts with them
  for (std::uint32_t i = t.rank(); i < count; i += t.size()) {
    scratch[i] = half_bits_to_float(halves[i]);
  }
  t.sync();
}

// The decode of such a head: the row scales (and the column scales of a dual head)
// converted once into block scratch (K + V floats), sync, then a rank per 16 codes:
// Bits / 2 32-bit loads, the codes unpacked, 16 values computed exactly as the
// per-value path computes them and stored with 128-bit stores; sync (the scratch is
// free again).
template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void decode_run16(const Team& t, const PageFormatView& f, const SqHead& h,
                               const std::uint8_t* in, const HeadOut<Staged>& y,
                               float* scratch) noexcept {
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const bool dual = h.kind == SqKind::dual;
  const float* rs = scratch;
  const float* cs = scratch + K;
  load_scales(t, f, h, in, scratch);
  const auto g = static_cast<std::int32_t>(stepquant::row_grid(h.grid8, Bits));
  const std::uint32_t per_row = V / 16;
  const std::uint32_t chunks = K * per_row;
  const auto* words = reinterpret_cast<const std::uint32_t*>(in + h.codes_offset);
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: dual-decode 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    std::uint32_t w[Bits / 2];
    for (std::uint32_t m = 0; m < Bits / 2; ++m) {
      w[m] = words[k * (Bits / 2) + m];
    }
    std::uint32_t u[16];
    unpack16<Bits>(w, u);
    const float r = rs[cursor.i];
    const float* c = cs + 16 * cursor.j;
    float v[16];
    for (std::uint32_t n = 0; n < 16; ++n) {
      const std::int32_t z = stepquant::unit_level(u[n], Bits);
      v[n] = dual ? stepquant::dual_axis_value(r, c[n], z * g) : r * static_cast<float>(z);
    }
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k}, v);
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k} + 8, v + 8);
  }
  t.sync();
}

// 16 values of chunk `src` (Bits / 2 words) of a row at width Bits: value(z) of each
// level z.
template <std::uint32_t Bits, class Value>
STATEPOOL_HD inline void read_chunk16(const std::uint32_t* src, float* v,
                                      const Value& value) noexcept {
  std::uint32_t w[Bits / 2];
  for (std::uint32_t m = 0; m < Bits / 2; ++m) {
    w[m] = src[m];
  }
  std::uint32_t u[16];
  unpack16<Bits>(w, u);
  for (std::uint32_t n = 0; n < 16; ++n) {
    v[n] = value(n, stepquant::unit_level(u[n], Bits), Bits);
  }
}

// The decode of a KDA head (rows16_fits): the scales once into block scratch as in
// decode_run16, then a rank per (row, 16-value chunk), the row's width read per chunk.
template <class Staged, class Team>
STATEPOOL_HD void decode_rows16(const Team& t, const PageFormatView& f, const SqHead& h,
                                const std::uint8_t* in, const HeadOut<Staged>& y,
                                float* scratch) noexcept {
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const bool dual = h.kind == SqKind::dual;
  const float* rs = scratch;
  const float* cs = scratch + K;
  load_scales(t, f, h, in, scratch);
  const std::uint32_t per_row = V / 16;
  const std::uint32_t chunks = K * per_row;
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: kda-decode 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const std::uint32_t bits = h.width(i);
    const auto* src =
        reinterpret_cast<const std::uint32_t*>(in + h.row_offsets[i]) + cursor.j * (bits / 2);
    const float r = rs[i];
    const float* c = cs + 16 * cursor.j;
    const auto value = [&](std::uint32_t n, std::int32_t z, std::uint32_t b) {
      const auto g = static_cast<std::int32_t>(stepquant::row_grid(h.grid8, b));
      return dual ? stepquant::dual_axis_value(r, c[n], z * g) : r * static_cast<float>(z);
    };
    float v[16];
    switch (bits) {
      case 2: read_chunk16<2>(src, v, value); break;
      case 4: read_chunk16<4>(src, v, value); break;
      case 6: read_chunk16<6>(src, v, value); break;
      case 8: read_chunk16<8>(src, v, value); break;
      default:  // a pivot row: fp16 values
        for (std::uint32_t m = 0; m < 8; ++m) {
          const std::uint32_t word = src[m];
          v[2 * m] = half_bits_to_float(static_cast<std::uint16_t>(word));
          v[2 * m + 1] = half_bits_to_float(static_cast<std::uint16_t>(word >> 16));
        }
        break;
    }
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k}, v);
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k} + 8, v + 8);
  }
  t.sync();
}

template <class Staged, class Team>
STATEPOOL_HD void decode_sq_head(const Team& t, const PageFormatView& f, std::uint32_t head,
                                 const std::uint8_t* in, const HeadOut<Staged>& y,
                                 float* scratch) noexcept {
  const SqHead h = sq_head(f, head);
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  if (run16_fits<Staged>(f, h, in, y.base, y.first)) {
    switch (h.bits) {
      case 2: decode_run16<2>(t, f, h, in, y, scratch); return;
      case 4: decode_run16<4>(t, f, h, in, y, scratch); return;
      case 6: decode_run16<6>(t, f, h, in, y, scratch); return;
      default: decode_run16<8>(t, f, h, in, y, scratch); return;
    }
  }
  if (rows16_fits<Staged>(f, h, in, y.base, y.first)) {
    decode_rows16(t, f, h, in, y, scratch);
    return;
  }
  switch (h.kind) {
    case SqKind::pivot_head: {
      const std::uint64_t n = std::uint64_t{K} * V;
      // kernel-report: pivot-decode 1 io
      for (std::uint64_t i = t.rank(); i < n; i += t.size()) {
        y.store(i, load_half_float(in + 2 * i));
      }
      break;
    }
    case SqKind::absmax:
      read_codes(
          t, f, h, in, y, [&](std::uint32_t i, std::uint32_t, std::uint32_t bits, std::uint32_t u) {
            return load_half_float(in + 2 * i) * static_cast<float>(stepquant::unit_level(u, bits));
          });
      break;
    case SqKind::dual: {
      const std::uint8_t* c = in + 2 * std::uint64_t{K};
      read_codes(t, f, h, in, y,
                 [&](std::uint32_t i, std::uint32_t j, std::uint32_t bits, std::uint32_t u) {
                   const std::int32_t z = stepquant::unit_level(u, bits);
                   const auto g = static_cast<std::int32_t>(stepquant::row_grid(h.grid8, bits));
                   return stepquant::dual_axis_value(load_half_float(in + 2 * i),
                                                     load_half_float(c + 2 * j), z * g);
                 });
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------
// One head, any codec

STATEPOOL_HD inline std::uint64_t head_first_value(const PageFormatView& f,
                                                   std::uint32_t head) noexcept {
  return std::uint64_t{head} * f.key_dim * f.value_dim;
}

STATEPOOL_HD inline std::uint64_t recurrent_staged_bytes(const PageFormatView& f) noexcept {
  return f.staged_bytes - f.conv_bytes;
}

}  // namespace detail

/// Floats of block scratch a decode needs: the K row and V column scales of a STEPQuant /
/// DSQ head as floats (decode_run16).
STATEPOOL_HD inline std::uint64_t decode_scratch_floats(const PageFormatView& f) noexcept {
  return std::uint64_t{f.key_dim} + f.value_dim;
}

/// Floats of block scratch an encode needs (stepquant and dsq heads: 2 K + V; at most
/// 48 KiB, at K = V = kMaxHeadDim).
STATEPOOL_HD inline std::uint64_t encode_scratch_floats(const PageFormatView& f) noexcept {
  return 2 * std::uint64_t{f.key_dim} + f.value_dim;
}

/// The codec families, each with its own kernels (codec_kernels.cu, step_kernels.cu): a
/// kernel compiled for one family holds none of the others' code, so its registers are
/// what that family needs (one kernel for all needed the most any codec needs). `any`
/// dispatches at run time (the host emulation may use either).
enum class CodecFamily : std::uint8_t { any, floats, uniform, stepquant };

/// The family of `codec`: float, uniform int, or STEPQuant / DSQ.
STATEPOOL_HD inline CodecFamily codec_family(CodecId codec) noexcept {
  if (is_float_codec(codec)) return CodecFamily::floats;
  if (is_uniform_codec(codec)) return CodecFamily::uniform;
  return CodecFamily::stepquant;
}

/// Encodes head `head` of `staged` into `page` (the head's bytes only). `scratch` is
/// encode_scratch_floats(f) floats of block scratch, visible to every rank of the team.
/// `Family`: any, or codec_family(f.codec).
template <class Staged, CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void encode_head(const Team& t, const PageFormatView& f, const void* staged,
                              std::uint8_t* page, std::uint32_t head, float* scratch) noexcept {
  const detail::HeadValues<Staged> x{staged, detail::head_first_value(f, head), f.value_dim};
  std::uint8_t* out = page + f.head_offsets[head];
  const std::uint64_t bytes = f.head_offsets[head + 1] - f.head_offsets[head];
  const CodecFamily family = Family == CodecFamily::any ? codec_family(f.codec) : Family;
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::floats) {
    if (family == CodecFamily::floats) detail::encode_float_head(t, f, x, out, bytes);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::uniform) {
    if (family == CodecFamily::uniform) detail::encode_uniform_head(t, f, x, out, bytes);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::stepquant) {
    if (family == CodecFamily::stepquant) {
      detail::encode_sq_head(t, f, head, x, out, bytes, scratch);
    }
  }
}

/// Decodes head `head` of `page` into `staged`. `scratch` is decode_scratch_floats(f)
/// floats of block scratch, visible to every rank. `Family`: as encode_head's.
template <class Staged, CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void decode_head(const Team& t, const PageFormatView& f, const std::uint8_t* page,
                              void* staged, std::uint32_t head, float* scratch) noexcept {
  const detail::HeadOut<Staged> y{staged, detail::head_first_value(f, head)};
  const std::uint8_t* in = page + f.head_offsets[head];
  const CodecFamily family = Family == CodecFamily::any ? codec_family(f.codec) : Family;
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::floats) {
    if (family == CodecFamily::floats) detail::decode_float_head(t, f, in, y);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::uniform) {
    if (family == CodecFamily::uniform) detail::decode_uniform_head(t, f, in, y);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::stepquant) {
    if (family == CodecFamily::stepquant) detail::decode_sq_head(t, f, head, in, y, scratch);
  }
}

/// Block `block` of a slot's encode: head `block`, or a piece of the conv state. `skip`
/// is this slot's skip entry or null; a slot whose entry is not kAllFinite is left
/// untouched (every rank returns before writing). `scratch` and `Family`: as
/// encode_head's.
template <class Staged, CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void encode_block(const Team& t, const PageFormatView& f, const void* staged,
                               void* page, const unsigned long long* skip, std::uint32_t block,
                               float* scratch) noexcept {
  if (skip != nullptr && *skip != kAllFinite) {
    return;
  }
  auto* out = static_cast<std::uint8_t*>(page);
  if (block < f.head_count) {
    encode_head<Staged, Family>(t, f, staged, out, block, scratch);
    return;
  }
  const std::uint64_t begin = std::uint64_t{block - f.head_count} * kConvChunkBytes;
  const std::uint64_t size =
      f.conv_bytes - begin < kConvChunkBytes ? f.conv_bytes - begin : kConvChunkBytes;
  detail::copy_bytes(
      t, static_cast<const std::uint8_t*>(staged) + detail::recurrent_staged_bytes(f) + begin,
      out + f.conv_offset + begin, size);
}

/// Block `block` of a slot's decode. `scratch`: as decode_head's.
template <class Staged, CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void decode_block(const Team& t, const PageFormatView& f, const void* page,
                               void* staged, std::uint32_t block, float* scratch) noexcept {
  const auto* in = static_cast<const std::uint8_t*>(page);
  if (block < f.head_count) {
    decode_head<Staged, Family>(t, f, in, staged, block, scratch);
    return;
  }
  const std::uint64_t begin = std::uint64_t{block - f.head_count} * kConvChunkBytes;
  const std::uint64_t size =
      f.conv_bytes - begin < kConvChunkBytes ? f.conv_bytes - begin : kConvChunkBytes;
  detail::copy_bytes(t, in + f.conv_offset + begin,
                     static_cast<std::uint8_t*>(staged) + detail::recurrent_staged_bytes(f) + begin,
                     size);
}

/// Head `head` of a slot's non-finite scan: lowers *first_index to the smallest flat
/// index (head * K V + row * V + col) of a NaN/Inf in that head, if any. *first_index
/// starts at kAllFinite.
template <class Staged, class Team>
STATEPOOL_HD void find_non_finite_block(const Team& t, const PageFormatView& f, const void* staged,
                                        unsigned long long* first_index,
                                        std::uint32_t head) noexcept {
  const std::uint64_t n = std::uint64_t{f.key_dim} * f.value_dim;
  const std::uint64_t first = detail::head_first_value(f, head);
  // kernel-report: nonfinite-scan 1 io
  for (std::uint64_t i = t.rank(); i < n; i += t.size()) {
    if (Staged::non_finite(staged, first + i)) {
      t.atomic_min(first_index, first + i);  // later indices of this rank are larger
      return;
    }
  }
}

}  // namespace statepool::kernels::cuda
