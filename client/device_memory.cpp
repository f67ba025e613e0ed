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
    // The daemon's GPU as this process numbers it (CUDA_VISIBLE_DEVICES may differ); an
    // older daemon sends no UUID, and its ordinal is all there is.
    int device = where.device;
    if (where.device_uuid != kernels::DeviceUuid{}) {
      device = kernels::cuda::device_with_uuid(where.device_uuid);
      if (device < 0) {
        throw Error(Status::internal,
                    "cannot map " + what + ": the daemon's GPU (its device " +
                        std::to_string(where.device) +
                        ") is not visible in this process; check CUDA_VISIBLE_DEVICES, or set "
                        "Options::map_device_memory = false to use it by id only");
      }
    }
    if (where.handle_kind == kernels::HandleKind::cuda_vmm_fd) {
      auto mapping = std::make_shared<const kernels::cuda::ImportedVmm>(fd, bytes, device);
      return {mapping, mapping->data(), device};
    }
    if (where.handle_kind == kernels::HandleKind::cuda_ipc) {
      auto mapping = std::make_shared<const kernels::cuda::ImportedIpc>(where.ipc_handle, device);
      return {mapping, mapping->data(), device};
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(Status::internal,
                "cannot map " + what + " (device memory of CUDA device " +
                    std::to_string(where.device) + ", " + kernels::to_string(where.handle_kind) +
                    " handle): " + e.what() +
                    " — set Options::map_device_memory = false to use it by id only");
  }
  throw Error(Status::internal, what + ": handle kind " + kernels::to_string(where.handle_kind) +
                                    " is not device memory");
#else
  (void)fd;
  (void)bytes;
  throw Error(Status::internal,
              what + " is device memory of CUDA device " + std::to_string(where.device) +
                  ", but this client library was built without CUDA; rebuild it with the CUDA "
                  "toolkit, or set Options::map_device_memory = false to use it by id only");
#endif
}

}  // namespace statepool::client::detail
