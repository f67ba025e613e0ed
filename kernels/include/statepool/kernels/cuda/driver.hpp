#pragma once
// The CUDA driver API without linking libcuda, and the one error type of the CUDA layer.
//
// Why not link CUDA::cuda_driver: a binary linked against libcuda.so.1 does not even
// start on a machine without the NVIDIA driver, and statepoold built with CUDA must still
// run `--backend host` there. The CUDA runtime (libcudart, linked statically or not) loads
// the driver itself when first used, and cudaGetDriverEntryPointByVersion hands out the
// driver's functions; without a driver the runtime reports cudaErrorInsufficientDriver
// instead of the loader refusing the binary.
//
//   driver()           the driver functions this project uses, resolved once
//   CudaError          a failed CUDA call: the operation, the device, the error's name and
//                      text; out_of_memory() for CUDA_ERROR_OUT_OF_MEMORY and
//                      cudaErrorMemoryAllocation
//   check(...)         throws CudaError for a failed cudaError_t or CUresult
//   handled_error_text the text of a failure handled without throwing (the last error reset)
//   is_sticky(status)  whether an error has left the CUDA context unusable
//   report_release_failure / set_failure_reporter
//                      failures while releasing (destructors): counted and handed to the
//                      daemon's log, never thrown
//   cuda_usability(d)  whether device d can be used for shareable memory, and why not,
//                      without throwing
//   query_device(d)    name, compute capability, free and total bytes, VMM support
//   DeviceGuard        makes a device current for a scope and restores the previous one
//
// Thread-safety: every function may be called from any thread; driver() resolves the
// functions exactly once (the first caller does, concurrent first callers wait).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "statepool/kernels/memory.hpp"

namespace statepool::kernels::cuda {

/// A failed CUDA runtime or driver call. The message reads
///   "cuMemCreate(1.0 GiB) on CUDA device 0: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
class CudaError : public std::runtime_error {
 public:
  /// A failed runtime call (`status` != cudaSuccess).
  CudaError(std::string_view operation, int device, cudaError_t status);
  /// A failed driver call (`status` != CUDA_SUCCESS).
  CudaError(std::string_view operation, int device, CUresult status);

  /// The device the operation was for; -1 when it was for no particular device.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// The cudaError_t or CUresult value.
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] bool from_driver() const noexcept { return from_driver_; }
  /// The device had no memory left for the request: the caller's problem to report as
  /// exhaustion (a smaller request, or freeing something, may succeed).
  [[nodiscard]] bool out_of_memory() const noexcept;

 private:
  int device_;
  int code_;
  bool from_driver_;
};

/// Throws CudaError(operation, device, status) unless `status` is cudaSuccess. The
/// runtime's "last error" is reset first, so that a later cudaGetLastError() (after a
/// kernel launch, say) does not report this already-handled failure again.
void check(cudaError_t status, std::string_view operation, int device);
/// Throws CudaError(operation, device, status) unless `status` is CUDA_SUCCESS.
void check(CUresult status, std::string_view operation, int device);

/// The one way a failed runtime call is turned into text where it is handled without
/// check(): resets the runtime's "last error" (as check() does, so that a later launch's
/// cudaGetLastError() blames the launch, not this call) and returns error_text(status).
[[nodiscard]] std::string handled_error_text(cudaError_t status);

/// Whether `status` is an error after which the CUDA context is unusable for the rest of
/// the process ("sticky": a device fault, an uncorrectable ECC or NVLink error, a device
/// assert, a contained error): every later call returns an error, and only a restart of
/// the process recovers. The list is the runtime's documentation of cudaError_t.
[[nodiscard]] bool is_sticky(cudaError_t status) noexcept;

