#pragma once
// Uniform int codecs (int4, int6, int8: format.hpp) of one head, for the block bodies of
// block_codec.hpp: fp16 scales [groups], then one packed run of K V codes.
//
// Sixteen codes of b bits are 2 b bytes, b / 2 32-bit words (pack16, unpack16). Where the
// head allows (uniform16_fits: groups of a multiple of 16 values, n a multiple of 16, an
// even number of scales so that the codes start 4-byte aligned, the staged head 16-byte
// aligned; every real model's shape at the default group of 32) a head is coded by
// 16-value chunks, with 128-bit staged accesses (load8, store8), 16-bit scale accesses
// and 32-bit code accesses, no byte-wide global access and no sync between scales and
// codes where it can be avoided:
//   encode, group size 32 (the default) and n a multiple of 32: one pass, a rank per
//     group: its 32 values (128-bit loads), absmax, the fp16 scale (a 16-bit store),
//     then each 16-value chunk loaded again (L1 hits), coded, packed and stored as
//     b / 2 words. Keeping all 32 values in registers across the 32 divisions of the
//     codes took 80 registers and spilled; loading the chunks again lets the compiler
//     keep what fits (no spill, under 50 registers at sm_90).
//   encode, other multiples of 16: scales, sync, codes. With at least as many groups as
//     ranks, a rank per group walks its group by chunks. With fewer (large groups: 4096
//     makes 4 groups of a 128 x 128 head, so 4 ranks of 256 would each walk 4096 values
//     while the others wait), every group is cut into `parts` runs of chunks, about one
//     per rank; each run's absmax goes as a 32-bit word into the codes region (scratch
//     until the codes overwrite it), sync, a rank per group takes the max of its parts.
//     Then, after a sync, a rank per chunk: the group's scale (a 16-bit load), the 16
//     values (read again: L1/L2 hits), codes.
//   decode: a rank per chunk, any group size of the shape: the group's scale (a 16-bit
//     load), b / 2 words, unpack16, uniform_value, two store8.
// Other shapes (groups of 4, 8, 12, ... values, an odd number of scales, unaligned
// buffers) take the fallback: a rank per group walking it value by value, sync, a rank
// per quad with byte-wide code accesses (pack_quad_at, unpack_quad_at).
// Every code is uniform_code / uniform_value of quantize.hpp at the scale as stored
// (half_bits_to_float of its fp16 bits), so every path writes PageCodec's bytes.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_io.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"

