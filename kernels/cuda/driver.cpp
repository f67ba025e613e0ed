#include "statepool/kernels/cuda/driver.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

namespace statepool::kernels::cuda {
namespace {

// The error-text functions, published as soon as they resolve: error_text(CUresult) may
// run while driver() is still initialising (a failed cuInit is reported with them), so it
// must not call driver() itself.
std::atomic<PFN_cuGetErrorName_v6000> g_error_name{nullptr};
std::atomic<PFN_cuGetErrorString_v6000> g_error_string{nullptr};

std::string message(std::string_view operation, int device, const std::string& error) {
  std::string out(operation);
  if (device >= 0) out += " on CUDA device " + std::to_string(device);
  out += ": ";
  out += error;
  return out;
}

/// The outcome of resolving the driver: the table, or why there is none.
struct Loaded {
  DriverApi api;
  std::optional<CudaError> error;
};

/// Resolves `symbol` in the ABI version `version` (the version in the name of the PFN
/// type `out` has, so the pointer matches its type). A missing symbol is an error: every
/// function in DriverApi is one statepool calls.
template <class Pfn>
std::optional<CudaError> resolve(const char* symbol, unsigned version, Pfn& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found);
  const std::string operation = std::string("resolving the CUDA driver's ") + symbol +
                                " (cudaGetDriverEntryPointByVersion, ABI " +
                                std::to_string(version) + ")";
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // reset, as check() does
    return CudaError(operation, -1, status);
  }
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return CudaError(operation + ": the driver does not provide it", -1, cudaErrorSymbolNotFound);
  }
  out = reinterpret_cast<Pfn>(fn);
  return std::nullopt;
}

Loaded load() {
  Loaded loaded;
  DriverApi& api = loaded.api;
  // The error texts first, so that every later failure is reported with them.
  loaded.error = resolve("cuGetErrorName", 6000, api.cuGetErrorName);
  if (!loaded.error) loaded.error = resolve("cuGetErrorString", 6000, api.cuGetErrorString);
  if (loaded.error) return loaded;
  g_error_name.store(api.cuGetErrorName);
  g_error_string.store(api.cuGetErrorString);

  // Stops at the first failure (a driver without one function is as unusable as none).
  auto step = [&loaded](auto&& resolve_one) {
    if (!loaded.error) loaded.error = resolve_one();
  };
  step([&] { return resolve("cuInit", 2000, api.cuInit); });
  step([&] { return resolve("cuDriverGetVersion", 2020, api.cuDriverGetVersion); });
  step([&] { return resolve("cuDeviceGet", 2000, api.cuDeviceGet); });
  step([&] { return resolve("cuDeviceGetName", 2000, api.cuDeviceGetName); });
  step([&] { return resolve("cuDeviceGetAttribute", 2000, api.cuDeviceGetAttribute); });
  step([&] {
    return resolve("cuMemGetAllocationGranularity", 10020, api.cuMemGetAllocationGranularity);
  });
  step([&] { return resolve("cuMemCreate", 10020, api.cuMemCreate); });
  step([&] { return resolve("cuMemRelease", 10020, api.cuMemRelease); });
  step([&] { return resolve("cuMemAddressReserve", 10020, api.cuMemAddressReserve); });
  step([&] { return resolve("cuMemAddressFree", 10020, api.cuMemAddressFree); });
  step([&] { return resolve("cuMemMap", 10020, api.cuMemMap); });
  step([&] { return resolve("cuMemUnmap", 10020, api.cuMemUnmap); });
  step([&] { return resolve("cuMemSetAccess", 10020, api.cuMemSetAccess); });
  step([&] {
    return resolve("cuMemExportToShareableHandle", 10020, api.cuMemExportToShareableHandle);
  });
  step([&] {
    return resolve("cuMemImportFromShareableHandle", 10020, api.cuMemImportFromShareableHandle);
  });
  if (loaded.error) return loaded;
  // The runtime has initialised the driver by now (it did to hand out entry points), but
  // the driver API's contract is cuInit before anything else; it is cheap when repeated.
  if (const CUresult status = api.cuInit(0); status != CUDA_SUCCESS) {
    loaded.error = CudaError("cuInit", -1, status);
  }
  return loaded;
}

