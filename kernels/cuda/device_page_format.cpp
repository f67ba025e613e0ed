// DevicePageFormat: PageFormatTables::blob() (page_format.cpp) uploaded in one allocation.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/page.hpp"

namespace statepool::kernels::cuda {

DevicePageFormat::DevicePageFormat(const PageCodec& codec, DType staged_dtype) {
  const PageFormatTables tables(codec, staged_dtype);
  const std::vector<std::byte> blob = tables.blob();
  if (const cudaError_t status = cudaMalloc(&tables_, blob.size()); status != cudaSuccess) {
    tables_ = nullptr;
    check(status, "DevicePageFormat: cudaMalloc(" + std::to_string(blob.size()) + " bytes)", -1);
  }
  // From pageable memory, cudaMemcpy may return before the DMA has landed, and the
  // launches that use the tables may run on any (non-blocking) stream: wait for it.
  cudaError_t status = cudaMemcpyAsync(tables_, blob.data(), blob.size(), cudaMemcpyHostToDevice,
                                       cudaStreamPerThread);
  if (status == cudaSuccess) status = cudaStreamSynchronize(cudaStreamPerThread);
  if (status != cudaSuccess) {
    report_release_failure("cudaFree (DevicePageFormat)", -1, cudaFree(tables_));
    tables_ = nullptr;
    check(status, "DevicePageFormat: cudaMemcpy(" + std::to_string(blob.size()) + " bytes)", -1);
  }
  view_ = tables.view_at(static_cast<const std::byte*>(tables_));
}

DevicePageFormat::~DevicePageFormat() {
  if (tables_ != nullptr)
    report_release_failure("cudaFree (DevicePageFormat)", -1, cudaFree(tables_));
}

DevicePageFormat::DevicePageFormat(DevicePageFormat&& other) noexcept
    : view_(other.view_), tables_(std::exchange(other.tables_, nullptr)) {
  other.view_ = PageFormatView{};
}

DevicePageFormat& DevicePageFormat::operator=(DevicePageFormat&& other) noexcept {
  if (this != &other) {
    if (tables_ != nullptr) {
      report_release_failure("cudaFree (DevicePageFormat)", -1, cudaFree(tables_));
    }
    view_ = std::exchange(other.view_, PageFormatView{});
    tables_ = std::exchange(other.tables_, nullptr);
  }
  return *this;
}

}  // namespace statepool::kernels::cuda
