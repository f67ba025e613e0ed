// The CUDA build on a machine without a GPU or driver (CI): the binaries start (nothing
// links libcuda; this executable running at all there is the first check), and asking for
// the cuda backend is a clear error, never a crash. Where a GPU is present the tests that
// need its absence skip; test_cuda_memory_gpu covers that side.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "exec/cuda_executor.hpp"
#include "memory/cuda_resource.hpp"
#include "memory/host_memfd.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/cuda/vmm.hpp"

namespace statepool::service {
namespace {

namespace cuda = kernels::cuda;

bool gpu_present() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return present;
}

#define STATEPOOL_SKIP_WITH_GPU()                                       \
  do {                                                                  \
    if (gpu_present()) GTEST_SKIP() << "a CUDA device is present here"; \
  } while (false)

TEST(CudaAbsent, TheResourceNamesTheDeviceTheReasonAndTheHostBackend) {
  STATEPOOL_SKIP_WITH_GPU();
  try {
    CudaResource resource(0);
    FAIL() << "expected std::runtime_error without a CUDA device";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA device 0"), std::string::npos) << what;
    EXPECT_NE(what.find("--backend host"), std::string::npos) << what;
    // The reason: the runtime's own error name, whichever it is here.
    const bool reason = what.find("cudaErrorInsufficientDriver") != std::string::npos ||
                        what.find("cudaErrorNoDevice") != std::string::npos ||
                        what.find("no CUDA device") != std::string::npos ||
                        what.find("CUDA driver") != std::string::npos;
    EXPECT_TRUE(reason) << what;
  }
}

TEST(CudaAbsent, UsabilitySaysWhyWithoutThrowing) {
  STATEPOOL_SKIP_WITH_GPU();
  const cuda::CudaUsability usable = cuda::cuda_usability(0);
  EXPECT_FALSE(usable);
  EXPECT_TRUE(usable.problem == cuda::CudaProblem::no_driver ||
              usable.problem == cuda::CudaProblem::no_device)
      << usable.reason;
  EXPECT_NE(usable.reason.find("CUDA"), std::string::npos) << usable.reason;
  // And again: nothing is cached wrongly, nothing throws.
  EXPECT_EQ(cuda::cuda_usability(0).reason, usable.reason);
  EXPECT_FALSE(cuda::cuda_usability(-1));
}

TEST(CudaAbsent, TheExecutorNamesTheDeviceAndTheError) {
  STATEPOOL_SKIP_WITH_GPU();
  HostMemfdResource memory;  // never reached: the device is checked first
  try {
    CudaExecutor executor(0, memory);
    FAIL() << "expected a CudaError without a CUDA device";
  } catch (const cuda::CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA device 0"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaError"), std::string::npos) << what;
  }
}

// What a destructor cannot throw: a release whose device cannot be made current here
// reaches the installed reporter (the daemon's log) and the count, never stderr alone.
std::mutex g_reported_mutex;
std::vector<std::string> g_reported;

void capture(std::string_view message) noexcept {
  const std::lock_guard lock(g_reported_mutex);
  g_reported.emplace_back(message);
}

TEST(CudaAbsent, AReleaseThatCannotRunIsReportedAndCounted) {
  STATEPOOL_SKIP_WITH_GPU();
  cuda::set_failure_reporter(capture);
  const std::uint64_t before = cuda::release_failures();
  cuda::detail::DeviceFree{0}(nullptr);
  cuda::detail::IpcClose{0}(nullptr);
  cuda::set_failure_reporter(nullptr);  // stderr again
  EXPECT_EQ(cuda::release_failures(), before + 2);
  const std::lock_guard lock(g_reported_mutex);
  ASSERT_EQ(g_reported.size(), 2u);
  EXPECT_NE(g_reported[0].find("for cudaFree (cudaSetDevice) on CUDA device 0: cudaError"),
            std::string::npos)
      << g_reported[0];
  EXPECT_NE(g_reported[1].find("cudaIpcCloseMemHandle"), std::string::npos) << g_reported[1];
  g_reported.clear();
}

TEST(CudaAbsent, DriverCallsThrowCudaError) {
  STATEPOOL_SKIP_WITH_GPU();
  EXPECT_THROW((void)cuda::query_device(0), cuda::CudaError);
  EXPECT_THROW((void)cuda::memory_info(0), cuda::CudaError);
  EXPECT_THROW((void)cuda::VmmAllocation::granularity(0), cuda::CudaError);
}

// Runs everywhere: the error type itself needs no device.
TEST(CudaError, NamesTheOperationTheDeviceAndTheError) {
  const cuda::CudaError runtime("cudaMalloc(2.0 MiB)", 3, cudaErrorMemoryAllocation);
  EXPECT_TRUE(runtime.out_of_memory());
  EXPECT_FALSE(runtime.from_driver());
  EXPECT_EQ(runtime.device(), 3);
  const std::string what = runtime.what();
  EXPECT_EQ(what.rfind("cudaMalloc(2.0 MiB) on CUDA device 3: cudaErrorMemoryAllocation (", 0), 0u)
      << what;

  const cuda::CudaError driver("cuMemCreate(2.0 MiB)", 0, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(driver.out_of_memory());
  EXPECT_TRUE(driver.from_driver());
  EXPECT_EQ(driver.code(), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(driver.what()).find("cuMemCreate(2.0 MiB) on CUDA device 0: "),
            std::string::npos);

  EXPECT_FALSE(cuda::CudaError("cuMemMap", 0, CUDA_ERROR_INVALID_VALUE).out_of_memory());
  EXPECT_FALSE(cuda::CudaError("cudaMemset", 0, cudaErrorInvalidValue).out_of_memory());
  EXPECT_NE(std::string(cuda::CudaError("x", -1, cudaErrorInvalidValue).what()).find("x: "),
            std::string::npos)
      << "no device named for -1";
  EXPECT_THROW(cuda::check(cudaErrorInvalidValue, "x", 0), cuda::CudaError);
  EXPECT_NE(cuda::handled_error_text(cudaErrorInvalidValue).find("cudaErrorInvalidValue ("),
            std::string::npos);
  EXPECT_NO_THROW(cuda::check(cudaSuccess, "x", 0));
  EXPECT_NO_THROW(cuda::check(CUDA_SUCCESS, "x", 0));
}

// The errors after which the context is gone (the executor stops using the device) are
// the device faults and uncorrectable errors; a refusal or exhaustion is not one.
TEST(CudaError, StickyErrorsAreTheFaultsThatEndTheContext) {
  for (const cudaError_t status :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
        cudaErrorIllegalInstruction, cudaErrorHardwareStackError, cudaErrorAssert,
        cudaErrorECCUncorrectable, cudaErrorLaunchTimeout, cudaErrorContained}) {
    EXPECT_TRUE(cuda::is_sticky(status)) << cudaGetErrorName(status);
  }
  for (const cudaError_t status :
       {cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorNotReady,
        cudaErrorLaunchOutOfResources, cudaErrorInvalidDevice, cudaErrorNoDevice,
        cudaErrorInsufficientDriver}) {
    EXPECT_FALSE(cuda::is_sticky(status)) << cudaGetErrorName(status);
  }
}

}  // namespace
}  // namespace statepool::service
