// The STEPQuant / DSQ / temporal-only fits of one head (stepquant/fit.hpp, which states
// the arithmetic exactly). The loops run over one row at a time with per-row constants
// so that they vectorize across columns; every reduction has a fixed order. The scalar
// steps are stepquant/fit_math.hpp's, which the CUDA kernels use too.

#include <algorithm>
#include <limits>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "simd.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"
#include "statepool/kernels/stepquant/fit.hpp"
#include "statepool/kernels/stepquant/fit_math.hpp"
#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::kernels::stepquant {
namespace {

void check_shape(std::span<const float> head, std::uint32_t key_dim, std::uint32_t value_dim) {
  if (key_dim == 0 || value_dim == 0) {
    throw std::invalid_argument("stepquant fit: key_dim and value_dim must be positive");
  }
  if (head.size() != std::size_t{key_dim} * value_dim) {
    throw std::invalid_argument("stepquant fit: head has " + std::to_string(head.size()) +
                                " values, expected " +
                                std::to_string(std::size_t{key_dim} * value_dim));
  }
}

void check_widths(Arch arch, std::span<const std::uint8_t> widths, std::uint32_t key_dim) {
  if (arch != Arch::gdn && arch != Arch::kda) {
    throw std::invalid_argument("stepquant fit: unknown arch " +
                                std::to_string(static_cast<unsigned>(arch)));
  }
  if (widths.size() != key_dim) {
    throw std::invalid_argument("stepquant fit: " + std::to_string(widths.size()) +
                                " row widths, expected " + std::to_string(key_dim));
  }
  for (std::size_t i = 0; i < widths.size(); ++i) {
    if (!is_stored_width(widths[i])) {
      throw std::invalid_argument("stepquant fit: row " + std::to_string(i) + " has width " +
                                  std::to_string(widths[i]) +
                                  "; widths are 2, 4, 6, 8 or 16 (pivot)");
    }
    if (arch == Arch::gdn && widths[i] != widths[0]) {
      throw std::invalid_argument("stepquant fit: a GDN head has one width, but row " +
                                  std::to_string(i) + " has " + std::to_string(widths[i]) +
                                  " and row 0 has " + std::to_string(widths[0]));
    }
  }
}

void check_impact(std::span<const float> impact, std::uint32_t key_dim) {
  if (impact.size() != key_dim) {
    throw std::invalid_argument("stepquant fit: " + std::to_string(impact.size()) +
                                " impact factors, expected " + std::to_string(key_dim));
  }
  for (std::size_t i = 0; i < impact.size(); ++i) {
    if (!(std::isfinite(impact[i]) && impact[i] > 0.0f)) {
      throw std::invalid_argument("stepquant fit: impact[" + std::to_string(i) +
                                  "] must be finite and > 0");
    }
  }
}

// Step 1's lane sum of one row (fit_math.hpp's lane_partial and lane_tree, the same additions in
// the same order): the 32 lanes are four 8-float vectors, each full chunk of 32 values adds into
// them, a last partial chunk is padded with +0 (which leaves a lane's non-negative sum unchanged),
// and the tree adds vectors 0 + 2 and 1 + 3 (stride 16), then the two (stride 8), then the eight
// lanes of the result (strides 4, 2, 1).
using F32x8 = float __attribute__((vector_size(32)));
using I32x8 = std::int32_t __attribute__((vector_size(32)));
constexpr std::uint32_t kLaneVectors = kSumLanes / 8;

// acc += |x[0..8)| (by reference: a returned 32-byte vector would change the ABI of the
// baseline clone).
STATEPOOL_FORCE_INLINE void add_abs8(F32x8& acc, const float* x) {
  I32x8 v;
  std::memcpy(&v, x, sizeof v);
  v &= 0x7FFFFFFF;
  F32x8 magnitude;
  std::memcpy(&magnitude, &v, sizeof v);
  acc += magnitude;
}

STATEPOOL_FORCE_INLINE float abs_lane_sum(const float* x, std::uint32_t n) {
  F32x8 acc[kLaneVectors] = {};
  std::uint32_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (std::uint32_t k = 0; k < kLaneVectors; ++k) add_abs8(acc[k], x + j + 8 * k);
  }
  if (j < n) {
    float tail[kSumLanes] = {};
    std::memcpy(tail, x + j, sizeof(float) * (n - j));
    for (std::uint32_t k = 0; k < kLaneVectors; ++k) add_abs8(acc[k], tail + 8 * k);
  }
  const F32x8 t = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  const float u0 = t[0] + t[4];
  const float u1 = t[1] + t[5];
  const float u2 = t[2] + t[6];
  const float u3 = t[3] + t[7];
  return (u0 + u2) + (u1 + u3);
}

