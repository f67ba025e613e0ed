// The CUDA fused-step kernel's code (kernels/cuda/block_step.hpp) run on the host with
// the teams of host_team.hpp, against the CPU fused step (kernels::fused_step): the same
// page bytes, outputs and rejected heads, bit for bit, for every codec instance of the
// conformance suite, teams of 1 and 3 concurrently running ranks, grouped q/k heads,
// pages addressed through slot indices and a stride larger than a page. The GPU runs
// exactly this block body, so this is the evidence that the device step equals the CPU
// step where no GPU is at hand; tests/gpu/test_fused_step_gpu.cpp checks the device.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "statepool/kernels/cuda/block_step.hpp"
#include "statepool/kernels/cuda/host_team.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/decode_step.hpp"

namespace statepool::kernels {
namespace {

using testing::Instance;
using testing::StepBatch;

constexpr std::uint32_t kBatch = 3;
constexpr std::uint32_t kSlots = 5;  // the arena; requests use slots 3, 0, 4
constexpr std::uint32_t kSlotOf[kBatch] = {3, 0, 4};

/// An arena of kSlots pages, `stride` apart, every page a different synthetic state.
std::vector<std::byte> arena(const PageCodec& codec, std::size_t stride) {
  std::vector<std::byte> bytes(stride * kSlots, std::byte{0x5A});
  for (std::uint32_t p = 0; p < kSlots; ++p) {
    const auto staged = synthetic::synthetic_staged_state(codec.layout(), 8, 30 + p, DType::f32);
    codec.encode(staged, DType::f32, {bytes.data() + p * stride, codec.page_bytes()});
  }
  return bytes;
}

class DeviceStepEmulation : public ::testing::TestWithParam<Instance> {};

TEST_P(DeviceStepEmulation, EqualsTheCpuFusedStep) {
  const PageCodec codec(GetParam().layout);
  const StateLayout& l = codec.layout();
  const cuda::PageFormatTables tables(codec, DType::f32);
  const std::size_t stride = codec.page_bytes() + 12;  // keeps the 4-byte alignment
  const std::uint32_t qk = l.num_heads % 2 == 0 ? l.num_heads / 2 : l.num_heads;
  for (const unsigned ranks : {1u, 3u}) {
    auto cpu = arena(codec, stride);
    auto device = cpu;
    for (std::uint32_t step = 0; step < 2; ++step) {
      for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
        StepBatch a(l, kBatch, qk, 400 + 10 * step + layer);
        StepBatch b = a;
        if (step == 1 && layer == 0) {  // request 1, head 0 becomes non-finite
          a.v[std::size_t{1} * l.num_heads * l.value_dim] = std::numeric_limits<float>::infinity();
          b.v = a.v;
        }
        // Request 2's first q head +Inf: its readouts are +-Inf or NaN while its states
        // stay finite, so those heads are stored (the device's per-column check looks at
        // the readout first, then at the column).
        const bool overflow = step == 0 && layer == 0;
        if (overflow) {
          std::fill_n(a.q.begin() + std::size_t{2} * qk * l.key_dim, l.key_dim,
                    std::numeric_limits<float>::infinity());
          b.q = a.q;
        }
        std::vector<std::byte*> pages;
        for (const std::uint32_t slot : kSlotOf) pages.push_back(cpu.data() + slot * stride);
        const StepResult expected = fused_step(codec, layer, pages, a.view());

        std::vector<std::uint8_t> rejected(std::size_t{kBatch} * l.num_heads, 0xEE);
        const cuda::StepView s{.layer = layer,
                               .num_heads = l.num_heads,
                               .batch = kBatch,
                               .qk_heads = qk,
                               .q = b.q.data(),
                               .k = b.k.data(),
                               .v = b.v.data(),
                               .log_decay = b.log_decay.data(),
                               .beta = b.beta.data(),
                               .out = b.out.data(),
                               .pages = reinterpret_cast<std::uint8_t*>(device.data()),
                               .page_stride = stride,
                               .page_count = kSlots,
                               .slots = kSlotOf,
                               .rejected = rejected.data()};
        cuda::emulate_fused_step(tables.view(), s, ranks);

        ASSERT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0)
            << "outputs, ranks " << ranks << " step " << step << " layer " << layer;
        ASSERT_EQ(testing::first_difference(cpu, device), -1)
            << "pages, ranks " << ranks << " step " << step << " layer " << layer;
        std::size_t count = 0;
        for (const std::uint8_t r : rejected) {
          ASSERT_TRUE(r == cuda::kStepStored || r == cuda::kStepNotFinite) << int{r};
          count += r == cuda::kStepNotFinite ? 1 : 0;
        }
        EXPECT_EQ(count, expected.rejected_heads);
        if (overflow) {
          EXPECT_EQ(expected.rejected_heads, 0u);
          EXPECT_TRUE(std::any_of(a.out.begin(), a.out.end(),
                                  [](float o) { return !std::isfinite(o); }))
              << "no readout is non-finite: the test does not reach the column check";
        }
        if (expected.rejected_heads > 0) {
          EXPECT_EQ(rejected[std::size_t{expected.first_rejected_request} * l.num_heads +
                             expected.first_rejected_head],
                    cuda::kStepNotFinite);
        }
      }
    }
  }
}

