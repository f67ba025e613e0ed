#pragma once
// STEPQuant and DSQ heads (stepquant/format.hpp, stepquant/fit.hpp) for the block bodies of
// block_codec.hpp: what a head is (SqHead), the fit (row scales, column scales, the
// refit) and the codes, each by 16-value chunks where the head's shape allows, else per
// quad. The decode is block_stepquant_decode.hpp.
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
  // KDA: the head's rows by width class and the classes' ends (PageFormatView).
  const std::uint32_t* row_order = nullptr;
  const std::uint32_t* class_ends = nullptr;
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
    h.row_order = f.row_order + row0;
    h.class_ends = f.class_ends + std::uint64_t{head} * kRowClasses;
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
//   b[V]          per column, the step-3 factor b_j
//   levels[K][8]  KDA heads only (encode_scratch_floats), 16-byte aligned: per row its
//                 RowLevels, so that the column passes of a head whose rows have their
//                 own widths run one branch-free path for every row (a warp's ranks take
//                 the columns of one row: these are broadcast reads)
struct SqScratch {
  float* data;
  std::uint32_t key_dim;
  std::uint32_t value_dim;

  STATEPOOL_HD float* partial() const noexcept { return data; }
  STATEPOOL_HD float* row(std::uint32_t k) const noexcept {
    return data + kRowBatch * kPartialStride + std::uint64_t{k} * key_dim;
  }
  STATEPOOL_HD float* e() const noexcept { return row(0); }
  STATEPOOL_HD float* a() const noexcept { return row(1); }
  STATEPOOL_HD float* rg() const noexcept { return row(2); }
  STATEPOOL_HD float* ww() const noexcept { return row(3); }
  STATEPOOL_HD float* b() const noexcept { return row(4); }
  STATEPOOL_HD float* levels() const noexcept { return data + levels_offset(key_dim, value_dim); }

  // Where levels[] starts: after b[V], rounded up to 4 floats (16 bytes).
  STATEPOOL_HD static std::uint64_t levels_offset(std::uint32_t key_dim,
                                                  std::uint32_t value_dim) noexcept {
    const std::uint64_t end = kRowBatch * kPartialStride + 4 * std::uint64_t{key_dim} + value_dim;
    return (end + 3) & ~std::uint64_t{3};
  }
};

// What the column passes of a KDA head need of row i, whatever its width b: the level of
// a quotient t is
//   r = clamp(round_half_even((t + off) * half), lo, hi)   (NaN -> lo)
//   z = r * m - off,  v = r g z = rgm * r - rgoff          (all exact)
// b = 4, 6, 8: off 0, half 1, lo -L_b, hi L_b, m 1: z = clamp(round(t), -L_b, L_b), as
//   code_from_quotient (t + 0 and t * 1 change only the sign of a zero, which neither the
//   rounding, the clamp nor the sums below can see);
// b = 2: off 3, half 0.5, lo 0, hi 3, m 2: four_level_code's u and z = 2u - 3;
// pivot rows: a = 0 (so t = 0 for finite x), lo = hi = 0, rgm = rgoff = 0: v = 0, so
//   the row adds zeros to the refit's sums (x + 0 = x for any sum that is not -0, and
//   sums start at +0) and nothing to the column maximum (e = 0).
// The stored code is u = r - lo. Two 16-byte loads per row.
struct RowLevels {
  float a, half, off, lo;
  float hi, rgm, rgoff, ww;
};

STATEPOOL_HD inline RowLevels row_levels(std::uint32_t bits, float a, float rg, float ww) noexcept {
  if (bits == stepquant::kPivotWidth) {
    return {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, ww};
  }
  if (bits == 2) {
    return {a, 0.5f, 3.0f, 0.0f, 3.0f, rg * 2.0f, rg * 3.0f, ww};  // exact
  }
  const auto q = static_cast<float>(stepquant::level_max(bits));
  return {a, 1.0f, 0.0f, -q, q, rg, 0.0f, ww};
}

STATEPOOL_HD inline void store_row_levels(float* p, const RowLevels& l) noexcept {
  const float v[8] = {l.a, l.half, l.off, l.lo, l.hi, l.rgm, l.rgoff, l.ww};
  for (std::uint32_t k = 0; k < 8; ++k) {
    p[k] = v[k];
  }
}

