#pragma once
// A STEPQuant calibration plan: per-unit bit widths (with FP16 pivots) and per-row impact
// factors for one model shape. Produced by calibration (service/calibration), stored as a
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

namespace statepool::kernels::stepquant {

/// Width value that marks a pivot unit, stored as fp16 values.
inline constexpr std::uint8_t kPivotWidth = 16;

/// Candidate widths of the allocation (besides pivots).
[[nodiscard]] std::span<const std::uint8_t> candidate_widths(std::uint32_t budget_bits) noexcept;

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
  float gamma = 0.25f;            ///< impact exponent used
  std::uint32_t horizon = 2048;   ///< lifetime horizon T used
  std::uint64_t tokens = 0;       ///< calibration tokens consumed
  std::string source;             ///< free text: model, trace, tool version

  [[nodiscard]] std::size_t units() const noexcept;  ///< widths.size() a valid plan has
  [[nodiscard]] std::uint32_t pivots() const noexcept;
  /// Width of unit (layer, head) for GDN, (layer, head, row) for KDA.
  [[nodiscard]] std::uint8_t width(std::uint32_t layer, std::uint32_t head,
                                   std::uint32_t row = 0) const noexcept;
  [[nodiscard]] std::span<const float> head_impact(std::uint32_t layer,
                                                   std::uint32_t head) const noexcept;
  /// Average nominal bits per value over the units (pivots count 16).
  [[nodiscard]] double average_width() const noexcept;
};

/// Checks a plan on its own: shapes, sizes, widths in the candidates, finite positive
/// impact factors. Empty string when valid, else a message naming what is wrong.
[[nodiscard]] std::string validate(const Plan& plan);
/// Checks that the plan fits the layout (arch and every dimension, budget matching the
/// codec). Empty string when it does.
[[nodiscard]] std::string check_matches(const Plan& plan, const StateLayout& layout);

/// Serialized plan file (FlatBuffer, file identifier "SPQP"). to_bytes never fails for a
/// valid plan. from_bytes verifies the buffer, the format version and validate(); it
/// throws std::invalid_argument with a clear message and returns nothing partial.
[[nodiscard]] std::vector<std::byte> to_bytes(const Plan& plan);
[[nodiscard]] Plan from_bytes(std::span<const std::byte> bytes);
/// Reads / writes a plan file; errors name the path.
[[nodiscard]] Plan load(const std::string& path);
void save(const Plan& plan, const std::string& path);

/// Content digest of the plan's codec-relevant fields (shape, budget, widths, impact),
/// as 16 lowercase hex characters. Layouts name their plan by it on the wire.
[[nodiscard]] std::string digest(const Plan& plan);

}  // namespace statepool::kernels::stepquant
