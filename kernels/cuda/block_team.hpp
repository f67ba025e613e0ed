#pragma once
// The CUDA thread block as the "team" of block_codec.hpp and block_step.hpp (internal to
// statepool_kernels_cuda: the page kernels and the fused-step kernel share it).

#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::cuda::detail {

// The CUDA thread block as a block_codec.hpp team. The members are __host__ __device__
// so that the host-side pass of nvcc can see the templates instantiated with this type;
// they only ever run on the device.
struct BlockTeam {
  STATEPOOL_HD unsigned rank() const noexcept {
#if defined(__CUDA_ARCH__)
    return threadIdx.x;
#else
    return 0;
#endif
  }
  STATEPOOL_HD unsigned size() const noexcept {
#if defined(__CUDA_ARCH__)
    return blockDim.x;
#else
    return 1;
#endif
  }
  STATEPOOL_HD void sync() const noexcept {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  STATEPOOL_HD void atomic_min(unsigned long long* p, unsigned long long v) const noexcept {
#if defined(__CUDA_ARCH__)
    atomicMin(p, v);
#else
    *p = v < *p ? v : *p;
#endif
  }
};

}  // namespace statepool::kernels::cuda::detail
