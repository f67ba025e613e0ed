#pragma once
// CUDA encode / decode of KV-cache streams (statepool/kernels/kv.hpp), batched: one
// launch handles `count` streams of one codec and shape (e.g. the keys and values of every
// full-attention layer of a prefix), each stream keys or values.
//
// Byte identity: the encoded streams are identical, byte for byte, to kv_encode on the
// CPU, and the decoded values identical to kv_decode, in every dtype. Both run
// kv_math.hpp's kv_encode_item / kv_decode_item over the same work items (a group record,
// or one value); here one thread per item. Every float operation in them is correctly
// rounded (__fdiv_rn, rintf) and none is fused (the library builds with --fmad=false,
// and the only product, code * scale, is exact anyway).
//
// Work split: a grid of (blocks, min(count, 65535)) blocks of 256 threads; block (x, y)
// handles streams y, y + gridDim.y, ... and, within a stream, items x * 256 + thread,
// striding by the grid (so any grid width is correct). Items write disjoint bytes.
//
// Launchers never throw and never synchronise: they check what the host can check
// (kv_view_problem(view), null arrays), enqueue on `stream` and return the launch status
// (cudaGetLastError, which also clears it: callers check every CUDA call, so what it
// returns is the launch's own error); on a bad argument they return cudaErrorInvalidValue with
// nothing enqueued. count == 0 enqueues nothing and returns cudaSuccess; so does a shape with no
// values, except that kv_find_non_finite_streams still sets first_index to UINT64_MAX.
// Kernel faults surface at the next synchronisation, as usual.
//
// Pointers: `roles`, `plain`, `encoded`, `skip`, `first_index` are DEVICE arrays of
// `count` entries; plain[i] and encoded[i] are device pointers (or managed / mapped
// memory). plain[i] holds tokens * channels values in view.dtype, row-major
// [token][channel], aligned to its element size (4 bytes for f32, 2 for bf16 / f16);
// encoded[i] holds kv_encoded_bytes(view.codec, roles[i], tokens, channels) bytes, any
// alignment. Buffers must not overlap. Every byte of a destination is written (except
// under skip, below). roles[i] is KvRole::keys or KvRole::values; the device cannot check:
// any other value is taken as values.
//
// Non-finite input: encode writes unspecified (in-bounds) bytes for NaN/Inf, where the CPU
// throws. Scan with kv_find_non_finite_streams first and pass its result as `skip`: a
// stream holding a non-finite value is then left exactly as it was, with no host round
// trip.
//
// Thread-safety: launchers are stateless; concurrent launches on any streams are fine.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::kernels::cuda {

/// What every stream of one launch shares. Passed by value.
struct KvBatchView {
  KvCodecId codec = KvCodecId::bf16;
  DType dtype = DType::f32;  ///< plain values: encode input, decode output (f32, bf16, f16)
  std::uint64_t tokens = 0;
  std::uint64_t channels = 0;
};

/// Null when `view` can be launched; else why not ("unknown KV codec", ...).
[[nodiscard]] const char* kv_view_problem(const KvBatchView& view) noexcept;

/// encoded[i] <- kv_encode of plain[i] as roles[i], for i < count. `skip`: null, or a
/// device array [count] (kv_find_non_finite_streams's first_index): stream i is not
/// written at all when skip[i] != UINT64_MAX.
cudaError_t kv_encode_streams(const KvBatchView& view, const KvRole* roles,
                              const void* const* plain, void* const* encoded, std::uint32_t count,
                              const unsigned long long* skip, cudaStream_t stream) noexcept;

/// plain[i] <- kv_decode of encoded[i] as roles[i], in view.dtype, for i < count.
cudaError_t kv_decode_streams(const KvBatchView& view, const KvRole* roles,
                              const void* const* encoded, void* const* plain, std::uint32_t count,
                              cudaStream_t stream) noexcept;

/// first_index[i] <- the smallest row-major index (token * channels + channel) of a NaN /
/// Inf in plain[i], or UINT64_MAX when every value is finite.
cudaError_t kv_find_non_finite_streams(const KvBatchView& view, const void* const* plain,
                                       std::uint32_t count, unsigned long long* first_index,
                                       cudaStream_t stream) noexcept;

}  // namespace statepool::kernels::cuda
