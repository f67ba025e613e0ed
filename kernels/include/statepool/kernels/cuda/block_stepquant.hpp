#pragma once
// STEPQuant and DSQ heads (stepquant/format.hpp, stepquant/fit.hpp) for the block bodies of
// block_codec.hpp: the fit (row scales, column scales, the refit), the codes and the
// decode, each by 16-value chunks where the head's shape allows, else per quad.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_float.hpp"
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
    // kernel-report: quad-codes 4 fallback
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
  // kernel-report: quad-codes 4 fallback
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
    // kernel-report: quad-decode 4 fallback
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
  // kernel-report: quad-decode 4 fallback
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

// Rows whose lane partials the row pass holds at once (write_row_scales).
inline constexpr std::uint32_t kRowBatch = 32;
// Floats of one row's lane partials in the scratch: kSumLanes, padded by one so that the
// ranks summing rows r = 0, 1, ... read partial l of their rows from different banks.
inline constexpr std::uint32_t kPartialStride = stepquant::kSumLanes + 1;

// The block scratch of a stepquant / dsq encode (encode_scratch_floats floats). Each entry
// is written by the rank that computes it and read by others after a sync():
//   partial [kRowBatch][kPartialStride]  lane partials of a batch of rows (the row pass)
//   e[K], a[K]    per row, the step-2 factor e_i and the step-3 factor a_i
//                 (temporal_only: a_i = 1 / s_i)
//   rg[K], ww[K]  per row, the refit's constants r_i g_i (exact) and w_i w_i
//   bits[K]       per row, its width as a float (exact), so the column passes of a KDA
//                 head read no global memory per row
//   b[V]          per column, the step-3 factor b_j
struct SqScratch {
  float* data;
  std::uint32_t key_dim;

  STATEPOOL_HD float* partial() const noexcept { return data; }
  STATEPOOL_HD float* row(std::uint32_t k) const noexcept {
    return data + kRowBatch * kPartialStride + std::uint64_t{k} * key_dim;
  }
  STATEPOOL_HD float* e() const noexcept { return row(0); }
  STATEPOOL_HD float* a() const noexcept { return row(1); }
  STATEPOOL_HD float* rg() const noexcept { return row(2); }
  STATEPOOL_HD float* ww() const noexcept { return row(3); }
  STATEPOOL_HD float* bits() const noexcept { return row(4); }
  STATEPOOL_HD float* b() const noexcept { return row(5); }
};

// The fp16 value of scale k of the head's scale arrays (r[K] then c[V], or s[K]), which
// start at the head's first byte (4-byte aligned): one 16-bit store.
STATEPOOL_HD inline void store_scale(std::uint8_t* head, std::uint32_t k, float v) noexcept {
  reinterpret_cast<std::uint16_t*>(head)[k] = float_to_half_bits(v);
}

// Step 1 (dual) or the absmax scale (temporal_only) of every row, into the page, and the
// row's constants into the scratch. Rows go by batches of kRowBatch: a rank per (row,
// lane) item adds (or takes the maximum of) the lane's values j = l, l + 32, ... in
// increasing j (fit_math.hpp's lane_partial, so the 32 ranks of a
// warp read 32 consecutive values), sync, then a rank per row of the batch takes the
// lane tree (or the maximum) of its partials and writes the row's scale and constants,
// sync. Every rank runs the same number of batches, so the barriers pair up.
template <class Staged, class Team>
STATEPOOL_HD void write_row_scales(const Team& t, const PageFormatView& f, const SqHead& h,
                                   const HeadValues<Staged>& x, std::uint8_t* out,
                                   const SqScratch& scratch) noexcept {
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const bool absmax = h.kind == SqKind::absmax;
  float* partial = scratch.partial();
  for (std::uint32_t batch = 0; batch < K; batch += kRowBatch) {
    const std::uint32_t rows = K - batch < kRowBatch ? K - batch : kRowBatch;
    for (std::uint32_t item = t.rank(); item < rows * stepquant::kSumLanes; item += t.size()) {
      const std::uint32_t r = item / stepquant::kSumLanes;  // a shift
      const std::uint32_t l = item % stepquant::kSumLanes;
      const std::uint32_t i = batch + r;
      const std::uint64_t first = std::uint64_t{i} * V;
      float p = 0.0f;
      std::uint32_t m = 0;
      if (absmax) {
        // kernel-report: absmax-rows 1 x4 io
        STATEPOOL_UNROLL_BY(4)
        for (std::uint32_t j = l; j < V; j += stepquant::kSumLanes) {
          const std::uint32_t a = abs_bits(x.flat(first + j));
          m = a > m ? a : m;
        }
        p = bits_float(m);  // a finite |x|: stored and read back as the same bits
      } else {
        p = stepquant::lane_partial(StagedRun<Staged>{x.base, x.first + first}, l, V);
      }
      partial[r * kPartialStride + l] = p;
    }
    t.sync();
    for (std::uint32_t r = t.rank(); r < rows; r += t.size()) {
      const std::uint32_t i = batch + r;
      const std::uint32_t bits = h.width(i);
      // This rank's own row of partials: the tree adds in place.
      float* lanes = partial + r * kPartialStride;
      float s = 0.0f;  // pivot rows store 0
      float e = 0.0f;
      float a = 0.0f;
      float rg = 0.0f;
      if (bits != stepquant::kPivotWidth && absmax) {
        std::uint32_t m = 0;
        for (std::uint32_t l = 0; l < stepquant::kSumLanes; ++l) {
          const std::uint32_t v = float_bits(lanes[l]);
          m = v > m ? v : m;
        }
        s = stepquant::absmax_row_scale(m, bits);
        a = stepquant::absmax_code_factor(s);
      } else if (bits != stepquant::kPivotWidth) {
        s = stepquant::row_scale_from_sum(stepquant::lane_tree(lanes), V, h.weight(i), bits);
        e = stepquant::column_ratio_factor(s, stepquant::row_code_limit(h.grid8, bits));
        a = stepquant::code_row_factor(s, stepquant::row_grid(h.grid8, bits));
        rg = s * static_cast<float>(stepquant::row_grid(h.grid8, bits));  // exact
      }
      scratch.e()[i] = e;
      scratch.a()[i] = a;
      scratch.rg()[i] = rg;
      scratch.ww()[i] = stepquant::refit_weight(h.weight(i));
      scratch.bits()[i] = static_cast<float>(bits);
      store_scale(out, i, s);
    }
    t.sync();
  }
}

