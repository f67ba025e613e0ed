#pragma once
// STEPQuant and DSQ heads (stepquant/format.hpp, stepquant/fit.hpp) for the block bodies of
// block_codec.hpp: the fit (row scales, column scales, the refit), the codes and the
// decode, each by 16-value chunks where the head's shape allows, else per quad.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_io.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/stepquant/fit_math.hpp"
#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::kernels::cuda {

namespace detail {

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

}  // namespace statepool::kernels::cuda
