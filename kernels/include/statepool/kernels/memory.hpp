#pragma once
// Where bytes live and how they are shared: the vocabulary the daemon's memory resources,
// its executors, the codec launchers and the client's mapping code have in common.
// Values match wire::MemorySpace and wire::HandleKind (protocol/convert.hpp ties them).
//
// Plain data; thread-safe to share.

#include <array>
#include <cstddef>
#include <cstdint>

namespace statepool::kernels {

/// Host memory is addressable by the CPU; device memory by one CUDA device.
enum class MemorySpace : std::uint8_t { host = 0, device = 1 };

/// What a peer process receives to map an allocation.
enum class HandleKind : std::uint8_t {
  memfd = 0,        ///< a memfd; mmap(MAP_SHARED) it (sent with SCM_RIGHTS)
  cuda_vmm_fd = 1,  ///< a CUDA VMM POSIX file descriptor (cuMemImportFromShareableHandle)
  cuda_ipc = 2,     ///< the 64 bytes of a legacy cudaIpcMemHandle_t (cudaIpcOpenMemHandle)
};

/// Bytes of a legacy cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr std::size_t kCudaIpcHandleBytes = 64;
/// Bytes of a GPU's UUID (cudaDeviceProp::uuid).
inline constexpr std::size_t kDeviceUuidBytes = 16;
using DeviceUuid = std::array<std::byte, kDeviceUuidBytes>;

/// How an arena or a staging buffer is mapped: what the daemon says in its reply
/// (wire::MemoryDescriptor) and what its memory resources describe. The descriptor of the
/// memfd and cuda_vmm_fd kinds travels beside it (SCM_RIGHTS), not in it.
struct MemoryDescriptor {
  MemorySpace space = MemorySpace::host;
  /// CUDA device ordinal; -1 for host memory. The daemon's ordinal in its reply; a client
  /// that maps the memory replaces it with the same GPU's ordinal in its own process
  /// (CUDA_VISIBLE_DEVICES may number the GPUs differently), found by `device_uuid`.
  int device = -1;
  /// Device memory: the GPU's UUID (all zero: unknown, e.g. from an older daemon).
  DeviceUuid device_uuid{};
  HandleKind handle_kind = HandleKind::memfd;
  std::size_t granularity = 1;  ///< the mapping size is a multiple of it
  std::array<std::byte, kCudaIpcHandleBytes> ipc_handle{};  ///< cuda_ipc only

  /// True when the handle is a file descriptor sent with the reply.
  [[nodiscard]] constexpr bool handle_is_fd() const noexcept {
    return handle_kind == HandleKind::memfd || handle_kind == HandleKind::cuda_vmm_fd;
  }
};

/// A buffer to read or write: a pointer valid in this process, its length, and where it
/// lives. Borrowed: whoever hands one out keeps the memory alive while it is used.
struct BufferRef {
  std::byte* data = nullptr;
  std::size_t size = 0;
  MemorySpace space = MemorySpace::host;
  int device = -1;  ///< CUDA device ordinal; -1 for host memory
};

[[nodiscard]] const char* to_string(MemorySpace space) noexcept;
[[nodiscard]] const char* to_string(HandleKind kind) noexcept;

}  // namespace statepool::kernels
