// The fused-step kernel (kernels/cuda/step_kernels.hpp) on the GPU against the CPU fused
// step (kernels::fused_step): the same page bytes, outputs and rejected heads, bit for
// bit, for every codec instance of the conformance suite, over consecutive steps and
// layers, with grouped q/k heads, pages addressed by slot index with a stride, and a
// non-finite head (a slot outside the arena: the emulation test); the second step is a
// light one (StepMode::light: the launch takes cuda::light_step_view). The block body is the one
// tests/kernels/test_device_step_emulation.cpp runs on host threads without a GPU.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "device_buffer.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/cuda/step_kernels.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/decode_step.hpp"

namespace statepool::kernels {
namespace {

using testing::DeviceBuffer;
using testing::Instance;
using testing::StepBatch;

constexpr std::uint32_t kBatch = 3;
constexpr std::uint32_t kSlots = 5;
const std::vector<std::uint32_t> kSlotOf = {3, 0, 4};

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class FusedStepGpu : public ::testing::TestWithParam<Instance> {};

TEST_P(FusedStepGpu, EqualsTheCpuFusedStepBitForBit) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const PageCodec codec(GetParam().layout);
  const StateLayout& l = codec.layout();
  const cuda::DevicePageFormat format(codec, DType::f32);
  const std::size_t stride = codec.page_bytes() + 12;
  const std::uint32_t qk = l.num_heads % 2 == 0 ? l.num_heads / 2 : l.num_heads;

  std::vector<std::byte> cpu(stride * kSlots, std::byte{0x5A});
  for (std::uint32_t p = 0; p < kSlots; ++p) {
    const auto staged = synthetic::synthetic_staged_state(l, 8, 30 + p, DType::f32);
    codec.encode(staged, DType::f32, {cpu.data() + p * stride, codec.page_bytes()});
  }
  DeviceBuffer arena(cpu.size());
  DeviceBuffer slots(kBatch * sizeof(std::uint32_t));
  ASSERT_TRUE(arena.ok() && slots.ok());
  STATEPOOL_CUDA_OK(arena.upload(cpu));
  STATEPOOL_CUDA_OK(slots.upload(bytes_of(kSlotOf)));
  // The light mode's counts on the device (StepView::step_counts): every (page, layer,
  // head) starts at 0, so at step t each request's number is t.
  DeviceBuffer counts(std::size_t{kSlots} * codec.head_count() * sizeof(std::uint32_t));
  ASSERT_TRUE(counts.ok());
  STATEPOOL_CUDA_OK(counts.fill(0));