const Loaded& loaded() {
  static const Loaded instance = load();  // thread-safe, once
  return instance;
}

/// Reads a device attribute through the driver.
int attribute(const DriverApi& api, CUdevice dev, CUdevice_attribute which, const char* name,
              int device) {
  int value = 0;
  check(api.cuDeviceGetAttribute(&value, which, dev),
        std::string("cuDeviceGetAttribute(") + name + ")", device);
  return value;
}

/// The driver's handle of `device`, after checking that the device exists (the driver's
/// own error for a bad ordinal, CUDA_ERROR_INVALID_DEVICE, does not say how many exist).
CUdevice device_handle(const DriverApi& api, int device) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", -1);
  if (device < 0 || device >= count) {
    throw CudaError("device " + std::to_string(device) + " of the " + std::to_string(count) +
                        " the driver sees",
                    device, cudaErrorInvalidDevice);
  }
  CUdevice dev = 0;
  check(api.cuDeviceGet(&dev, device), "cuDeviceGet", device);
  return dev;
}

std::string device_name(const DriverApi& api, CUdevice dev, int device) {
  char name[256] = {};
  check(api.cuDeviceGetName(name, static_cast<int>(sizeof name), dev), "cuDeviceGetName", device);
  return name;
}

}  // namespace

// --- errors -------------------------------------------------------------------------------

std::string error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