// Steps 2-4 of one column j: the max-based scale, then each round of the refit (h.refits):
// the levels of step 3 under the column's current scale and the impact-weighted
// least-squares scale from them, sums over rows in row order. A column's rounds read no
// other column, so this equals the CPU's rounds over whole rows. Bits: the width of every
// row (GDN, dsq: no pivot rows), or 0 for a head whose rows have their own widths and
// may be pivots (KDA: read from the scratch). Per row only the scratch is read (a
// broadcast: the ranks of a warp take consecutive columns of the same row).
template <std::uint32_t Bits, class Staged>
STATEPOOL_HD float column_scale(const PageFormatView& f, const SqHead& h,
                                const HeadValues<Staged>& x, const SqScratch& scratch,
                                std::uint32_t j) noexcept {
  const std::uint32_t K = f.key_dim;
  const float* e = scratch.e();
  const float* a = scratch.a();
  const float* rg = scratch.rg();
  const float* ww = scratch.ww();
  const float* widths = scratch.bits();
  const auto width = [&](std::uint32_t i) {
    return Bits != 0 ? Bits : static_cast<std::uint32_t>(widths[i]);
  };
  std::uint32_t max_bits = 0;
  // kernel-report: dual-columns 1 x4 io
  STATEPOOL_UNROLL_BY(4)
  for (std::uint32_t i = 0; i < K; ++i) {
    const float v = x.at(i, j);  // loaded on every row, so the address steps by V
    if (Bits != 0 || width(i) != stepquant::kPivotWidth) {
      const std::uint32_t m = stepquant::column_ratio_bits(v, e[i]);
      max_bits = m > max_bits ? m : max_bits;
    }
  }
  float c = stepquant::column_scale_from_max(max_bits);
  for (std::uint32_t round = 0; round < h.refits; ++round) {
    const float b = stepquant::column_code_factor(c);
    float num = 0.0f;
    float den = 0.0f;
    // kernel-report: dual-refit 1 x4 io
    STATEPOOL_UNROLL_BY(4)
    for (std::uint32_t i = 0; i < K; ++i) {
      const std::uint32_t bits = width(i);
      const float v = x.at(i, j);
      if (Bits != 0 || bits != stepquant::kPivotWidth) {
        const std::int32_t z = stepquant::unit_level(stepquant::dual_code(v, a[i], b, bits), bits);
        stepquant::refit_accumulate(v, z, rg[i], ww[i], num, den);
      }
    }
    c = stepquant::refit_column_scale(num, den, c);
  }
  return c;
}

