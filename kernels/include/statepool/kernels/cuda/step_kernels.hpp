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
// (view_problem, null pointers, qk_heads dividing num_heads, the layer, the shared memory
// a head needs against the device's per-block limit), enqueues on `stream` and returns
// the launch status, cudaErrorInvalidValue with nothing enqueued on a bad argument.
// batch == 0 enqueues nothing. Every pointer in `step` is device memory (or managed /
// mapped): the inputs, the outputs, the arena's pages, the slot indices and `rejected`.
//
// Thread-safety: stateless; concurrent launches on disjoint pages are fine.

#include <cuda_runtime_api.h>

#include "statepool/kernels/cuda/block_step.hpp"
#include "statepool/kernels/cuda/page_format.hpp"

namespace statepool::kernels::cuda {

/// Threads per block of the step kernel.
inline constexpr unsigned kStepBlock = 128;

/// Largest K * V the step kernel supports on the current device (its opt-in shared
/// memory per block, less the decay row and the flag), or 0 when it cannot be queried.
[[nodiscard]] std::uint64_t max_step_head_values() noexcept;

/// One step of layer step.layer for step.batch requests (see block_step.hpp's StepView).
/// `view` is a DevicePageFormat's view of the arena's layout (any staged dtype).
cudaError_t fused_step_pages(const PageFormatView& view, const StepView& step,
                             cudaStream_t stream) noexcept;

}  // namespace statepool::kernels::cuda
