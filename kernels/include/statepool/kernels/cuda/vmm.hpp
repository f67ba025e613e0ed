#pragma once
// Shareable device memory: what the daemon allocates and exports, and what a client maps.
//
// Two handle kinds (kernels::HandleKind), both offered by the daemon's CUDA resource:
//
//   cuda_vmm_fd  (the default) The daemon cuMemCreate()s physical memory that may be
//                exported as a POSIX file descriptor, maps it in its own address space
//                (cuMemAddressReserve + cuMemMap + cuMemSetAccess), and sends the
//                descriptor with its reply (SCM_RIGHTS). A client maps it with
//                ImportedVmm: cuMemImportFromShareableHandle((void*)(uintptr_t)fd),
//                cuMemAddressReserve, cuMemMap, cuMemSetAccess(read/write for its device).
//                The descriptor may be closed once imported. Needs a device with
//                CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
//                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED. Physical
//                memory is freed when every process has unmapped and released it and every
//                descriptor is closed, so a client that crashes leaves nothing behind once
//                the daemon releases the allocation (the kernel closes the client's side).
//   cuda_ipc     Legacy CUDA IPC, for clients that want it (PyTorch-style): the daemon
//                cudaMalloc()s and sends the 64 bytes of cudaIpcGetMemHandle() in its
//                reply. A client maps it with ImportedIpc: cudaIpcOpenMemHandle(
//                cudaIpcMemLazyEnablePeerAccess); cudaIpcCloseMemHandle when done. A
//                process cannot open its own handles.
//
// Granularity: VMM sizes are multiples of VmmAllocation::granularity(device), the driver's
// RECOMMENDED granularity (cuMemGetAllocationGranularity) for pinned device memory with
// POSIX-fd handles: typically 2 MiB. VmmAllocation rounds a request up to it; ImportedVmm
// requires the size (from the daemon's descriptor) to be a multiple of it. The daemon rounds
// IPC allocations to the same granularity, so both kinds have the same sizes.
//
// Memory is zeroed before a constructor returns (cudaMemsetAsync on the calling thread's
// per-thread stream, then waiting for it), so a peer that maps it after the daemon's reply
// sees zeros.
//
// Ordering: these types do not synchronise with work in flight when they are destroyed.
// Whoever destroys one must know that no stream still reads or writes it (the daemon's
// executors hold an allocation until their work completes).
//
// Errors: constructors throw CudaError (driver.hpp) naming the call, the size and the
// device, e.g. "cuMemCreate(2.0 MiB) on CUDA device 0: CUDA_ERROR_OUT_OF_MEMORY (out of
// memory)"; CudaError::out_of_memory() tells exhaustion from other failures. Invalid
// arguments (a zero size, an imported size that is not a multiple of the granularity, a
// negative descriptor) throw std::invalid_argument. Destructors never throw; a failing
// release is reported on stderr (and ignored silently while the process exits and the
// driver is already shut down).
//
// Thread-safety: objects are move-only values; distinct objects may be used from
// different threads. Constructors and destructors leave the calling thread's current
// device as they found it (DeviceGuard).

#include <array>
#include <cstddef>
#include <memory>

#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::kernels::cuda {

/// The bytes of a legacy cudaIpcMemHandle_t, as the wire carries them.
using IpcHandleBytes = std::array<std::byte, kCudaIpcHandleBytes>;

namespace detail {

/// A VMM allocation handle mapped read/write for one device at an address range reserved
/// in this process: what the daemon's and the client's VMM memory have in common. Owns
/// all three (handle, range, mapping) and undoes them in reverse order.
class VmmMapping {
 public:
  VmmMapping() noexcept = default;
  /// Takes ownership of `handle` (also when it throws: the handle is released then).
  VmmMapping(CUmemGenericAllocationHandle handle, std::size_t bytes, int device);
  VmmMapping(VmmMapping&& other) noexcept;
  VmmMapping& operator=(VmmMapping&& other) noexcept;
  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;
  ~VmmMapping() { reset(); }

  [[nodiscard]] std::byte* data() const noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] CUmemGenericAllocationHandle handle() const noexcept { return handle_; }

