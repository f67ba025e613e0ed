#include "statepool/kernels/cuda/vmm.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "statepool/support/size.hpp"

namespace statepool::kernels::cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "the wire's IPC handle size must be the runtime's");

/// "cuMemCreate(2.0 MiB)": the call and the size, for error messages.
std::string sized(const char* call, std::size_t bytes) {
  return std::string(call) + "(" + support::format_bytes(bytes) + ")";
}

/// What every VMM allocation of statepool is: pinned device memory on `device`, shareable
/// as a POSIX file descriptor. The granularity query and cuMemCreate must use the same.
CUmemAllocationProp allocation_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

void require_bytes(std::size_t bytes, const char* what) {
  if (bytes == 0) throw std::invalid_argument(std::string(what) + ": 0 bytes");
}

/// Zeroes `bytes` at `data` on the current device and waits for it. The per-thread stream
/// (not the legacy default stream) so that allocations on different threads do not wait
/// for each other's work, nor for the executors' streams.
void zero(std::byte* data, std::size_t bytes, int device) {
  check(cudaMemsetAsync(data, 0, bytes, cudaStreamPerThread), sized("cudaMemsetAsync", bytes),
        device);
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize", device);
}

}  // namespace

// --- the mapping both sides share ---------------------------------------------------------

namespace detail {

VmmMapping::VmmMapping(CUmemGenericAllocationHandle handle, std::size_t bytes, int device)
    : handle_(handle), owns_handle_(true), bytes_(bytes), device_(device) {
  try {
    const DriverApi& api = driver();
    check(api.cuMemAddressReserve(&address_, bytes, 0, 0, 0), sized("cuMemAddressReserve", bytes),
          device);
    check(api.cuMemMap(address_, bytes, 0, handle_, 0), sized("cuMemMap", bytes), device);
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(api.cuMemSetAccess(address_, bytes, &access, 1), sized("cuMemSetAccess", bytes), device);
  } catch (...) {
    reset();  // no destructor runs for an object whose constructor threw
    throw;
  }
}

VmmMapping::VmmMapping(VmmMapping&& other) noexcept
    : handle_(std::exchange(other.handle_, 0)),
      owns_handle_(std::exchange(other.owns_handle_, false)),
      address_(std::exchange(other.address_, 0)),
      mapped_(std::exchange(other.mapped_, false)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(std::exchange(other.device_, -1)) {}

VmmMapping& VmmMapping::operator=(VmmMapping&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, 0);
    owns_handle_ = std::exchange(other.owns_handle_, false);
    address_ = std::exchange(other.address_, 0);
    mapped_ = std::exchange(other.mapped_, false);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

std::byte* VmmMapping::data() const noexcept {
  // A device address is an integer to the driver API and a pointer to the runtime's.
  return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(address_));
}

void VmmMapping::reset() noexcept {
  if (!owns_handle_ && address_ == 0) return;
  // A mapping exists only after driver() succeeded, so this cannot throw.
  const DriverApi& api = driver();
  // The driver calls need the device's context current, and the thread that lets the
  // mapping go (a worker closing an arena, a client's thread) may never have used CUDA.
  std::optional<DeviceGuard> on;
  try {
    on.emplace(device_);
  } catch (const CudaError& e) {
    report_release_failure("making the device current to unmap (cudaSetDevice)", device_,
                           static_cast<cudaError_t>(e.code()));
  }
  // The documented order: unmap before freeing the range, and the physical memory goes
  // when the handle is released and no mapping refers to it any more.
  if (mapped_) report_release_failure("cuMemUnmap", device_, api.cuMemUnmap(address_, bytes_));
  if (address_ != 0) {
    report_release_failure("cuMemAddressFree", device_, api.cuMemAddressFree(address_, bytes_));
  }
  if (owns_handle_) report_release_failure("cuMemRelease", device_, api.cuMemRelease(handle_));
  handle_ = 0;
  owns_handle_ = false;
  address_ = 0;
  mapped_ = false;
  bytes_ = 0;
}

void DeviceFree::operator()(std::byte* data) const noexcept {
  try {
    const DeviceGuard guard(device);
    report_release_failure("cudaFree", device, cudaFree(data));
  } catch (const CudaError& e) {
    report_release_failure("making the device current for cudaFree (cudaSetDevice)", device,
                           static_cast<cudaError_t>(e.code()));
  }
}

void IpcClose::operator()(std::byte* data) const noexcept {
  try {
    const DeviceGuard guard(device);
    report_release_failure("cudaIpcCloseMemHandle", device, cudaIpcCloseMemHandle(data));
  } catch (const CudaError& e) {
    report_release_failure("making the device current for cudaIpcCloseMemHandle (cudaSetDevice)",
                           device, static_cast<cudaError_t>(e.code()));
  }
}

}  // namespace detail