STATEPOOL_HD inline RowLevels load_row_levels(const float* p) noexcept {
  const Words4 x = load16(p);
  const Words4 y = load16(p + 4);
  return {bits_float(x.w[0]), bits_float(x.w[1]), bits_float(x.w[2]), bits_float(x.w[3]),
          bits_float(y.w[0]), bits_float(y.w[1]), bits_float(y.w[2]), bits_float(y.w[3])};
}

// r of RowLevels for the quotient t: round_half_even((t + off) * half) clamped to
// [lo, hi], NaN to lo (the selects of code_from_quotient and four_level_code).
STATEPOOL_HD inline float row_level_r(const RowLevels& l, float t) noexcept {
  float r = round_half_even_small(mul_f32(add_f32(t, l.off), l.half));
  r = r > l.lo ? r : l.lo;
  return r < l.hi ? r : l.hi;
}

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
      if (h.row_offsets != nullptr && !absmax) {
        store_row_levels(scratch.levels() + 8 * std::uint64_t{i},
                         row_levels(bits, a, rg, scratch.ww()[i]));
      }
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
// may be pivots (KDA: each row's RowLevels, one branch-free path for every width). Per
// row only the scratch is read (a broadcast: the ranks of a warp take consecutive
// columns of the same row).
template <std::uint32_t Bits, class Staged>
STATEPOOL_HD float column_scale(const PageFormatView& f, const SqHead& h,
                                const HeadValues<Staged>& x, const SqScratch& scratch,
                                std::uint32_t j) noexcept {
  const std::uint32_t K = f.key_dim;
  const float* e = scratch.e();
  std::uint32_t max_bits = 0;
  // kernel-report: dual-columns 1 x4 io
  STATEPOOL_UNROLL_BY(4)
  for (std::uint32_t i = 0; i < K; ++i) {
    // Loaded on every row, so the address steps by V. A KDA pivot row has e = 0.
    const std::uint32_t m = stepquant::column_ratio_bits(x.at(i, j), e[i]);
    max_bits = m > max_bits ? m : max_bits;
  }
  float c = stepquant::column_scale_from_max(max_bits);
  for (std::uint32_t round = 0; round < h.refits; ++round) {
    const float b = stepquant::column_code_factor(c);
    float num = 0.0f;
    float den = 0.0f;
    if constexpr (Bits != 0) {
      const float* a = scratch.a();
      const float* rg = scratch.rg();
      const float* ww = scratch.ww();
      // kernel-report: dual-refit 1 x4 io
      STATEPOOL_UNROLL_BY(4)
      for (std::uint32_t i = 0; i < K; ++i) {
        const float v = x.at(i, j);
        const std::int32_t z = stepquant::unit_level(stepquant::dual_code(v, a[i], b, Bits), Bits);
        stepquant::refit_accumulate(v, z, rg[i], ww[i], num, den);
      }
    } else {
      const float* levels = scratch.levels();
      // kernel-report: dual-refit 1 x4 io
      STATEPOOL_UNROLL_BY(4)
      for (std::uint32_t i = 0; i < K; ++i) {
        const RowLevels l = load_row_levels(levels + 8 * i);
        const float v = x.at(i, j);
        const float r = row_level_r(l, mul_f32(mul_f32(v, l.a), b));
        const float rgz = add_f32(l.rgm * r, -l.rgoff);  // exact: r g z
        stepquant::refit_accumulate_value(v, rgz, l.ww, num, den);
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

// Runs `body` once per 16-value chunk of the rows in slots [begin, end) of a KDA head's
// row_order (one width class), as body(i, j16, at): row i, chunk j16 (values 16 j16 ...
// 16 j16 + 15), at = i V + 16 j16. Chunk k of the range goes to the rank that the
// head-wide chunk index begin V / 16 + k falls to, so the classes together spread over
// the ranks as one loop over the head would.
template <class Team, class Body>
STATEPOOL_HD void for_class_chunks(const Team& t, const PageFormatView& f, const SqHead& h,
                                   std::uint32_t begin, std::uint32_t end,
                                   const Body& body) noexcept {
  const std::uint32_t per_row = f.value_dim / 16;
  const std::uint32_t chunks = (end - begin) * per_row;
  const std::uint32_t k0 = (t.rank() + t.size() - begin * per_row % t.size()) % t.size();
  GridCursor cursor(k0, t.size(), per_row);
  for (std::uint32_t k = k0; k < chunks; k += t.size(), cursor.next()) {
    const std::uint32_t i = h.row_order[begin + cursor.i];
    body(i, cursor.j, std::uint64_t{i} * f.value_dim + 16 * cursor.j);
  }
}

// The rows of width Bits (slots [begin, end) of row_order) by 16-value chunks: 16 staged
// values by 128-bit loads, coded (code(v, i, j, Bits); a pivot row's fp16 bits), packed
// and stored as Bits / 2 32-bit words. The ranks of a warp code at one width (the end
// of a class may leave some of them idle until the next class's loop).
template <std::uint32_t Bits, class Staged, class Team, class Code>
STATEPOOL_HD void write_class16(const Team& t, const PageFormatView& f, const SqHead& h,
                                const HeadValues<Staged>& x, std::uint8_t* out, std::uint32_t begin,
                                std::uint32_t end, const Code& code) noexcept {
  // kernel-report: kda-codes 16 io
  for_class_chunks(t, f, h, begin, end, [&](std::uint32_t i, std::uint32_t j16, std::uint64_t at) {
    float v[16];
    load8<Staged>(x.base, x.first + at, v);
    load8<Staged>(x.base, x.first + at + 8, v + 8);
    std::uint32_t u[16];
    for (std::uint32_t n = 0; n < 16; ++n) {
      u[n] = Bits == stepquant::kPivotWidth ? float_to_half_bits(v[n])
                                            : code(v[n], i, 16 * j16 + n, Bits);
    }
    std::uint32_t w[Bits / 2];
    pack16<Bits>(u, w);
    auto* dst = reinterpret_cast<std::uint32_t*>(out + h.row_offsets[i]) + j16 * (Bits / 2);
    for (std::uint32_t m = 0; m < Bits / 2; ++m) {
      dst[m] = w[m];
    }
  });
}

// The rows of a KDA head (rows16_fits) by width class (write_class16).
template <class Staged, class Team, class Code>
STATEPOOL_HD void write_rows16(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out,
                               const Code& code) noexcept {
  const std::uint32_t* ends = h.class_ends;
  write_class16<2>(t, f, h, x, out, 0, ends[0], code);
  write_class16<4>(t, f, h, x, out, ends[0], ends[1], code);
  write_class16<6>(t, f, h, x, out, ends[1], ends[2], code);
  write_class16<8>(t, f, h, x, out, ends[2], ends[3], code);
  write_class16<stepquant::kPivotWidth>(t, f, h, x, out, ends[3], ends[4], code);
}

// Every code of a dual or absmax head: code(v, i, j, bits) is the code of value v at
// (i, j). By 16-value chunks where the head allows (run16_fits, rows16_fits), else per
// quad. Family: as encode_sq_head's.
template <CodecFamily Family, class Staged, class Team, class Code>
STATEPOOL_HD void encode_codes(const Team& t, const PageFormatView& f, const SqHead& h,
                               const HeadValues<Staged>& x, std::uint8_t* out,
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
      write_rows16(t, f, h, x, out, code);
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
  const SqScratch scratch{scratch_floats, f.key_dim, f.value_dim};
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
    encode_codes<Family>(t, f, h, x, out,
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
  encode_codes<Family>(t, f, h, x, out,
                       [&](float v, std::uint32_t i, std::uint32_t j, std::uint32_t bits) {
                         return stepquant::dual_code(v, scratch.a()[i], scratch.b()[j], bits);
                       });
}

}  // namespace detail

/// Floats of block scratch an encode needs (stepquant and dsq heads: the lane partials of
/// kRowBatch rows, four per row, one per column, and eight more per row of a KDA head):
/// 6.6 KiB at K = V = 128 (KDA 10.6 KiB); 84 KiB at K = V = kMaxHeadDim (KDA 212 KiB),
/// where the launch opts in to more than 48 KiB (KDA heads above K = V = 3128 exceed what
/// an sm_80 block may have, 163 KiB: that launch is refused).
STATEPOOL_HD inline std::uint64_t encode_scratch_floats(const PageFormatView& f) noexcept {
  const std::uint64_t levels = f.arch == Arch::kda ? 8 * std::uint64_t{f.key_dim} : 0;
  return detail::SqScratch::levels_offset(f.key_dim, f.value_dim) + levels;
}

}  // namespace statepool::kernels::cuda
