#pragma once
// From calibration statistics to a STEPQuant plan (STEPQUANT.md, "Bit allocation").
//
//   measure_layer   one layer's accumulator -> LayerCosts: impact factors per row, mean
//                   log-decay and lifetime weight per unit, and the mean squared
//                   reconstruction error of every unit at every candidate width (and as
//                   an fp16 pivot) over the layer's snapshots, using the real fit
//                   (kernels::stepquant::fit_head / reconstruct).
//   build_plan      all layers' costs -> pivots, allocation, Plan, Report.
//
// Costs. The default, CostModel::output: the error a unit's quantization puts into its
//   head's output over the error's life, relative to the head's output energy:
//   cost(u, b) = sum over the unit's rows i of W_i e_i(b) / E_out, with W_i the readout
//   weights the accumulator's probes measure through the delta rule, e_i(b) the row's
//   summed squared error (mean over snapshots) and E_out the head's mean ||S^T q||^2.
//   Stored as mse(u, b) * L_u (GDN: mse = sum_i W_i e_i / (K V), L = K V / E_out; KDA:
//   mse = e_i / V, L = V W_i / E_out), so that the allocation below is the same for
//   every cost model. The other two (docs/calibration.md, "Costs"):
// cost(u, b) = mse(u, b) * L_u with L_u = lifetime_weight(mean log-decay, horizon).
//   GDN (unit = head): the head is fitted with every row at width b and impact w;
//     mse = mean over snapshots of sum_ij w_i^2 (x_ij - x̂_ij)^2 / (K V).
//   KDA (unit = key row): the head is fitted with *every* row at width b (one fit per
//     width, not one per row and width) and each row's own error is read off:
//     mse_i = mean over snapshots of sum_j (x_ij - x̂_ij)^2 / V. In the real page a row
//     shares its column scales with rows of other widths, so this is an approximation:
//     the column scales of a mixed head are set by its widest rows (the 8-bit grid), which
//     the all-rows-at-b fit does not see. Not impact-weighted (the specification weights
//     GDN costs only).
//   Pivot cost: the error of storing the unit as fp16 values, weighted the same way.
//   Relative cost (CostModel::relative, the default): both are divided by the head's
//     energy E_h = mean over snapshots of sum_ij w_i^2 x_ij^2 / (K V) (GDN; KDA without
//     the weights), so a unit's cost is its error relative to its own head's state. A
//     head's readout is RMS-normalised before the output projection (Qwen3-Next: a gated
//     RMSNorm per head), so a small, fast-forgetting head turns the same absolute error
//     into a larger output error than a large one; the absolute cost (the paper's) sends
//     such heads to 2 bits. Measured on the trained models of eval/README.md. A head
//     whose snapshots are all zero keeps its absolute costs.
// Pivots (at most P units stored as fp16), ranked by risk: GDN: the heads with the highest
// cost after a first allocation (DP, budget B n, no pivots); KDA: the rows with the highest
// cost(8) - cost(fp16). Default P: kernels::stepquant::default_pivot_count (plan.hpp).
// Allocation of the other units: sum_u b_u <= B n - 8 p, n = all units of the model (each
// pivot takes 8 bits of the nominal budget; the other 8 of its 16 are extra, so the
// plan's average width, pivots counted at 16, is B + 8 p / n). GDN: allocate_dp; KDA:
// allocate_lagrangian. This is done for every p in [0, P] (the p riskiest units as
// pivots; for P > kPivotSteps, for 0 and kPivotSteps evenly spaced counts up to P) and the
// p of least expected cost is kept (ties: fewer), so that the plan's expected cost is
// never above that of no pivots or of all P of them, and for P <= kPivotSteps asking for
// more pivots never raises it (a pivot that saves less than the 8 bits it takes from the
// others is not used).
//
// Thread-safety: pure functions (measure_layer may use `threads` worker threads).

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/calibration/accumulator.hpp"
#include "statepool/calibration/allocate.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::calibration {

/// Pivot counts build_plan tries beyond 0 (see the header comment).
inline constexpr std::uint32_t kPivotSteps = 64;

/// What a unit's reconstruction error is measured against (see the header comment).
enum class CostModel : std::uint8_t {
  /// Squared error relative to the mean energy of the unit's head (default, ours): every
  /// model of the family normalises each head's readout (an RMSNorm per head), so what
  /// reaches the output is a head's error relative to its own state.
  relative = 0,
  /// Absolute squared error (the paper's cost).
  absolute = 1,
  /// The unit's expected error in its head's output over the error's life, relative to the
  /// head's output energy: row errors weighted by the readout weights W_i that the
  /// accumulator's probes measure through the delta rule (see the header comment).
  output = 2,
};

/// "relative", "absolute", "output".
[[nodiscard]] const char* to_string(CostModel cost) noexcept;
/// The model named `text` (to_string's names); false for any other text.
[[nodiscard]] bool parse_cost_model(std::string_view text, CostModel& out) noexcept;