// The loops over a block of rows below make one call per block, not per row (a row of
// 128 values is 8 AVX-512 vectors, about what a call, its dispatch and a loop's remainder
// handling cost), and compile the common row length kCommonRow as a constant: each
// *_body<N> runs rows of N values, *_body<0> rows of the given length. Every row gets the
// same operations in the same order as the single-row bodies.
constexpr std::uint32_t kCommonRow = 128;

template <std::uint32_t N>
STATEPOOL_FORCE_INLINE std::uint32_t row_length(std::uint32_t n) {
  return N != 0 ? N : n;
}

// Step 1's lane sums of `rows` rows of n values.
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE void row_sums_body(const float* x, std::size_t rows, std::uint32_t n,
                                          float* sums) {
  const std::uint32_t len = row_length<N>(n);
  for (std::size_t r = 0; r < rows; ++r) sums[r] = abs_lane_sum(x + r * len, len);
}

STATEPOOL_SIMD_CLONES void row_sums(const float* x, std::size_t rows, std::uint32_t n,
                                    float* sums) {
  if (n == kCommonRow) {
    row_sums_body<kCommonRow>(x, rows, n, sums);
  } else {
    row_sums_body<0>(x, rows, n, sums);
  }
}

// Step 1's row scales from the row sums, every row (pivot rows too; the caller overwrites
// theirs); w: the rows' impact factors.
STATEPOOL_SIMD_CLONES void row_scales(const float* sums, std::size_t rows, std::uint32_t n,
                                      const float* w, const std::uint32_t* bits, float* out) {
  for (std::size_t i = 0; i < rows; ++i) {
    out[i] = row_scale_from_sum(sums[i], n, w[i], bits[i]);
  }
}

// The per-row factors e_i = 1 / (r_i q_i) and a_i = 1 / (r_i g_i), every row (the
// caller ignores those of pivot rows).
STATEPOOL_SIMD_CLONES void row_factors(const float* r, const std::uint32_t* q,
                                       const std::uint32_t* g, std::size_t rows, float* e,
                                       float* a) {
  for (std::size_t i = 0; i < rows; ++i) {
    e[i] = column_ratio_factor(r[i], q[i]);
    a[i] = code_row_factor(r[i], g[i]);
  }
}

// A pivot row's stored values: fp16(x_j) as floats.
STATEPOOL_SIMD_CLONES void fp16_values(const float* x, std::size_t n, float* out) {
  for (std::size_t j = 0; j < n; ++j) {
    out[j] = fp16_value(x[j]);
  }
}

// Step 2's column scales from the maxima's bits.
STATEPOOL_SIMD_CLONES void column_scales(const std::int32_t* max_bits, std::size_t n, float* c) {
  for (std::size_t j = 0; j < n; ++j) {
    c[j] = column_scale_from_max(static_cast<std::uint32_t>(max_bits[j]));
  }
}

// Step 3's column factors b_j.
STATEPOOL_SIMD_CLONES void column_factors(const float* c, std::size_t n, float* b) {
  for (std::size_t j = 0; j < n; ++j) {
    b[j] = column_code_factor(c[j]);
  }
}

// Step 4's refitted column scales (in place).
STATEPOOL_SIMD_CLONES void refit_column_scales(const float* num, const float* den, std::size_t n,
                                               float* c) {
  for (std::size_t j = 0; j < n; ++j) {
    c[j] = refit_column_scale(num[j], den[j], c[j]);
  }
}

// Step 2 for one row: cm[j] = max(cm[j], |x_j| e), as bits (non-negative floats order
// like their bits; int32 compares vectorize on SSE2).
STATEPOOL_FORCE_INLINE void column_max_row(const float* x, std::uint32_t n, float e,
                                           std::int32_t* cm) {
  for (std::uint32_t j = 0; j < n; ++j) {
    const auto t = static_cast<std::int32_t>(column_ratio_bits(x[j], e));
    cm[j] = std::max(cm[j], t);
  }
}

