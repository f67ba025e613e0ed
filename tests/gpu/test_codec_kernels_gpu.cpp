// CUDA page kernels (kernels/cuda) against the CPU codecs: the GPU must write the same
// page bytes as PageCodec::encode and decode pages to the same staged bytes.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/testing/synthetic_state.hpp"

namespace statepool::kernels {

using testing::synthetic_staged_state;

// Readable test parameters in ctest listings.
static void PrintTo(CodecId id, std::ostream* os) {
  *os << to_string(id);
}
static void PrintTo(DType dtype, std::ostream* os) {
  *os << to_string(dtype);
}

namespace {

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
  cudaError_t upload(const std::vector<std::byte>& host) const {
    return cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice);
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

struct Shape {
  std::uint32_t key_dim;
  std::uint32_t value_dim;
  std::uint32_t group;
};

using Param = std::tuple<CodecId, DType, Shape>;

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.key_dim << "x" << s.value_dim << " group " << s.group;
}

StateLayout layout_for(CodecId id, const Shape& shape) {
  StateLayout layout;
  layout.name = "gpu-test";
  layout.num_layers = 3;
  layout.num_heads = 5;
  layout.key_dim = shape.key_dim;
  layout.value_dim = shape.value_dim;
  layout.conv_channels = 12;
  layout.conv_width = 3;
  layout.conv_dtype = DType::bf16;
  layout.codec = {id, shape.group};
  return layout;
}

long first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) {
    return 0;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

class GpuCodec : public ::testing::TestWithParam<Param> {};

TEST_P(GpuCodec, EncodeBytesEqualCpuBytes) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const auto& [id, dtype, shape] = GetParam();
  const StateLayout layout = layout_for(id, shape);
  const PageCodec cpu(layout);
  const auto staged = synthetic_staged_state(layout, 60, 11, dtype);
  std::vector<std::byte> expected(cpu.page_bytes());
  cpu.encode(staged, dtype, expected);

  DeviceBuffer d_staged(staged.size());
  DeviceBuffer d_page(cpu.page_bytes());
  ASSERT_TRUE(d_staged.ok() && d_page.ok());
  STATEPOOL_CUDA_OK(d_staged.upload(staged));
  STATEPOOL_CUDA_OK(d_page.fill(0xA7));  // every byte must be written
  const cuda::PageDesc desc = cuda::make_page_desc(layout, dtype);
  EXPECT_EQ(desc.head_bytes * desc.num_heads, cpu.conv_offset());
  STATEPOOL_CUDA_OK(cuda::encode_page(desc, d_staged.get(), d_page.get(), nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::byte> got;
  STATEPOOL_CUDA_OK(d_page.download(got));
  EXPECT_EQ(first_difference(got, expected), -1);
}

TEST_P(GpuCodec, DecodeEqualsCpuDecode) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const auto& [id, dtype, shape] = GetParam();
  const StateLayout layout = layout_for(id, shape);
  const PageCodec cpu(layout);
  const auto staged = synthetic_staged_state(layout, 60, 12, DType::f32);
  std::vector<std::byte> page(cpu.page_bytes());
  cpu.encode(staged, DType::f32, page);
  std::vector<std::byte> expected(cpu.staged_bytes(dtype));
  cpu.decode(page, dtype, expected);

  DeviceBuffer d_page(page.size());
  DeviceBuffer d_staged(expected.size());
  ASSERT_TRUE(d_staged.ok() && d_page.ok());
  STATEPOOL_CUDA_OK(d_page.upload(page));
  STATEPOOL_CUDA_OK(d_staged.fill(0x5C));
  STATEPOOL_CUDA_OK(cuda::decode_page(cuda::make_page_desc(layout, dtype), d_page.get(),
                                      d_staged.get(), nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::byte> got;
  STATEPOOL_CUDA_OK(d_staged.download(got));
  EXPECT_EQ(first_difference(got, expected), -1);
}

const Shape kShapes[] = {{128, 128, 0}, {16, 24, 32}, {10, 10, 32}, {7, 5, 12}, {3, 3, 4}};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [id, dtype, shape] = info.param;
  return std::string(to_string(id)) + "_" + to_string(dtype) + "_" + std::to_string(shape.key_dim) +
         "x" + std::to_string(shape.value_dim) + "_g" + std::to_string(shape.group);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, GpuCodec,
                         ::testing::Combine(::testing::Values(CodecId::fp32, CodecId::bf16,
                                                              CodecId::fp16, CodecId::int4,
                                                              CodecId::int6, CodecId::int8),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::ValuesIn(kShapes)),
                         param_name);

TEST(GpuKernels, EdgeValuesEncodeLikeTheCpu) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  for (const CodecId id :
       {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4, CodecId::int6, CodecId::int8}) {
    const StateLayout layout = layout_for(id, {7, 5, 12});
    const PageCodec cpu(layout);
    auto staged = synthetic_staged_state(layout, 10, 13, DType::f32);
    // Zeros, FP32 denormals, tiny and huge values, at the start of the recurrent part.
    const float edges[] = {0.0f,     -0.0f,    1e-40f,
                           -3e-42f,  3e-6f,    -7e-8f,
                           1e30f,    -3e38f,   std::numeric_limits<float>::max(),
                           65520.0f, 65504.0f, 1.0f};
    std::memcpy(staged.data(), edges, sizeof edges);
    std::vector<std::byte> expected(cpu.page_bytes());
    cpu.encode(staged, DType::f32, expected);

    DeviceBuffer d_staged(staged.size());
    DeviceBuffer d_page(cpu.page_bytes());
    ASSERT_TRUE(d_staged.ok() && d_page.ok());
    STATEPOOL_CUDA_OK(d_staged.upload(staged));
    STATEPOOL_CUDA_OK(cuda::encode_page(cuda::make_page_desc(layout, DType::f32), d_staged.get(),
                                        d_page.get(), nullptr));
    STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
    std::vector<std::byte> got;
    STATEPOOL_CUDA_OK(d_page.download(got));
    EXPECT_EQ(first_difference(got, expected), -1) << to_string(id);
  }
}

TEST(GpuKernels, FindNonFiniteReportsTheFirstIndex) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const StateLayout layout = layout_for(CodecId::int6, {16, 24, 0});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    auto staged = synthetic_staged_state(layout, 10, 3, dtype);
    const cuda::PageDesc desc = cuda::make_page_desc(layout, dtype);
    DeviceBuffer d_staged(staged.size());
    DeviceBuffer d_index(sizeof(unsigned long long));
    ASSERT_TRUE(d_staged.ok() && d_index.ok());

    STATEPOOL_CUDA_OK(d_staged.upload(staged));
    STATEPOOL_CUDA_OK(cuda::find_non_finite(
        desc, d_staged.get(), static_cast<unsigned long long*>(d_index.get()), nullptr));
    unsigned long long index = 0;
    STATEPOOL_CUDA_OK(cudaMemcpy(&index, d_index.get(), sizeof index, cudaMemcpyDeviceToHost));
    EXPECT_EQ(index, std::numeric_limits<unsigned long long>::max());

    const std::size_t first = 1000;
    const std::size_t later = 5000;
    if (dtype == DType::f32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float inf = std::numeric_limits<float>::infinity();
      std::memcpy(staged.data() + 4 * later, &nan, 4);
      std::memcpy(staged.data() + 4 * first, &inf, 4);
    } else {
      const std::uint16_t nan = 0x7FC0;
      const std::uint16_t inf = 0xFF80;
      std::memcpy(staged.data() + 2 * later, &nan, 2);
      std::memcpy(staged.data() + 2 * first, &inf, 2);
    }
    STATEPOOL_CUDA_OK(d_staged.upload(staged));
    STATEPOOL_CUDA_OK(cuda::find_non_finite(
        desc, d_staged.get(), static_cast<unsigned long long*>(d_index.get()), nullptr));
    STATEPOOL_CUDA_OK(cudaMemcpy(&index, d_index.get(), sizeof index, cudaMemcpyDeviceToHost));
    EXPECT_EQ(index, first);
  }
}

TEST(GpuKernels, RejectsBadDescriptorsAndPointers) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const StateLayout layout = layout_for(CodecId::int4, {16, 24, 0});
  const cuda::PageDesc good = cuda::make_page_desc(layout, DType::f32);
  DeviceBuffer a(1 << 20);
  DeviceBuffer b(1 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  cuda::PageDesc bad = good;
  bad.group_size = 6;
  EXPECT_EQ(cuda::encode_page(bad, a.get(), b.get(), nullptr), cudaErrorInvalidValue);
  bad = good;
  bad.head_bytes += 4;
  EXPECT_EQ(cuda::decode_page(bad, a.get(), b.get(), nullptr), cudaErrorInvalidValue);
  const auto* misaligned = static_cast<const std::byte*>(a.get()) + 2;
  EXPECT_EQ(cuda::encode_recurrent(good, misaligned, b.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::encode_recurrent(good, nullptr, b.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_THROW((void)cuda::make_page_desc(layout, DType::f16), std::invalid_argument);
}

}  // namespace
}  // namespace statepool::kernels