// Light steps (StepMode::light) numbered on the device: the kernel reads each (page,
// layer, head)'s count (StepView::step_counts), encodes with light_step_view's format
// unless the count is a multiple of full_every, and counts the step. Whatever the batches
// (slot 0 also steps alone), the pages equal the CPU's step with each request's own
// number, bit for bit, and the counts are the steps each page had.
TEST_P(DeviceStepEmulation, LightStepsCountedOnTheDeviceEqualTheCpuLightSteps) {
  const PageCodec codec(GetParam().layout);
  const StateLayout& l = codec.layout();
  const cuda::PageFormatTables tables(codec, DType::f32);
  const std::size_t stride = codec.page_bytes();
  auto cpu = arena(codec, stride);
  auto device = cpu;
  std::vector<std::uint32_t> counts(std::size_t{kSlots} * codec.head_count(), 0);
  std::uint64_t cpu_counts[kSlots] = {};
  StepPolicy policy;
  policy.mode = StepMode::light;
  policy.full_every = 3;
  for (std::uint32_t call = 0; call < 7; ++call) {
    const bool alone = call % 2 == 1;  // slot 0 alone, else slots 3, 0, 4
    const std::uint32_t one[] = {0};
    const std::span<const std::uint32_t> slots =
        alone ? std::span<const std::uint32_t>(one) : std::span<const std::uint32_t>(kSlotOf);
    const auto batch = static_cast<std::uint32_t>(slots.size());
    StepBatch a(l, batch, l.num_heads, 500 + call);
    StepBatch b = a;
    std::vector<std::byte*> pages;
    std::vector<std::uint64_t> numbers;
    for (const std::uint32_t slot : slots) {
      pages.push_back(cpu.data() + slot * stride);
      numbers.push_back(cpu_counts[slot]++);
    }
    policy.steps = numbers;
    const StepResult expected = fused_step(codec, 0, pages, a.view(), {}, policy);
    ASSERT_TRUE(expected.ok());
    const cuda::StepView s{.num_heads = l.num_heads,
                           .batch = batch,
                           .qk_heads = l.num_heads,
                           .q = b.q.data(),
                           .k = b.k.data(),
                           .v = b.v.data(),
                           .log_decay = b.log_decay.data(),
                           .beta = b.beta.data(),
                           .out = b.out.data(),
                           .pages = reinterpret_cast<std::uint8_t*>(device.data()),
                           .page_stride = stride,
                           .page_count = kSlots,
                           .slots = slots.data(),
                           .rejected = nullptr,
                           .step_counts = counts.data(),
                           .full_every = policy.full_every};
    cuda::emulate_fused_step(tables.view(), s, 3);
    ASSERT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0)
        << "outputs, call " << call;
    ASSERT_EQ(testing::first_difference(cpu, device), -1) << "pages, call " << call;
  }
  for (std::uint32_t slot = 0; slot < kSlots; ++slot) {
    for (std::size_t head = 0; head < codec.head_count(); ++head) {
      const std::uint64_t want = head < l.num_heads ? cpu_counts[slot] : 0;  // layer 0 only
      EXPECT_EQ(counts[slot * codec.head_count() + head], want)
          << "slot " << slot << " head " << head;
    }
  }
}

