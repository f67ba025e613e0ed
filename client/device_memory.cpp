#include "device_memory.hpp"

#include <stdexcept>
#include <string>

#include "statepool/client.hpp"
#if defined(STATEPOOL_HAVE_CUDA)
#include "statepool/kernels/cuda/vmm.hpp"
#endif

namespace statepool::client::detail {

bool can_map_device_memory() noexcept {
#if defined(STATEPOOL_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

DeviceMapping map_device_memory(const kernels::MemoryDescriptor& where, int fd, std::size_t bytes,
                                const std::string& what) {
#if defined(STATEPOOL_HAVE_CUDA)
  try {
    if (where.handle_kind == kernels::HandleKind::cuda_vmm_fd) {
      auto mapping = std::make_shared<const kernels::cuda::ImportedVmm>(fd, bytes, where.device);
      return {mapping, mapping->data()};
    }
    if (where.handle_kind == kernels::HandleKind::cuda_ipc) {
      auto mapping =
          std::make_shared<const kernels::cuda::ImportedIpc>(where.ipc_handle, where.device);
      return {mapping, mapping->data()};
    }
  } catch (const std::exception& e) {
    throw Error(wire::Status::internal,
                "cannot map " + what + " (device memory of CUDA device " +
                    std::to_string(where.device) + ", " + kernels::to_string(where.handle_kind) +
                    " handle): " + e.what() +
                    " — set Options::map_device_memory = false to use it by id only");
  }
  throw Error(wire::Status::internal, what + ": handle kind " +
                                          kernels::to_string(where.handle_kind) +
                                          " is not device memory");
#else
  (void)fd;
  (void)bytes;
  throw Error(wire::Status::internal,
              what + " is device memory of CUDA device " + std::to_string(where.device) +
                  ", but this client library was built without CUDA; rebuild it with the CUDA "
                  "toolkit, or set Options::map_device_memory = false to use it by id only");
#endif
}

}  // namespace statepool::client::detail
