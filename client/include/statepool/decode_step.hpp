#pragma once
// The fused decode step on an arena's pages, run by the engine itself every token: the
// daemon is not involved (no request, no round trip). One call advances one linear
// layer of a batch of requests by one token, reading and writing each request's
// compressed page in place (kernels/fused_step.hpp says exactly what it computes).
//
//   auto arena = conn.open_arena(layout, 64);            // host backend: mapped here
//   auto slots = conn.allocate(arena, batch);
//   statepool::client::DecodeStep step(arena);            // threads: every core
//   for (each token) for (layer) {
//     /* q, k, v, g, beta of the batch for this layer, FP32 */
//     auto result = step.run(layer, slot_ids, {.batch = batch, .qk_heads = 16, .q = q,
//                                              .k = k, .v = v, .log_decay = g,
//                                              .beta = beta, .out = o});
//     if (!result.ok()) { /* fail request result.first_rejected_request */ }
//   }
//
// The arena must be mapped in this process (host memory: the host backend) and know its
// page format (opened from the LayoutInfo of register_layout); device arenas are refused
// here with a clear error: their step is client::DeviceDecodeStep (client_cuda.hpp).
// Slots are the engine's to coordinate: a slot must not be stepped by two calls at once,
// nor compressed/decompressed by the daemon while a step runs on it.
//
// Thread-safety: run() may be called from several threads at once on disjoint slots;
// they share the step's worker threads. The Arena must outlive the DecodeStep.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/fused_step.hpp"

namespace statepool::support {
class WorkerPool;
}

namespace statepool::client {

class DecodeStep {
 public:
  struct Options {
    /// Threads that run one call's heads: 0 = every core (std::thread::hardware_concurrency),
    /// 1 = the calling thread only. The calling thread always takes part.
    unsigned threads = 0;
  };

  /// Throws std::logic_error when `arena` is not mapped in this process as host memory
  /// or does not know its page format.
  explicit DecodeStep(const Arena& arena, Options options);
  explicit DecodeStep(const Arena& arena) : DecodeStep(arena, Options{}) {}
  ~DecodeStep();
  DecodeStep(DecodeStep&&) noexcept;
  DecodeStep& operator=(DecodeStep&&) noexcept;
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  /// One step of `layer` for the requests whose pages are `slots` (in batch order:
  /// inputs.batch == slots.size()), in the arena codec's measured step mode
  /// (default_policy()). Throws std::invalid_argument when the inputs do not fit the
  /// layout (nothing is written), std::out_of_range for a slot outside the arena,
  /// std::invalid_argument when a slot appears twice. Non-finite new states are reported
  /// in the result, not thrown (fused_step.hpp).
  kernels::StepResult run(std::uint32_t layer, std::span<const SlotId> slots,
                          const kernels::StepInputs& inputs);
  /// The same with the step mode `policy` (docs/client.md, "Step modes"). The step numbers
  /// of a light policy are `policy.steps` when it has them (one per slot), otherwise this
  /// object's count of each slot's steps of `layer` (policy.step is not read), so that
  /// every page gets the full fit at least every full_every of its steps however the
  /// engine batches them.
  kernels::StepResult run(std::uint32_t layer, std::span<const SlotId> slots,
                          const kernels::StepInputs& inputs, const kernels::StepPolicy& policy);

  /// kernels::measured_step_policy of the arena's codec: for stepquant6 light steps with a
  /// full fit every 16 steps of a page, for every other codec the full fit.
  [[nodiscard]] const kernels::StepPolicy& default_policy() const noexcept { return default_; }
  /// Steps of `layer` this object has run on `slot`, modulo 2^32 (0 for a slot or layer it
  /// does not have).
  [[nodiscard]] std::uint64_t steps(SlotId slot, std::uint32_t layer) const noexcept;

  /// Threads a call uses, the caller's included.
  [[nodiscard]] unsigned threads() const noexcept;
  [[nodiscard]] const kernels::PageCodec& codec() const noexcept { return *codec_; }

 private:
  const Arena* arena_;
  const kernels::PageCodec* codec_;
  std::unique_ptr<support::WorkerPool> workers_;  // null: the calling thread only
  kernels::StepPolicy default_;
  /// [slot][layer]: steps run, the step numbers of light policies (modulo 2^32, a multiple
  /// of any power-of-two full_every). Calls on disjoint slots touch disjoint entries.
  std::vector<std::uint32_t> steps_;
};

}  // namespace statepool::client
