// DeviceStepCounts (step_kernels.hpp): the per-(page, layer, head) step counts of the light
// step mode, one zeroed device allocation.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/cuda/step_kernels.hpp"

namespace statepool::kernels::cuda {

DeviceStepCounts::DeviceStepCounts(std::uint32_t page_count, std::uint32_t head_count) {
  const std::uint64_t count = std::uint64_t{page_count} * head_count;
  if (count == 0 || count > std::numeric_limits<std::size_t>::max() / sizeof(std::uint32_t)) {
    throw std::invalid_argument("DeviceStepCounts: " + std::to_string(page_count) + " pages x " +
                                std::to_string(head_count) + " heads");
  }
  const std::size_t bytes = count * sizeof(std::uint32_t);
  void* memory = nullptr;
  check(cudaMalloc(&memory, bytes),
        "DeviceStepCounts: cudaMalloc(" + std::to_string(bytes) + " bytes)", -1);
  if (const cudaError_t status = cudaMemset(memory, 0, bytes); status != cudaSuccess) {
    report_release_failure("cudaFree (DeviceStepCounts)", -1, cudaFree(memory));
    check(status, "DeviceStepCounts: cudaMemset(" + std::to_string(bytes) + " bytes)", -1);
  }
  counts_ = static_cast<std::uint32_t*>(memory);
}

DeviceStepCounts::~DeviceStepCounts() {
  if (counts_ != nullptr) {
    report_release_failure("cudaFree (DeviceStepCounts)", -1, cudaFree(counts_));
  }
}

DeviceStepCounts::DeviceStepCounts(DeviceStepCounts&& other) noexcept
    : counts_(std::exchange(other.counts_, nullptr)) {}

DeviceStepCounts& DeviceStepCounts::operator=(DeviceStepCounts&& other) noexcept {
  if (this != &other) {
    if (counts_ != nullptr) {
      report_release_failure("cudaFree (DeviceStepCounts)", -1, cudaFree(counts_));
    }
    counts_ = std::exchange(other.counts_, nullptr);
  }
  return *this;
}

}  // namespace statepool::kernels::cuda
