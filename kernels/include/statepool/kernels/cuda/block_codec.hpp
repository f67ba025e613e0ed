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
// bytes. Ranks share the page and a block scratch (shared memory on the GPU, sized by
// encode_scratch_floats / decode_scratch_floats): a rank writes a scale or a constant,
// sync(), then every rank reads it.
//
// Grid: one block per (slot, x) with x in [0, page_blocks(view)): x < head_count encodes
// or decodes head x; the others copy one kConvChunkBytes piece of the conv state (16
// bytes per rank). Within a head (K rows, V columns, n = K V values, row-major):
//   float codecs, pivot GDN heads
//                     rank per 8 values (128-bit accesses) where the head is aligned,
//                     else rank per value (block_float.hpp)
//   int4/6/8          rank per 32-value group in one pass, or absmax by groups (or parts
//                     of groups), sync, codes per 16-value chunk; else rank per group,
//                     sync, rank per quad (block_uniform.hpp)
//   dual axis (GDN at 2/4/6/8 bits, KDA, dsq4/6)
//                     by batches of 32 rows: rank per (row, lane) for the lane partials,
//                     sync, rank per row for r_i and its constants, sync; rank per
//                     column (c_j: max over rows, then the refit sums over rows in row
//                     order, binary32; b_j into the scratch), sync, codes: rank per 16
//                     values of a row (run16_fits, rows16_fits), else rank per quad
//                     (block_stepquant.hpp, block_stepquant_decode.hpp)
//   temporal_only     the row pass with maxima (absmax scale, its reciprocal into the
//                     scratch), codes as above
//   decode            float codecs as encode; int4/6/8 rank per 16 codes; STEPQuant /
//                     DSQ: the scales (and KDA widths) into the block scratch, sync, rank
//                     per 16 codes of a row where the head allows, sync; else rank per
//                     quad
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

#include "statepool/kernels/cuda/block_float.hpp"
#include "statepool/kernels/cuda/block_io.hpp"
#include "statepool/kernels/cuda/block_stepquant.hpp"
#include "statepool/kernels/cuda/block_stepquant_decode.hpp"
#include "statepool/kernels/cuda/block_uniform.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"

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

namespace detail {

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

/// Encodes head `head` of `staged` into `page` (the head's bytes only). `scratch` is
/// encode_scratch_floats(f) floats of block scratch, visible to every rank of the team.
/// `Family`: any, or codec_family(f).
template <class Staged, CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void encode_head(const Team& t, const PageFormatView& f, const void* staged,
                              std::uint8_t* page, std::uint32_t head, float* scratch) noexcept {
  const detail::HeadValues<Staged> x{staged, detail::head_first_value(f, head), f.value_dim};
  std::uint8_t* out = page + f.head_offsets[head];
  const std::uint64_t bytes = f.head_offsets[head + 1] - f.head_offsets[head];
  const CodecFamily family = Family == CodecFamily::any ? codec_family(f) : Family;
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::floats) {
    if (family == CodecFamily::floats) detail::encode_float_head(t, f, f.codec, x, out, bytes);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::uniform) {
    if (family == CodecFamily::uniform) detail::encode_uniform_head(t, f, x, out, bytes);
  }
  if constexpr (Family == CodecFamily::any || is_stepquant_family(Family)) {
    if (is_stepquant_family(family)) {
      detail::encode_sq_head<Family>(t, f, head, x, out, bytes, scratch);
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
  const CodecFamily family = Family == CodecFamily::any ? codec_family(f) : Family;
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::floats) {
    if (family == CodecFamily::floats) detail::decode_float_head(t, f, f.codec, in, y);
  }
  if constexpr (Family == CodecFamily::any || Family == CodecFamily::uniform) {
    if (family == CodecFamily::uniform) detail::decode_uniform_head(t, f, in, y);
  }
  if constexpr (Family == CodecFamily::any || is_stepquant_family(Family)) {
    if (is_stepquant_family(family)) detail::decode_sq_head<Family>(t, f, head, in, y, scratch);
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
  const auto size = static_cast<std::uint32_t>(
      f.conv_bytes - begin < kConvChunkBytes ? f.conv_bytes - begin : kConvChunkBytes);
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
  const auto size = static_cast<std::uint32_t>(
      f.conv_bytes - begin < kConvChunkBytes ? f.conv_bytes - begin : kConvChunkBytes);
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
