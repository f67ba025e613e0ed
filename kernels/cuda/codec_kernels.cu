// CUDA page encode / decode / non-finite scan for every codec (codec_kernels.hpp): thin
// __global__ entries around the block bodies of block_codec.hpp, which a CUDA thread
// block runs as its "team", and the host launchers that check arguments and size the
// grid. Built with --fmad=false (kernels/CMakeLists.txt): see codec_kernels.hpp.

#include <cstdint>

#include "block_team.hpp"
#include "statepool/kernels/cuda/block_codec.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"

namespace statepool::kernels::cuda {
namespace {

constexpr unsigned kBlock = 256;
constexpr std::uint32_t kMaxGridY = 65535;              // more slots: blocks loop over them
constexpr std::size_t kDefaultSharedLimit = 48 * 1024;  // dynamic shared memory without opt-in

// The per-slot pointers of a launch: a device array of `count` pointers, or (single-page
// forms) one pointer for slot 0.
template <class T>
struct Slots {
  T* const* array = nullptr;
  T* single = nullptr;
  __device__ T* operator[](std::uint32_t slot) const {
    return array != nullptr ? array[slot] : single;
  }
};

// Blocks of the encode kernel an SM must hold: at most 64 registers per thread (32 for
// the float codecs, which need no more), so that at least half the SM's warps are
// resident. Left to itself, ptxas gave the STEPQuant encodes 110 to 125 registers (a
// quarter of the SM), or 32 with spills around the divisions' slow-path calls; with the
// bound every encode keeps within it without a spill (scripts/kernel-report).
template <CodecFamily Family>
constexpr int kEncodeBlocksPerSm = Family == CodecFamily::floats ? 8 : 4;

// One kernel per (staged dtype, codec family): see CodecFamily.
template <class Staged, CodecFamily Family>
__global__ void __launch_bounds__(kBlock, kEncodeBlocksPerSm<Family>)
    encode_kernel(PageFormatView f, Slots<const void> staged, Slots<void> pages,
                  const unsigned long long* skip, std::uint32_t count) {
  extern __shared__ float scratch[];  // encode_scratch_floats(f)
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    encode_block<Staged, Family>(detail::BlockTeam{}, f, staged[slot], pages[slot],
                                 skip != nullptr ? skip + slot : nullptr, blockIdx.x, scratch);
  }
}

template <class Staged, CodecFamily Family>
__global__ void __launch_bounds__(kBlock) decode_kernel(PageFormatView f, Slots<const void> pages,
                                                        Slots<void> staged, std::uint32_t count) {
  extern __shared__ float scratch[];  // decode_scratch_floats(f)
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    decode_block<Staged, Family>(detail::BlockTeam{}, f, pages[slot], staged[slot], blockIdx.x,
                                 scratch);
  }
}

template <class Staged>
__global__ void __launch_bounds__(kBlock)
    find_non_finite_kernel(PageFormatView f, Slots<const void> staged,
                           unsigned long long* first_index, std::uint32_t count) {
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    find_non_finite_block<Staged>(detail::BlockTeam{}, f, staged[slot], first_index + slot,
                                  blockIdx.x);
  }
}

// ---------------------------------------------------------------------------------------
// Host side

// Calls launch.template operator()<Staged, Family>() for the view's staged dtype and codec
// family.
template <class Launch>
void dispatch(const PageFormatView& f, const Launch& launch) {
  const auto with = [&]<class Staged>() {
    switch (codec_family(f)) {
      case CodecFamily::floats: launch.template operator()<Staged, CodecFamily::floats>(); break;
      case CodecFamily::uniform: launch.template operator()<Staged, CodecFamily::uniform>(); break;
      case CodecFamily::stepquant_rows:
        launch.template operator()<Staged, CodecFamily::stepquant_rows>();
        break;
      default: launch.template operator()<Staged, CodecFamily::stepquant>(); break;
    }
  };
  if (f.staged_dtype == DType::f32) {
    with.template operator()<StagedF32>();
  } else {
    with.template operator()<StagedBf16>();
  }
}

