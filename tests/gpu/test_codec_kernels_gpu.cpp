// CUDA page kernels (kernels/cuda) against the CPU codecs: for every codec and variant,
// the GPU must write the same page bytes as PageCodec::encode and decode pages to the
// same staged bytes, in batches of several slots (a skipped slot left untouched) and in
// the single-page forms. The same block bodies run on host threads in
// tests/kernels/test_device_codec_emulation.cpp, which needs no GPU.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device_buffer.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using testing::DeviceBuffer;

using cuda::DevicePageFormat;
using stepquant::kPivotWidth;
using synthetic::synthetic_staged_state;
using testing::first_difference;
using testing::plan_layout;

constexpr unsigned long long kFinite = std::numeric_limits<unsigned long long>::max();

struct Case {
  std::string name;
  StateLayout layout;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

StateLayout plain_layout(CodecId id, Arch arch, std::uint32_t k, std::uint32_t v,
                         std::uint32_t group) {
  StateLayout layout;
  layout.name = "gpu-test";
  layout.arch = arch;
  layout.num_layers = 3;
  layout.num_heads = 5;
  layout.key_dim = k;
  layout.value_dim = v;
  layout.conv_channels = 12;
  layout.conv_width = 3;
  layout.conv_dtype = DType::bf16;
  layout.codec = {id, group};
  return layout;
}

std::vector<Case> cases() {
  struct Shape {
    std::uint32_t k, v, group;
  };
  const Shape shapes[] = {{128, 128, 0}, {16, 24, 32}, {10, 10, 32}, {7, 5, 12}, {3, 3, 4}};
  std::vector<Case> out;
  for (const CodecId id : {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4,
                           CodecId::int6, CodecId::int8, CodecId::dsq4, CodecId::dsq6}) {
    for (const Shape& s : shapes) {
      for (const Arch arch : {Arch::gdn, Arch::kda}) {
        if (arch == Arch::kda && !is_dsq_codec(id)) {
          continue;  // the arch changes nothing for the other codecs
        }
        out.push_back({std::string(to_string(id)) + "_" + to_string(arch) + "_" +
                           std::to_string(s.k) + "x" + std::to_string(s.v) + "_g" +
                           std::to_string(s.group),
                       plain_layout(id, arch, s.k, s.v, s.group)});
      }
    }
  }
  constexpr std::uint8_t P = kPivotWidth;
  const auto cycling = [](Arch arch, std::uint32_t k, std::uint32_t v, std::uint32_t budget,
                          std::vector<std::uint8_t> widths, std::uint64_t seed) {
    return testing::make_plan(
        arch, 2, 3, k, v, budget,
        [widths](std::size_t u) { return widths[(u * 7 + u / 3) % widths.size()]; },
        testing::random_impact(seed));
  };
  const std::pair<std::string, stepquant::Plan> plans[] = {
      {"gdn_plan6", testing::gdn_plan6()},
      {"gdn_plan4", testing::gdn_plan4()},
      {"kda_plan6", testing::kda_plan6()},
      {"kda_plan4_v20", testing::kda_plan4(20)},
      {"kda_plan4_v7", testing::kda_plan4(7)},
      {"gdn4_7x5", cycling(Arch::gdn, 7, 5, 4, {2, 4, 6, 8, P}, 1)},
      {"gdn4_5x40", cycling(Arch::gdn, 5, 40, 4, {2, 4, 6, 8, P}, 2)},
      {"kda4_10x10", cycling(Arch::kda, 10, 10, 4, {2, 4, 6, 8, P}, 3)},
      {"kda4_128x128", cycling(Arch::kda, 128, 128, 4, {2, 4, 6, 8, P}, 4)},
      {"gdn6_16x24", cycling(Arch::gdn, 16, 24, 6, {4, 6, 8, P}, 5)},
  };
  for (const auto& [name, plan] : plans) {
    const CodecId id = plan.budget_bits == 4 ? CodecId::stepquant4 : CodecId::stepquant6;
    for (const StepQuantVariant variant :
         {StepQuantVariant::full, StepQuantVariant::spatial_only, StepQuantVariant::temporal_only,
          StepQuantVariant::no_refit}) {
      out.push_back({name + "_" + to_string(variant), plan_layout(plan, id, variant, 12, 3)});
    }
  }
  return out;
}

using Param = std::tuple<Case, DType>;

class GpuCodec : public ::testing::TestWithParam<Param> {};

constexpr std::uint32_t kSlots = 3;

// A batch of kSlots staged states (each its own seed) and their CPU pages, on the device.
struct Batch {
  std::vector<std::vector<std::byte>> staged;
  std::vector<std::vector<std::byte>> pages;
};

Batch make_batch(const PageCodec& cpu, DType dtype, std::uint64_t seed) {
  Batch b;
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    b.staged.push_back(synthetic_staged_state(cpu.layout(), 40, seed + s, dtype));
    b.pages.emplace_back(cpu.page_bytes());
    cpu.encode(b.staged.back(), dtype, b.pages.back());
  }
  return b;
}

