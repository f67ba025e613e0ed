#pragma once
// CUDA encode/decode of one page for the float (fp32, bf16, fp16) and uniform int (int4,
// int6, int8) codecs. The bytes written are identical to PageCodec::encode on the CPU:
// both use numeric.hpp, packing.hpp and quantize.hpp, and every float operation that
// feeds a stored bit is IEEE-exact (division with __fdiv_rn, round-half-even, exact
// fp16 * code products).
//
// Layers (CUB/FlashInfer style): these host launchers check the descriptor and pointers,
// size the grid and launch; thin __global__ entries run a per-group (encode) or per-quad
// (decode) device function. Launchers never throw and never synchronise: they enqueue on
// `stream` and return the launch status (cudaErrorInvalidValue for a bad descriptor or a
// misaligned pointer, with nothing enqueued). Kernel faults surface at the next
// synchronisation, as usual.
//
// Pointers are device pointers (or managed / mapped memory). Alignment: page 4 bytes;
// staged 4 bytes for f32 and 2 bytes for bf16. Buffers must not overlap.
// Non-finite input: the encode kernels write unspecified (but in-bounds) bytes for a
// non-finite value; run find_non_finite first when the input is not trusted (the CPU
// PageCodec::encode does that check itself).
//
// Thread-safety: launchers are stateless; concurrent launches on any streams are fine.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "statepool/kernels/layout.hpp"

namespace statepool::kernels::cuda {

/// Everything the page kernels need, passed by value (make it with make_page_desc).
struct PageDesc {
  CodecId codec = CodecId::fp32;
  DType staged_dtype = DType::f32;  ///< f32 or bf16: element type of the staged recurrent part
  std::uint32_t group_size = 0;     ///< effective group size (uniform codecs), else 0
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::uint32_t num_heads = 0;   ///< layers * heads: every head of the recurrent part
  std::uint64_t head_bytes = 0;  ///< bytes of one encoded head (same for every head)
  std::uint64_t conv_bytes = 0;  ///< raw conv-state bytes (after the heads, both sides)
};

/// Descriptor of `layout`'s pages with a staged recurrent part in `staged_dtype`. Host
/// only (no CUDA call). Throws std::invalid_argument on an invalid layout, a staged dtype
/// other than f32/bf16, or a codec without a CUDA kernel.
[[nodiscard]] PageDesc make_page_desc(const StateLayout& layout, DType staged_dtype);

/// page[0, num_heads * head_bytes) <- encoded recurrent part of `staged`.
cudaError_t encode_recurrent(PageDesc desc, const void* staged, void* page,
                             cudaStream_t stream) noexcept;
/// staged recurrent part <- decoded page[0, num_heads * head_bytes).
cudaError_t decode_recurrent(PageDesc desc, const void* page, void* staged,
                             cudaStream_t stream) noexcept;

/// Whole page (PageCodec::page_bytes()) from a whole staged state
/// (PageCodec::staged_bytes(dtype)): encode_recurrent plus an asynchronous copy of the
/// conv state.
cudaError_t encode_page(PageDesc desc, const void* staged, void* page,
                        cudaStream_t stream) noexcept;
/// Whole staged state from a whole page.
cudaError_t decode_page(PageDesc desc, const void* page, void* staged,
                        cudaStream_t stream) noexcept;

/// Writes to *first_index (device memory, 8 bytes) the smallest flat index
/// ((layer * heads + head) * K * V + row * V + col) of a NaN/Inf in the staged recurrent
/// part, or UINT64_MAX when every value is finite.
cudaError_t find_non_finite(PageDesc desc, const void* staged, unsigned long long* first_index,
                            cudaStream_t stream) noexcept;

}  // namespace statepool::kernels::cuda
