#pragma once
// The CUDA side of the client (builds with CUDA only): waiting for the daemon's device
// work on an engine's stream, and decoding pages on the device without a round trip.
//
//   statepool::client::StreamFence fence(device);          // once
//   ... the engine's kernels write the state into the staging buffer on `stream` ...
//   auto pending = conn.compress_async(arena.id(), slot.id(), staging.id(), 0,
//                                      kernels::DType::f32, fence.record(stream));
//   statepool::client::wait_on_stream(pending, stream);   // stream waits, host does not
//
//   statepool::client::DeviceDecoder decoder(arena, kernels::DType::bf16);
//   decoder.decode(slot.id(), my_state_ptr, stream);       // page -> bf16 state, on device
//
//   statepool::client::DeviceDecodeStep step(arena);       // the fused step, per token
//   step.run(layer, {.batch = n, .slots = d_slots, .q = d_q, ...}, stream);
//
// Thread-safety: the functions are thread-safe; a DeviceDecoder is immutable once built
// and may be used from several threads and streams at once.

#include <cuda_runtime_api.h>

#include "statepool/client.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/cuda/step_kernels.hpp"
#include "statepool/kernels/fused_step.hpp"

namespace statepool::client {

/// An interprocess event of the engine's, to order the daemon's work after the engine's
/// own stream (the `after` argument of Connection::compress/decompress/copy and their
/// _async forms): the daemon's stream waits for the event's last record before it reads
/// or writes, so the host never waits. Record after the kernels that write the staged
/// state (compress), or that still read the staging range or the pages (decompress,
/// copy, a DeviceDecodeStep). The daemon enqueues its wait before it replies, so the
/// fence may be recorded again once the call that got its bytes has returned.
class StreamFence {
 public:
  /// Creates the event on `device` (cudaEventInterprocess | cudaEventDisableTiming).
  /// Throws Error(internal) naming the CUDA error.
  explicit StreamFence(int device);
  ~StreamFence();
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;

  /// Records the event on `stream` (which must belong to the fence's device) and returns
  /// its IPC handle, for `after`.
  [[nodiscard]] IpcEventBytes record(cudaStream_t stream);

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
  IpcEventBytes handle_{};
};

/// Makes `stream` wait for the work `pending` names (cudaIpcOpenEventHandle +
/// cudaStreamWaitEvent); nothing when it carries no event. Call it before the next
/// request on the connection that returned `pending`. Throws Error(internal) naming the
/// CUDA error.
void wait_on_stream(const Pending& pending, cudaStream_t stream);
/// Blocks the calling thread until that work is done.
void synchronize(const Pending& pending);

/// Local decode of an arena's pages on the device with the daemon's kernels (byte for
/// byte what the daemon's decompress writes). The arena must be mapped on the device
/// (Arena::device_data()) and know its page format (Arena::has_codec()).
class DeviceDecoder {
 public:
  /// Uploads the page format's tables (on the current device). Throws std::logic_error
  /// for an arena without device memory or codec, Error(internal) for a CUDA failure.
  DeviceDecoder(const Arena& arena, kernels::DType staged_dtype);

  /// Enqueues on `stream`: the staged state at `staged` (device memory,
  /// arena.codec().staged_bytes(dtype) bytes) <- page `slot`. Throws std::out_of_range for
  /// a bad slot and Error(internal) when the launch fails.
  void decode(SlotId slot, void* staged, cudaStream_t stream) const;

 private:
  const Arena* arena_;
  kernels::cuda::DevicePageFormat format_;
};

/// One layer's step inputs on the device: kernels::StepInputs's shapes and meaning
/// (kernels/fused_step.hpp), every pointer device memory.
struct DeviceStepInputs {
  std::uint32_t batch = 0;
  std::uint32_t qk_heads = 0;        ///< 0 means num_heads
  const SlotId* slots = nullptr;     ///< [batch] the requests' slots in the arena, distinct
  const float* q = nullptr;          ///< [batch][qk_heads][K]
  const float* k = nullptr;          ///< [batch][qk_heads][K]
  const float* v = nullptr;          ///< [batch][H][V]
  const float* log_decay = nullptr;  ///< [batch][H] (GDN) or [batch][H][K] (KDA)
  const float* beta = nullptr;       ///< [batch][H]
  float* out = nullptr;              ///< [batch][H][V]
  /// [batch][H] or null: kernels::cuda::kStepStored, kStepNotFinite (the head keeps its
  /// previous bytes), kStepBadSlot (a slot outside the arena: nothing touched) or
  /// kStepDuplicateSlot (an earlier request of the batch has the slot: nothing touched).
  std::uint8_t* rejected = nullptr;
};

/// The fused decode step on an arena's device pages (kernels/cuda/step_kernels.hpp), on
/// the engine's stream, with no round trip to the daemon: one launch per layer call.
/// Bit for bit the host step (client::DecodeStep, kernels::fused_step).
class DeviceDecodeStep {
 public:
  /// Uploads the page format's tables to the arena's device and makes the step counts of
  /// its pages (zero). Throws std::logic_error for an arena without device memory or
  /// codec, Error(internal) for a CUDA failure.
  explicit DeviceDecodeStep(const Arena& arena);

  /// Enqueues one step of `layer` on `stream`, in the arena codec's measured step mode
  /// (default_policy(); docs/client.md, "Step modes"). Throws std::invalid_argument for
  /// what the host can check (the layer, qk_heads, null pointers, a head too large for the
  /// device's shared memory), Error(internal) when the launch fails. Slots are checked on
  /// the device (kStepBadSlot, kStepDuplicateSlot).
  void run(std::uint32_t layer, const DeviceStepInputs& inputs, cudaStream_t stream) const;
  /// The same with the step mode `policy`. A light policy's steps are numbered on the
  /// device, per page, layer and head (kernels::cuda::DeviceStepCounts, counted by every
  /// launch of this object, full or light): a page gets the full fit at its first step
  /// under this DeviceDecodeStep and every full_every-th after it, however the engine
  /// batches.
  /// policy.step is not read; per-request numbers (policy.steps) are refused with
  /// std::invalid_argument.
  void run(std::uint32_t layer, const DeviceStepInputs& inputs, cudaStream_t stream,
           const kernels::StepPolicy& policy) const;

  /// kernels::measured_step_policy of the arena's codec (light for stepquant6).
  [[nodiscard]] const kernels::StepPolicy& default_policy() const noexcept { return default_; }

 private:
  const Arena* arena_;
  kernels::cuda::DevicePageFormat format_;
  kernels::StepPolicy default_;
  kernels::cuda::DeviceStepCounts counts_;
};

}  // namespace statepool::client
