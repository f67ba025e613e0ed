#pragma once
// Capacity planner (DESIGN.md, "Capacity planner"): from a ModelSpec and deployment
// choices, the bytes of one request's recurrent state (exact page bytes, as the pool
// stores them), of its KV cache, of the weights, and what fits on one GPU.
//
// Memory model, per GPU (tensor-parallel rank):
//   usable      = gpu_memory * (1 - reserved)
//   per request = slots * state page stride + KV bytes at `context` tokens
//   weights     = ceil(parameters * weight_bits / 8 + group metadata) / tp
//   max concurrency = floor((usable - weights) / per request)
//   crossover   = smallest concurrency N with N * state bytes > weights
// What tensor parallelism divides: weights (all of them, evenly), linear-attention heads
// (key and value heads, hence conv channels; must divide), GQA KV heads (ceil(kv/tp): a
// rank with fewer KV heads than needed holds a replica). The MLA latent is not divided
// (every rank caches the whole latent).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/planner/fits.hpp"
#include "statepool/planner/model.hpp"

namespace statepool::planner {

/// Pages are placed at this alignment in an arena; must equal service::kPageAlignment
/// (checked by the tests).
inline constexpr std::uint64_t kPageAlignment = 256;

/// KV-cache storage of the full-attention layers (STEPQUANT.md, "KV-cache codecs"); the
/// codecs themselves are kernels::KvCodecId (statepool/kernels/kv.hpp, same names and
/// order), whose encoded sizes these are:
///   bf16      2 B per element
///   fp8       1 B per element (per-tensor scales ignored)
///   flexgen4  4-bit asymmetric, groups of 32 along each token's vector, fp16 scale and
///             offset per group: 20 B per 32 elements (ratio 3.2 vs FP16)
///   kivi2/4   keys per channel (groups of 32 tokens), values per token (groups of 32
///             channels), fp16 scale and offset per group; the newest min(context, 128)
///             tokens stay FP16. A partial group of keys is stored whole. MLA: the latent
///             is one stream, quantized per channel like keys.
enum class KvDtype : std::uint8_t { bf16, fp8, kivi2, kivi4, flexgen4 };

[[nodiscard]] const char* to_string(KvDtype kv) noexcept;
[[nodiscard]] bool parse_kv_dtype(std::string_view text, KvDtype& out) noexcept;

inline constexpr std::uint32_t kKvGroup = kernels::kKvGroupSize;
inline constexpr std::uint64_t kKiviResidualTokens = kernels::kKvResidualTokens;

/// The kernels' codec of `kv`.
[[nodiscard]] kernels::KvCodecId kv_codec(KvDtype kv) noexcept;

/// Bytes of one KV stream of `channels` values per token over `tokens` tokens.
/// `per_channel`: KIVI keys layout (groups along tokens); otherwise per token.
/// kernels::kv_encoded_bytes of that stream (keys when per_channel, else values): the
/// exact size of what kernels::kv_encode writes.
[[nodiscard]] std::uint64_t kv_stream_bytes(KvDtype kv, std::uint64_t channels,
                                            std::uint64_t tokens, bool per_channel) noexcept;

/// The state codecs the planner compares.
[[nodiscard]] const std::vector<kernels::CodecId>& planner_codecs();

/// Exact bytes of one page of `shape` under `codec` (PageCodec::page_bytes; the shape's
/// codec and plan are ignored). stepquant4/6: with kernels::stepquant::nominal_plan();
/// `pivots` (optional) receives its pivot count.
[[nodiscard]] std::uint64_t page_bytes(const kernels::StateLayout& shape, kernels::CodecId codec,
                                       std::uint32_t* pivots = nullptr);

/// Input bounds. plan() refuses values outside them: they keep every byte count of a
/// breakdown (concurrency x (slots x page stride + KV at context)) well inside 64 bits.
inline constexpr std::uint32_t kMaxSlots = 1024;
inline constexpr std::uint64_t kMaxContext = 1ull << 24;  ///< 16,777,216 tokens
inline constexpr std::uint32_t kMaxTp = 1024;
inline constexpr std::uint64_t kMaxGpuMemory = 1ull << 50;  ///< 1 PiB
inline constexpr std::uint64_t kMaxConcurrency = 1ull << 20;

struct PlanInputs {
  std::uint32_t weight_bits = 16;  ///< 16, 8 or 4
  KvDtype kv = KvDtype::bf16;
  /// empty = planner_codecs(); a codec named twice gets one row, where first named.
  std::vector<kernels::CodecId> codecs;
  std::uint32_t slots = 1;        ///< state slots per request
  std::uint64_t context = 32768;  ///< tokens per request
  std::uint64_t gpu_memory = 141ull << 30;
  double reserved = 0.1;  ///< fraction of gpu_memory kept for activations, runtime, ...
  std::uint32_t tp = 1;
  /// Concurrency of the breakdown; unset = each codec's max concurrency.
  std::optional<std::uint64_t> concurrency;
};

struct Breakdown {
  std::uint64_t concurrency = 0;
  std::uint64_t weights = 0;
  std::uint64_t state = 0;
  std::uint64_t kv = 0;
  std::uint64_t total = 0;
  std::int64_t free = 0;  ///< usable - total (negative: does not fit)
};

struct CodecRow {
  kernels::CodecId codec = kernels::CodecId::fp32;
  bool nominal_plan = false;            ///< stepquant: bytes from nominal_plan()
  std::uint32_t pivots = 0;             ///< stepquant: pivot units of the nominal plan
  std::uint64_t page_bytes = 0;         ///< PageCodec::page_bytes (recurrent + conv)
  std::uint64_t page_stride = 0;        ///< rounded up to kPageAlignment
  std::uint64_t state_per_request = 0;  ///< slots * page_stride
  double ratio_vs_fp32 = 0;             ///< fp32 state / this state (same slots)
  double ratio_vs_bf16 = 0;
  double saving_vs_fp32 = 0;  ///< 1 - this / fp32 (fraction of bytes saved)
  double saving_vs_bf16 = 0;
  std::uint64_t per_request = 0;  ///< state + KV
  std::uint64_t max_concurrency = 0;
  std::uint64_t crossover = 0;  ///< N where N * state first exceeds the weights
  bool crossover_fits = false;  ///< crossover <= max_concurrency
  Breakdown breakdown;
};

struct PlanReport {
  ModelSpec model;
  PlanInputs inputs;
  kernels::StateLayout layout;       ///< per-GPU state shape (heads / tp), FP32 codec
  std::uint64_t weights = 0;         ///< per GPU
  double kv_per_token = 0;           ///< per GPU, steady rate (KIVI: quantized part)
  std::uint64_t kv_per_request = 0;  ///< per GPU at inputs.context
  std::uint64_t usable = 0;          ///< gpu_memory * (1 - reserved)
  std::vector<CodecRow> rows;
};

/// Weight bytes of the whole model: 16 bits: 2 B per parameter; 8 / 4 bits: 1 / 0.5 B
/// plus one fp16 scale per 128 weights (group-wise weight-only quantization). Other bits:
/// std::invalid_argument "weights-bits must be 16, 8 or 4, got 5", as from plan() and
/// set_plan_input().
[[nodiscard]] std::uint64_t weight_bytes(std::uint64_t parameters, std::uint32_t bits);
/// KV bytes per request on one rank.
[[nodiscard]] std::uint64_t kv_request_bytes(const ModelSpec& model, KvDtype kv,
                                             std::uint64_t context, std::uint32_t tp);

/// Runs the plan. Throws std::invalid_argument for bad inputs, naming them by the names of
/// set_plan_input() with its messages ("tp must be between 1 and 1024, got 0"), or for
/// inputs the model cannot take ("tp 3 does not divide the linear heads ...").
[[nodiscard]] PlanReport plan(const ModelSpec& model, const PlanInputs& inputs);

/// Readable table and notes.
[[nodiscard]] std::string format_text(const PlanReport& report);
/// One JSON object (Boost.JSON inside).
[[nodiscard]] std::string format_json(const PlanReport& report);
/// The same object with "fits_now": what the live pool can still take of this state
/// (the daemon's answer to PlanCapacity and POST /v1/plan).
[[nodiscard]] std::string format_json(const PlanReport& report, const FitsReport& fits);

/// Sets one input by the name the CLI flags, the HTTP query string and docs/capacity.md
/// share: weights-bits, kv, state-codec (all, or a comma-separated list of codec names),
/// slots, context, gpu-memory (a size: support::parse_size, "80GB" = 80 * 10^9 bytes,
/// "141GiB" = 141 * 2^30; at most kMaxGpuMemory), reserved, tp, concurrency. Returns false
/// for an unknown name; throws std::invalid_argument for a bad value, leaving `inputs`
/// unchanged: "NAME must be RULE, got VALUE", the value as a number when it is one
/// ("slots must be between 1 and 1024, got 0"), else quoted as given ("weights-bits must
/// be 16, 8 or 4, got 'x'"): the same sentence plan() throws for the same value.
bool set_plan_input(PlanInputs& inputs, std::string_view name, std::string_view value);
/// The names set_plan_input() knows, in the order above.
[[nodiscard]] const std::vector<std::string_view>& plan_input_names();

}  // namespace statepool::planner