 private:
  /// Unmaps, frees the range, releases the handle: whichever of them exist, with the
  /// device's context current (any thread may let a mapping go) and the caller's device
  /// restored. Failures go to report_release_failure (driver.hpp).
  void reset() noexcept;

  CUmemGenericAllocationHandle handle_ = 0;
  bool owns_handle_ = false;
  CUdeviceptr address_ = 0;  ///< 0: no range reserved
  bool mapped_ = false;
  std::size_t bytes_ = 0;
  int device_ = -1;
};

/// cudaFree on the device the memory belongs to.
struct DeviceFree {
  int device = -1;
  void operator()(std::byte* data) const noexcept;
};

/// cudaIpcCloseMemHandle on the device the memory was opened on.
struct IpcClose {
  int device = -1;
  void operator()(std::byte* data) const noexcept;
};

}  // namespace detail

/// Device memory of the daemon, exported as a CUDA VMM POSIX file descriptor
/// (HandleKind::cuda_vmm_fd).
class VmmAllocation {
 public:
  /// At least `bytes` (> 0) zeroed bytes on `device`, rounded up to granularity(device).
  /// Throws CudaError (out_of_memory() when the device is full), std::invalid_argument
  /// for 0 bytes, std::system_error when the descriptor cannot be made close-on-exec.
  VmmAllocation(int device, std::size_t bytes);

  /// The RECOMMENDED allocation granularity of `device` for this kind of memory (pinned,
  /// on the device, POSIX-fd shareable). Throws CudaError.
  [[nodiscard]] static std::size_t granularity(int device);

  /// The memory in this process (a device address).
  [[nodiscard]] std::byte* data() const noexcept { return mapping_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return mapping_.size(); }
  [[nodiscard]] int device() const noexcept { return mapping_.device(); }
  /// The exported descriptor (close-on-exec), owned by this object: send it, do not close
  /// it. Valid while the allocation lives.
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }

 private:
  // Declared before mapping_ so it is destroyed after it: unmap, free the range, release
  // the handle, then close the descriptor.
  support::UniqueFd fd_;
  detail::VmmMapping mapping_;
  std::size_t granularity_ = 0;
};

/// Device memory of the daemon, shared as a legacy CUDA IPC handle (HandleKind::cuda_ipc).
class IpcAllocation {
 public:
  /// `bytes` (> 0) zeroed bytes on `device` (cudaMalloc: not rounded). Throws CudaError
  /// (out_of_memory() when the device is full), std::invalid_argument for 0 bytes.
  IpcAllocation(int device, std::size_t bytes);

  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] int device() const noexcept { return data_.get_deleter().device; }
  /// cudaIpcGetMemHandle's bytes, for the reply.
  [[nodiscard]] const IpcHandleBytes& handle() const noexcept { return handle_; }

 private:
  std::unique_ptr<std::byte, detail::DeviceFree> data_;
  std::size_t bytes_ = 0;
  IpcHandleBytes handle_{};
};

/// A client's mapping of a daemon's VMM allocation (HandleKind::cuda_vmm_fd).
class ImportedVmm {
 public:
  /// Maps the allocation `fd` (borrowed: the caller may close it afterwards) refers to,
  /// `bytes` long (a multiple of VmmAllocation::granularity(device)), read/write for
  /// `device`. Throws CudaError, std::invalid_argument.
  ImportedVmm(int fd, std::size_t bytes, int device);

  [[nodiscard]] std::byte* data() const noexcept { return mapping_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return mapping_.size(); }
  [[nodiscard]] int device() const noexcept { return mapping_.device(); }

 private:
  detail::VmmMapping mapping_;
};

/// A client's mapping of a daemon's legacy IPC allocation (HandleKind::cuda_ipc). Must be
/// another process than the one that made the handle.
class ImportedIpc {
 public:
  /// Opens `handle` on `device`. Throws CudaError.
  ImportedIpc(const IpcHandleBytes& handle, int device);

  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] int device() const noexcept { return data_.get_deleter().device; }

 private:
  std::unique_ptr<std::byte, detail::IpcClose> data_;
};

}  // namespace statepool::kernels::cuda