/// Where failures that nothing can throw go (a destructor releasing memory, a mapping or
/// an import): the daemon installs its logger; the default writes the line to stderr.
/// The reporter must not throw and must be callable from any thread.
using FailureReporter = void (*)(std::string_view message) noexcept;
void set_failure_reporter(FailureReporter reporter) noexcept;
/// Reports "<operation> on CUDA device <device> failed: <error>" through the reporter and
/// counts it. Failures at process exit (the driver or runtime already gone) are neither.
void report_release_failure(std::string_view operation, int device, cudaError_t status) noexcept;
void report_release_failure(std::string_view operation, int device, CUresult status) noexcept;
/// Release failures reported since the process started.
[[nodiscard]] std::uint64_t release_failures() noexcept;

/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; for logs where nothing is thrown.
[[nodiscard]] std::string error_text(CUresult status);
/// "cudaErrorMemoryAllocation (out of memory)".
[[nodiscard]] std::string error_text(cudaError_t status);

/// The driver functions statepool calls. The member types are cudaTypedefs.h's PFN types
/// for the driver ABI version each one is requested with.
struct DriverApi {
  PFN_cuInit_v2000 cuInit = nullptr;
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetName_v2000 cuDeviceGetName = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle = nullptr;
};

/// The resolved driver functions, every member non-null, the driver initialised (cuInit).
/// Resolved on the first call; a failure (no driver, a driver too old to have a function)
/// is remembered and thrown again, as the same CudaError, on every call.
[[nodiscard]] const DriverApi& driver();

/// Why CUDA cannot be used for statepool's shareable device memory.
enum class CudaProblem : unsigned char {
  none = 0,     ///< usable: VMM allocations with POSIX file-descriptor handles
  no_driver,    ///< no NVIDIA driver, or one too old for this runtime
  no_device,    ///< the driver sees no device, or not the one asked for
  no_vmm,       ///< the device lacks virtual memory management (cuMemCreate)
  no_posix_fd,  ///< VMM works but cannot export POSIX file descriptors (legacy IPC only)
};

struct CudaUsability {
  CudaProblem problem = CudaProblem::none;
  /// Empty when usable, else a sentence naming the device and what is missing, e.g.
  /// "no CUDA driver: cudaErrorInsufficientDriver (CUDA driver version is insufficient
  /// for CUDA runtime version)".
  std::string reason;
  [[nodiscard]] explicit operator bool() const noexcept { return problem == CudaProblem::none; }
};

/// Whether `device` (an ordinal) can hold statepool's shared memory. Never throws: every
/// failure along the way is the answer's reason.
[[nodiscard]] CudaUsability cuda_usability(int device) noexcept;

struct DeviceInfo {
  int ordinal = -1;
  std::string name;  ///< "NVIDIA H100 80GB HBM3"
  int compute_major = 0;
  int compute_minor = 0;
  std::size_t free_bytes = 0;   ///< cudaMemGetInfo on the device, at the time of the query
  std::size_t total_bytes = 0;  ///< cudaMemGetInfo on the device
  bool vmm = false;             ///< CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool posix_fd = false;        ///< CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
  DeviceUuid uuid{};            ///< cudaDeviceProp::uuid: the same GPU in every process
};

/// Describes `device`. Throws CudaError (no driver, no such device, a failed query).
[[nodiscard]] DeviceInfo query_device(int device);

/// This process's ordinal of the GPU whose UUID is `uuid`, or -1 when it is not visible
/// here (CUDA_VISIBLE_DEVICES, containers). Throws CudaError when devices cannot be
/// listed.
[[nodiscard]] int device_with_uuid(const DeviceUuid& uuid);

/// Free and total bytes of `device` (cudaMemGetInfo with the device current). Throws
/// CudaError.
struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};
[[nodiscard]] MemoryInfo memory_info(int device);

/// Makes `device` the calling thread's current device for the guard's scope, and makes
/// the previous one current again at its end. The runtime's calls (cudaMalloc,
/// cudaMemset, cudaIpcOpenMemHandle, ...) act on the current device, and the driver API's
/// memory calls need a current context (the guard initialises the device's primary
/// context); a daemon thread may serve several devices, and the caller's choice must
/// survive our calls.
/// The constructor throws CudaError; the destructor never throws.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

}  // namespace statepool::kernels::cuda