// Every column's scale c_j into the page and its factor b_j into the scratch: a rank per
// column (the ranks of a warp read 32 consecutive values of a row).
template <std::uint32_t Bits, class Staged, class Team>
STATEPOOL_HD void write_column_scales(const Team& t, const PageFormatView& f, const SqHead& h,
                                      const HeadValues<Staged>& x, std::uint8_t* out,
                                      const SqScratch& scratch) noexcept {
  for (std::uint32_t j = t.rank(); j < f.value_dim; j += t.size()) {
    const float c = column_scale<Bits>(f, h, x, scratch, j);
    store_scale(out, f.key_dim + j, c);
    scratch.b()[j] = stepquant::column_code_factor(c);
  }
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

// Sixteen codes of `bits` bits (2, 4, 6, 8, or 16: the fp16 bits of a pivot row) as
// packing.hpp's little-endian bit stream: bits / 2 32-bit words to dst, stored as they
// fill. For a width known only at run time (KDA rows), so a warp whose ranks take rows of
// different widths runs one path, not one per width.
STATEPOOL_HD inline void put_stream16(const std::uint32_t* u, std::uint32_t bits,
                                      std::uint32_t* dst) noexcept {
  std::uint64_t acc = 0;
  std::uint32_t fill = 0;  // bits of acc not yet stored (< 32 between codes)
  std::uint32_t m = 0;
  STATEPOOL_UNROLL
  for (std::uint32_t n = 0; n < 16; ++n) {
    acc |= std::uint64_t{u[n]} << fill;
    fill += bits;
    if (fill >= 32) {
      dst[m++] = static_cast<std::uint32_t>(acc);
      acc >>= 32;
      fill -= 32;
    }
  }
}

// put_stream16's inverse: sixteen codes of `bits` bits from bits / 2 words at src, loaded
// as they are needed.
STATEPOOL_HD inline void get_stream16(const std::uint32_t* src, std::uint32_t bits,
                                      std::uint32_t* u) noexcept {
  const std::uint32_t mask = (1u << bits) - 1u;
  std::uint64_t acc = 0;
  std::uint32_t avail = 0;  // bits of acc not yet taken (< bits + 32)
  std::uint32_t m = 0;
  STATEPOOL_UNROLL
  for (std::uint32_t n = 0; n < 16; ++n) {
    if (avail < bits) {
      acc |= std::uint64_t{src[m++]} << avail;
      avail += 32;
    }
    u[n] = static_cast<std::uint32_t>(acc) & mask;
    acc >>= bits;
    avail -= bits;
  }
}

// The rows of a KDA head (rows16_fits) by 16-value chunks: a rank per (row, chunk), the
// row's width read per chunk (ranks of one warp may take rows of other widths, hence the
// width-generic bit stream). A chunk takes 2 bits bytes: bits / 2 words, pivot rows 8.
template <class Staged, class Team, class Code>
STATEPOOL_HD void write_rows16(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out, const float* widths,
                               const Code& code) noexcept {
  const std::uint32_t per_row = f.value_dim / 16;
  const std::uint32_t chunks = f.key_dim * per_row;
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: kda-codes 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const auto bits = static_cast<std::uint32_t>(widths[i]);
    float v[16];
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k}, v);
    load8<Staged>(x.base, x.first + 16 * std::uint64_t{k} + 8, v + 8);
    std::uint32_t u[16];
    if (bits == stepquant::kPivotWidth) {
      for (std::uint32_t n = 0; n < 16; ++n) u[n] = float_to_half_bits(v[n]);
    } else {
      for (std::uint32_t n = 0; n < 16; ++n) u[n] = code(v[n], i, 16 * cursor.j + n, bits);
    }
    put_stream16(u, bits,
                 reinterpret_cast<std::uint32_t*>(out + h.row_offsets[i]) + cursor.j * (bits / 2));
  }
}

// Every code of a dual or absmax head: code(v, i, j, bits) is the code of value v at
// (i, j). By 16-value chunks where the head allows (run16_fits, rows16_fits), else per
// quad. `widths`: the rows' widths in the scratch (SqScratch::bits). Family: as
// encode_sq_head's.
template <CodecFamily Family, class Staged, class Team, class Code>
STATEPOOL_HD void encode_codes(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out, const float* widths,
                               const Code& code) noexcept {
  if constexpr (Family != CodecFamily::stepquant_rows) {
    if (run16_fits<Staged>(f, h, out, x.base, x.first)) {
      switch (h.bits) {
        case 2: write_run16<2>(t, f, h, x, out, code); return;
        case 4: write_run16<4>(t, f, h, x, out, code); return;
        case 6: write_run16<6>(t, f, h, x, out, code); return;
        default: write_run16<8>(t, f, h, x, out, code); return;
      }
    }
  }
  if constexpr (Family != CodecFamily::stepquant) {
    if (rows16_fits<Staged>(f, h, out, x.base, x.first)) {
      write_rows16(t, f, h, x, out, widths, code);
      return;
    }
  }
  write_codes(t, f, h, x, out, [&](std::uint32_t i, std::uint32_t j, std::uint32_t bits) {
    return code(x.at(i, j), i, j, bits);
  });
}

