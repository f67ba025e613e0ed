// The fused-step kernel (step_kernels.hpp): a thin __global__ entry around block_step.hpp's
// step_block, run by a CUDA thread block as its team with the head in dynamic shared
// memory, and the host launcher. Built with --fmad=false (kernels/CMakeLists.txt).

#include <cstdint>

#include "block_team.hpp"
#include "statepool/kernels/cuda/block_step.hpp"
#include "statepool/kernels/cuda/step_kernels.hpp"

namespace statepool::kernels::cuda {
namespace {

constexpr std::uint32_t kMaxGridY = 65535;  // more requests: blocks loop over them

// One kernel per codec family (block_codec.hpp's CodecFamily). At least 3 blocks per SM:
// what the shared memory allows at K = V = 128 (72-76 KiB each, the head in it); the
// bound lets ptxas use up to 170 registers (with none, it held the KDA kernel to 64 and
// spilled).
template <CodecFamily Family>
__global__ void __launch_bounds__(kStepBlock, 3) step_kernel(PageFormatView f, StepView s) {
  extern __shared__ float scratch[];
  __shared__ unsigned long long flags[2];
  for (std::uint32_t request = blockIdx.y; request < s.batch; request += gridDim.y) {
    step_block<Family>(detail::BlockTeam{}, f, s, scratch, flags, request, blockIdx.x);
  }
}

using StepKernel = void (*)(PageFormatView, StepView);

StepKernel kernel_for(const PageFormatView& f) noexcept {
  switch (codec_family(f)) {
    case CodecFamily::floats: return step_kernel<CodecFamily::floats>;
    case CodecFamily::uniform: return step_kernel<CodecFamily::uniform>;
    case CodecFamily::stepquant_rows: return step_kernel<CodecFamily::stepquant_rows>;
    default: return step_kernel<CodecFamily::stepquant>;
  }
}

std::uint64_t dynamic_bytes(const PageFormatView& f) noexcept {
  return step_scratch_floats(f) * sizeof(float);
}

}  // namespace

bool step_fits_device(const PageFormatView& view) noexcept {
  int device = 0;
  int limit = 0;
  cudaFuncAttributes attributes{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attributes, kernel_for(view)) != cudaSuccess) {
    (void)cudaGetLastError();  // answered: the next launch's status must be its own
    return false;
  }
  return dynamic_bytes(view) + attributes.sharedSizeBytes <= static_cast<std::uint64_t>(limit);
}

cudaError_t fused_step_pages(const PageFormatView& view, const StepView& step,
                             cudaStream_t stream) noexcept {
  if (view_problem(view) != nullptr || step.num_heads == 0 || step.qk_heads == 0 ||
      step.num_heads % step.qk_heads != 0 || view.head_count % step.num_heads != 0 ||
      step.layer >= view.head_count / step.num_heads || step.page_stride < view.page_bytes ||
      step.page_stride % 4 != 0 || step.page_count == 0) {
    return cudaErrorInvalidValue;
  }
  if (step.batch == 0) return cudaSuccess;
  if (step.q == nullptr || step.k == nullptr || step.v == nullptr || step.log_decay == nullptr ||
      step.beta == nullptr || step.out == nullptr || step.pages == nullptr ||
      step.slots == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (!step_fits_device(view)) return cudaErrorInvalidValue;
  const std::uint64_t shared = dynamic_bytes(view);
  if (shared > 48 * 1024) {
    const cudaError_t status = cudaFuncSetAttribute(
        kernel_for(view), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (status != cudaSuccess) return status;
  }
  const dim3 grid(step.num_heads, step.batch < kMaxGridY ? step.batch : kMaxGridY, 1);
  kernel_for(view)<<<grid, kStepBlock, shared, stream>>>(view, step);
  return cudaGetLastError();
}

}  // namespace statepool::kernels::cuda
