#pragma once
// CUDA encode / decode of whole pages, batched over slots, for every codec: fp32, bf16,
// fp16, int4/6/8, dsq4/6 and stepquant4/6 (full, spatial_only, temporal_only; GDN and
// KDA; 2-bit GDN heads, mixed KDA row widths, pivots, the refit; format v2).
//
// Byte identity: the pages written are identical, byte for byte, to PageCodec::encode on
// the CPU, and the staged states written identical to PageCodec::decode (f32 or bf16),
// padding and unused code bits included. Both sides run the same per-value functions
// (numeric.hpp, quantize.hpp, packing.hpp, stepquant/fit_math.hpp) and every reduction in
// the specified order: the STEPQuant row sum as the lane sum (32 strided partials, then a
// fixed tree), the refit sums over rows in row order, maxima as integer maxima of |x|
// bits; everything in binary32 through the _rn intrinsics (one division per row or
// column, none per value), no multiply-add fused (the library builds with --fmad=false).
// The block bodies are block_codec.hpp's, which the CPU tests also run on host threads
// (tests/kernels/test_device_codec_emulation.cpp); tests/gpu checks the device.
//
// Work split (block_codec.hpp and the family headers have the details): a grid of
// (page_blocks(view), slots) blocks of 256 threads; block (x, slot) encodes or decodes
// head x of that slot (x < head_count) or copies a 32 KiB piece of its conv state.
// Within a head the work goes by 16-value chunks where the shape allows, with
// __syncthreads() between the phases of a fit; dynamic shared memory holds the fit's
// per-row and per-column constants (encode_scratch_floats) or the decode's scales
// (decode_scratch_floats).
//
// Launchers never throw and never synchronise: they check what the host can check
// (view_problem(view), null pointers, alignment of the single-page pointers), enqueue on
// `stream` and return the launch status; on a bad argument they return
// cudaErrorInvalidValue with nothing enqueued. count == 0 enqueues nothing and returns
// cudaSuccess. Kernel faults surface at the next synchronisation, as usual.
//
// Pointers are device pointers (or managed / mapped memory). The batched forms take
// DEVICE arrays of `count` device pointers, one per slot. Alignment (also of every
// pointer in those arrays, which the host cannot check): pages 4 bytes, staged states
// 4 bytes for f32 and 2 for bf16; first_index / skip 8 bytes. Buffers must not overlap.
// A page is PageCodec::page_bytes() bytes, a staged state PageCodec::staged_bytes(dtype);
// every byte of the destination is written (except under skip, below).
//
// Non-finite input: encode writes unspecified (in-bounds) bytes for NaN/Inf; scan with
// find_non_finite_pages first and pass its result as `skip` to encode_pages: a slot with
// a non-finite value is then left exactly as it was, with no host round trip.
//
// Thread-safety: launchers are stateless; concurrent launches on any streams are fine.
// DevicePageFormat is immutable after construction (its view may be used concurrently).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::kernels {
class PageCodec;
}

namespace statepool::kernels::cuda {

/// The device tables of a layout's pages (PageFormatTables uploaded), owned.
class DevicePageFormat {
 public:
  /// Builds the tables of `codec`'s pages with a staged recurrent part in `staged_dtype`
  /// and uploads them (cudaMalloc + cudaMemcpy on the current device; synchronous).
  /// Throws std::invalid_argument for a staged dtype other than f32 / bf16, and
  /// std::runtime_error naming the CUDA error when allocation or copy fails.
  DevicePageFormat(const PageCodec& codec, DType staged_dtype);
  ~DevicePageFormat();
  DevicePageFormat(DevicePageFormat&& other) noexcept;
  DevicePageFormat& operator=(DevicePageFormat&& other) noexcept;
  DevicePageFormat(const DevicePageFormat&) = delete;
  DevicePageFormat& operator=(const DevicePageFormat&) = delete;

  /// Pass by value to the launchers; valid while this object lives.
  [[nodiscard]] const PageFormatView& view() const noexcept { return view_; }

 private:
  PageFormatView view_;
  void* tables_ = nullptr;  // one allocation holding every table
};

/// pages[i] <- encoded staged[i], for i < count. `skip`: null, or a device array [count]
/// (e.g. find_non_finite_pages's first_index): slot i is not written at all when
/// skip[i] != UINT64_MAX.
cudaError_t encode_pages(const PageFormatView& view, const void* const* staged, void* const* pages,
                         std::uint32_t count, const unsigned long long* skip,
                         cudaStream_t stream) noexcept;

/// staged[i] <- decoded pages[i], for i < count.
cudaError_t decode_pages(const PageFormatView& view, const void* const* pages, void* const* staged,
                         std::uint32_t count, cudaStream_t stream) noexcept;

/// first_index[i] (device array [count]) <- the smallest flat index
/// ((layer * heads + head) * K * V + row * V + col) of a NaN/Inf in the recurrent part of
/// staged[i], or UINT64_MAX when it is finite. The conv state is not looked at.
cudaError_t find_non_finite_pages(const PageFormatView& view, const void* const* staged,
                                  std::uint32_t count, unsigned long long* first_index,
                                  cudaStream_t stream) noexcept;

/// One page, without pointer arrays. `skip`: null or a device pointer to one value (the
/// page is left untouched unless it is UINT64_MAX).
cudaError_t encode_page(const PageFormatView& view, const void* staged, void* page,
                        const unsigned long long* skip, cudaStream_t stream) noexcept;
cudaError_t decode_page(const PageFormatView& view, const void* page, void* staged,
                        cudaStream_t stream) noexcept;
/// *first_index (device memory) <- as find_non_finite_pages for one state.
cudaError_t find_non_finite(const PageFormatView& view, const void* staged,
                            unsigned long long* first_index, cudaStream_t stream) noexcept;

}  // namespace statepool::kernels::cuda
