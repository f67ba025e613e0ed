#pragma once
// The STEPQuant dual-axis fit (spatial axis) of one head, exposed for calibration (cost
// of a unit at a width) and tests. The codecs in kernels/cpu/stepquant_codec.cpp store
// exactly what these functions compute. Every scalar step below is a function of
// fit_math.hpp, which the CUDA kernels (cuda/block_codec.hpp) share, so that they store
// the same bytes.
//
// Head: row-major key_dim x value_dim FP32 values. Row widths in {2,4,6,8,kPivotWidth}.
// Impact: w_i > 0 per row (all ones = no spatial axis).
//
// The fit, exactly (page format 2, docs/codecs.md: binary32, every operation rounded to
// nearest even, no fused multiply-add; fp16(y) = float_to_half_bits of numeric.hpp
// applied to min(y, 65504); every scale is used as stored; L_b = level_max(b) of
// format.hpp (3 at 2 bits, 2^(b-1) - 1 otherwise); q_i = L_{b_i} and g_i = 1 for GDN and
// DSQ, g_i = grid_factor(b_i) (1, 4, 16, 32 at 8, 6, 4, 2 bits) and q_i = L_{b_i} g_i for
// KDA, the row's largest level on the shared 8-bit grid; 1/y is 0 for y = 0; S is the
// lane sum of fit_math.hpp's lane_partial and lane_tree: 32 strided lane partials, then a fixed
// tree):
//   1. r_i = fp16(sqrt(S_j |x_ij| / (V w_i))). A row whose r_i rounds to 0 (all zeros,
//      or values below about 1e-15) gets r_i = 1, or r_i = 0 at 2 bits. Per row
//      e_i = 1/(r_i q_i) and a_i = 1/(r_i g_i) (both products exact).
//   2. c_j = fp16(max_i (|x_ij| e_i)) over non-pivot rows; 0 when the column is zero (or
//      every row is a pivot). Per column b_j = 1/c_j.
//   3. t = (x_ij a_i) b_j; z_ij = clamp(round_half_even(t), -L_{b_i}, L_{b_i}) (the row
//      width's bound, also on KDA's grid), or at 2 bits the four-level z_ij = 2u - 3,
//      u = clamp(round_half_even((t + 3) * 0.5), 0, 3).
//   4. Refit (not DSQ): over non-pivot rows in row order, v = r_i g_i z_ij (exact),
//      t = (w_i w_i) v, N_j += t x_ij, D_j += t v; c_j = fp16(N_j / D_j) when D_j > 0 and
//      the quotient is finite, > 0 and does not round to 0, else c_j keeps its value.
//      Then b_j and step 3 again with the new c_j. Heads with a 2-bit row, or whose
//      non-pivot rows average 4 bits or fewer, run step 4 (and 3) twice (fit_math.hpp's
//      refit_rounds).
//   Reconstruction: x̂_ij = (r_i c_j) * (g_i z_ij) (dual_axis_value in format.hpp).
//   Pivot rows: x̂_ij = fp16(x_ij) (saturating at +-65504); their r_i is stored as 0.
// HeadFit::codes holds the levels z_ij; the pages store them as format.hpp's unit_code.
// (2-bit units were ternary {-1, 0, 1} in page format 1, and the paper's format before
// that; docs/codecs.md, "2-bit heads and rows", says what was measured.)
// Temporal-only fit (fit_head_absmax): per row s_i = fp16(absmax_i / L_{b_i}) (as the int
// codecs do), z_ij = the level of t = x_ij (1/s_i) as in step 3; x̂ = s_i z_ij.
//
// Every function throws std::invalid_argument on inconsistent sizes, a width outside
// {2,4,6,8,16}, a GDN head whose rows have different widths, or an impact factor that is
// not finite and > 0. Non-finite input values give unspecified but finite-sized results
// and HeadFit::finite = false.
//
// Thread-safety: pure functions; `out` is owned by the caller.

#include <cstdint>
#include <span>
#include <vector>

#include "statepool/kernels/layout.hpp"