// Step 2 for `rows` rows of n values, in row order, skipping pivot rows (width 16).
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE void column_max_rows_body(const float* x, std::size_t rows, std::uint32_t n,
                                                 const float* e, const std::uint8_t* widths,
                                                 std::int32_t* cm) {
  const std::uint32_t len = row_length<N>(n);
  for (std::size_t r = 0; r < rows; ++r) {
    if (widths[r] != kPivotWidth) column_max_row(x + r * len, len, e[r], cm);
  }
}

STATEPOOL_SIMD_CLONES void column_max_rows(const float* x, std::size_t rows, std::uint32_t n,
                                           const float* e, const std::uint8_t* widths,
                                           std::int32_t* cm) {
  if (n == kCommonRow) {
    column_max_rows_body<kCommonRow>(x, rows, n, e, widths, cm);
  } else {
    column_max_rows_body<0>(x, rows, n, e, widths, cm);
  }
}

// Step 3's level of quotient t in a row of 4, 6 or 8 bits (FourLevel false; qmax given) or
// of 2 bits. Each row loop below is written once per kind of unit, so that each
// vectorizes without a branch per value.
template <bool FourLevel>
STATEPOOL_FORCE_INLINE std::int32_t row_level(float t, std::uint32_t qmax) {
  if constexpr (FourLevel) {
    return 2 * static_cast<std::int32_t>(four_level_code(t)) - 3;
  } else {
    return static_cast<std::int32_t>(code_from_quotient(t, qmax)) - static_cast<std::int32_t>(qmax);
  }
}

// Step 3 for one row: z_j = the level of (x_j a) b_j.
template <bool FourLevel>
STATEPOOL_FORCE_INLINE void encode_row_body(const float* x, std::uint32_t n, float a,
                                            const float* b, std::uint32_t qmax, std::int32_t* z) {
  for (std::uint32_t j = 0; j < n; ++j) {
    z[j] = row_level<FourLevel>(mul_f32(mul_f32(x[j], a), b[j]), qmax);
  }
}

// Step 3 and step 4's accumulation for one row in one pass (row order is the caller's
// loop order): the same operations as encode_row_body, then refit_accumulate. The levels
// are not stored: the final step 3 after the last round writes every code.
template <bool FourLevel>
STATEPOOL_FORCE_INLINE void refit_row_body(const float* x, std::uint32_t n, float a, const float* b,
                                           std::uint32_t qmax, float rg, float ww, float* num,
                                           float* den) {
  for (std::uint32_t j = 0; j < n; ++j) {
    const std::int32_t level = row_level<FourLevel>(mul_f32(mul_f32(x[j], a), b[j]), qmax);
    refit_accumulate(x[j], level, rg, ww, num[j], den[j]);
  }
}

// Step 3 for `rows` rows of n values, skipping pivot rows: row r's levels through a[r]
// into z + r n.
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE void encode_rows_body(const float* x, std::size_t rows, std::uint32_t n,
                                             const float* a, const float* b,
                                             const std::uint8_t* widths, std::int32_t* z) {
  const std::uint32_t len = row_length<N>(n);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint32_t bits = widths[r];
    if (bits == kPivotWidth) continue;
    if (bits == 2) {
      encode_row_body<true>(x + r * len, len, a[r], b, 0, z + r * len);
    } else {
      encode_row_body<false>(x + r * len, len, a[r], b, code_qmax(bits), z + r * len);
    }
  }
}

STATEPOOL_SIMD_CLONES void encode_rows(const float* x, std::size_t rows, std::uint32_t n,
                                       const float* a, const float* b, const std::uint8_t* widths,
                                       std::int32_t* z) {
  if (n == kCommonRow) {
    encode_rows_body<kCommonRow>(x, rows, n, a, b, widths, z);
  } else {
    encode_rows_body<0>(x, rows, n, a, b, widths, z);
  }
}

