#pragma once
// The shape of one request's whole recurrent state for one model, and the codec that
// stores it. One page of an arena holds exactly one such state (all linear layers).
//
// Plain data; thread-safe to share once built.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace statepool::kernels {

/// Gated delta rule family: GDN (Qwen3-Next/Qwen3.5, one gate per head) or KDA
/// (Kimi-Linear, one gate per key row). Values match wire::Arch.
enum class Arch : std::uint8_t { gdn = 0, kda = 1 };

/// Element type of full-precision data. Values match wire::DType.
enum class DType : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

/// Codec of the recurrent state. Values match wire::CodecId.
/// stepquant4/6 need a calibration plan (StateLayout::plan) whose budget is 4/6 bits;
/// dsq4/dsq6 are the dual-scale baselines (no plan). See ../shared/STEPQUANT.md.
enum class CodecId : std::uint8_t {
  fp32 = 0,
  bf16 = 1,
  fp16 = 2,
  int4 = 3,
  int6 = 4,
  int8 = 5,
  stepquant4 = 6,
  stepquant6 = 7,
  dsq4 = 8,
  dsq6 = 9,
};

/// STEPQuant ablation switches (the paper's table): both axes, the spatial axis only
/// (impact-weighted dual-axis fit at uniform width), or the temporal axis only (the plan's
/// per-unit widths with plain absmax scales); and no_refit, the full codec without the
/// least-squares refit of the column scales (format v2's ablation, docs/codecs.md). Pivots
/// on/off is a property of the plan (calibrate with zero pivots). Values match
/// wire::StepQuantVariant.
enum class StepQuantVariant : std::uint8_t {
  full = 0,
  spatial_only = 1,
  temporal_only = 2,
  no_refit = 3,
};

namespace stepquant {
struct Plan;
}

inline constexpr std::uint32_t kDefaultGroupSize = 128;

struct CodecSpec {
  CodecId id = CodecId::fp32;
  /// Uniform int codecs: consecutive values (row-major within one head) sharing one fp16
  /// scale. 0 means kDefaultGroupSize. Ignored by the float codecs.
  std::uint32_t group_size = 0;
  /// stepquant4/6 only.
  StepQuantVariant variant = StepQuantVariant::full;
};

struct StateLayout {
  std::string name;  ///< free text (logs, metrics); not part of identity
  Arch arch = Arch::gdn;
  std::uint32_t num_layers = 0;     ///< linear-attention layers
  std::uint32_t num_heads = 0;      ///< state heads per layer
  std::uint32_t key_dim = 0;        ///< K: rows of one head's state
  std::uint32_t value_dim = 0;      ///< V: columns of one head's state
  std::uint32_t conv_channels = 0;  ///< short-conv channels per layer (0 = none)
  std::uint32_t conv_width = 0;     ///< conv state length per channel (kernel - 1)
  DType conv_dtype = DType::bf16;
  CodecSpec codec;
  /// Calibration plan of the stepquant codecs (shared, immutable); null for the others.
  /// Part of identity: two layouts with different plans are different layouts.
  std::shared_ptr<const stepquant::Plan> plan;

  /// Identity comparison (everything but `name`; group_size compared after defaulting).
  [[nodiscard]] bool same_shape_and_codec(const StateLayout& other) const noexcept;
};

/// Bytes of one element of `dtype`.
[[nodiscard]] std::size_t dtype_bytes(DType dtype) noexcept;
[[nodiscard]] const char* to_string(DType dtype) noexcept;
[[nodiscard]] const char* to_string(Arch arch) noexcept;
[[nodiscard]] const char* to_string(CodecId codec) noexcept;
/// "full", "spatial_only", "temporal_only", "no_refit".
[[nodiscard]] const char* to_string(StepQuantVariant variant) noexcept;
/// Parses a codec name as printed by to_string ("int6", "stepquant6", "dsq4", ...);
/// returns false if unknown.
[[nodiscard]] bool parse_codec(std::string_view text, CodecId& out) noexcept;

/// Limits a layout must respect (they keep page sizes and loops bounded).
inline constexpr std::uint32_t kMaxLayers = 1024;
inline constexpr std::uint32_t kMaxHeads = 1024;
inline constexpr std::uint32_t kMaxHeadDim = 4096;
inline constexpr std::uint32_t kMaxConvChannels = 1u << 20;
inline constexpr std::uint32_t kMaxConvWidth = 64;
inline constexpr std::uint64_t kMaxPageBytes = 4ull << 30;

/// Checks a layout; returns an empty string when valid, else a message naming the field
/// (e.g. "key_dim must be between 1 and 4096, got 0").
[[nodiscard]] std::string validate(const StateLayout& layout);

/// Content digest of a layout's identity (everything same_shape_and_codec compares: the
/// shape, the conv state, the codec with its defaulted parameters, and the plan's digest),
/// as 16 lowercase hex characters: FNV-1a 64 over a canonical little-endian encoding. Equal
/// for layouts that store the same page format, in any process and on any machine; what a
/// stored page is bound to outside one daemon (prefix-state snapshots in remote tiers).
[[nodiscard]] std::string layout_digest(const StateLayout& layout);

}  // namespace statepool::kernels