// One head of a stepquant / dsq page. Family: stepquant (one-width heads),
// stepquant_rows (KDA heads) or any; a kernel compiles only its family's paths.
template <CodecFamily Family, class Staged, class Team>
STATEPOOL_HD void encode_sq_head(const Team& t, const PageFormatView& f, std::uint32_t head,
                                 const HeadValues<Staged>& x, std::uint8_t* out,
                                 std::uint64_t head_bytes, float* scratch_floats) noexcept {
  const SqHead h = sq_head(f, head);
  const SqScratch scratch{scratch_floats, f.key_dim};
  if (h.kind == SqKind::pivot_head) {  // fp16 x[K V]: the fp16 codec's head
    if constexpr (Family != CodecFamily::stepquant_rows) {
      encode_float_head(t, f, CodecId::fp16, x, out, head_bytes);
    }
    return;
  }
  zero_bytes(t, out, h.data_end, head_bytes);
  t.sync();                                    // the team's previous head is done with the scratch
  write_row_scales(t, f, h, x, out, scratch);  // ends with a sync
  if (h.kind == SqKind::absmax) {
    encode_codes<Family>(t, f, h, x, out, scratch.bits(),
                         [&](float v, std::uint32_t i, std::uint32_t, std::uint32_t bits) {
                           return stepquant::absmax_code(v, scratch.a()[i], bits);
                         });
    return;
  }
  if (h.row_offsets != nullptr) {  // KDA: rows of their own widths
    if constexpr (Family != CodecFamily::stepquant) {
      write_column_scales<0>(t, f, h, x, out, scratch);
    }
  } else if constexpr (Family != CodecFamily::stepquant_rows) {
    switch (h.bits) {
      case 2: write_column_scales<2>(t, f, h, x, out, scratch); break;
      case 4: write_column_scales<4>(t, f, h, x, out, scratch); break;
      case 6: write_column_scales<6>(t, f, h, x, out, scratch); break;
      default: write_column_scales<8>(t, f, h, x, out, scratch); break;
    }
  }
  t.sync();
  encode_codes<Family>(t, f, h, x, out, scratch.bits(),
                       [&](float v, std::uint32_t i, std::uint32_t j, std::uint32_t bits) {
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
  if (h.row_offsets != nullptr) {  // KDA: the rows' widths after the scales, as floats
    float* widths = scratch + f.key_dim + f.value_dim;
    for (std::uint32_t i = t.rank(); i < f.key_dim; i += t.size()) {
      widths[i] = static_cast<float>(h.width(i));
    }
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
  const float* widths = scratch + K + V;
  load_scales(t, f, h, in, scratch);
  const std::uint32_t per_row = V / 16;
  const std::uint32_t chunks = K * per_row;
  GridCursor cursor(t.rank(), t.size(), per_row);
  // kernel-report: kda-decode 16 io
  for (std::uint32_t k = t.rank(); k < chunks; k += t.size(), cursor.next()) {
    const std::uint32_t i = cursor.i;
    const auto bits = static_cast<std::uint32_t>(widths[i]);
    const auto* src =
        reinterpret_cast<const std::uint32_t*>(in + h.row_offsets[i]) + cursor.j * (bits / 2);
    const float r = rs[i];
    const float* c = cs + 16 * cursor.j;
    std::uint32_t u[16];
    get_stream16(src, bits, u);
    float v[16];
    if (bits == stepquant::kPivotWidth) {
      for (std::uint32_t n = 0; n < 16; ++n)
        v[n] = half_bits_to_float(static_cast<std::uint16_t>(u[n]));
    } else {
      const auto g = static_cast<std::int32_t>(stepquant::row_grid(h.grid8, bits));
      for (std::uint32_t n = 0; n < 16; ++n) {
        const std::int32_t z = stepquant::unit_level(u[n], bits);
        v[n] = dual ? stepquant::dual_axis_value(r, c[n], z * g) : r * static_cast<float>(z);
      }
    }
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k}, v);
    store8<Staged>(y.base, y.first + 16 * std::uint64_t{k} + 8, v + 8);
  }
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
/// DSQ head as floats, and the K row widths of a KDA head (load_scales).
STATEPOOL_HD inline std::uint64_t decode_scratch_floats(const PageFormatView& f) noexcept {
  return 2 * std::uint64_t{f.key_dim} + f.value_dim;
}

/// Floats of block scratch an encode needs (stepquant and dsq heads: the lane partials of
/// kRowBatch rows, five per row, one per column; 7.1 KiB at K = V = 128, 97 KiB at
/// K = V = kMaxHeadDim, where the launch opts in to more than 48 KiB).
STATEPOOL_HD inline std::uint64_t encode_scratch_floats(const PageFormatView& f) noexcept {
  return std::uint64_t{detail::kRowBatch} * detail::kPartialStride + 5 * std::uint64_t{f.key_dim} +
         f.value_dim;
}

}  // namespace statepool::kernels::cuda