// Step 4's accumulation (through step 3's levels) for `rows` rows in row order,
// skipping pivot rows; rg[r] = r_r g_r and ww[r] = refit_weight(w_r).
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE void refit_rows_body(const float* x, std::size_t rows, std::uint32_t n,
                                            const float* a, const float* b,
                                            const std::uint8_t* widths, const float* rg,
                                            const float* ww, float* num, float* den) {
  const std::uint32_t len = row_length<N>(n);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint32_t bits = widths[r];
    if (bits == kPivotWidth) continue;
    if (bits == 2) {
      refit_row_body<true>(x + r * len, len, a[r], b, 0, rg[r], ww[r], num, den);
    } else {
      refit_row_body<false>(x + r * len, len, a[r], b, code_qmax(bits), rg[r], ww[r], num, den);
    }
  }
}

STATEPOOL_SIMD_CLONES void refit_rows(const float* x, std::size_t rows, std::uint32_t n,
                                      const float* a, const float* b, const std::uint8_t* widths,
                                      const float* rg, const float* ww, float* num, float* den) {
  if (n == kCommonRow) {
    refit_rows_body<kCommonRow>(x, rows, n, a, b, widths, rg, ww, num, den);
  } else {
    refit_rows_body<0>(x, rows, n, a, b, widths, rg, ww, num, den);
  }
}

// The carried fit's pass over one row before its scale: the bits of max_j |x_j| b_j and of
// max_j |x_j| (the finite check: |x| bits of Inf and NaN are the largest).
STATEPOOL_FORCE_INLINE void carried_row_max(const float* x, std::uint32_t n, const float* b,
                                            std::uint32_t& ratio_max, std::uint32_t& abs_max) {
  std::int32_t ratio = 0;
  std::int32_t magnitude = 0;
  for (std::uint32_t j = 0; j < n; ++j) {
    ratio = std::max(ratio, static_cast<std::int32_t>(column_ratio_bits(x[j], b[j])));
    magnitude = std::max(magnitude, static_cast<std::int32_t>(abs_bits(x[j])));
  }
  ratio_max = static_cast<std::uint32_t>(ratio);
  abs_max = static_cast<std::uint32_t>(magnitude);
}

// Non-zero values of one row in the columns whose factor b_j is 0.
STATEPOOL_SIMD_CLONES std::uint32_t lost_in_row(const float* x, std::uint32_t n, const float* b) {
  std::uint32_t lost = 0;
  for (std::uint32_t j = 0; j < n; ++j) {
    lost += static_cast<std::uint32_t>(abs_bits(x[j]) != 0) &
            static_cast<std::uint32_t>(float_bits(b[j]) == 0);
  }
  return lost;
}

// Step 3 for one row, counting the quotients beyond `limit` (clamp_limit).
template <bool FourLevel>
STATEPOOL_FORCE_INLINE std::uint32_t encode_count_row_body(const float* x, std::uint32_t n,
                                                           float a, const float* b,
                                                           std::uint32_t qmax, float limit,
                                                           std::int32_t* z) {
  std::uint32_t clamped = 0;
  for (std::uint32_t j = 0; j < n; ++j) {
    const float t = mul_f32(mul_f32(x[j], a), b[j]);
    z[j] = row_level<FourLevel>(t, qmax);
    clamped += static_cast<std::uint32_t>(abs_f32(t) > limit);
  }
  return clamped;
}

// The carried fit's first pass over `rows` rows of n values, skipping pivot rows: per row
// the bits of max_j |x_j| b_j into ratio; `odd` gets whether a value was NaN or +-Inf.
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE void carried_maxima_body(const float* x, std::size_t rows, std::uint32_t n,
                                                const float* b, const std::uint8_t* widths,
                                                std::uint32_t* ratio, std::uint32_t& odd) {
  const std::uint32_t len = row_length<N>(n);
  for (std::size_t i = 0; i < rows; ++i) {
    if (widths[i] == kPivotWidth) continue;
    std::uint32_t abs_max = 0;
    carried_row_max(x + i * len, len, b, ratio[i], abs_max);
    odd |= static_cast<std::uint32_t>(abs_max >= 0x7F800000u);
  }
}

STATEPOOL_SIMD_CLONES void carried_maxima(const float* x, std::size_t rows, std::uint32_t n,
                                          const float* b, const std::uint8_t* widths,
                                          std::uint32_t* ratio, std::uint32_t& odd) {
  if (n == kCommonRow) {
    carried_maxima_body<kCommonRow>(x, rows, n, b, widths, ratio, odd);
  } else {
    carried_maxima_body<0>(x, rows, n, b, widths, ratio, odd);
  }
}