namespace statepool::kernels::stepquant {

/// How a HeadFit reconstructs.
enum class FitKind : std::uint8_t {
  dual_axis,        ///< x̂ = r_i c_j z_ij (GDN heads, DSQ)
  dual_axis_grid8,  ///< x̂ = r_i c_j z_ij g_i (KDA heads, one shared column grid)
  row_absmax,       ///< x̂ = s_i z_ij (temporal_only)
};

/// What the fit stores, decoded: fp16 scales (as float values exactly representable in
/// fp16) and signed codes.
struct HeadFit {
  FitKind kind = FitKind::dual_axis;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  /// r_i [K] (dual axis; 0 for pivot rows) or s_i [K] (row_absmax; 0 for pivot rows).
  std::vector<float> row_scale;
  std::vector<float> col_scale;  ///< c_j [V] (dual axis kinds); empty otherwise
  /// z_ij, row-major K x V, levels in [-L_i, L_i] (the row's own level, without the grid
  /// factor); 0 for pivot rows.
  std::vector<std::int32_t> codes;
  /// fp16-rounded values of the pivot rows only, in row order, value_dim each.
  std::vector<float> pivot_values;
  /// False when a value of the head was NaN or +-Inf: the rest of the fit is then
  /// unspecified (finite-sized). Found without a pass of its own (a row's sum of |x| is
  /// finite unless a value is not, or the sum overflows; only then is the row scanned).
  bool finite = true;
};

/// Whether fit_head refits the column scales (step 4). Refit::off is the no_refit
/// ablation codec: measured on eval/, dropping the refit costs too much to be the
/// default (docs/codecs.md, "The refit").
enum class Refit : bool { off = false, on = true };

/// Full STEPQuant fit of one head: impact-weighted row scales, max-based column scales
/// over non-pivot rows, symmetric levels, one impact-weighted least-squares refit of the
/// columns (two in coarse heads, refit_rounds; none when `refit` is off), fp16 rounding of
/// every scale as stored, re-encode. KDA heads may mix widths (levels of a b-bit row are
/// scaled by grid_factor(b) onto the shared 8-bit column grid); GDN heads have one width for all
/// rows. A GDN head of pivots gives kind dual_axis with every row a pivot.
void fit_head(Arch arch, std::span<const float> head, std::uint32_t key_dim,
              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
              std::span<const float> impact, HeadFit& out, Refit refit = Refit::on);

/// How the carried fit chooses a row's scale.
enum class RowRule : std::uint8_t {
  absmax,  ///< r_i = fp16(max_j (|x_ij| b_j) / q_i): the row's largest value at its top level
  impact,  ///< r_i of step 1 (the row-impact rule); values beyond the top level clamp
};

/// What a carried fit saw, for the caller's choice of a full fit instead.
struct CarriedStats {
  /// The most clamped values in one row (values whose quotient is beyond the row's top
  /// level, clamp_limit of fit_math.hpp).
  std::uint32_t worst_row_clamps = 0;
  /// Non-zero values in columns whose carried scale is unusable (0, negative, +Inf or
  /// NaN; stored as 0): they would decode as 0. A caller must not keep such a fit.
  std::uint32_t lost_values = 0;
};

/// The carried fit (step mode "carried", docs/codecs.md): the column scales are the
/// head's previous ones (`col_scale`, V values as decoded from the page's fp16; an
/// unusable one, not finite and > 0, is stored as 0), each non-pivot row gets a fresh
/// scale by `rule`, and step 3 codes the values against them with a_i = 1 / (r_i g_i) and
/// b_j = 1 / c_j. No column maximum, no refit. Pivot rows as in fit_head. Checks and
/// `out.finite` as fit_head's; `col_scale.size()` must be value_dim.
CarriedStats fit_head_carried(Arch arch, std::span<const float> head, std::uint32_t key_dim,
                              std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
                              std::span<const float> impact, std::span<const float> col_scale,
                              RowRule rule, HeadFit& out);

/// Reconstruction x̂ of a fit (row-major key_dim x value_dim). `arch` must be the one the
/// fit was made for (KDA for dual_axis_grid8); `row_widths` the widths it was made with.
void reconstruct(Arch arch, const HeadFit& fit, std::span<const std::uint8_t> row_widths,
                 std::span<float> out);

/// The DSQ baseline fit: steps 1-3 of the fit above with w_i = 1, q_i = L_bits, g_i = 1
/// (r_i = fp16(sqrt(S_j |x_ij| / V)) by the lane sum, c_j = fp16(max_i (|x_ij| e_i))),
/// uniform width, no impact, no refit. Kind dual_axis (reconstruct with any arch
/// and `bits` for every row). bits is 4 or 6 (2 and 8 are accepted too).
void fit_head_dsq(std::span<const float> head, std::uint32_t key_dim, std::uint32_t value_dim,
                  std::uint32_t bits, HeadFit& out);

/// The temporal_only fit: plain per-row absmax scales at the row's width, pivot rows as
/// fp16 (see the header comment). Kind row_absmax. GDN heads must have one width.
void fit_head_absmax(Arch arch, std::span<const float> head, std::uint32_t key_dim,
                     std::uint32_t value_dim, std::span<const std::uint8_t> row_widths,
                     HeadFit& out);

}  // namespace statepool::kernels::stepquant