namespace statepool::kernels::cuda {

namespace detail {

// Whether a uniform head of n values in `groups` groups takes the 16-value paths (see the
// header comment). The head starts 4-byte aligned in a page (round_up4 of every head's
// bytes); it is checked anyway, since the scales are stored as halves and the codes as
// words.
template <class Staged>
STATEPOOL_HD inline bool uniform16_fits(const PageFormatView& f, std::uint32_t n,
                                        std::uint32_t groups, const std::uint8_t* head,
                                        const void* base, std::uint64_t first) noexcept {
  return f.group_size % 16 == 0 && n % 16 == 0 && groups % 2 == 0 &&
         (reinterpret_cast<std::uintptr_t>(head) & 3u) == 0 &&
         aligned16(Staged::address(base, first));
}

// 16 values coded at the stored scale s (uniform_code: the test of s hoisted out of the
// values) and packed into Bits / 2 words at dst.
template <std::uint32_t Bits>
STATEPOOL_HD inline void code16(const float* v, float s, std::uint32_t* dst) noexcept {
  constexpr std::uint32_t kQmax = code_qmax(Bits);
  std::uint32_t u[16];
  if (s > 0.0f) {
    for (std::uint32_t k = 0; k < 16; ++k) {
      u[k] = uniform_code_positive_scale(v[k], s, kQmax);
    }
  } else {
    for (std::uint32_t k = 0; k < 16; ++k) {
      u[k] = kQmax;
    }
  }
  std::uint32_t w[Bits / 2];
  pack16<Bits>(u, w);
  for (std::uint32_t m = 0; m < Bits / 2; ++m) {
    dst[m] = w[m];
  }
}

STATEPOOL_HD inline std::uint32_t max_u32(std::uint32_t a, std::uint32_t b) noexcept {
  return a > b ? a : b;
}

// Group size 32, one pass: a rank per group.
template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void encode_uniform_groups32(const Team& t, std::uint32_t groups,
                                          const HeadValues<Staged>& x, std::uint8_t* out) noexcept {
  constexpr std::uint32_t kQmax = code_qmax(Bits);
  auto* scales = reinterpret_cast<std::uint16_t*>(out);
  auto* words = reinterpret_cast<std::uint32_t*>(out + 2 * groups);  // Bits words a group
  // A trip: 32 values. No ACCESSES in the marker: how many of the chunk loads the
  // compiler keeps as reloads (and at which width) varies by instantiation, and a body of
  // some 800 instructions is never unrolled.
  // kernel-report: uniform-encode 32 io
  for (std::uint32_t g = t.rank(); g < groups; g += t.size()) {
    float v[32];
    for (std::uint32_t k = 0; k < 4; ++k) {
      load8<Staged>(x.base, x.first + 32 * std::uint64_t{g} + 8 * k, v + 8 * k);
    }
    std::uint32_t absmax = 0;
    for (std::uint32_t k = 0; k < 32; ++k) {
      absmax = max_u32(absmax, abs_bits(v[k]));
    }
    const std::uint16_t bits = uniform_scale_bits(absmax, kQmax);
    scales[g] = bits;
    const float s = half_bits_to_float(bits);  // what decode reads back
STATEPOOL_UNROLL
    for (std::uint32_t h = 0; h < 2; ++h) {
      float c[16];
      load8<Staged>(x.base, x.first + 32 * std::uint64_t{g} + 16 * h, c);
      load8<Staged>(x.base, x.first + 32 * std::uint64_t{g} + 16 * h + 8, c + 8);
      code16<Bits>(c, s, words + g * Bits + h * (Bits / 2));
    }
  }
}

// Other group sizes of a multiple of 16: scales by (group, part) items, then codes by
// chunks (the header comment says why).
template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void encode_uniform_chunks(const Team& t, std::uint32_t n, std::uint32_t group,
                                        std::uint32_t groups, const HeadValues<Staged>& x,
                                        std::uint8_t* out) noexcept {
  constexpr std::uint32_t kQmax = code_qmax(Bits);
  auto* scales = reinterpret_cast<std::uint16_t*>(out);
  auto* words = reinterpret_cast<std::uint32_t*>(out + 2 * groups);
  const std::uint32_t chunks = n / 16;
  const std::uint32_t per_group = group / 16;
  // Parts per group: about one (group, part) item per rank, at most one part per chunk
  // of min(group, n) values. The partial words then fit the codes region (at least n / 2
  // bytes): groups parts <= groups min(group, n) / 16, which is n / 16 for one group and
  // below n / 8 for more (every group but the last is whole: groups group < 2 n).
  std::uint32_t parts = 1;
  if (groups < t.size()) {
    const std::uint32_t most = (group < n ? group : n) / 16;
    parts = t.size() / groups;  // 32-bit divisions, once per head
    parts = parts < most ? parts : most;
  }
  const std::uint32_t span = (per_group + parts - 1) / parts;  // chunks per part
  const std::uint32_t items = groups * parts;
  GridCursor item(t.rank(), t.size(), parts);  // .i: the item's group, .j: its part
  for (std::uint32_t k = t.rank(); k < items; k += t.size(), item.next()) {
    const std::uint32_t group_end =
        (item.i + 1) * per_group < chunks ? (item.i + 1) * per_group : chunks;
    const std::uint32_t begin = item.i * per_group + item.j * span;
    const std::uint32_t end = begin + span < group_end ? begin + span : group_end;
    std::uint32_t absmax = 0;
    // A trip: 16 values, 4 128-bit loads (f32).
    // kernel-report: uniform-split-scales 16/4 io
    for (std::uint32_t c = begin; c < end; ++c) {
      float v[16];
      load8<Staged>(x.base, x.first + 16 * std::uint64_t{c}, v);
      load8<Staged>(x.base, x.first + 16 * std::uint64_t{c} + 8, v + 8);
      for (std::uint32_t m = 0; m < 16; ++m) {
        absmax = max_u32(absmax, abs_bits(v[m]));
      }
    }
    if (parts == 1) {
      scales[item.i] = uniform_scale_bits(absmax, kQmax);
    } else {
      words[k] = absmax;  // an empty part (the last group's) leaves 0
    }
  }
  if (parts > 1) {  // the same on every rank
    t.sync();
    // groups < size: at most one group per rank, at most size words per head.
    for (std::uint32_t g = t.rank(); g < groups; g += t.size()) {
      std::uint32_t absmax = 0;
      for (std::uint32_t p = 0; p < parts; ++p) {
        absmax = max_u32(absmax, words[g * parts + p]);
      }
      scales[g] = uniform_scale_bits(absmax, kQmax);
    }
  }
  t.sync();  // scales written, partial words read: the codes may overwrite them
  GridCursor group_of(t.rank(), t.size(), per_group);  // .i: the chunk's group
  // A trip: 16 values, a 16-bit scale load, 4 128-bit loads (f32), 4 word stores (int8).
  // kernel-report: uniform-split-codes 16/9 io
  for (std::uint32_t c = t.rank(); c < chunks; c += t.size(), group_of.next()) {
    const float s = half_bits_to_float(scales[group_of.i]);
    float v[16];
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{c}, v);
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{c} + 8, v + 8);
    code16<Bits>(v, s, words + c * (Bits / 2));
  }
}

template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void encode_uniform16(const Team& t, std::uint32_t n, std::uint32_t group,
                                   std::uint32_t groups, const HeadValues<Staged>& x,
                                   std::uint8_t* out) noexcept {
  if (group == 32 && n % 32 == 0) {  // else the last group is a single chunk
    encode_uniform_groups32<Bits>(t, groups, x, out);
  } else {
    encode_uniform_chunks<Bits>(t, n, group, groups, x, out);
  }
}

