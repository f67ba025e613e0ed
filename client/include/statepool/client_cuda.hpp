#pragma once
// The CUDA side of the client (builds with CUDA only): waiting for the daemon's device
// work on an engine's stream, and decoding pages on the device without a round trip.
//
//   auto pending = conn.compress_async(arena.id(), slot.id(), staging.id(), 0);
//   statepool::client::wait_on_stream(pending, stream);   // stream waits, host does not
//
//   statepool::client::DeviceDecoder decoder(arena, kernels::DType::bf16);
//   decoder.decode(slot.id(), my_state_ptr, stream);       // page -> bf16 state, on device
//
// Thread-safety: the functions are thread-safe; a DeviceDecoder is immutable once built
// and may be used from several threads and streams at once.

#include <cuda_runtime_api.h>

#include "statepool/client.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"

namespace statepool::client {

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

}  // namespace statepool::client