// The absmax rule's row scales from the maxima' bits, every row (vectorized across rows).
STATEPOOL_SIMD_CLONES void carried_row_scales(const std::uint32_t* ratio, std::size_t rows,
                                              const std::uint32_t* q, const std::uint32_t* bits,
                                              float* r) {
  for (std::size_t i = 0; i < rows; ++i) r[i] = carried_row_scale(ratio[i], q[i], bits[i]);
}

// The carried fit's codes: step 3 for `rows` rows through a[i], skipping pivot rows.
// Returns the largest count of clamped quotients in a row.
template <std::uint32_t N>
STATEPOOL_FORCE_INLINE std::uint32_t encode_count_rows_body(const float* x, std::size_t rows,
                                                            std::uint32_t n, const float* a,
                                                            const float* b,
                                                            const std::uint8_t* widths,
                                                            std::int32_t* z) {
  const std::uint32_t len = row_length<N>(n);
  std::uint32_t worst = 0;
  for (std::size_t i = 0; i < rows; ++i) {
    const std::uint32_t bits = widths[i];
    if (bits == kPivotWidth) continue;
    const float* row = x + i * len;
    const std::uint32_t clamped =
        bits == 2 ? encode_count_row_body<true>(row, len, a[i], b, 0, clamp_limit(2), z + i * len)
                  : encode_count_row_body<false>(row, len, a[i], b, code_qmax(bits),
                                                 clamp_limit(bits), z + i * len);
    worst = std::max(worst, clamped);
  }
  return worst;
}

STATEPOOL_SIMD_CLONES std::uint32_t encode_count_rows(const float* x, std::size_t rows,
                                                      std::uint32_t n, const float* a,
                                                      const float* b, const std::uint8_t* widths,
                                                      std::int32_t* z) {
  if (n == kCommonRow) return encode_count_rows_body<kCommonRow>(x, rows, n, a, b, widths, z);
  return encode_count_rows_body<0>(x, rows, n, a, b, widths, z);
}

// x_j = (r c_j) (g z_j), the dual-axis reconstruction of one row.
STATEPOOL_SIMD_CLONES void reconstruct_dual_row(const std::int32_t* z, std::size_t n, float r,
                                                const float* c, std::int32_t g, float* x) {
  for (std::size_t j = 0; j < n; ++j) {
    x[j] = dual_axis_value(r, c[j], z[j] * g);
  }
}

struct DualOptions {
  bool grid8 = false;  // KDA: rows on the shared 8-bit column grid
  bool refit = true;   // STEPQuant: impact-weighted least-squares refit of the columns
};