std::string error_text(CUresult status) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (const auto fn = g_error_name.load(); fn == nullptr || fn(status, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  if (const auto fn = g_error_string.load(); fn == nullptr || fn(status, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  std::string out = name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(status));
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

CudaError::CudaError(std::string_view operation, int device, cudaError_t status)
    : std::runtime_error(message(operation, device, error_text(status))),
      device_(device),
      code_(static_cast<int>(status)),
      from_driver_(false) {}

CudaError::CudaError(std::string_view operation, int device, CUresult status)
    : std::runtime_error(message(operation, device, error_text(status))),
      device_(device),
      code_(static_cast<int>(status)),
      from_driver_(true) {}

bool CudaError::out_of_memory() const noexcept {
  return from_driver_ ? code_ == CUDA_ERROR_OUT_OF_MEMORY : code_ == cudaErrorMemoryAllocation;
}

void check(cudaError_t status, std::string_view operation, int device) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  throw CudaError(operation, device, status);
}

void check(CUresult status, std::string_view operation, int device) {
  if (status != CUDA_SUCCESS) throw CudaError(operation, device, status);
}

std::string handled_error_text(cudaError_t status) {
  (void)cudaGetLastError();
  return error_text(status);
}

bool is_sticky(cudaError_t status) noexcept {
  switch (status) {
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorExternalDevice: return true;
    default: return false;
  }
}

namespace {

void stderr_reporter(std::string_view message) noexcept {
  std::fprintf(stderr, "statepool: %.*s\n", static_cast<int>(message.size()), message.data());
}

std::atomic<FailureReporter> g_reporter{stderr_reporter};
std::atomic<std::uint64_t> g_release_failures{0};

void report_failure(std::string_view operation, int device, const std::string& error) noexcept {
  g_release_failures.fetch_add(1, std::memory_order_relaxed);
  try {
    g_reporter.load()(message(operation, device, error));
  } catch (...) {
    // A message that cannot be built (no memory) is dropped; the count remains.
  }
}

}  // namespace

void set_failure_reporter(FailureReporter reporter) noexcept {
  g_reporter.store(reporter != nullptr ? reporter : stderr_reporter);
}

void report_release_failure(std::string_view operation, int device, cudaError_t status) noexcept {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  // The runtime is going away at process exit: not a leak.
  if (status == cudaErrorCudartUnloading) return;
  report_failure(operation, device, error_text(status));
}

void report_release_failure(std::string_view operation, int device, CUresult status) noexcept {
  if (status == CUDA_SUCCESS || status == CUDA_ERROR_DEINITIALIZED) return;
  report_failure(operation, device, error_text(status));
}

std::uint64_t release_failures() noexcept {
  return g_release_failures.load(std::memory_order_relaxed);
}

// --- the driver -----------------------------------------------------------------------------

const DriverApi& driver() {
  const Loaded& state = loaded();
  if (state.error) throw *state.error;
  return state.api;
}

CudaUsability cuda_usability(int device) noexcept {
  try {
    int count = 0;
    if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
      (void)cudaGetLastError();
      if (status == cudaErrorNoDevice) {
        return {CudaProblem::no_device, "no CUDA device: " + error_text(status)};
      }
      return {CudaProblem::no_driver, "no usable CUDA driver: " + error_text(status)};
    }
    if (device < 0 || device >= count) {
      return {CudaProblem::no_device, "no CUDA device " + std::to_string(device) +
                                          ": the driver sees " + std::to_string(count) +
                                          " device(s)"};
    }
    const Loaded& state = loaded();
    if (state.error) {
      return {CudaProblem::no_driver,
              std::string("the CUDA driver cannot be used: ") + state.error->what()};
    }
    const DriverApi& api = state.api;
    const CUdevice dev = device_handle(api, device);
    const std::string which =
        "CUDA device " + std::to_string(device) + " (" + device_name(api, dev, device) + ")";
    if (attribute(api, dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                  "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", device) == 0) {
      return {CudaProblem::no_vmm,
              which + " lacks virtual memory management (cuMemCreate, cuMemMap)"};
    }
    if (attribute(api, dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                  "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", device) == 0) {
      return {CudaProblem::no_posix_fd,
              which +
                  " cannot export memory as POSIX file descriptors (only legacy CUDA IPC "
                  "handles)"};
    }
    return {};
  } catch (const std::exception& e) {
    return {CudaProblem::no_driver, std::string("CUDA query failed: ") + e.what()};
  } catch (...) {
    return {CudaProblem::no_driver, "CUDA query failed"};
  }
}

DeviceInfo query_device(int device) {
  const DriverApi& api = driver();
  const CUdevice dev = device_handle(api, device);
  DeviceInfo info;
  info.ordinal = device;
  info.name = device_name(api, dev, device);
  info.compute_major = attribute(api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                 "COMPUTE_CAPABILITY_MAJOR", device);
  info.compute_minor = attribute(api, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                 "COMPUTE_CAPABILITY_MINOR", device);
  info.vmm = attribute(api, dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                       "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", device) != 0;
  info.posix_fd =
      attribute(api, dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", device) != 0;
  const MemoryInfo memory = memory_info(device);
  info.free_bytes = memory.free_bytes;
  info.total_bytes = memory.total_bytes;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", device);
  static_assert(sizeof(prop.uuid.bytes) == sizeof(info.uuid));
  std::memcpy(info.uuid.data(), prop.uuid.bytes, info.uuid.size());
  return info;
}

int device_with_uuid(const DeviceUuid& uuid) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", -1);
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", device);
    if (std::memcmp(prop.uuid.bytes, uuid.data(), uuid.size()) == 0) return device;
  }
  return -1;
}

MemoryInfo memory_info(int device) {
  const DeviceGuard guard(device);
  MemoryInfo info;
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo", device);
  return info;
}

// --- current device ---------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) : device_(device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice", device);
  // Set even when it is current already: since CUDA 12 cudaSetDevice also initialises the
  // device's primary context and makes it current on this thread, which the driver API
  // calls made under the guard (cuMemCreate, cuMemMap, ...) rely on.
  check(cudaSetDevice(device_), "cudaSetDevice", device);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ == device_) return;
  report_release_failure("restoring the current CUDA device (cudaSetDevice)", previous_,
                         cudaSetDevice(previous_));
}

}  // namespace statepool::kernels::cuda
