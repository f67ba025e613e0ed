#pragma once
// A STEPQuant calibration plan: per-unit bit widths (with FP16 pivots) and per-row impact
// factors for one model shape. Produced by calibration (calibration/), stored as a
// versioned, verified FlatBuffer file (kernels/stepquant/plan.fbs; docs/plans.md), loaded
// by the daemon and by clients that decode pages locally, and fixed for every page of a
// layout. Units: a whole head for GDN, one key row of one head for KDA.
//
// Thread-safety: plain immutable data once built; share it as shared_ptr<const Plan>.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/format.hpp"  // kPivotWidth

namespace statepool::kernels::stepquant {

/// Candidate widths of the allocation (besides pivots): {4, 6, 8} for a 6-bit budget,
/// {2, 4, 6, 8} for a 4-bit budget, empty for any other budget.
[[nodiscard]] std::span<const std::uint8_t> candidate_widths(std::uint32_t budget_bits) noexcept;

/// Paper's pivot shares: 32 heads of 48 x 48 = 2304 (1.39%) for Qwen GDN (the fraction the
/// paper quotes; on Qwen3-Next's 36 x 32 = 1152 heads it gives 16), and 512 rows of
/// 20 layers x 32 heads x 128 rows (0.625%) for Kimi KDA.
inline constexpr double kGdnPivotShare = 32.0 / 2304.0;
inline constexpr double kKdaPivotShare = 512.0 / (20.0 * 32.0 * 128.0);

/// Default number of pivots: round(share * units), at least 0 and at most units.
[[nodiscard]] std::uint32_t default_pivot_count(Arch arch, std::size_t units) noexcept;

struct Plan;
/// Nominal plan of a shape (layout's arch and dimensions; its codec and plan are ignored):
/// every unit at `budget_bits` (6 or 4), the first default_pivot_count(arch, units) units as
/// FP16 pivots, impact all 1. What the capacity planner sizes pages with before a model is
/// calibrated; a calibrated plan's bytes differ slightly (its allocator gives pivots' extra
/// bits back). Throws std::invalid_argument for a budget other than 4 or 6.
[[nodiscard]] Plan nominal_plan(const StateLayout& layout, std::uint32_t budget_bits);

struct Plan {
  static constexpr std::uint32_t kFormatVersion = 1;

  Arch arch = Arch::gdn;
  std::uint32_t num_layers = 0;
  std::uint32_t num_heads = 0;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  /// Nominal budget in bits per value: 6 (widths {4,6,8}) or 4 (widths {2,4,6,8}).
  std::uint32_t budget_bits = 6;
  /// One width per unit, in {candidate_widths(budget_bits)} or kPivotWidth.
  /// GDN: [layer][head]; KDA: [layer][head][row].
  std::vector<std::uint8_t> widths;
  /// Impact factor w_i per key row, [layer][head][row]; finite and > 0. A plan calibrated
  /// without the spatial axis holds all ones.
  std::vector<float> impact;

  // --- provenance (reported, not used by the codec) ---------------------------------
  /// Mean log-decay per unit (same indexing as widths); may be empty.
  std::vector<float> mean_log_decay;
  float gamma = 0.25f;           ///< impact exponent used
  std::uint32_t horizon = 2048;  ///< lifetime horizon T used
  std::uint64_t tokens = 0;      ///< calibration tokens consumed
  std::string source;            ///< free text: model, trace, tool version
  /// STEPQuant page format (kPageFormat) the plan was calibrated with: 1 for plan
  /// files without the field (builds before 2026-12-05), whose 2-bit units were costed
  /// as ternary; such plans still load and encode in this build's format, and
  /// calibrating again gives allocations measured with the current 2-bit units.
  std::uint32_t page_format = kPageFormat;