// A device array of the device pointers of `buffers`.
template <class Ptr>
std::vector<Ptr> pointers(const std::vector<std::unique_ptr<DeviceBuffer>>& buffers) {
  std::vector<Ptr> out;
  for (const auto& b : buffers) {
    out.push_back(b->get());
  }
  return out;
}

std::vector<std::unique_ptr<DeviceBuffer>> buffers(std::size_t count, std::size_t bytes) {
  std::vector<std::unique_ptr<DeviceBuffer>> out;
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back(std::make_unique<DeviceBuffer>(bytes));
  }
  return out;
}

TEST_P(GpuCodec, BatchedEncodeBytesEqualCpuBytesAndSkippedSlotsStayUntouched) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const DevicePageFormat format(cpu, dtype);
  const Batch batch = make_batch(cpu, dtype, 11);

  auto d_staged = buffers(kSlots, cpu.staged_bytes(dtype));
  auto d_pages = buffers(kSlots, cpu.page_bytes());
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    ASSERT_TRUE(d_staged[s]->ok() && d_pages[s]->ok());
    STATEPOOL_CUDA_OK(d_staged[s]->upload(batch.staged[s]));
    STATEPOOL_CUDA_OK(d_pages[s]->fill(0xA7));  // every byte must be written
  }
  const auto staged_ptrs = pointers<const void*>(d_staged);
  const auto page_ptrs = pointers<void*>(d_pages);
  DeviceBuffer d_staged_array(sizeof(void*) * kSlots);
  DeviceBuffer d_page_array(sizeof(void*) * kSlots);
  const unsigned long long skip[kSlots] = {kFinite, 17, kFinite};
  DeviceBuffer d_skip(sizeof skip);
  ASSERT_TRUE(d_staged_array.ok() && d_page_array.ok() && d_skip.ok());
  STATEPOOL_CUDA_OK(d_staged_array.upload(staged_ptrs.data(), sizeof(void*) * kSlots));
  STATEPOOL_CUDA_OK(d_page_array.upload(page_ptrs.data(), sizeof(void*) * kSlots));
  STATEPOOL_CUDA_OK(d_skip.upload(skip, sizeof skip));

  STATEPOOL_CUDA_OK(
      cuda::encode_pages(format.view(), static_cast<const void* const*>(d_staged_array.get()),
                         static_cast<void* const*>(d_page_array.get()), kSlots,
                         static_cast<const unsigned long long*>(d_skip.get()), nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<std::byte> untouched(cpu.page_bytes(), std::byte{0xA7});
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    std::vector<std::byte> got;
    STATEPOOL_CUDA_OK(d_pages[s]->download(got));
    EXPECT_EQ(first_difference(got, s == 1 ? untouched : batch.pages[s]), -1) << "slot " << s;
  }

  // The single-page form, for the slot the batch skipped.
  STATEPOOL_CUDA_OK(
      cuda::encode_page(format.view(), d_staged[1]->get(), d_pages[1]->get(), nullptr, nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::byte> got;
  STATEPOOL_CUDA_OK(d_pages[1]->download(got));
  EXPECT_EQ(first_difference(got, batch.pages[1]), -1);
}

TEST_P(GpuCodec, BatchedDecodeEqualsCpuDecode) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const DevicePageFormat format(cpu, dtype);
  const Batch batch = make_batch(cpu, DType::f32, 12);

  auto d_pages = buffers(kSlots, cpu.page_bytes());
  auto d_staged = buffers(kSlots, cpu.staged_bytes(dtype));
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    ASSERT_TRUE(d_staged[s]->ok() && d_pages[s]->ok());
    STATEPOOL_CUDA_OK(d_pages[s]->upload(batch.pages[s]));
    STATEPOOL_CUDA_OK(d_staged[s]->fill(0x5C));
  }
  const auto page_ptrs = pointers<const void*>(d_pages);
  const auto staged_ptrs = pointers<void*>(d_staged);
  DeviceBuffer d_page_array(sizeof(void*) * kSlots);
  DeviceBuffer d_staged_array(sizeof(void*) * kSlots);
  ASSERT_TRUE(d_staged_array.ok() && d_page_array.ok());
  STATEPOOL_CUDA_OK(d_page_array.upload(page_ptrs.data(), sizeof(void*) * kSlots));
  STATEPOOL_CUDA_OK(d_staged_array.upload(staged_ptrs.data(), sizeof(void*) * kSlots));
  STATEPOOL_CUDA_OK(
      cuda::decode_pages(format.view(), static_cast<const void* const*>(d_page_array.get()),
                         static_cast<void* const*>(d_staged_array.get()), kSlots, nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    std::vector<std::byte> expected(cpu.staged_bytes(dtype));
    cpu.decode(batch.pages[s], dtype, expected);
    std::vector<std::byte> got;
    STATEPOOL_CUDA_OK(d_staged[s]->download(got));
    EXPECT_EQ(first_difference(got, expected), -1) << "slot " << s;
  }

  // The single-page form.
  STATEPOOL_CUDA_OK(d_staged[0]->fill(0x5C));
  STATEPOOL_CUDA_OK(
      cuda::decode_page(format.view(), d_pages[0]->get(), d_staged[0]->get(), nullptr));
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::byte> expected(cpu.staged_bytes(dtype));
  cpu.decode(batch.pages[0], dtype, expected);
  std::vector<std::byte> got;
  STATEPOOL_CUDA_OK(d_staged[0]->download(got));
  EXPECT_EQ(first_difference(got, expected), -1);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param).name + "_" + to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, GpuCodec,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         param_name);

