#pragma once
// What the GPU benchmarks share: CUDA errors as exceptions, device memory for a
// benchmark's lifetime, and the one way they time device work (median of host-timed
// runs, or the device's own event time of the last run where that is smaller).
// Header-only, benchmarks only (CUDA builds).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common.hpp"
#include "statepool/kernels/cuda/driver.hpp"

namespace statepool::bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + kernels::cuda::handled_error_text(status));
  }
}

/// Device memory for the benchmark's lifetime.
struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(std::size_t bytes) { check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBytes() { (void)cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  [[nodiscard]] std::byte* get() const { return static_cast<std::byte*>(ptr); }
};

/// Median seconds of `iters` runs of `launch` on `stream`, timed with events.
template <class Launch>
double median_gpu_seconds(std::uint32_t iters, cudaStream_t stream, Launch&& launch) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  const double seconds = statepool::bench::median_seconds(iters, [&] {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  });
  float ms = 0;
  // The host-side median includes launch latency; the event time of the last run is the
  // device's own. Report the smaller: both see the same work.
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return std::min(seconds, static_cast<double>(ms) / 1e3);
}

}  // namespace statepool::bench