  [[nodiscard]] std::size_t units() const noexcept;  ///< widths.size() a valid plan has
  [[nodiscard]] std::uint32_t pivots() const noexcept;
  /// Width of unit (layer, head) for GDN, (layer, head, row) for KDA.
  [[nodiscard]] std::uint8_t width(std::uint32_t layer, std::uint32_t head,
                                   std::uint32_t row = 0) const noexcept;
  [[nodiscard]] std::span<const float> head_impact(std::uint32_t layer,
                                                   std::uint32_t head) const noexcept;
  /// Average nominal bits per value over the units (pivots count 16).
  [[nodiscard]] double average_width() const noexcept;

  /// Every field equal, provenance included (floats compared by value).
  friend bool operator==(const Plan&, const Plan&) = default;
};

/// True when two plans make the same pages: arch, dimensions, budget, widths and impact
/// equal (impact compared bit for bit); provenance is ignored. Equal codec fields imply
/// equal digests.
[[nodiscard]] bool same_codec_fields(const Plan& a, const Plan& b) noexcept;

/// Empty, or a note for people about a plan calibrated with an older page format whose
/// 2-bit units it allocates: it works as it is (its units decode in this build's format),
/// but calibrating again sizes those units by the current format's errors.
[[nodiscard]] std::string page_format_note(const Plan& plan);

/// Checks a plan on its own: shapes, sizes, widths in the candidates, finite positive
/// impact factors. Empty string when valid, else a message naming what is wrong.
[[nodiscard]] std::string validate(const Plan& plan);
/// Checks that the plan fits the layout (arch and every dimension, budget matching the
/// codec: 6 for stepquant6, 4 for stepquant4). Empty string when it does. Assumes a valid
/// plan; does not look at layout.plan.
[[nodiscard]] std::string check_matches(const Plan& plan, const StateLayout& layout);

/// Width the codec stores for row `row` of head (layer, head) under `variant`: the plan's
/// width (GDN: the head's, for every row) for full and temporal_only; for spatial_only,
/// budget_bits for every non-pivot unit (pivots stay pivots). `plan` must be valid and
/// the indices in range.
[[nodiscard]] std::uint8_t stored_width(const Plan& plan, StepQuantVariant variant,
                                        std::uint32_t layer, std::uint32_t head,
                                        std::uint32_t row) noexcept;
/// Bytes of the encoded head (layer, head) of a stepquant page for `variant`
/// (stepquant/format.hpp; a multiple of 4). `plan` must be valid, the indices in range.
[[nodiscard]] std::size_t head_bytes(const Plan& plan, StepQuantVariant variant,
                                     std::uint32_t layer, std::uint32_t head) noexcept;

/// Largest plan file from_bytes / load accept.
inline constexpr std::size_t kMaxPlanBytes = std::size_t{256} << 20;

/// Serialized plan file (FlatBuffer, file identifier "SPQP"). to_bytes never fails for a
/// valid plan (it throws std::invalid_argument, naming the problem, for an invalid one).
/// from_bytes verifies the buffer, the format version and validate(); it throws
/// std::invalid_argument with a clear message and returns nothing partial.
[[nodiscard]] std::vector<std::byte> to_bytes(const Plan& plan);
[[nodiscard]] Plan from_bytes(std::span<const std::byte> bytes);
/// Reads / writes a plan file; errors (std::invalid_argument for a bad file or plan,
/// std::runtime_error for an I/O failure) name the path. save writes a temporary file
/// next to `path`, fsyncs it and renames it over `path`, so readers see the old file or
/// the whole new one.
[[nodiscard]] Plan load(const std::string& path);
void save(const Plan& plan, const std::string& path);

/// Content digest of the plan's codec-relevant fields (shape, budget, widths, impact),
/// as 16 lowercase hex characters: FNV-1a 64 over a canonical little-endian encoding
/// (docs/plans.md). Layouts name their plan by it on the wire. Not collision resistant
/// against a deliberate forger: whoever keys plans by digest should compare
/// same_codec_fields() when a digest is already known.
[[nodiscard]] std::string digest(const Plan& plan);
/// The same digest as a number.
[[nodiscard]] std::uint64_t digest_value(const Plan& plan) noexcept;

}  // namespace statepool::kernels::stepquant
