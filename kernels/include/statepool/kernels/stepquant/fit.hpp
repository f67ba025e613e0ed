#pragma once
// The STEPQuant dual-axis fit (spatial axis) of one head, exposed for calibration (cost
// of a unit at a width) and tests. The codecs in kernels/cpu/stepquant_codec.cpp store
// exactly what these functions compute.
//
// Head: row-major key_dim x value_dim FP32 values. Row widths in {2,4,6,8,kPivotWidth}.
// Impact: w_i > 0 per row (all ones = no spatial axis).

#include <cstdint>
#include <span>
#include <vector>

#include "statepool/kernels/layout.hpp"

namespace statepool::kernels::stepquant {

/// What the fit stores, decoded: fp16 scales (as float values exactly representable in
/// fp16) and signed codes. For 2-bit GDN heads `row_scale` holds value_dim/32 (rounded up)
/// scales per row and col_scale is unused.
struct HeadFit {
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::vector<float> row_scale;      ///< r_i (or per-32-value scales for 2-bit GDN heads)
  std::vector<float> col_scale;      ///< c_j
  std::vector<std::int32_t> codes;   ///< z_ij, row-major; 0 for pivot rows
  std::vector<float> pivot_values;   ///< fp16-rounded values of pivot rows, row-major
};

/// Full STEPQuant fit of one head: impact-weighted row scales, max-based column scales
/// over non-pivot rows, symmetric codes, one impact-weighted least-squares refit of the
/// columns, fp16 rounding of every scale as stored, re-encode. KDA heads may mix widths
/// (codes of a b-bit row are scaled by 2^(8-b) onto the shared 8-bit column grid); GDN
/// heads have one width for all rows, and 2-bit GDN heads use levels {-3,-1,1,3} with
/// per-32-value row scales.
void fit_head(Arch arch, std::span<const float> head, std::uint32_t key_dim,
              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
              std::span<const float> impact, HeadFit& out);

/// Reconstruction x̂ of a fit (row-major key_dim x value_dim).
void reconstruct(Arch arch, const HeadFit& fit, std::span<const std::uint8_t> row_widths,
                 std::span<float> out);

/// The DSQ baseline fit: r_i = fp16(sqrt(mean_j |x_ij|)), c_j = fp16(max_i |x_ij / r_i| /
/// qmax), uniform width, no impact, no refit.
void fit_head_dsq(std::span<const float> head, std::uint32_t key_dim, std::uint32_t value_dim,
                  std::uint32_t bits, HeadFit& out);

}  // namespace statepool::kernels::stepquant