// The dual-axis fit (steps 1-4). widths: per row, checked; impact: per row, checked, or
// empty for all ones.
void fit_dual(std::span<const float> head, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const std::uint8_t> widths, std::span<const float> impact,
              DualOptions options, HeadFit& out) {
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  out.kind = options.grid8 ? FitKind::dual_axis_grid8 : FitKind::dual_axis;
  out.key_dim = key_dim;
  out.value_dim = value_dim;
  out.row_scale.assign(K, 0.0f);
  out.col_scale.assign(V, 0.0f);
  // Every code of a non-pivot row is written below; pivot rows are zeroed where they are
  // met (a head's codes are 64 KiB at 128 x 128: no memset of the whole array).
  out.codes.resize(K * V);
  out.pivot_values.clear();

  // q_i (largest grid code) and g_i (grid factor) per row.
  const auto row_qmax = [&](std::size_t i) { return row_code_limit(options.grid8, widths[i]); };
  const auto grid = [&](std::size_t i) { return row_grid(options.grid8, widths[i]); };

  // The per-thread buffers of the fit (no allocation once a thread has fitted a head of
  // this size).
  thread_local std::vector<float> sums, w, e, a, b, num, den, rg, ww;
  thread_local std::vector<std::int32_t> cm;
  thread_local std::vector<std::uint32_t> q, g, bits;
  sums.resize(K);
  e.resize(K);
  a.resize(K);
  b.resize(V);
  q.resize(K);
  g.resize(K);
  bits.resize(K);
  RowWidths row_widths;
  for (std::size_t i = 0; i < K; ++i) {
    const bool pivot = widths[i] == kPivotWidth;  // a pivot row's factors are unused
    q[i] = pivot ? 1u : row_qmax(i);
    g[i] = pivot ? 1u : grid(i);
    bits[i] = widths[i];
    row_widths.add(widths[i]);
  }
  if (impact.empty()) {
    w.assign(K, 1.0f);
  } else {
    w.assign(impact.begin(), impact.end());
  }

  // Steps 1 and 2 for blocks of rows while they are in L1: the row sums, the scales and
  // factors of the block's rows (vectorized across rows), their column maxima through
  // e_i = 1 / (r_i q_i). Then the pivot rows: scale 0, codes 0, values in fp16.
  cm.assign(V, 0);
  constexpr std::size_t kRowBlock = 16;
  std::uint32_t odd_sums = 0;  // rows whose sum is NaN or +-Inf
  for (std::size_t r0 = 0; r0 < K; r0 += kRowBlock) {
    const std::size_t rows = std::min(kRowBlock, K - r0);
    row_sums(head.data() + r0 * V, rows, value_dim, &sums[r0]);
    for (std::size_t r = r0; r < r0 + rows; ++r) {
      odd_sums |= static_cast<std::uint32_t>(is_non_finite_bits(float_bits(sums[r])));
    }
    row_scales(&sums[r0], rows, value_dim, &w[r0], &bits[r0], &out.row_scale[r0]);
    row_factors(&out.row_scale[r0], &q[r0], &g[r0], rows, &e[r0], &a[r0]);
    column_max_rows(head.data() + r0 * V, rows, value_dim, &e[r0], &widths[r0], cm.data());
  }
  column_scales(cm.data(), V, out.col_scale.data());
  // A sum of finite values can still overflow: only then are the values looked at.
  out.finite = odd_sums == 0 || std::none_of(head.begin(), head.end(), [](float v) {
                 return is_non_finite_bits(float_bits(v));
               });
  for (std::size_t p = 0; p < K; ++p) {
    if (widths[p] != kPivotWidth) continue;
    out.row_scale[p] = 0.0f;
    const std::size_t at = out.pivot_values.size();
    out.pivot_values.resize(at + V);
    fp16_values(head.data() + p * V, V, out.pivot_values.data() + at);
    std::fill_n(out.codes.begin() + static_cast<std::ptrdiff_t>(p * V), V, 0);
  }

  // Step 3 (and rounds of 4 and 3): levels through a_i = 1 / (r_i g_i) and b_j = 1 / c_j;
  // each round's levels feed its column sums in the same pass, so a head makes one pass
  // per round and one for the final levels.
  const auto encode = [&] {
    column_factors(out.col_scale.data(), V, b.data());
    encode_rows(head.data(), K, value_dim, a.data(), b.data(), widths.data(), out.codes.data());
  };
  const std::uint32_t rounds = refit_rounds(options.refit, row_widths);
  if (rounds == 0) {
    encode();
    return;
  }
  rg.resize(K);
  ww.resize(K);
  for (std::size_t i = 0; i < K; ++i) {
    rg[i] = out.row_scale[i] * static_cast<float>(g[i]);
    ww[i] = refit_weight(w[i]);
  }
  for (std::uint32_t round = 0; round < rounds; ++round) {
    column_factors(out.col_scale.data(), V, b.data());
    num.assign(V, 0.0f);
    den.assign(V, 0.0f);
    refit_rows(head.data(), K, value_dim, a.data(), b.data(), widths.data(), rg.data(), ww.data(),
               num.data(), den.data());
    refit_column_scales(num.data(), den.data(), V, out.col_scale.data());
  }
  encode();
}

}  // namespace

void fit_head(Arch arch, std::span<const float> head, std::uint32_t key_dim,
              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
              std::span<const float> impact, HeadFit& out, Refit refit) {
  check_shape(head, key_dim, value_dim);
  check_widths(arch, row_widths, key_dim);
  check_impact(impact, key_dim);
  fit_dual(head, key_dim, value_dim, row_widths, impact,
           {.grid8 = arch == Arch::kda, .refit = refit == Refit::on}, out);
}