// --- daemon side --------------------------------------------------------------------------------

std::size_t VmmAllocation::granularity(int device) {
  const CUmemAllocationProp prop = allocation_prop(device);
  std::size_t granularity = 0;
  check(driver().cuMemGetAllocationGranularity(&granularity, &prop,
                                               CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity", device);
  return granularity;
}

VmmAllocation::VmmAllocation(int device, std::size_t bytes) {
  require_bytes(bytes, "VmmAllocation");
  const DriverApi& api = driver();
  const DeviceGuard guard(device);  // its context for the driver calls and the memset
  granularity_ = granularity(device);
  const std::size_t rest = bytes % granularity_;
  if (rest != 0 && bytes > std::numeric_limits<std::size_t>::max() - (granularity_ - rest)) {
    throw std::invalid_argument("VmmAllocation: " + std::to_string(bytes) + " bytes is too large");
  }
  const std::size_t size = rest == 0 ? bytes : bytes + (granularity_ - rest);

  const CUmemAllocationProp prop = allocation_prop(device);
  CUmemGenericAllocationHandle handle = 0;
  check(api.cuMemCreate(&handle, size, &prop, 0), sized("cuMemCreate", size), device);
  mapping_ = detail::VmmMapping(handle, size, device);

  // Exported once, now: the descriptor is what every reply for this memory carries.
  int fd = -1;
  check(api.cuMemExportToShareableHandle(&fd, mapping_.handle(),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle", device);
  fd_ = support::UniqueFd(fd);
  // The driver does not promise O_CLOEXEC; a child the daemon spawns must not inherit
  // device memory.
  const int flags = ::fcntl(fd_.get(), F_GETFD);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFD, flags | FD_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "fcntl(FD_CLOEXEC) of a CUDA VMM descriptor");
  }

  zero(mapping_.data(), size, device);
  // On any throw above, the members already set are destroyed in the right order.
}

IpcAllocation::IpcAllocation(int device, std::size_t bytes) : data_(nullptr, {device}) {
  require_bytes(bytes, "IpcAllocation");
  const DeviceGuard guard(device);
  void* raw = nullptr;
  check(cudaMalloc(&raw, bytes), sized("cudaMalloc", bytes), device);
  data_.reset(static_cast<std::byte*>(raw));
  bytes_ = bytes;
  cudaIpcMemHandle_t handle{};
  check(cudaIpcGetMemHandle(&handle, raw), "cudaIpcGetMemHandle", device);
  std::memcpy(handle_.data(), &handle, sizeof handle);
  zero(data_.get(), bytes, device);
}

// --- client side --------------------------------------------------------------------------------

ImportedVmm::ImportedVmm(int fd, std::size_t bytes, int device) {
  require_bytes(bytes, "ImportedVmm");
  if (fd < 0)
    throw std::invalid_argument("ImportedVmm: no descriptor (" + std::to_string(fd) + ")");
  const DriverApi& api = driver();
  const DeviceGuard guard(device);  // the device's context, current for the driver calls
  if (const std::size_t unit = VmmAllocation::granularity(device); bytes % unit != 0) {
    throw std::invalid_argument(
        "ImportedVmm: " + std::to_string(bytes) + " bytes is not a multiple of CUDA device " +
        std::to_string(device) + "'s granularity (" + std::to_string(unit) + " bytes)");
  }
  CUmemGenericAllocationHandle handle = 0;
  // The driver's documented way to pass a POSIX descriptor: the int in the pointer.
  check(api.cuMemImportFromShareableHandle(&handle,
                                           reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle", device);
  mapping_ = detail::VmmMapping(handle, bytes, device);
}

ImportedIpc::ImportedIpc(const IpcHandleBytes& handle, int device) : data_(nullptr, {device}) {
  const DeviceGuard guard(device);
  cudaIpcMemHandle_t ipc{};
  std::memcpy(&ipc, handle.data(), sizeof ipc);
  void* raw = nullptr;
  // Lazy peer access: the client's device may differ from the daemon's.
  check(cudaIpcOpenMemHandle(&raw, ipc, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle",
        device);
  data_.reset(static_cast<std::byte*>(raw));
}

}  // namespace statepool::kernels::cuda
