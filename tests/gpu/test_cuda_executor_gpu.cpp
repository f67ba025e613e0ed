// The executor conformance suite (tests/service/executor_conformance.hpp) for the CUDA
// executor: the same contract as the host executor's, on device memory. Skipped without
// a CUDA device.
#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "exec/cuda_executor.hpp"
#include "executor_conformance.hpp"
#include "memory/cuda_resource.hpp"
#include "memory/tracking.hpp"

namespace statepool::service {
namespace {

/// Why CUDA device 0 cannot be used here, or empty.
std::string no_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  return {};
}

/// Test vectors get device copies (cudaMalloc); sync() copies them back.
class CudaRig {
 public:
  CudaRig() : missing_(no_device()) {
    if (!missing_.empty()) return;
    memory_ = std::make_unique<CudaResource>(0);
    executor_memory_ = std::make_unique<TrackingResource>(*memory_);
    executor_ = std::make_unique<CudaExecutor>(0, *executor_memory_);
  }
  ~CudaRig() {
    if (executor_ != nullptr) {
      executor_->wait_idle();
      EXPECT_GT(executor_memory_->usage().live_allocations, 0u);  // at least its check results
      executor_.reset();
      // Its own device memory (tables, check results, KV scratch) all given back.
      EXPECT_EQ(executor_memory_->usage().live_allocations, 0u);
      EXPECT_EQ(executor_memory_->usage().live_bytes, 0u);
    }
    for (auto& [host, device] : bound_) (void)cudaFree(device);
  }
  CudaRig(const CudaRig&) = delete;
  CudaRig& operator=(const CudaRig&) = delete;

  [[nodiscard]] const std::string& missing() const { return missing_; }
  [[nodiscard]] static std::string kv_missing() { return {}; }
  Executor& executor() { return *executor_; }
  MemoryResource& memory() { return *memory_; }

  /// A vector bound twice gets the same device buffer (with its current bytes), so
  /// buffers alias on the device exactly when they alias on the host.
  kernels::BufferRef bind(std::vector<std::byte>& bytes) {
    void* device = nullptr;
    for (auto& [host, existing] : bound_) {
      if (host == &bytes) device = existing;
    }
    if (device == nullptr) {
      if (cudaMalloc(&device, bytes.empty() ? 1 : bytes.size()) != cudaSuccess) {
        throw std::runtime_error("cannot allocate a test buffer on the device");
      }
      bound_.emplace_back(&bytes, device);
    }
    // A pageable cudaMemcpy may return before the DMA lands; the executor's stream does
    // not wait for the legacy stream: synchronise.
    if (cudaMemcpy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      throw std::runtime_error("cannot stage a test buffer on the device");
    }
    return {static_cast<std::byte*>(device), bytes.size(), MemorySpace::device, 0};
  }
  void sync() {
    for (auto& [host, device] : bound_) {
      if (cudaMemcpy(host->data(), device, host->size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
        throw std::runtime_error("cannot read a test buffer back from the device");
      }
    }
  }
  static void upload(const Allocation& allocation, const std::vector<std::byte>& bytes) {
    if (cudaMemcpy(allocation.info().data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      throw std::runtime_error("cannot upload into a device allocation");
    }
  }

 private:
  std::string missing_;
  std::unique_ptr<CudaResource> memory_;
  std::unique_ptr<TrackingResource> executor_memory_;
  std::unique_ptr<CudaExecutor> executor_;
  std::vector<std::pair<std::vector<std::byte>*, void*>> bound_;
};

using Executors = ::testing::Types<CudaRig>;
class ExecutorNames {
 public:
  template <class T>
  static std::string GetName(int /*index*/) {
    return "cuda_device_0";
  }
};

}  // namespace

namespace conformance {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, ExecutorConformance, Executors, ExecutorNames);
}  // namespace conformance
}  // namespace statepool::service