// Random values over a wide dynamic range (and the edge values of the CPU suites) for the
// codecs with a fit: where one differently rounded operation would show.
TEST(GpuKernels, WideRangeAndEdgeValuesEncodeLikeTheCpu) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const std::vector<StateLayout> layouts = {
      plain_layout(CodecId::int6, Arch::gdn, 7, 5, 12),
      plain_layout(CodecId::dsq6, Arch::gdn, 9, 13, 0),
      plan_layout(testing::gdn_plan4(), CodecId::stepquant4),
      plan_layout(testing::kda_plan4(13), CodecId::stepquant4),
      plan_layout(testing::kda_plan6(), CodecId::stepquant6, StepQuantVariant::spatial_only),
  };
  const float edges[] = {0.0f,     -0.0f,    1e-40f,
                         -3e-42f,  3e-6f,    -7e-8f,
                         1e30f,    -3e38f,   std::numeric_limits<float>::max(),
                         65520.0f, 65504.0f, 1.0f};
  for (const StateLayout& layout : layouts) {
    const PageCodec cpu(layout);
    const DevicePageFormat format(cpu, DType::f32);
    DeviceBuffer d_staged(cpu.staged_bytes(DType::f32));
    DeviceBuffer d_page(cpu.page_bytes());
    ASSERT_TRUE(d_staged.ok() && d_page.ok());
    for (std::uint64_t seed = 0; seed < 8; ++seed) {
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
      std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
      std::vector<std::byte> staged(cpu.staged_bytes(DType::f32));
      for (std::size_t i = 0; i < staged.size() / 4; ++i) {
        const float v = mantissa(rng) * std::exp2(exponent(rng));
        std::memcpy(staged.data() + 4 * i, &v, 4);
      }
      if (seed == 0) {
        std::memcpy(staged.data(), edges, sizeof edges);
      }
      std::vector<std::byte> expected(cpu.page_bytes());
      cpu.encode(staged, DType::f32, expected);
      STATEPOOL_CUDA_OK(d_staged.upload(staged));
      STATEPOOL_CUDA_OK(d_page.fill(0x11));
      STATEPOOL_CUDA_OK(
          cuda::encode_page(format.view(), d_staged.get(), d_page.get(), nullptr, nullptr));
      STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
      std::vector<std::byte> got;
      STATEPOOL_CUDA_OK(d_page.download(got));
      EXPECT_EQ(first_difference(got, expected), -1)
          << to_string(layout.codec.id) << " seed " << seed;
    }
  }
}

