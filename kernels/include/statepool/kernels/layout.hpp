#pragma once
// The shape of one request's whole recurrent state for one model, and the codec that
// stores it. One page of an arena holds exactly one such state (all linear layers).
//
// Plain data; thread-safe to share once built.

#include <cstddef>
#include <cstdint>
#include <string>

namespace statepool::kernels {

/// Gated delta rule family: GDN (Qwen3-Next/Qwen3.5, one gate per head) or KDA
/// (Kimi-Linear, one gate per key row). Values match wire::Arch.
enum class Arch : std::uint8_t { gdn = 0, kda = 1 };

/// Element type of full-precision data. Values match wire::DType.
enum class DType : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

/// Codec of the recurrent state. Values match wire::CodecId.
enum class CodecId : std::uint8_t { fp32 = 0, bf16 = 1, fp16 = 2, int4 = 3, int6 = 4, int8 = 5 };

inline constexpr std::uint32_t kDefaultGroupSize = 128;

struct CodecSpec {
  CodecId id = CodecId::fp32;
  /// Uniform int codecs: consecutive values (row-major within one head) sharing one fp16
  /// scale. 0 means kDefaultGroupSize. Ignored by the float codecs.
  std::uint32_t group_size = 0;
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

  /// Identity comparison (everything but `name`; group_size compared after defaulting).
  [[nodiscard]] bool same_shape_and_codec(const StateLayout& other) const noexcept;
};

/// Bytes of one element of `dtype`.
[[nodiscard]] std::size_t dtype_bytes(DType dtype) noexcept;
[[nodiscard]] const char* to_string(DType dtype) noexcept;
[[nodiscard]] const char* to_string(Arch arch) noexcept;
[[nodiscard]] const char* to_string(CodecId codec) noexcept;
/// Parses "fp32", "bf16", "fp16", "int4", "int6", "int8"; returns false if unknown.
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

}  // namespace statepool::kernels