CarriedStats fit_head_carried(Arch arch, std::span<const float> head, std::uint32_t key_dim,
                              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
                              std::span<const float> impact, std::span<const float> col_scale,
                              RowRule rule, HeadFit& out) {
  check_shape(head, key_dim, value_dim);
  check_widths(arch, row_widths, key_dim);
  check_impact(impact, key_dim);
  if (col_scale.size() != value_dim) {
    throw std::invalid_argument("stepquant carried fit: " + std::to_string(col_scale.size()) +
                                " column scales, expected " + std::to_string(value_dim));
  }
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  const bool grid8 = arch == Arch::kda;
  out.kind = grid8 ? FitKind::dual_axis_grid8 : FitKind::dual_axis;
  out.key_dim = key_dim;
  out.value_dim = value_dim;
  out.row_scale.assign(K, 0.0f);
  out.codes.resize(K * V);
  out.pivot_values.clear();
  out.col_scale.resize(V);

  thread_local std::vector<float> b;
  b.resize(V);
  bool lossy_columns = false;  // a usable scale has b_j > 0; the others are stored as 0
  for (std::size_t j = 0; j < V; ++j) {
    // A usable scale is finite and > 0 (its factor too); any other (a page's bytes are
    // client memory) codes its column as 0, so that lost_in_row counts its values.
    const float factor = column_code_factor(col_scale[j]);
    const bool usable = factor > 0.0f && factor <= std::numeric_limits<float>::max();
    b[j] = usable ? factor : 0.0f;
    out.col_scale[j] = usable ? col_scale[j] : 0.0f;
    lossy_columns = lossy_columns || !usable;
  }

  std::uint32_t odd = 0;  // rows with a NaN or +-Inf
  for (std::size_t i = 0; i < K; ++i) {  // pivot rows: values in fp16, codes 0
    if (row_widths[i] != kPivotWidth) continue;
    const float* x = head.data() + i * V;
    const std::size_t at = out.pivot_values.size();
    out.pivot_values.resize(at + V);
    fp16_values(x, V, out.pivot_values.data() + at);
    std::fill_n(out.codes.begin() + static_cast<std::ptrdiff_t>(i * V), V, 0);
    odd |= static_cast<std::uint32_t>(
        std::any_of(x, x + V, [](float v) { return is_non_finite_bits(float_bits(v)); }));
  }
  // Per row: q_i, g_i and the width (a pivot row's are unused), the maxima or the sums,
  // the scales by `rule` (vectorized across rows), a_i; then the codes.
  thread_local std::vector<float> w, sums, e, a;
  thread_local std::vector<std::uint32_t> q, g, bits, ratio;
  q.resize(K);
  g.resize(K);
  bits.resize(K);
  e.resize(K);
  a.resize(K);
  for (std::size_t i = 0; i < K; ++i) {
    const bool pivot = row_widths[i] == kPivotWidth;
    q[i] = pivot ? 1u : row_code_limit(grid8, row_widths[i]);
    g[i] = pivot ? 1u : row_grid(grid8, row_widths[i]);
    bits[i] = row_widths[i];
  }
  if (impact.empty()) {
    w.assign(K, 1.0f);
  } else {
    w.assign(impact.begin(), impact.end());
  }
  ratio.assign(K, 0);
  carried_maxima(head.data(), K, value_dim, b.data(), row_widths.data(), ratio.data(), odd);
  if (rule == RowRule::absmax) {
    carried_row_scales(ratio.data(), K, q.data(), bits.data(), out.row_scale.data());
  } else {
    sums.resize(K);
    row_sums(head.data(), K, value_dim, sums.data());
    row_scales(sums.data(), K, value_dim, w.data(), bits.data(), out.row_scale.data());
  }
  for (std::size_t i = 0; i < K; ++i) {
    if (row_widths[i] == kPivotWidth) out.row_scale[i] = 0.0f;
  }
  row_factors(out.row_scale.data(), q.data(), g.data(), K, e.data(), a.data());
  CarriedStats stats;
  stats.worst_row_clamps = encode_count_rows(head.data(), K, value_dim, a.data(), b.data(),
                                             row_widths.data(), out.codes.data());
  if (lossy_columns) {
    for (std::size_t i = 0; i < K; ++i) {
      if (row_widths[i] != kPivotWidth) {
        stats.lost_values += lost_in_row(head.data() + i * V, value_dim, b.data());
      }
    }
  }
  out.finite = odd == 0;
  return stats;
}

