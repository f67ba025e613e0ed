#pragma once
// What the GPU kernel tests share: skipping without a device, asserting CUDA calls, and
// device memory owned for the duration of a test (tests/gpu only).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#define STATEPOOL_SKIP_WITHOUT_GPU()                                             \
  do {                                                                           \
    int device_count = 0;                                                        \
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) { \
      GTEST_SKIP() << "no CUDA device";                                          \
    }                                                                            \
  } while (false)

#define STATEPOOL_CUDA_OK(expr)                                     \
  do {                                                              \
    const cudaError_t status_ = (expr);                             \
    ASSERT_EQ(status_, cudaSuccess) << cudaGetErrorString(status_); \
  } while (false)

namespace statepool::testing {

// Device memory owned for the duration of a test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      (void)cudaFree(ptr_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] void* get() const noexcept { return ptr_; }
  [[nodiscard]] bool ok() const noexcept { return ptr_ != nullptr; }
  cudaError_t upload(const void* host, std::size_t bytes) const {
    return cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice);
  }
  cudaError_t upload(const std::vector<std::byte>& host) const {
    return upload(host.data(), host.size());
  }
  cudaError_t download(std::vector<std::byte>& host) const {
    host.resize(bytes_);
    return cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost);
  }
  cudaError_t fill(int value) const { return cudaMemset(ptr_, value, bytes_); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

}  // namespace statepool::testing