TEST(DeviceStepEmulationSlots, ASlotOutsideTheArenaIsSkippedAndMarked) {
  StateLayout l = testing::head_layout(CodecId::int8, 0, 8, 8);
  l.num_heads = 2;
  const PageCodec codec(l);
  const cuda::PageFormatTables tables(codec, DType::f32);
  auto pages = arena(codec, codec.page_bytes());
  const auto before = pages;
  StepBatch in(l, 2, 2, 5);
  const std::uint32_t slots[] = {1, kSlots};  // the second is one past the end
  std::vector<std::uint8_t> rejected(4, 0xEE);
  const cuda::StepView s{.num_heads = 2,
                         .batch = 2,
                         .qk_heads = 2,
                         .q = in.q.data(),
                         .k = in.k.data(),
                         .v = in.v.data(),
                         .log_decay = in.log_decay.data(),
                         .beta = in.beta.data(),
                         .out = in.out.data(),
                         .pages = reinterpret_cast<std::uint8_t*>(pages.data()),
                         .page_stride = codec.page_bytes(),
                         .page_count = kSlots,
                         .slots = slots,
                         .rejected = rejected.data()};
  cuda::emulate_fused_step(tables.view(), s, 3);
  EXPECT_EQ(rejected, (std::vector<std::uint8_t>{cuda::kStepStored, cuda::kStepStored,
                                                 cuda::kStepBadSlot, cuda::kStepBadSlot}));
  const std::size_t page = codec.page_bytes();
  for (std::uint32_t p = 0; p < kSlots; ++p) {
    const bool changed = !std::equal(pages.begin() + p * page, pages.begin() + (p + 1) * page,
                                     before.begin() + p * page);
    EXPECT_EQ(changed, p == 1) << "page " << p;
  }
}

// Two requests of one launch with the same slot would step its page in two blocks at
// once: the device steps the first and refuses the later ones, writing nothing for them.
TEST(DeviceStepEmulationSlots, ASlotTwiceInOneBatchIsSteppedOnceForItsFirstRequest) {
  StateLayout l = testing::head_layout(CodecId::dsq6, 0, 8, 8);
  l.num_heads = 2;
  const PageCodec codec(l);
  const cuda::PageFormatTables tables(codec, DType::f32);
  StepBatch in(l, 3, 2, 7);
  const std::uint32_t slots[] = {1, 3, 1};
  const auto view = [&](std::vector<std::byte>& pages, StepBatch& batch, std::uint32_t count,
                        std::uint8_t* rejected) {
    return cuda::StepView{.num_heads = 2,
                          .batch = count,
                          .qk_heads = 2,
                          .q = batch.q.data(),
                          .k = batch.k.data(),
                          .v = batch.v.data(),
                          .log_decay = batch.log_decay.data(),
                          .beta = batch.beta.data(),
                          .out = batch.out.data(),
                          .pages = reinterpret_cast<std::uint8_t*>(pages.data()),
                          .page_stride = codec.page_bytes(),
                          .page_count = kSlots,
                          .slots = slots,
                          .rejected = rejected};
  };
  // The same launch without the third request.
  auto expected_pages = arena(codec, codec.page_bytes());
  StepBatch expected = in;
  cuda::emulate_fused_step(tables.view(), view(expected_pages, expected, 2, nullptr), 1);

  for (const unsigned ranks : {1u, 3u}) {
    auto pages = arena(codec, codec.page_bytes());
    StepBatch got = in;
    std::vector<std::uint8_t> rejected(6, 0xEE);
    cuda::emulate_fused_step(tables.view(), view(pages, got, 3, rejected.data()), ranks);
    EXPECT_EQ(rejected, (std::vector<std::uint8_t>{
                            cuda::kStepStored, cuda::kStepStored, cuda::kStepStored,
                            cuda::kStepStored, cuda::kStepDuplicateSlot, cuda::kStepDuplicateSlot}))
        << ranks << " ranks";
    EXPECT_EQ(pages, expected_pages) << ranks << " ranks";
    // Requests 0 and 1 wrote what they write alone; request 2 wrote nothing.
    // (bit for bit: request 2's outputs are still the batch's NaN fill)
    ASSERT_EQ(got.out.size(), expected.out.size());
    EXPECT_EQ(std::memcmp(got.out.data(), expected.out.data(), got.out.size() * sizeof(float)), 0)
        << ranks << " ranks";
  }
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, DeviceStepEmulation, ::testing::ValuesIn(testing::instances()),
                         instance_name);

}  // namespace
}  // namespace statepool::kernels