void fit_head_dsq(std::span<const float> head, std::uint32_t key_dim, std::uint32_t value_dim,
                  std::uint32_t bits, HeadFit& out) {
  check_shape(head, key_dim, value_dim);
  if (!is_supported_code_bits(bits)) {
    throw std::invalid_argument("dsq fit: width " + std::to_string(bits) +
                                " is not one of 2, 4, 6, 8");
  }
  const std::vector<std::uint8_t> widths(key_dim, static_cast<std::uint8_t>(bits));
  fit_dual(head, key_dim, value_dim, widths, {}, {.grid8 = false, .refit = false}, out);
}

void fit_head_absmax(Arch arch, std::span<const float> head, std::uint32_t key_dim,
                     std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
                     HeadFit& out) {
  check_shape(head, key_dim, value_dim);
  check_widths(arch, row_widths, key_dim);
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  out.kind = FitKind::row_absmax;
  out.key_dim = key_dim;
  out.value_dim = value_dim;
  out.row_scale.assign(K, 0.0f);
  out.col_scale.clear();
  out.codes.assign(K * V, 0);
  out.pivot_values.clear();
  out.finite = true;
  for (std::size_t i = 0; i < K; ++i) {
    const float* x = head.data() + i * V;
    if (row_widths[i] == kPivotWidth) {
      const std::size_t at = out.pivot_values.size();
      out.pivot_values.resize(at + V);
      fp16_values(x, V, out.pivot_values.data() + at);
      out.finite = out.finite && std::none_of(x, x + V, [](float v) {
                     return is_non_finite_bits(float_bits(v));
                   });
      continue;
    }
    const std::uint32_t bits = row_widths[i];
    std::uint32_t absmax = 0;
    for (std::size_t j = 0; j < V; ++j) {
      absmax = std::max(absmax, abs_bits(x[j]));
    }
    out.finite = out.finite && absmax < 0x7F800000u;  // |x| bits of Inf and NaN are larger
    const float s = absmax_row_scale(absmax, bits);
    out.row_scale[i] = s;
    const float inv = absmax_code_factor(s);
    std::int32_t* z = out.codes.data() + i * V;
    for (std::size_t j = 0; j < V; ++j) {
      z[j] = unit_level(absmax_code(x[j], inv, bits), bits);
    }
  }
}

void reconstruct(Arch arch, const HeadFit& fit, std::span<const std::uint8_t> row_widths,
                 std::span<float> out) {
  const std::size_t K = fit.key_dim;
  const std::size_t V = fit.value_dim;
  check_widths(arch, row_widths, fit.key_dim);
  if (K == 0 || V == 0 || out.size() != K * V || fit.codes.size() != K * V) {
    throw std::invalid_argument(
        "stepquant reconstruct: output or codes do not have key_dim * "
        "value_dim entries");
  }
  if (fit.kind == FitKind::dual_axis_grid8 && arch != Arch::kda) {
    throw std::invalid_argument("stepquant reconstruct: a shared-grid fit is a KDA fit");
  }
  const auto pivot_rows =
      static_cast<std::size_t>(std::count(row_widths.begin(), row_widths.end(), kPivotWidth));
  const bool dual = fit.kind == FitKind::dual_axis || fit.kind == FitKind::dual_axis_grid8;
  if (fit.row_scale.size() != K || (dual && fit.col_scale.size() != V) ||
      fit.pivot_values.size() != pivot_rows * V) {
    throw std::invalid_argument(
        "stepquant reconstruct: the fit does not match its shape or "
        "row widths");
  }

  const float* pivot = fit.pivot_values.data();
  for (std::size_t i = 0; i < K; ++i) {
    float* x = out.data() + i * V;
    if (row_widths[i] == kPivotWidth) {
      std::copy(pivot, pivot + V, x);
      pivot += V;
      continue;
    }
    const std::int32_t* z = fit.codes.data() + i * V;
    const float r = fit.row_scale[i];
    if (fit.kind == FitKind::row_absmax) {
      for (std::size_t j = 0; j < V; ++j) {
        x[j] = r * static_cast<float>(z[j]);
      }
      continue;
    }
    const auto g = static_cast<std::int32_t>(
        fit.kind == FitKind::dual_axis_grid8 ? grid_factor(row_widths[i]) : 1u);
    reconstruct_dual_row(z, V, r, fit.col_scale.data(), g, x);
  }
}

}  // namespace statepool::kernels::stepquant
