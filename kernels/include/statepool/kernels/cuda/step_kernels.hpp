#pragma once
// The fused decode step on the GPU (kernels/fused_step.hpp's step, on device pages): one
// launch per layer call, a block of 128 threads per (request, head), the head held in
// shared memory between unpacking and repacking (block_step.hpp has the exact work).
//
// Equality with the CPU: the page bytes, the outputs and the rejected heads equal
// kernels::fused_step's bit for bit: the block body is the code the CPU tests run on
// host threads against fused_step (tests/kernels/test_device_step_emulation.cpp), the
// decay is decay_factor (IEEE operations only), the codec phases are block_codec.hpp's,
// and the library builds with --fmad=false. tests/gpu/test_fused_step_gpu.cpp checks the
// device itself.
//
// The launcher never throws and never synchronises: it checks what the host can check
// (view_problem, null pointers, qk_heads dividing num_heads, the layer, step_fits_device),
// enqueues on `stream` and returns the launch status, cudaErrorInvalidValue with nothing
// enqueued on a bad argument. batch == 0 enqueues nothing. Every pointer in `step` is
// device memory (or managed / mapped): the inputs, the outputs, the arena's pages, the
// slot indices and `rejected`. A slot that appears twice in one launch is stepped once,
// for its first request; the later ones are refused on the device (kStepDuplicateSlot,
// nothing written for them), since the host cannot read the device's slot list.
//
// Thread-safety: stateless; concurrent launches on disjoint pages are fine.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "statepool/kernels/cuda/block_step.hpp"
#include "statepool/kernels/cuda/page_format.hpp"

namespace statepool::kernels::cuda {

/// Threads per block of the step kernel.
inline constexpr unsigned kStepBlock = 128;

/// True when a block of the step kernel for `view`'s heads fits the current device's
/// shared memory per block (opt-in limit): the K V state, the K decays and the kernel's
/// own static shared memory. False when the device cannot be queried. (K = V = 128 needs
/// 66 KiB; an H100/H200 allows 227 KiB per block, an A100 163 KiB.)
[[nodiscard]] bool step_fits_device(const PageFormatView& view) noexcept;

/// The step counts of an arena's pages for StepView::step_counts (the light step mode):
/// page_count x head_count zeroed uint32 on the current device, owned.
class DeviceStepCounts {
 public:
  /// cudaMalloc + cudaMemset (synchronous). Throws std::runtime_error naming the CUDA
  /// error, std::invalid_argument for a size of 0 or one that overflows.
  DeviceStepCounts(std::uint32_t page_count, std::uint32_t head_count);
  ~DeviceStepCounts();
  DeviceStepCounts(DeviceStepCounts&& other) noexcept;
  DeviceStepCounts& operator=(DeviceStepCounts&& other) noexcept;
  DeviceStepCounts(const DeviceStepCounts&) = delete;
  DeviceStepCounts& operator=(const DeviceStepCounts&) = delete;

  [[nodiscard]] std::uint32_t* data() const noexcept { return counts_; }

 private:
  std::uint32_t* counts_ = nullptr;
};

/// One step of layer step.layer for step.batch requests (see block_step.hpp's StepView).
/// `view` is a DevicePageFormat's view of the arena's layout (any staged dtype).
cudaError_t fused_step_pages(const PageFormatView& view, const StepView& step,
                             cudaStream_t stream) noexcept;

}  // namespace statepool::kernels::cuda