TEST(GpuKernels, FindNonFiniteReportsTheFirstIndexPerSlotAndEncodeSkipsThoseSlots) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const StateLayout layout =
      plan_layout(testing::kda_plan4(20), CodecId::stepquant4, StepQuantVariant::full, 12, 3);
  const PageCodec cpu(layout);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const DevicePageFormat format(cpu, dtype);
    Batch batch = make_batch(cpu, dtype, 3);
    const std::size_t first = 100;
    const std::size_t later = 250;
    const auto poke = [dtype](std::vector<std::byte>& s, std::size_t i, bool nan) {
      if (dtype == DType::f32) {
        const float v =
            nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
        std::memcpy(s.data() + 4 * i, &v, 4);
      } else {
        const std::uint16_t v = nan ? 0x7FC0 : 0xFF80;
        std::memcpy(s.data() + 2 * i, &v, 2);
      }
    };
    poke(batch.staged[2], later, true);
    poke(batch.staged[2], first, false);

    auto d_staged = buffers(kSlots, cpu.staged_bytes(dtype));
    auto d_pages = buffers(kSlots, cpu.page_bytes());
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      ASSERT_TRUE(d_staged[s]->ok() && d_pages[s]->ok());
      STATEPOOL_CUDA_OK(d_staged[s]->upload(batch.staged[s]));
      STATEPOOL_CUDA_OK(d_pages[s]->fill(0x42));
    }
    const auto staged_ptrs = pointers<const void*>(d_staged);
    const auto page_ptrs = pointers<void*>(d_pages);
    DeviceBuffer d_staged_array(sizeof(void*) * kSlots);
    DeviceBuffer d_page_array(sizeof(void*) * kSlots);
    DeviceBuffer d_first(sizeof(unsigned long long) * kSlots);
    ASSERT_TRUE(d_staged_array.ok() && d_page_array.ok() && d_first.ok());
    STATEPOOL_CUDA_OK(d_staged_array.upload(staged_ptrs.data(), sizeof(void*) * kSlots));
    STATEPOOL_CUDA_OK(d_page_array.upload(page_ptrs.data(), sizeof(void*) * kSlots));
    auto* first_index = static_cast<unsigned long long*>(d_first.get());
    const auto* staged_array = static_cast<const void* const*>(d_staged_array.get());
    // Scan, then encode with the scan as the skip array: no host round trip between.
    STATEPOOL_CUDA_OK(
        cuda::find_non_finite_pages(format.view(), staged_array, kSlots, first_index, nullptr));
    STATEPOOL_CUDA_OK(cuda::encode_pages(format.view(), staged_array,
                                         static_cast<void* const*>(d_page_array.get()), kSlots,
                                         first_index, nullptr));
    STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
    unsigned long long found[kSlots] = {};
    STATEPOOL_CUDA_OK(cudaMemcpy(found, first_index, sizeof found, cudaMemcpyDeviceToHost));
    EXPECT_EQ(found[0], kFinite);
    EXPECT_EQ(found[1], kFinite);
    EXPECT_EQ(found[2], first);
    const std::vector<std::byte> untouched(cpu.page_bytes(), std::byte{0x42});
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      std::vector<std::byte> got;
      STATEPOOL_CUDA_OK(d_pages[s]->download(got));
      EXPECT_EQ(first_difference(got, s == 2 ? untouched : batch.pages[s]), -1) << "slot " << s;
    }
    // The single-state form.
    STATEPOOL_CUDA_OK(
        cuda::find_non_finite(format.view(), d_staged[2]->get(), first_index, nullptr));
    unsigned long long one = 0;
    STATEPOOL_CUDA_OK(cudaMemcpy(&one, first_index, sizeof one, cudaMemcpyDeviceToHost));
    EXPECT_EQ(one, first);
  }
}

TEST(GpuKernels, RejectsBadViewsAndPointersWithoutLaunching) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const PageCodec cpu(plain_layout(CodecId::int4, Arch::gdn, 16, 24, 0));
  const DevicePageFormat format(cpu, DType::f32);
  DeviceBuffer a(1 << 20);
  DeviceBuffer b(1 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  cuda::PageFormatView bad = format.view();
  bad.group_size = 6;
  EXPECT_EQ(cuda::encode_page(bad, a.get(), b.get(), nullptr, nullptr), cudaErrorInvalidValue);
  bad = format.view();
  bad.page_bytes += 4;
  EXPECT_EQ(cuda::decode_page(bad, a.get(), b.get(), nullptr), cudaErrorInvalidValue);
  bad = format.view();
  bad.head_offsets = nullptr;
  EXPECT_EQ(cuda::encode_page(bad, a.get(), b.get(), nullptr, nullptr), cudaErrorInvalidValue);
  const auto* misaligned = static_cast<const std::byte*>(a.get()) + 2;
  EXPECT_EQ(cuda::encode_page(format.view(), misaligned, b.get(), nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::encode_page(format.view(), nullptr, b.get(), nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::encode_pages(format.view(), nullptr, nullptr, 2, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      cuda::find_non_finite(
          format.view(), a.get(),
          reinterpret_cast<unsigned long long*>(static_cast<std::byte*>(b.get()) + 4), nullptr),
      cudaErrorInvalidValue);
  // Nothing to do is not an error.
  EXPECT_EQ(cuda::decode_pages(format.view(), static_cast<const void* const*>(a.get()),
                               static_cast<void* const*>(b.get()), 0, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_THROW(DevicePageFormat(cpu, DType::f16), std::invalid_argument);

  // A moved-from format has an empty view, which the launchers refuse.
  DevicePageFormat moved(cpu, DType::bf16);
  DevicePageFormat target = std::move(moved);
  EXPECT_NE(target.view().head_offsets, nullptr);
  EXPECT_EQ(cuda::encode_page(moved.view(), a.get(), b.get(), nullptr,
                              nullptr),  // NOLINT(bugprone-use-after-move)
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace statepool::kernels