// The fallback: a rank per group (value by value), sync, a rank per quad.
template <class Staged, class Team>
STATEPOOL_HD void encode_uniform_quads(const Team& t, std::uint32_t bits, std::uint32_t n,
                                       std::uint32_t group, std::uint32_t groups,
                                       const HeadValues<Staged>& x, std::uint8_t* out) noexcept {
  const std::uint32_t qmax = code_qmax(bits);
  for (std::uint32_t g = t.rank(); g < groups; g += t.size()) {
    const std::uint32_t begin = g * group;
    const std::uint32_t end = group < n - begin ? begin + group : n;
    std::uint32_t absmax = 0;
    // kernel-report: uniform-fallback 1
    for (std::uint32_t i = begin; i < end; ++i) {
      absmax = max_u32(absmax, abs_bits(x.flat(i)));
    }
    store_half(out + 2 * g, uniform_scale_bits(absmax, qmax));
  }
  std::uint8_t* codes = out + 2 * groups;
  t.sync();
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);  // .i: the quad's group
  // kernel-report: uniform-fallback 4
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

template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void decode_uniform16(const Team& t, std::uint32_t n, std::uint32_t group,
                                   std::uint32_t groups, const std::uint8_t* in,
                                   const HeadOut<Staged>& y) noexcept {
  constexpr std::uint32_t kQmax = code_qmax(Bits);
  const auto* scales = reinterpret_cast<const std::uint16_t*>(in);
  const auto* words = reinterpret_cast<const std::uint32_t*>(in + 2 * groups);
  GridCursor group_of(t.rank(), t.size(), group / 16);  // .i: the chunk's group
  // A trip: 16 values, a 16-bit scale load, 4 word loads (int8), 4 128-bit stores (f32).
  // kernel-report: uniform-decode 16/9 io
  for (std::uint32_t c = t.rank(); c < n / 16; c += t.size(), group_of.next()) {
    const float s = half_bits_to_float(scales[group_of.i]);
    std::uint32_t w[Bits / 2];
    for (std::uint32_t m = 0; m < Bits / 2; ++m) {
      w[m] = words[c * (Bits / 2) + m];
    }
    std::uint32_t u[16];
    unpack16<Bits>(w, u);
    float v[16];
    for (std::uint32_t k = 0; k < 16; ++k) {
      v[k] = uniform_value(u[k], s, kQmax);
    }
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{c}, v);
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{c} + 8, v + 8);
  }
}

template <class Staged, class Team>
STATEPOOL_HD void decode_uniform_quads(const Team& t, std::uint32_t bits, std::uint32_t n,
                                       std::uint32_t group, std::uint32_t groups,
                                       const std::uint8_t* in, const HeadOut<Staged>& y) noexcept {
  const std::uint32_t qmax = code_qmax(bits);
  const std::uint8_t* codes = in + 2 * groups;
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);
  // kernel-report: uniform-fallback 4
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

template <class Staged, class Team>
STATEPOOL_HD void encode_uniform_head(const Team& t, const PageFormatView& f,
                                      const HeadValues<Staged>& x, std::uint8_t* out,
                                      std::uint64_t head_bytes) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  // 32-bit within a head: K V <= kMaxHeadDim^2 = 2^24.
  const std::uint32_t n = f.key_dim * f.value_dim;
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;  // one division per head
  // Only the padding after the codes (none on the 16-value paths: 2 groups and 2 Bits n /
  // 16 bytes are multiples of 4), which no pass below writes.
  zero_bytes(t, out, 2 * std::uint64_t{groups} + packed_bytes(n, bits), head_bytes);
  if (uniform16_fits<Staged>(f, n, groups, out, x.base, x.first)) {
    switch (bits) {
      case 4: encode_uniform16<4>(t, n, group, groups, x, out); return;
      case 6: encode_uniform16<6>(t, n, group, groups, x, out); return;
      default: encode_uniform16<8>(t, n, group, groups, x, out); return;
    }
  }
  encode_uniform_quads(t, bits, n, group, groups, x, out);
}

template <class Staged, class Team>
STATEPOOL_HD void decode_uniform_head(const Team& t, const PageFormatView& f,
                                      const std::uint8_t* in, const HeadOut<Staged>& y) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  const std::uint32_t n = f.key_dim * f.value_dim;  // as in encode_uniform_head
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;
  if (uniform16_fits<Staged>(f, n, groups, in, y.base, y.first)) {
    switch (bits) {
      case 4: decode_uniform16<4>(t, n, group, groups, in, y); return;
      case 6: decode_uniform16<6>(t, n, group, groups, in, y); return;
      default: decode_uniform16<8>(t, n, group, groups, in, y); return;
    }
  }
  decode_uniform_quads(t, bits, n, group, groups, in, y);
}

}  // namespace detail

}  // namespace statepool::kernels::cuda
