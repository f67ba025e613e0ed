#pragma once
// The fused decode step: one gated-delta-rule step (recurrence.hpp) of one linear layer,
// for a batch of requests, run directly on their compressed pages. Per (request, head):
// unpack the page's head, decay + delta-rule update + readout in FP32, fit and pack the
// new state back (for STEPQuant with the plan's widths, pivots and impact factors), so
// that a request's state never exists in FP32 memory between tokens. Each head of the
// page is read once and written once; its FP32 form lives only in a per-thread scratch
// buffer (64 KiB for a 128 x 128 head, in cache). The same entry point serves every
// codec, fp32 and bf16 included, so the baseline is measured by the same code.
//
// Equivalence (tests/kernels/test_fused_step.cpp): for every codec, the bytes written and
// the outputs are those of "decode the layer's heads (PageCodec::decode_heads), run
// kernels::gdn_step / kda_step on each, encode them (PageCodec::encode_heads)", bit for bit.
//
// Inputs, for `batch` requests of a layout with H = num_heads state (value) heads:
//   q, k       [batch][qk_heads][K]  L2-normalised, q scaled by 1/sqrt(K) (normalize_qk);
//                                    state head h reads q/k head h / (H / qk_heads)
//                                    (Qwen3-Next: 16 key heads for 32 value heads)
//   v          [batch][H][V]
//   log_decay  [batch][H] (GDN)  or  [batch][H][K] (KDA): g, the decay is exp(g)
//   beta       [batch][H]
//   out        [batch][H][V]         receives o = S^T q (from the FP32 state, before packing)
// All FP32, row-major, dense. pages[b] is the first byte of request b's page (page_bytes()
// bytes, host memory, the heads' 4-byte alignment kept); pages must be distinct.
// The conv state in the page is not touched: the engine updates it itself.
//
// A head whose new state holds NaN or +-Inf is not stored: its page bytes keep the
// previous step's state, the head is counted in StepResult, and the outputs are still
// written. The engine should fail that request (its heads are then from different steps).
//
// Thread-safety: concurrent calls are safe on disjoint pages; one call may use several
// threads through `parallel` (heads are independent).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "statepool/kernels/page.hpp"

namespace statepool::kernels {

/// How the step re-encodes a head (docs/codecs.md, "Step modes").
enum class StepMode : std::uint8_t {
  full = 0,   ///< the codec's full encode (for STEPQuant the whole fit) every step
  light = 1,  ///< STEPQuant heads get a light fit (LightOptions) between full fits
};

struct StepPolicy {
  StepMode mode = StepMode::full;
  /// light: the steps whose number is a multiple of full_every run the full fit (16, the
  /// measured choice for stepquant6); 0: only a head that falls back does.
  std::uint32_t full_every = 16;
  /// light: the step number of every request of the call, unless `steps` is given.
  std::uint64_t step = 0;
  /// light: each request's own step number, in batch order (size batch), or empty. What
  /// the numbers must guarantee is only that a page never has more than full_every - 1
  /// light steps in a row; client::DecodeStep counts them per slot and layer itself.
  std::span<const std::uint64_t> steps;
  LightOptions light;
};

/// Whether `policy` makes the step of a request numbered `step` a light one: light mode,
/// and a number that is not a multiple of full_every (any number when full_every is 0).
[[nodiscard]] constexpr bool is_light_step(const StepPolicy& policy, std::uint64_t step) noexcept {
  return policy.mode == StepMode::light &&
         (policy.full_every == 0 || step % policy.full_every != 0);
}

/// The same for the call's number `policy.step` (every request, when `steps` is empty).
[[nodiscard]] constexpr bool is_light_step(const StepPolicy& policy) noexcept {
  return is_light_step(policy, policy.step);
}

/// The same for request `request` of the call: its entry of `steps`, or `step`.
[[nodiscard]] constexpr bool is_light_request(const StepPolicy& policy,
                                              std::size_t request) noexcept {
  return is_light_step(policy, policy.steps.empty() ? policy.step : policy.steps[request]);
}

/// The measured step mode of `codec` (docs/codecs.md, "Step modes"): light steps without
/// the refit and a full fit every 16 steps for stepquant6 pages of variant `full`; the
/// full fit every step for every other codec (stepquant4 included: its long-lived heads
/// need the refit). What client::DecodeStep runs unless told otherwise.
[[nodiscard]] StepPolicy measured_step_policy(const CodecSpec& codec) noexcept;

struct StepInputs {
  std::uint32_t batch = 0;
  /// Heads of q and k; 0 means num_heads. num_heads must be a multiple of it.
  std::uint32_t qk_heads = 0;
  std::span<const float> q;
  std::span<const float> k;
  std::span<const float> v;
  std::span<const float> log_decay;
  std::span<const float> beta;
  std::span<float> out;
};

struct StepResult {
  /// Heads whose new state was not finite (their page bytes are unchanged).
  std::size_t rejected_heads = 0;
  /// The first rejected (request, head) in (request, head) order, when rejected_heads > 0.
  std::uint32_t first_rejected_request = 0;
  std::uint32_t first_rejected_head = 0;
  /// Heads stored with a light fit, and heads whose light fit fell back to the full fit
  /// (StepMode::light; every other stored head had the full encode).
  std::size_t light_heads = 0;
  std::size_t fallback_heads = 0;
  [[nodiscard]] bool ok() const noexcept { return rejected_heads == 0; }
};

/// Runs fn(first, last) over chunks that cover [0, count), each at most `grain` long,
/// possibly concurrently, and returns when all have run (WorkerPool::parallel_for).
using ParallelFor = std::function<void(std::size_t count, std::size_t grain,
                                       const std::function<void(std::size_t, std::size_t)>& fn)>;

/// What is wrong with stepping layer `layer` of `layout` with `qk_heads` q/k heads (0: one
/// per state head), or an empty string: the layer must exist and qk_heads divide
/// num_heads. The host and device entry points share it.
[[nodiscard]] std::string step_problem(const StateLayout& layout, std::uint32_t layer,
                                       std::uint32_t qk_heads);

/// Throws std::invalid_argument (the message names the field) unless `in` and `pages` fit
/// `codec`'s layout: layer < num_layers, pages.size() == batch, every span of the size
/// above, qk_heads dividing num_heads, no null page.
void check_step(const PageCodec& codec, std::uint32_t layer, std::span<std::byte* const> pages,
                const StepInputs& in);

/// One step of layer `layer` for every request of `in` (checked by check_step first).
/// The work items are the batch * num_heads (request, head) pairs; with `parallel` they
/// are split over its threads, otherwise they run on this thread. `policy`: how the heads
/// are re-encoded (the full fit by default); std::invalid_argument when its `steps` is
/// neither empty nor one number per request.
StepResult fused_step(const PageCodec& codec, std::uint32_t layer,
                      std::span<std::byte* const> pages, const StepInputs& in,
                      const ParallelFor& parallel = {}, const StepPolicy& policy = {});

/// Items [first, last) of the same step (item = request * num_heads + head), unchecked:
/// for executors that split one call themselves. Results of disjoint ranges add up
/// (merge()).
StepResult fused_step_items(const PageCodec& codec, std::uint32_t layer,
                            std::span<std::byte* const> pages, const StepInputs& in,
                            std::size_t first, std::size_t last, const StepPolicy& policy = {});

/// Combines the results of two disjoint ranges of one call.
void merge(StepResult& into, const StepResult& other) noexcept;

}  // namespace statepool::kernels
