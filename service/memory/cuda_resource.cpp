#include "memory/cuda_resource.hpp"

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "statepool/kernels/cuda/vmm.hpp"
#include "statepool/support/size.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using kernels::cuda::CudaError;
using kernels::cuda::CudaProblem;
using kernels::cuda::IpcAllocation;
using kernels::cuda::VmmAllocation;

constexpr HandleKind kVmmAndIpc[] = {HandleKind::cuda_vmm_fd, HandleKind::cuda_ipc};
constexpr HandleKind kIpcOnly[] = {HandleKind::cuda_ipc};

[[noreturn]] void throw_unusable(int device, const std::string& reason) {
  throw std::runtime_error("the cuda backend cannot use CUDA device " + std::to_string(device) +
                           ": " + reason + "; --backend host needs no GPU");
}

/// One allocation of either kind; `Memory` is VmmAllocation or IpcAllocation, which free
/// the device memory (and close the descriptor) when this is destroyed.
template <class Memory>
class CudaAllocation final : public Allocation {
 public:
  CudaAllocation(const AllocationInfo& info, Memory memory) noexcept
      : Allocation(info), memory_(std::move(memory)) {}

 private:
  Memory memory_;
};

/// Memory another daemon allocated: this process's mapping and the descriptor it sends on.
struct AdoptedVmm {
  kernels::cuda::ImportedVmm mapping;
  support::UniqueFd fd;
};

}  // namespace

CudaResource::CudaResource(int device) : device_(device) {
  const kernels::cuda::CudaUsability usable = kernels::cuda::cuda_usability(device);
  // Without POSIX descriptors the device still shares memory as legacy IPC handles.
  if (!usable && usable.problem != CudaProblem::no_posix_fd) throw_unusable(device, usable.reason);
  try {
    info_ = kernels::cuda::query_device(device);
  } catch (const CudaError& e) {
    throw_unusable(device, e.what());
  }
  try {
    granularity_ = VmmAllocation::granularity(device);
  } catch (const CudaError& e) {
    // The query names POSIX-descriptor memory, which a device without that support may
    // refuse; its IPC allocations then round to 2 MiB, cudaMalloc's large-page size.
    if (info_.posix_fd) throw_unusable(device, e.what());
    granularity_ = std::size_t{2} << 20;
  }
}

std::span<const HandleKind> CudaResource::handle_kinds() const noexcept {
  if (info_.posix_fd) return kVmmAndIpc;
  return kIpcOnly;
}

std::size_t CudaResource::free_bytes() const {
  try {
    return kernels::cuda::memory_info(device_).free_bytes;
  } catch (const CudaError& e) {
    throw StatusError(Status::internal, e.what());
  }
}

std::size_t CudaResource::total_bytes() const {
  try {
    return kernels::cuda::memory_info(device_).total_bytes;
  } catch (const CudaError& e) {
    throw StatusError(Status::internal, e.what());
  }
}

std::shared_ptr<Allocation> CudaResource::do_allocate(std::size_t bytes, std::string_view label,
                                                      HandleKind handle) {
  const auto what = [&] {
    return "'" + std::string(label) + "' (" + support::format_bytes(bytes) + ")";
  };
  AllocationInfo info;
  info.bytes = bytes;
  info.where.space = MemorySpace::device;
  info.where.device = device_;
  info.where.device_uuid = info_.uuid;
  info.where.handle_kind = handle;
  info.where.granularity = granularity_;
  try {
    if (handle == HandleKind::cuda_vmm_fd) {
      VmmAllocation memory(device_, bytes);  // bytes is already a granularity multiple
      info.bytes = memory.size();
      info.data = memory.data();
      info.fd = memory.fd();
      return std::make_shared<CudaAllocation<VmmAllocation>>(info, std::move(memory));
    }
    IpcAllocation memory(device_, bytes);
    info.data = memory.data();
    info.where.ipc_handle = memory.handle();
    return std::make_shared<CudaAllocation<IpcAllocation>>(info, std::move(memory));
  } catch (const CudaError& e) {
    if (e.out_of_memory()) {
      throw StatusError(Status::pool_exhausted,
                        "cuda memory: no device memory left for " + what() + ": " + e.what());
    }
    throw StatusError(Status::internal, "cuda memory for " + what() + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw StatusError(Status::internal, "cuda memory for " + what() + ": " + e.what());
  }
}

std::shared_ptr<Allocation> CudaResource::do_adopt(support::UniqueFd fd, std::size_t bytes,
                                                   std::string_view label, HandleKind handle) {
  if (handle != HandleKind::cuda_vmm_fd) {
    return MemoryResource::do_adopt(std::move(fd), bytes, label, handle);
  }
  const auto what = [&] {
    return "'" + std::string(label) + "' (" + support::format_bytes(bytes) + ")";
  };
  try {
    kernels::cuda::ImportedVmm mapping(fd.get(), bytes, device_);
    AllocationInfo info;
    info.bytes = mapping.size();
    info.data = mapping.data();
    info.fd = fd.get();
    info.where.space = MemorySpace::device;
    info.where.device = device_;
    info.where.device_uuid = info_.uuid;
    info.where.handle_kind = handle;
    info.where.granularity = granularity_;
    return std::make_shared<CudaAllocation<AdoptedVmm>>(
        info, AdoptedVmm{std::move(mapping), std::move(fd)});
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    // The descriptor is input: whatever the driver refuses is a refusal of it.
    throw StatusError(Status::invalid_argument,
                      "cuda memory to take over " + what() + ": " + e.what());
  }
}

}  // namespace statepool::service
