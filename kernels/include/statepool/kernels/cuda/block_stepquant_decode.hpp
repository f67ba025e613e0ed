#pragma once
// The decode of STEPQuant and DSQ heads for the block bodies of block_codec.hpp: the
// scales into block scratch, then the codes by 16-value chunks where the head's shape
// allows (one run, per width class, per row), else per quad. What a head is (SqHead) and
// the encode: block_stepquant.hpp.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_stepquant.hpp"

namespace statepool::kernels::cuda {

namespace detail {

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

// The rows of width Bits of a KDA head (slots [begin, end) of row_order) by 16-value
// chunks: Bits / 2 32-bit loads, the codes unpacked (a pivot row's fp16 bits), 16 values
// computed as the per-value path computes them, 128-bit stores.
template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void decode_class16(const Team& t, const PageFormatView& f, const SqHead& h,
                                 const std::uint8_t* in, const HeadOut<Staged>& y,
                                 const float* scratch, std::uint32_t begin,
                                 std::uint32_t end) noexcept {
  const bool dual = h.kind == SqKind::dual;
  const float* rs = scratch;
  const float* cs = scratch + f.key_dim;
  // A pivot row (Bits 16) has no grid: its values are fp16.
  const std::int32_t g = Bits == stepquant::kPivotWidth
                             ? 1
                             : static_cast<std::int32_t>(stepquant::row_grid(h.grid8, Bits));
  // kernel-report: kda-decode 16 io
  for_class_chunks(t, f, h, begin, end, [&](std::uint32_t i, std::uint32_t j16, std::uint64_t at) {
    const auto* src =
        reinterpret_cast<const std::uint32_t*>(in + h.row_offsets[i]) + j16 * (Bits / 2);
    std::uint32_t w[Bits / 2];
    for (std::uint32_t m = 0; m < Bits / 2; ++m) {
      w[m] = src[m];
    }
    std::uint32_t u[16];
    unpack16<Bits>(w, u);
    const float r = rs[i];
    const float* c = cs + 16 * j16;
    float v[16];
    for (std::uint32_t n = 0; n < 16; ++n) {
      if constexpr (Bits == stepquant::kPivotWidth) {
        v[n] = half_bits_to_float(static_cast<std::uint16_t>(u[n]));
      } else {
        const std::int32_t z = stepquant::unit_level(u[n], Bits);
        v[n] = dual ? stepquant::dual_axis_value(r, c[n], z * g) : r * static_cast<float>(z);
      }
    }
    store8<Staged>(y.base, y.first + at, v);
    store8<Staged>(y.base, y.first + at + 8, v + 8);
  });
}

// The decode of a KDA head (rows16_fits): the scales once into block scratch as in
// decode_run16, then the rows by width class (decode_class16); sync.
template <class Staged, class Team>
STATEPOOL_HD void decode_rows16(const Team& t, const PageFormatView& f, const SqHead& h,
                                const std::uint8_t* in, const HeadOut<Staged>& y,
                                float* scratch) noexcept {
  load_scales(t, f, h, in, scratch);
  const std::uint32_t* ends = h.class_ends;
  decode_class16<2>(t, f, h, in, y, scratch, 0, ends[0]);
  decode_class16<4>(t, f, h, in, y, scratch, ends[0], ends[1]);
  decode_class16<6>(t, f, h, in, y, scratch, ends[1], ends[2]);
  decode_class16<8>(t, f, h, in, y, scratch, ends[2], ends[3]);
  decode_class16<stepquant::kPivotWidth>(t, f, h, in, y, scratch, ends[3], ends[4]);
  t.sync();
}

// Family: as encode_sq_head's.
template <CodecFamily Family, class Staged, class Team>
STATEPOOL_HD void decode_sq_head(const Team& t, const PageFormatView& f, std::uint32_t head,
                                 const std::uint8_t* in, const HeadOut<Staged>& y,
                                 float* scratch) noexcept {
  const SqHead h = sq_head(f, head);
  const std::uint32_t K = f.key_dim;
  if constexpr (Family != CodecFamily::stepquant_rows) {
    if (run16_fits<Staged>(f, h, in, y.base, y.first)) {
      switch (h.bits) {
        case 2: decode_run16<2>(t, f, h, in, y, scratch); return;
        case 4: decode_run16<4>(t, f, h, in, y, scratch); return;
        case 6: decode_run16<6>(t, f, h, in, y, scratch); return;
        default: decode_run16<8>(t, f, h, in, y, scratch); return;
      }
    }
  }
  if constexpr (Family != CodecFamily::stepquant) {
    if (rows16_fits<Staged>(f, h, in, y.base, y.first)) {
      decode_rows16(t, f, h, in, y, scratch);
      return;
    }
  }
  switch (h.kind) {
    case SqKind::pivot_head:  // fp16 x[K V]: the fp16 codec's head
      if constexpr (Family != CodecFamily::stepquant_rows) {
        decode_float_head(t, f, CodecId::fp16, in, y);
      }
      break;
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

}  // namespace detail

/// Floats of block scratch a decode needs: the K row and V column scales of a STEPQuant /
/// DSQ head as floats (load_scales).
STATEPOOL_HD inline std::uint64_t decode_scratch_floats(const PageFormatView& f) noexcept {
  return std::uint64_t{f.key_dim} + f.value_dim;
}

}  // namespace statepool::kernels::cuda
