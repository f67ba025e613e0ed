// The STEPQuant / DSQ / temporal-only fits of one head (stepquant/fit.hpp, which states
// the arithmetic exactly). The loops run over one row at a time with per-row constants
// so that they vectorize across columns; every reduction has a fixed order. The scalar
// steps are stepquant/fit_math.hpp's, which the CUDA kernels use too.

#include <algorithm>
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

// Step 1 for one row (the sum and its rounding are fit_math.hpp's): the rows after the
// last whole group of abs_sums8.
STATEPOOL_SIMD_CLONES double abs_sum(const float* x, std::uint32_t n) {
  return row_abs_sum(x, n);
}

// row_abs_sum of eight rows `stride` apart, computed together: each row's four lanes are
// summed exactly as row_abs_sum sums them (the same additions in the same order), but
// the eight rows' chains of dependent binary64 additions are independent, so they overlap
// instead of waiting for each other (an addition's latency is four of its throughput).
// GCC/Clang vector types keep one row's four lanes in one register (the auto-vectorizer
// would put the rows in the lanes and gather).
using F32x4 = float __attribute__((vector_size(16)));
using I32x4 = std::int32_t __attribute__((vector_size(16)));
using F64x4 = double __attribute__((vector_size(32)));
constexpr std::size_t kSumRows = 8;

STATEPOOL_SIMD_CLONES void abs_sums8(const float* x, std::size_t stride, std::uint32_t n,
                                     double* out) {
  F64x4 s[kSumRows] = {};
  std::uint32_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (std::size_t r = 0; r < kSumRows; ++r) {
      F32x4 v;
      std::memcpy(&v, x + r * stride + j, sizeof v);
      // |x| in binary32 is exact, and so is its conversion: the same value as abs_f64(x).
      const auto magnitude = std::bit_cast<F32x4>(std::bit_cast<I32x4>(v) & 0x7FFFFFFF);
      s[r] += __builtin_convertvector(magnitude, F64x4);
    }
  }
  for (std::size_t r = 0; r < kSumRows; ++r) {
    double lane[4] = {s[r][0], s[r][1], s[r][2], s[r][3]};
    for (std::uint32_t l = 0; j + l < n; ++l)
      lane[l] = add_f64(lane[l], abs_f64(x[r * stride + j + l]));
    out[r] = add_f64(add_f64(lane[0], lane[1]), add_f64(lane[2], lane[3]));
  }
}