  for (std::uint32_t step = 0; step < 2; ++step) {
    for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
      StepBatch in(l, kBatch, qk, 400 + 10 * step + layer);
      if (step == 1 && layer == 0) {
        in.v[std::size_t{1} * l.num_heads * l.value_dim] = std::numeric_limits<float>::infinity();
      }
      DeviceBuffer q(in.q.size() * 4), k(in.k.size() * 4), v(in.v.size() * 4),
          g(in.log_decay.size() * 4), beta(in.beta.size() * 4), out(in.out.size() * 4),
          rejected(std::size_t{kBatch} * l.num_heads);
      STATEPOOL_CUDA_OK(q.upload(bytes_of(in.q)));
      STATEPOOL_CUDA_OK(k.upload(bytes_of(in.k)));
      STATEPOOL_CUDA_OK(v.upload(bytes_of(in.v)));
      STATEPOOL_CUDA_OK(g.upload(bytes_of(in.log_decay)));
      STATEPOOL_CUDA_OK(beta.upload(bytes_of(in.beta)));
      STATEPOOL_CUDA_OK(rejected.fill(0xEE));

      std::vector<std::byte*> pages;
      for (const std::uint32_t slot : kSlotOf) pages.push_back(cpu.data() + slot * stride);
      StepPolicy policy;
      policy.mode = StepMode::light;
      policy.full_every = 2;
      policy.step = step;  // 0: the full fit, 1: a light step (the device counts it)
      const StepResult expected = fused_step(codec, layer, pages, in.view(), {}, policy);

      const cuda::StepView s{.layer = layer,
                             .num_heads = l.num_heads,
                             .batch = kBatch,
                             .qk_heads = qk,
                             .q = static_cast<const float*>(q.get()),
                             .k = static_cast<const float*>(k.get()),
                             .v = static_cast<const float*>(v.get()),
                             .log_decay = static_cast<const float*>(g.get()),
                             .beta = static_cast<const float*>(beta.get()),
                             .out = static_cast<float*>(out.get()),
                             .pages = static_cast<std::uint8_t*>(arena.get()),
                             .page_stride = stride,
                             .page_count = kSlots,
                             .slots = static_cast<const std::uint32_t*>(slots.get()),
                             .rejected = static_cast<std::uint8_t*>(rejected.get()),
                             .step_counts = static_cast<std::uint32_t*>(counts.get()),
                             .full_every = policy.full_every};
      STATEPOOL_CUDA_OK(cuda::fused_step_pages(format.view(), s, nullptr));
      STATEPOOL_CUDA_OK(cudaDeviceSynchronize());

      std::vector<std::byte> device_pages, device_out, device_rejected;
      STATEPOOL_CUDA_OK(arena.download(device_pages));
      STATEPOOL_CUDA_OK(out.download(device_out));
      STATEPOOL_CUDA_OK(rejected.download(device_rejected));
      ASSERT_EQ(std::memcmp(device_out.data(), in.out.data(), device_out.size()), 0)
          << "outputs, step " << step << " layer " << layer;
      ASSERT_EQ(testing::first_difference(device_pages, cpu), -1)
          << "pages, step " << step << " layer " << layer;
      std::size_t count = 0;
      for (const std::byte r : device_rejected) {
        ASSERT_TRUE(r == std::byte{cuda::kStepStored} || r == std::byte{cuda::kStepNotFinite});
        count += r == std::byte{cuda::kStepNotFinite} ? 1 : 0;
      }
      EXPECT_EQ(count, expected.rejected_heads);
    }
  }
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, FusedStepGpu, ::testing::ValuesIn(testing::instances()),
                         instance_name);

TEST(FusedStepGpuLaunch, EachBadArgumentIsRefused) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  StateLayout l = testing::head_layout(CodecId::int8, 0, 8, 8);
  l.num_heads = 4;
  const PageCodec codec(l);
  const cuda::DevicePageFormat format(codec, DType::f32);
  EXPECT_TRUE(cuda::step_fits_device(format.view()));
  // batch 0 with valid shapes enqueues nothing and succeeds; each bad field alone fails.
  const cuda::StepView valid{.layer = 0,
                             .num_heads = 4,
                             .batch = 0,
                             .qk_heads = 2,
                             .page_stride = codec.page_bytes(),
                             .page_count = 1};
  EXPECT_EQ(cuda::fused_step_pages(format.view(), valid, nullptr), cudaSuccess);
  cuda::StepView bad = valid;
  bad.qk_heads = 3;  // does not divide 4
  EXPECT_EQ(cuda::fused_step_pages(format.view(), bad, nullptr), cudaErrorInvalidValue);
  bad = valid;
  bad.layer = 1;  // one layer only
  EXPECT_EQ(cuda::fused_step_pages(format.view(), bad, nullptr), cudaErrorInvalidValue);
  bad = valid;
  bad.page_stride = codec.page_bytes() - 4;  // pages would overlap
  EXPECT_EQ(cuda::fused_step_pages(format.view(), bad, nullptr), cudaErrorInvalidValue);
  bad = valid;
  bad.page_count = 0;
  EXPECT_EQ(cuda::fused_step_pages(format.view(), bad, nullptr), cudaErrorInvalidValue);
  bad = valid;
  bad.batch = 1;  // and every pointer null
  EXPECT_EQ(cuda::fused_step_pages(format.view(), bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace statepool::kernels
