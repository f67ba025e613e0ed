// DevicePageFormat: PageFormatTables (page_format.cpp) uploaded in one allocation.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/page.hpp"

namespace statepool::kernels::cuda {
namespace {

std::size_t round_up8(std::size_t bytes) {
  return (bytes + 7) & ~std::size_t{7};
}

// Appends `table` to `blob` at an 8-byte boundary; returns its offset.
template <class T>
std::size_t append(std::vector<std::byte>& blob, const std::vector<T>& table) {
  const std::size_t offset = round_up8(blob.size());
  blob.resize(offset + table.size() * sizeof(T));
  if (!table.empty()) {
    std::memcpy(blob.data() + offset, table.data(), table.size() * sizeof(T));
  }
  return offset;
}

[[noreturn]] void fail(const char* what, std::size_t bytes, cudaError_t status) {
  throw std::runtime_error(std::string("DevicePageFormat: ") + what + " of " +
                           std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(status));
}

}  // namespace

DevicePageFormat::DevicePageFormat(const PageCodec& codec, DType staged_dtype) {
  const PageFormatTables tables(codec, staged_dtype);
  std::vector<std::byte> blob;
  const std::size_t head_offsets = append(blob, tables.head_offsets());
  const std::size_t impact = append(blob, tables.impact());
  const std::size_t row_offsets = append(blob, tables.row_offsets());
  const std::size_t widths = append(blob, tables.widths());
  if (cudaError_t status = cudaMalloc(&tables_, blob.size()); status != cudaSuccess) {
    tables_ = nullptr;
    fail("cudaMalloc", blob.size(), status);
  }
  // From pageable memory, cudaMemcpy may return before the DMA has landed, and the
  // launches that use the tables may run on any (non-blocking) stream: wait for it.
  cudaError_t status = cudaMemcpyAsync(tables_, blob.data(), blob.size(), cudaMemcpyHostToDevice,
                                       cudaStreamPerThread);
  if (status == cudaSuccess) status = cudaStreamSynchronize(cudaStreamPerThread);
  if (status != cudaSuccess) {
    (void)cudaFree(tables_);
    tables_ = nullptr;
    fail("cudaMemcpy", blob.size(), status);
  }
  auto* base = static_cast<std::byte*>(tables_);
  view_ = tables.scalars();
  view_.head_offsets = reinterpret_cast<const std::uint64_t*>(base + head_offsets);
  if (!tables.impact().empty()) {
    view_.impact = reinterpret_cast<const float*>(base + impact);
  }
  if (!tables.row_offsets().empty()) {
    view_.row_offsets = reinterpret_cast<const std::uint32_t*>(base + row_offsets);
  }
  if (!tables.widths().empty()) {
    view_.widths = reinterpret_cast<const std::uint8_t*>(base + widths);
  }
}

DevicePageFormat::~DevicePageFormat() {
  if (tables_ != nullptr) {
    (void)cudaFree(tables_);
  }
}

DevicePageFormat::DevicePageFormat(DevicePageFormat&& other) noexcept
    : view_(other.view_), tables_(std::exchange(other.tables_, nullptr)) {
  other.view_ = PageFormatView{};
}

DevicePageFormat& DevicePageFormat::operator=(DevicePageFormat&& other) noexcept {
  if (this != &other) {
    if (tables_ != nullptr) {
      (void)cudaFree(tables_);
    }
    view_ = std::exchange(other.view_, PageFormatView{});
    tables_ = std::exchange(other.tables_, nullptr);
  }
  return *this;
}

}  // namespace statepool::kernels::cuda