struct PlanOptions {
  /// Nominal bits per value: 6 (widths {4,6,8}) or 4 (widths {2,4,6,8}).
  std::uint32_t budget_bits = 6;
  /// Number of pivot units; unset = default_pivot_count(arch, units).
  std::optional<std::uint32_t> pivots;
  /// Impact exponent; 0 disables the spatial axis (all impact factors 1).
  double gamma = 0.25;
  /// Lifetime horizon T in tokens.
  std::uint32_t horizon = 2048;
  CostModel cost = CostModel::output;
  /// The allocation (widths and pivots) is kept only when its expected cost is below
  /// (1 - min_gain) x that of the uniform plan (every unit at the budget width, no
  /// pivots); otherwise the plan is uniform. The costs price each unit on its own, so a
  /// small predicted gain is within what they cannot see (an error's path through the
  /// later layers): on eval/'s models, allocations predicted to gain 1-7% were no better
  /// end to end than the uniform widths (worse output TV on gdn-fast), those predicted
  /// to gain 30-75% much better (docs/calibration.md). 0 keeps any allocation that lowers
  /// the cost. In [0, 1).
  double min_gain = 0.1;
  /// Free text stored in the plan (model, trace, tool version).
  std::string source;
  /// Worker threads for measure_layer (heads in parallel); 0 or 1 = the calling thread.
  std::uint32_t threads = 1;
};

/// Model shape the plan is for.
struct PlanShape {
  kernels::Arch arch = kernels::Arch::gdn;
  std::uint32_t layers = 0;
  std::uint32_t heads = 0;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  [[nodiscard]] std::uint32_t units_per_head() const noexcept;
  [[nodiscard]] std::size_t units() const noexcept;
};

/// What plan building needs of one layer (no snapshots).
struct LayerCosts {
  std::uint32_t layer = 0;
  std::uint64_t tokens = 0;            ///< tokens seen per head
  std::uint32_t min_snapshots = 0;     ///< fewest snapshots any head had
  std::vector<std::uint8_t> widths;    ///< candidate widths the mse columns refer to
  std::vector<float> impact;           ///< [head][row]
  std::vector<double> mean_log_decay;  ///< per unit ([head] or [head][row])
  std::vector<double> lifetime;        ///< per unit
  std::vector<double> mse;             ///< [unit][width index], before the lifetime weight
  std::vector<double> pivot_mse;       ///< per unit, fp16 storage, before the lifetime weight
};

/// Measures one layer. Throws std::invalid_argument when a head has no snapshot (trace
/// shorter than snapshot_every tokens) or the options are invalid.
[[nodiscard]] LayerCosts measure_layer(const LayerAccumulator& accumulator,
                                       const PlanOptions& options);

/// Report of a plan, for people (format_report) and tools.
struct Report {
  struct Layer {
    std::uint32_t layer = 0;
    /// Units at width 2, 4, 6, 8 and pivots (16).
    std::array<std::uint32_t, 5> histogram{};
    double average_width = 0.0;
    double min_log_decay = 0.0;  ///< over the layer's units
    double max_log_decay = 0.0;
  };
  struct Pivot {
    std::uint32_t layer = 0;
    std::uint32_t head = 0;
    std::uint32_t row = 0;  ///< 0 for GDN
    double mean_log_decay = 0.0;
    double risk = 0.0;  ///< what it was chosen by (see plan_builder.hpp)
  };
  /// Units grouped by mean log-decay (quartiles: slowest-decaying first).
  struct DecayBand {
    double min_log_decay = 0.0;
    double max_log_decay = 0.0;
    std::size_t units = 0;
    double average_width = 0.0;  ///< pivots counted at 16
  };

  PlanShape shape;
  std::uint32_t budget_bits = 0;
  CostModel cost = CostModel::output;
  std::size_t units = 0;
  std::uint64_t tokens = 0;
  std::vector<Layer> layers;
  std::vector<Pivot> pivots;           ///< the pivots used (at most pivots_requested)
  std::uint32_t pivots_requested = 0;  ///< P: the most the allocation could use
  std::vector<DecayBand> bands;
  /// Average nominal width, pivots at 16: B + 8 P / n at most.
  double average_width = 0.0;
  /// Sum of lifetime-weighted costs of the plan, and of every unit at the nominal width B
  /// with no pivots (the uniform baseline of the same budget); their ratio is what the
  /// allocation buys on the calibration snapshots.
  double expected_cost = 0.0;
  double uniform_cost = 0.0;
  /// The allocation's expected cost, and whether it gained less than min_gain, so that
  /// the plan is uniform (then expected_cost == uniform_cost).
  double allocation_cost = 0.0;
  double min_gain = 0.0;
  bool uniform_kept = false;

  /// Page sizes of one whole state (recurrent part, no conv state) with the plan, measured
  /// by kernels::PageCodec. page_note says why they are missing when page_bytes == 0.
  std::size_t page_bytes = 0;
  std::size_t uniform_int_page_bytes = 0;  ///< int{B} (group 128) page of the same shape
  std::size_t fp32_bytes = 0;
  std::size_t bf16_bytes = 0;
  std::string page_note;
};

struct PlanResult {
  kernels::stepquant::Plan plan;
  Report report;
};

/// Builds the plan from every layer's costs (layers in order 0 .. shape.layers-1).
/// `tokens` is recorded in the plan. Throws std::invalid_argument on inconsistent inputs,
/// an unsupported budget, or more pivots than the budget can pay for.
[[nodiscard]] PlanResult build_plan(const PlanShape& shape, std::span<const LayerCosts> layers,
                                    const PlanOptions& options, std::uint64_t tokens);

/// Fills the page fields of `report` with PageCodec (stepquant{B} with the plan, int{B},
/// fp32, bf16). Leaves them 0 and sets page_note when the codec cannot be built.
void measure_pages(const kernels::stepquant::Plan& plan, Report& report);

/// Human-readable report (multi-line).
[[nodiscard]] std::string format_report(const Report& report);

}  // namespace statepool::calibration
