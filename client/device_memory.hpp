#pragma once
// Internal: maps the daemon's device memory (cuda backend) into this process, for Arena
// and Staging. Built with CUDA, it imports a VMM descriptor (cuMemImportFromShareableHandle
// + cuMemMap + cuMemSetAccess) or opens a legacy IPC handle (cudaIpcOpenMemHandle); built
// without CUDA, it refuses with a clear Error. The mapping is released when the last
// reference goes (RAII, like the host mmap).

#include <cstddef>
#include <memory>
#include <string>

#include "statepool/kernels/memory.hpp"

namespace statepool::client::detail {

/// Device memory mapped here: the device address of its first byte. Releasing the owner
/// unmaps it.
struct DeviceMapping {
  std::shared_ptr<const void> owner;
  std::byte* data = nullptr;
  int device = -1;  ///< the GPU's ordinal in this process
};

/// True when this client library can map device memory (it was built with CUDA).
[[nodiscard]] bool can_map_device_memory() noexcept;

/// Maps `bytes` of the device memory `where` describes (`fd`: the descriptor received
/// with the reply, for cuda_vmm_fd; borrowed). `what` names it in errors ("arena 3").
/// Throws Error(internal) naming the CUDA failure, or when built without CUDA.
[[nodiscard]] DeviceMapping map_device_memory(const kernels::MemoryDescriptor& where, int fd,
                                              std::size_t bytes, const std::string& what);

}  // namespace statepool::client::detail
