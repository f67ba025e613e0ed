#pragma once
// The cuda backend's memory: device memory on one CUDA device, shared with clients as
//
//   cuda_vmm_fd  (default) cuMemCreate'd memory exported as a POSIX file descriptor. The
//                reply's descriptor (AllocationInfo::fd) travels with SCM_RIGHTS; the
//                client cuMemImportFromShareableHandle()s it, reserves an address range,
//                cuMemMap()s it and cuMemSetAccess()es it read/write for its device
//                (kernels::cuda::ImportedVmm does all of it).
//   cuda_ipc     cudaMalloc'd memory with a legacy cudaIpcMemHandle_t: the 64 bytes go in
//                the reply's MemoryDescriptor::ipc_handle (no descriptor, fd -1); the
//                client cudaIpcOpenMemHandle()s them (kernels::cuda::ImportedIpc).
//                Offered alone when the device cannot export POSIX descriptors.
//
// Granularity: every size is rounded up to the device's recommended VMM granularity
// (cuMemGetAllocationGranularity, typically 2 MiB), for both kinds, and descriptors say
// it (MemoryDescriptor::granularity). Memory is zeroed before allocate() returns.
//
// Errors:
//   - construction: std::runtime_error when CUDA cannot be used, naming the device and
//     what is missing, e.g. "the cuda backend cannot use CUDA device 0: no usable CUDA
//     driver: cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA
//     runtime version); --backend host needs no GPU". Missing: a driver, the device, or
//     virtual memory management (cuMemCreate).
//   - allocate(): out of device memory is StatusError(pool_exhausted) "cuda memory: no
//     device memory left for 'arena-3' (2.0 GiB): cuMemCreate(2.0 GiB) on CUDA device 0:
//     CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; any other CUDA failure is
//     StatusError(internal) with the CUDA error text; a zero size or a handle kind the
//     device cannot give is invalid_argument (MemoryResource::allocate).
//   - free_bytes() / total_bytes(): StatusError(internal) when the query fails.
//
// Releasing an allocation does not wait for device work: the executors hold allocations
// until the work that uses them completes (resource.hpp).
//
// Thread-safety: allocate() and every getter may be called concurrently from any thread;
// none of them changes the calling thread's current device.

#include <cstddef>
#include <span>
#include <string_view>

#include "memory/resource.hpp"
#include "statepool/kernels/cuda/driver.hpp"

namespace statepool::service {

class CudaResource final : public MemoryResource {
 public:
  /// Memory on CUDA device `device`. Throws std::runtime_error (see the top of the file)
  /// when the driver, the device or its VMM support is missing.
  explicit CudaResource(int device);

  [[nodiscard]] std::string_view name() const noexcept override { return "cuda"; }
  [[nodiscard]] MemorySpace space() const noexcept override { return MemorySpace::device; }
  [[nodiscard]] int device() const noexcept override { return device_; }
  /// The device's recommended VMM allocation granularity.
  [[nodiscard]] std::size_t granularity() const noexcept override { return granularity_; }
  /// {cuda_vmm_fd, cuda_ipc}; {cuda_ipc} when the device cannot export POSIX descriptors.
  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override;

  /// What the device is (name, compute capability, memory at construction, VMM support).
  [[nodiscard]] const kernels::cuda::DeviceInfo& device_info() const noexcept { return info_; }
  /// Free device memory now (cudaMemGetInfo): for the planner and for a capacity given as
  /// a fraction of the device. Other processes' use counts too.
  [[nodiscard]] std::size_t free_bytes() const;
  /// The device's memory size (cudaMemGetInfo).
  [[nodiscard]] std::size_t total_bytes() const;
  /// free_bytes(): what capacity planning and a fractional --pool-capacity answer against.
  [[nodiscard]] std::optional<std::uint64_t> available_bytes() const override {
    return free_bytes();
  }

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override;
  /// cuda_vmm_fd only: imports the exported allocation (cuMemImportFromShareableHandle)
  /// and maps it on this device; the descriptor stays open for clients. Legacy IPC
  /// handles cannot move to another process's ownership: the default refusal.
  std::shared_ptr<Allocation> do_adopt(support::UniqueFd fd, std::size_t bytes,
                                       std::string_view label, HandleKind handle) override;

  int device_;
  kernels::cuda::DeviceInfo info_;
  std::size_t granularity_ = 0;
};

}  // namespace statepool::service