bool aligned(const void* p, std::uintptr_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

std::uintptr_t staged_alignment(const PageFormatView& f) {
  return f.staged_dtype == DType::f32 ? 4 : 2;
}

dim3 grid(std::uint32_t blocks_per_slot, std::uint32_t count) {
  return {blocks_per_slot, count < kMaxGridY ? count : kMaxGridY, 1};
}

cudaError_t launch_encode(const PageFormatView& f, Slots<const void> staged, Slots<void> pages,
                          const unsigned long long* skip, std::uint32_t count,
                          cudaStream_t stream) {
  const dim3 g = grid(page_blocks(f), count);
  // 6.6 KiB at K = V = 128 (KDA 10.6 KiB); heads above K = V = 2246 (KDA 864) need more
  // than 48 KiB, the limit without an opt-in (encode_scratch_floats gives the most).
  const std::size_t shared = encode_scratch_floats(f) * sizeof(float);
  cudaError_t status = cudaSuccess;
  const auto launch = [&]<class Staged, CodecFamily Family>() {
    if (shared > kDefaultSharedLimit) {
      status = cudaFuncSetAttribute(encode_kernel<Staged, Family>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared));
      if (status != cudaSuccess) return;
    }
    encode_kernel<Staged, Family><<<g, kBlock, shared, stream>>>(f, staged, pages, skip, count);
  };
  dispatch(f, launch);
  return status != cudaSuccess ? status : cudaGetLastError();
}

cudaError_t launch_decode(const PageFormatView& f, Slots<const void> pages, Slots<void> staged,
                          std::uint32_t count, cudaStream_t stream) {
  const dim3 g = grid(page_blocks(f), count);
  // At most 32 KiB (kMaxHeadDim), below the limit without an opt-in.
  const std::size_t shared = decode_scratch_floats(f) * sizeof(float);
  const auto launch = [&]<class Staged, CodecFamily Family>() {
    decode_kernel<Staged, Family><<<g, kBlock, shared, stream>>>(f, pages, staged, count);
  };
  dispatch(f, launch);
  return cudaGetLastError();
}

cudaError_t launch_find(const PageFormatView& f, Slots<const void> staged,
                        unsigned long long* first_index, std::uint32_t count, cudaStream_t stream) {
  // Every entry starts at UINT64_MAX (all bytes 0xFF); the blocks lower it.
  const cudaError_t status =
      cudaMemsetAsync(first_index, 0xFF, sizeof(unsigned long long) * count, stream);
  if (status != cudaSuccess) {
    return status;
  }
  const dim3 g = grid(f.head_count, count);
  if (f.staged_dtype == DType::f32) {
    find_non_finite_kernel<StagedF32><<<g, kBlock, 0, stream>>>(f, staged, first_index, count);
  } else {
    find_non_finite_kernel<StagedBf16><<<g, kBlock, 0, stream>>>(f, staged, first_index, count);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t encode_pages(const PageFormatView& view, const void* const* staged, void* const* pages,
                         std::uint32_t count, const unsigned long long* skip,
                         cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || pages == nullptr ||
      (skip != nullptr && !aligned(skip, 8))) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) {
    return cudaSuccess;
  }
  return launch_encode(view, {staged, nullptr}, {pages, nullptr}, skip, count, stream);
}

cudaError_t decode_pages(const PageFormatView& view, const void* const* pages, void* const* staged,
                         std::uint32_t count, cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || pages == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) {
    return cudaSuccess;
  }
  return launch_decode(view, {pages, nullptr}, {staged, nullptr}, count, stream);
}

cudaError_t find_non_finite_pages(const PageFormatView& view, const void* const* staged,
                                  std::uint32_t count, unsigned long long* first_index,
                                  cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || first_index == nullptr ||
      !aligned(first_index, 8)) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) {
    return cudaSuccess;
  }
  return launch_find(view, {staged, nullptr}, first_index, count, stream);
}

cudaError_t encode_page(const PageFormatView& view, const void* staged, void* page,
                        const unsigned long long* skip, cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || page == nullptr ||
      !aligned(staged, staged_alignment(view)) || !aligned(page, 4) ||
      (skip != nullptr && !aligned(skip, 8))) {
    return cudaErrorInvalidValue;
  }
  return launch_encode(view, {nullptr, staged}, {nullptr, page}, skip, 1, stream);
}

cudaError_t decode_page(const PageFormatView& view, const void* page, void* staged,
                        cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || page == nullptr ||
      !aligned(staged, staged_alignment(view)) || !aligned(page, 4)) {
    return cudaErrorInvalidValue;
  }
  return launch_decode(view, {nullptr, page}, {nullptr, staged}, 1, stream);
}

cudaError_t find_non_finite(const PageFormatView& view, const void* staged,
                            unsigned long long* first_index, cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || staged == nullptr || first_index == nullptr ||
      !aligned(staged, staged_alignment(view)) || !aligned(first_index, 8)) {
    return cudaErrorInvalidValue;
  }
  return launch_find(view, {nullptr, staged}, first_index, 1, stream);
}

}  // namespace statepool::kernels::cuda
