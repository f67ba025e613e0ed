#pragma once
// CUDA encode / decode of KV-cache streams (statepool/kernels/kv.hpp), batched: one
// launch handles `count` streams of one codec and shape (e.g. the keys and values of every
// full-attention layer of a prefix), each stream keys or values.
//
// Byte identity: the encoded streams are identical, byte for byte, to kv_encode on the
// CPU, and the decoded values identical to kv_decode, in every dtype. Both use
// kv_math.hpp's per-value math; here its per-item functions run one thread per item (a
// group record, a 32-bit word of 2 bf16 / fp16 or 4 fp8 values, the stream's partial last
// word) in kv_stream.hpp's thread loops, which test_device_kv_emulation.cpp runs on the
// host against the CPU.
// Every float operation in them is correctly rounded (__fdiv_rn, rintf) and none is fused
// (the library builds with --fmad=false, and the only product, code * scale, is exact).
//
// Work split: a grid of (blocks, min(count, 65535)) blocks of 256 threads; block (x, y)
// handles streams y, y + gridDim.y, ... and, within a stream, group records and then flat
// words x * 256 + thread, striding by the grid (so any grid width is correct); thread 0
// of the grid takes the partial last word. Items write disjoint bytes. A stream whose
// encoded[i] is 4-byte aligned is read and written in 32-bit words (kv_math.hpp,
// "Alignment"); any other takes the same items byte by byte.
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
// alignment (4-byte aligned is the fast path). Buffers must not overlap. Every byte of
// a destination is written (except under skip, below). roles[i] is KvRole::keys or
// KvRole::values; the device cannot check: any other value is taken as values.
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

/// Null when `view` can be launched (a known codec and dtype, at most kKvMaxChannels
/// channels, tokens * channels * 20 within 64 bits); else why not ("unknown KV codec",
/// "too many channels", ...).
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
