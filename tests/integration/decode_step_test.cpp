// The client's fused decode step (client/include/statepool/decode_step.hpp) on the pages
// of a real daemon's arena: states compressed by the daemon are stepped in the client's
// mapping, with no request per token, and the daemon then decompresses the stepped
// states. Bytes and outputs equal the unfused oracle's; misuse is refused clearly.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstring>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/decode_step.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/decode_step.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/plans.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using statepool::testing::StepBatch;
using namespace std::chrono_literals;

namespace {

// Two GDN layers of four heads, 32 x 32, stepquant6 with mixed widths and a pivot.
kernels::StateLayout layout() {
  const std::uint8_t widths[] = {6, 8, 4, 6, 6, 16, 6, 6};
  auto plan = statepool::testing::make_plan(
      kernels::Arch::gdn, 2, 4, 32, 32, 6, [&](std::size_t u) { return widths[u]; },
      statepool::testing::random_impact(11));
  auto l = statepool::testing::plan_layout(plan, kernels::CodecId::stepquant6,
                                           kernels::StepQuantVariant::full, 16, 3);
  l.name = "it-decode-step";
  return l;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(DecodeStep, StepsTheDaemonsPagesInPlaceAsTheUnfusedPathDoes) {
  DaemonProcess daemon({}, true);
  auto conn = client::Connection::connect(client_options(daemon));
  const auto info = conn.register_layout(layout());
  auto arena = conn.open_arena(info, 4);
  auto staging = conn.open_staging(info.state_bytes_f32);
  auto slots = conn.allocate(arena, 3);
  const kernels::PageCodec& codec = arena.codec();

  // Three requests parked by the daemon; the local copies follow the unfused path.
  std::vector<std::vector<std::byte>> expected;
  std::vector<client::SlotId> ids;
  for (std::size_t b = 0; b < slots.size(); ++b) {
    const auto state = statepool::synthetic::synthetic_staged_state(codec.layout(), 32, 70 + b,
                                                                    kernels::DType::f32);
    std::memcpy(staging.bytes().data(), state.data(), state.size());
    conn.compress(slots[b], staging, 0);
    const auto page = arena.page(slots[b]);
    expected.emplace_back(page.begin(), page.end());
    ids.push_back(slots[b].id());
  }

  client::DecodeStep step(arena, {.threads = 2});
  EXPECT_EQ(step.threads(), 2u);
  for (std::uint32_t token = 0; token < 4; ++token) {
    for (std::uint32_t layer = 0; layer < 2; ++layer) {
      StepBatch in(codec.layout(), 3, 2, 900 + 2 * token + layer);  // 2 q/k heads for 4
      std::vector<float> out(in.out.size());
      for (std::uint32_t b = 0; b < 3; ++b) {
        ASSERT_TRUE(statepool::testing::unfused_step(codec, layer, expected[b], in, b, out));
      }
      ASSERT_TRUE(step.run(layer, ids, in.view(), kernels::StepPolicy{}).ok());  // full fits
      ASSERT_TRUE(same_bits(in.out, out)) << "token " << token << " layer " << layer;
      for (std::uint32_t b = 0; b < 3; ++b) {
        const auto page = arena.page(slots[b]);
        ASSERT_EQ(std::memcmp(page.data(), expected[b].data(), page.size()), 0)
            << "request " << b << " token " << token << " layer " << layer;
      }
    }
  }

  // A light step (docs/codecs.md, "Step modes") through the client: the policy reaches
  // the step (layer 0 has no pivot head: 3 x 4 light heads) and the pages are the
  // kernel's light step's. The step's own count numbers it: 4 steps of layer 0 so far.
  {
    EXPECT_EQ(step.steps(ids[1], 0), 4u);
    kernels::StepPolicy light;
    light.mode = kernels::StepMode::light;
    light.step = 1;  // for the kernel below; DecodeStep reads its own count
    StepBatch in(codec.layout(), 3, 2, 990);
    StepBatch copy = in;
    std::vector<std::byte*> pages;
    for (auto& page : expected) pages.push_back(page.data());
    ASSERT_TRUE(kernels::fused_step(codec, 0, pages, copy.view(), {}, light).ok());
    const kernels::StepResult r = step.run(0, ids, in.view(), light);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.light_heads, 12u);
    for (std::uint32_t b = 0; b < 3; ++b) {
      const auto page = arena.page(slots[b]);
      ASSERT_EQ(std::memcmp(page.data(), expected[b].data(), page.size()), 0) << "request " << b;
    }
  }

  // The default is stepquant6's measured mode, numbered per slot by the DecodeStep
  // itself, whatever the batches: a new one's first step of a page is a full fit, then
  // 15 light steps, then a full fit. Slot 0 steps alone 5 times, then with the others.
  {
    client::DecodeStep counted(arena, {.threads = 1});
    EXPECT_EQ(counted.default_policy().mode, kernels::StepMode::light);
    EXPECT_EQ(counted.default_policy().full_every, 16u);
    const kernels::StepPolicy measured = counted.default_policy();
    for (std::uint64_t n = 0; n < 5; ++n) {
      StepBatch in(codec.layout(), 1, 2, 1000 + n);
      StepBatch copy = in;
      kernels::StepPolicy at = measured;
      const std::uint64_t numbers[] = {n};
      at.steps = numbers;
      std::byte* page = expected[0].data();
      ASSERT_TRUE(kernels::fused_step(codec, 0, {&page, 1}, copy.view(), {}, at).ok());
      const kernels::StepResult r = counted.run(0, std::span(ids).first(1), in.view());
      EXPECT_EQ(r.light_heads, n == 0 ? 0u : 4u) << "step " << n;
    }
    for (std::uint64_t j = 0; j < 12; ++j) {
      StepBatch in(codec.layout(), 3, 2, 1100 + j);
      StepBatch copy = in;
      kernels::StepPolicy at = measured;
      const std::uint64_t numbers[] = {5 + j, j, j};
      at.steps = numbers;
      std::vector<std::byte*> pages;
      for (auto& page : expected) pages.push_back(page.data());
      ASSERT_TRUE(kernels::fused_step(codec, 0, pages, copy.view(), {}, at).ok());
      const kernels::StepResult r = counted.run(0, ids, in.view());
      const std::size_t light = (j == 0 ? 0u : 8u) + (j == 11 ? 0u : 4u);
      EXPECT_EQ(r.light_heads, light) << "joint step " << j;
    }
    EXPECT_EQ(counted.steps(ids[0], 0), 17u);
    EXPECT_EQ(counted.steps(ids[2], 0), 12u);
    EXPECT_EQ(counted.steps(ids[2], 1), 0u);
    for (std::uint32_t b = 0; b < 3; ++b) {
      const auto page = arena.page(slots[b]);
      ASSERT_EQ(std::memcmp(page.data(), expected[b].data(), page.size()), 0) << "request " << b;
    }
  }

  // The daemon resumes the stepped state: its decompression is the local decode.
  conn.decompress(slots[1], staging, 0);
  std::vector<std::byte> local(info.state_bytes_f32);
  codec.decode(expected[1], kernels::DType::f32, local);
  EXPECT_EQ(std::memcmp(staging.bytes().data(), local.data(), local.size()), 0);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}

TEST(DecodeStep, MisuseIsRefusedClearlyAndWritesNothing) {
  DaemonProcess daemon({}, true);
  auto conn = client::Connection::connect(client_options(daemon));
  const auto info = conn.register_layout(layout());
  auto arena = conn.open_arena(info, 2);
  auto slots = conn.allocate(arena, 2);
  const auto before = std::vector<std::byte>(arena.data().begin(), arena.data().end());
  client::DecodeStep step(arena, {.threads = 1});
  EXPECT_EQ(step.threads(), 1u);
  StepBatch in(arena.codec().layout(), 2, 4, 1);

  const std::vector<client::SlotId> twice = {slots[0].id(), slots[0].id()};
  try {
    (void)step.run(0, twice, in.view());
    ADD_FAILURE() << "a slot twice in one batch was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
  const std::vector<client::SlotId> outside = {slots[0].id(), 7};
  EXPECT_THROW((void)step.run(0, outside, in.view()), std::out_of_range);
  const std::vector<client::SlotId> ids = {slots[0].id(), slots[1].id()};
  EXPECT_THROW((void)step.run(2, ids, in.view()), std::invalid_argument);  // no layer 2
  in.beta.pop_back();
  EXPECT_THROW((void)step.run(0, ids, in.view()), std::invalid_argument);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), arena.data().begin()));

  // An arena that is not mapped here is refused.
  const client::Arena never_opened;
  try {
    client::DecodeStep unmapped(never_opened);
    ADD_FAILURE() << "an unmapped arena was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("not mapped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}
