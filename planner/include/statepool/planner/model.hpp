#pragma once
// A hybrid linear-attention model's memory geometry, read from its Hugging Face
// config.json: linear (GDN/KDA) layers and their recurrent + conv state, full-attention
// layers and their KV-cache geometry, and an estimate of the weight parameters.
//
// Supported: Qwen3-Next (model_type qwen3_next), Qwen3.5 / Qwen3.8 dense and MoE
// (qwen3_5, qwen3_5_moe; fields nested in text_config), Kimi-Linear (kimi_linear).
// No Boost in this header: the JSON parser lives in model.cpp.
//
// Thread-safety: pure functions; ModelSpec is plain data.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "statepool/kernels/layout.hpp"

namespace statepool::planner {

enum class Family : std::uint8_t { qwen3_next, qwen3_5, kimi_linear };
/// Full-attention KV geometry: grouped-query (K and V per KV head) or MLA (one
/// compressed latent of kv_lora_rank + qk_rope_head_dim per token per layer).
enum class AttentionKind : std::uint8_t { gqa, mla };

[[nodiscard]] const char* to_string(Family family) noexcept;
[[nodiscard]] const char* to_string(AttentionKind kind) noexcept;

struct ModelSpec {
  std::string model_type;  ///< as written in config.json (top level)
  Family family = Family::qwen3_next;
  kernels::Arch arch = kernels::Arch::gdn;

  std::uint32_t hidden_size = 0;
  std::uint32_t num_layers = 0;     ///< all decoder layers (MTP layers excluded)
  std::uint32_t linear_layers = 0;  ///< GDN or KDA layers
  std::uint32_t full_layers = 0;    ///< full-attention layers

  // Linear attention. GDN: state heads = value heads (each value head reads its key
  // head, key heads <= value heads). KDA: key heads = value heads = num_heads.
  std::uint32_t linear_key_heads = 0;
  std::uint32_t linear_value_heads = 0;
  std::uint32_t linear_key_dim = 0;
  std::uint32_t linear_value_dim = 0;
  /// Short-conv kernel; the state keeps kernel - 1 steps per channel, so a kernel of 1 (a
  /// per-channel scale, no history) has no conv state.
  std::uint32_t conv_kernel = 0;
  /// Short-conv channels per linear layer. GDN: 2 * key_heads * key_dim + value_heads *
  /// value_dim (q, k, v share one conv). KDA: 3 * num_heads * head_dim (separate q, k, v).
  std::uint32_t conv_channels = 0;
  /// Recurrent state dtype the model declares (Qwen3.5 mamba_ssm_dtype). When the config
  /// says nothing (Qwen3-Next, Kimi) this is the model dtype (bf16), the vLLM "auto"
  /// default, and state_dtype_declared is false: engines differ, so the planner always
  /// shows FP32 and BF16 side by side.
  kernels::DType state_dtype = kernels::DType::bf16;
  bool state_dtype_declared = false;

  // Full attention.
  AttentionKind attention = AttentionKind::gqa;
  std::uint32_t attention_heads = 0;   ///< query heads
  std::uint32_t kv_heads = 0;          ///< GQA only
  std::uint32_t head_dim = 0;          ///< GQA only (K and V head dim)
  std::uint32_t kv_lora_rank = 0;      ///< MLA only
  std::uint32_t qk_rope_head_dim = 0;  ///< MLA only

  /// Weight parameters of the language model (embedding, attention, linear attention,
  /// MLP or MoE experts incl. shared experts and routers, norms, lm_head unless tied).
  /// MTP / next-token-prediction layers and vision towers are not counted.
  std::uint64_t parameters = 0;
  std::uint64_t embedding_parameters = 0;  ///< input embedding (+ lm_head when untied)

  /// The state of one request on one GPU holding all heads (tp = 1), FP32 recurrent
  /// codec: the shape only; the planner sets the codec. No conv state (conv_channels and
  /// conv_width 0) when conv_kernel is 1.
  [[nodiscard]] kernels::StateLayout state_layout() const;
  /// KV-cache elements per token summed over all full-attention layers (K and V for GQA,
  /// the latent for MLA), tp = 1.
  [[nodiscard]] std::uint64_t kv_elements_per_token() const noexcept;
};

/// Ranges parse_model() accepts. Every numeric config.json key it reads has one (listed
/// in docs/capacity.md, "Config keys"): the geometry of the linear-attention state within
/// the pool's layout limits (kernels::kMaxLayers, kMaxHeads, kMaxHeadDim, a conv kernel of
/// at most kMaxConvWidth + 1), the rest within the bounds below. Together with the
/// derived limits (conv channels, the FP32 page, key rows, KV elements per token) they
/// keep every parameter count and every byte count of plan() exact in 64 bits.
inline constexpr std::uint32_t kMaxConvKernel = kernels::kMaxConvWidth + 1;  ///< state: kernel - 1
inline constexpr std::uint32_t kMaxHiddenSize = 1u << 16;
inline constexpr std::uint32_t kMaxVocabSize = 1u << 24;
inline constexpr std::uint32_t kMaxIntermediateSize = 1u << 18;  ///< dense and expert MLPs
inline constexpr std::uint32_t kMaxExperts = 4096;               ///< routed and shared
inline constexpr std::uint32_t kMaxLoraRank = 1u << 16;          ///< kv_lora_rank, q_lora_rank
/// KV-cache elements per token over all full-attention layers (kv_elements_per_token()).
inline constexpr std::uint64_t kMaxKvElementsPerToken = 1u << 18;
/// A model config file larger than this is refused (the daemon's limit too).
inline constexpr std::size_t kMaxModelConfigBytes = std::size_t{1} << 20;

/// Parses config.json text. Throws std::invalid_argument naming the problem in one line,
/// by its config.json key: "config.json: missing text_config.linear_num_value_heads",
/// "config.json: text_config.linear_num_value_heads must be between 1 and 1024, got
/// 1000000000", "config.json: unsupported architecture 'llama' (model_type); supported:
/// ...". A number may be written as an integer or as a whole-valued float (48.0).
/// `source` replaces "config.json" in messages. The spec it returns always has a valid
/// state_layout().
[[nodiscard]] ModelSpec parse_model(std::string_view json_text,
                                    std::string_view source = "config.json");
/// Reads (support::read_file, at most kMaxModelConfigBytes) and parses a file. Throws
/// std::runtime_error naming the path when it cannot be read ("PATH: cannot open: No such
/// file or directory", "PATH: is a directory") and
/// std::invalid_argument (naming the path) when it is not a supported config.
[[nodiscard]] ModelSpec load_model(const std::string& path);

}  // namespace statepool::planner