// Step 1's row scales from the row sums, every row (pivot rows too; the caller overwrites
// theirs). impact: per row, or null for all ones.
STATEPOOL_SIMD_CLONES void row_scales(const double* sums, std::size_t rows, std::uint32_t n,
                                      const float* impact, float* out) {
  for (std::size_t i = 0; i < rows; ++i) {
    const double w = impact == nullptr ? 1.0 : static_cast<double>(impact[i]);
    out[i] = row_scale_from_sum(sums[i], n, w);
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

// Step 3's column divisors.
STATEPOOL_SIMD_CLONES void column_divisors(const float* c, std::size_t n, float* c_div) {
  for (std::size_t j = 0; j < n; ++j) {
    c_div[j] = column_divisor(c[j]);
  }
}

// Step 4's refitted column scales (in place).
STATEPOOL_SIMD_CLONES void refit_column_scales(const double* num, const double* den,
                                               std::size_t n, float* c) {
  for (std::size_t j = 0; j < n; ++j) {
    c[j] = refit_column_scale(num[j], den[j], c[j]);
  }
}

// Step 2 for one row: cm[j] = max(cm[j], |x_j| / dq), as bits (non-negative floats order
// like their bits; int32 compares vectorize on SSE2).
STATEPOOL_SIMD_CLONES void column_max_row(const float* x, std::uint32_t n, float dq,
                                          std::int32_t* cm) {
  for (std::uint32_t j = 0; j < n; ++j) {
    const auto t = static_cast<std::int32_t>(column_ratio_bits(x[j], dq));
    cm[j] = std::max(cm[j], t);
  }
}

// Step 3 for one row: z_j = clamp(round_half_even(x_j / ((r g) c_j)), -qmax, qmax).
// `c_div` holds column_divisor(c_j).
STATEPOOL_SIMD_CLONES void encode_row(const float* x, std::uint32_t n, float rg, const float* c_div,
                                      std::uint32_t qmax, std::int32_t* z) {
  const auto offset = static_cast<std::int32_t>(qmax);
  for (std::uint32_t j = 0; j < n; ++j) {
    z[j] = static_cast<std::int32_t>(dual_code(x[j], rg, c_div[j], qmax)) - offset;
  }
}

// Step 4 accumulation for one row, in binary64 (row order is the caller's loop order).
STATEPOOL_SIMD_CLONES void refit_row(const float* x, const std::int32_t* z, std::uint32_t n,
                                     float rg, double ww, double* num, double* den) {
  for (std::uint32_t j = 0; j < n; ++j) {
    refit_accumulate(x[j], z[j], rg, ww, num[j], den[j]);
  }
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

  const auto weight = [&](std::size_t i) {
    return impact.empty() ? 1.0 : static_cast<double>(impact[i]);
  };
  // q_i (largest grid code) and g_i (grid factor) per row.
  const auto row_qmax = [&](std::size_t i) { return row_code_limit(options.grid8, widths[i]); };
  const auto grid = [&](std::size_t i) { return row_grid(options.grid8, widths[i]); };

  // Step 1: the row sums eight rows at a time, the scales of every row, then the pivot
  // rows (scale 0, codes 0, values in fp16).
  std::vector<double> sums(K);
  const std::size_t grouped = K - K % kSumRows;
  for (std::size_t r = 0; r < grouped; r += kSumRows) {
    abs_sums8(head.data() + r * V, V, value_dim, &sums[r]);
  }
  for (std::size_t r = grouped; r < K; ++r) sums[r] = abs_sum(head.data() + r * V, value_dim);
  row_scales(sums.data(), K, value_dim, impact.empty() ? nullptr : impact.data(),
             out.row_scale.data());
  for (std::size_t p = 0; p < K; ++p) {
    if (widths[p] != kPivotWidth) continue;
    out.row_scale[p] = 0.0f;
    const std::size_t at = out.pivot_values.size();
    out.pivot_values.resize(at + V);
    fp16_values(head.data() + p * V, V, out.pivot_values.data() + at);
    std::fill_n(out.codes.begin() + static_cast<std::ptrdiff_t>(p * V), V, 0);
  }

  // Step 2.
  std::vector<std::int32_t> cm(V, 0);
  for (std::size_t i = 0; i < K; ++i) {
    if (widths[i] != kPivotWidth) {
      const float dq = out.row_scale[i] * static_cast<float>(row_qmax(i));  // exact
      column_max_row(head.data() + i * V, value_dim, dq, cm.data());
    }
  }
  column_scales(cm.data(), V, out.col_scale.data());

  // Step 3 (and 4, 3 again).
  std::vector<float> c_div(V);
  const auto encode = [&] {
    column_divisors(out.col_scale.data(), V, c_div.data());
    for (std::size_t i = 0; i < K; ++i) {
      if (widths[i] != kPivotWidth) {
        encode_row(head.data() + i * V, value_dim, out.row_scale[i] * static_cast<float>(grid(i)),
                   c_div.data(), code_qmax(widths[i]), out.codes.data() + i * V);
      }
    }
  };
  encode();
  if (!options.refit) {
    return;
  }
  std::vector<double> num(V, 0.0);
  std::vector<double> den(V, 0.0);
  for (std::size_t i = 0; i < K; ++i) {
    if (widths[i] != kPivotWidth) {
      const double w = weight(i);
      refit_row(head.data() + i * V, out.codes.data() + i * V, value_dim,
                out.row_scale[i] * static_cast<float>(grid(i)), w * w, num.data(), den.data());
    }
  }
  refit_column_scales(num.data(), den.data(), V, out.col_scale.data());
  encode();
}

}  // namespace

void fit_head(Arch arch, std::span<const float> head, std::uint32_t key_dim,
              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
              std::span<const float> impact, HeadFit& out) {
  check_shape(head, key_dim, value_dim);
  check_widths(arch, row_widths, key_dim);
  check_impact(impact, key_dim);
  fit_dual(head, key_dim, value_dim, row_widths, impact,
           {.grid8 = arch == Arch::kda, .refit = true}, out);
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
  for (std::size_t i = 0; i < K; ++i) {
    const float* x = head.data() + i * V;
    if (row_widths[i] == kPivotWidth) {
      const std::size_t at = out.pivot_values.size();
      out.pivot_values.resize(at + V);
      fp16_values(x, V, out.pivot_values.data() + at);
      continue;
    }
    const std::uint32_t qmax = code_qmax(row_widths[i]);
    std::uint32_t absmax = 0;
    for (std::size_t j = 0; j < V; ++j) {
      absmax = std::max(absmax, abs_bits(x[j]));
    }
    const float s = absmax_row_scale(absmax, qmax);
    out.row_scale[i] = s;
    std::int32_t* z = out.codes.data() + i * V;
    for (std::size_t j = 0; j < V; ++j) {
      z[j] =
          static_cast<std::int32_t>(uniform_code(x[j], s, qmax)) - static_cast<std::int32_t>(qmax);
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
