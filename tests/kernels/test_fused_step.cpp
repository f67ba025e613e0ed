// The fused decode step (kernels/include/statepool/kernels/fused_step.hpp) against the
// unfused path it replaces, on every codec instance of the conformance suite (every
// codec, variant and plan, GDN and KDA, odd shapes, several layers and heads, conv
// states):
//   - the bytes of every page and every output equal, bit for bit, those of "decode the
//     layer's heads, kernels::gdn_step / kda_step per head, encode the layer's heads",
//     over several consecutive steps, for every layer, with grouped q/k heads where the
//     head count allows, on one thread and split over threads;
//   - the other layers' heads and the conv state are not touched;
//   - a head whose new state is not finite keeps its page bytes and is reported;
//   - inputs that do not fit the layout are refused, naming the field.
// And over 1,000 steps, the outputs' drift from an FP32 recurrence is the drift of the
// unfused path (identical runs), for stepquant6 and the uniform codecs, GDN and KDA.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/support/worker_pool.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/decode_step.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using testing::Instance;
using testing::StepBatch;
using testing::unfused_step;

/// Splits the items over `pool`'s threads and the caller, as client::DecodeStep does.
ParallelFor split_over(support::WorkerPool& pool) {
  return [&pool](std::size_t count, std::size_t grain,
                 const std::function<void(std::size_t, std::size_t)>& fn) {
    pool.parallel_for(count, grain, fn);
  };
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::vector<std::byte>> initial_pages(const PageCodec& codec, std::uint32_t batch,
                                                  std::uint64_t seed) {
  std::vector<std::vector<std::byte>> pages;
  for (std::uint32_t b = 0; b < batch; ++b) {
    const auto staged = synthetic::synthetic_staged_state(codec.layout(), 16, seed + b, DType::f32);
    pages.emplace_back(codec.page_bytes());
    codec.encode(staged, DType::f32, pages.back());
  }
  return pages;
}

std::vector<std::byte*> pointers(std::vector<std::vector<std::byte>>& pages) {
  std::vector<std::byte*> out;
  for (auto& page : pages) out.push_back(page.data());
  return out;
}

class FusedStepEquivalence : public ::testing::TestWithParam<Instance> {};

TEST_P(FusedStepEquivalence, EqualsDecodeStepEncodeBitForBit) {
  const PageCodec codec(GetParam().layout);
  const StateLayout& l = codec.layout();
  constexpr std::uint32_t kBatch = 3;
  constexpr int kSteps = 3;
  // Grouped q/k heads (two state heads per q/k head) where the head count allows.
  const std::uint32_t qk = l.num_heads % 2 == 0 ? l.num_heads / 2 : l.num_heads;
  auto fused = initial_pages(codec, kBatch, 100);
  auto unfused = fused;
  const auto fused_ptrs = pointers(fused);
  support::WorkerPool pool(2);

  for (int step = 0; step < kSteps; ++step) {
    for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
      StepBatch in(l, kBatch, qk, 1000 + 10 * step + layer);
      std::vector<float> expected(in.out.size());
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        ASSERT_TRUE(unfused_step(codec, layer, unfused[b], in, b, expected));
      }
      // Odd steps split the heads over three threads.
      const StepResult result = fused_step(codec, layer, fused_ptrs, in.view(),
                                           step % 2 == 1 ? split_over(pool) : ParallelFor{});
      EXPECT_TRUE(result.ok());
      ASSERT_TRUE(same_bits(in.out, expected))
          << "outputs differ at step " << step << " layer " << layer;
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        ASSERT_EQ(testing::first_difference(fused[b], unfused[b]), -1)
            << "page " << b << " differs at step " << step << " layer " << layer;
      }
    }
  }
}

TEST_P(FusedStepEquivalence, TouchesOnlyTheLayersHeads) {
  const PageCodec codec(GetParam().layout);
  const StateLayout& l = codec.layout();
  for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
    auto pages = initial_pages(codec, 1, 7);
    const auto before = pages[0];
    StepBatch in(l, 1, l.num_heads, 77 + layer);
    const auto ptrs = pointers(pages);
    ASSERT_TRUE(fused_step(codec, layer, ptrs, in.view()).ok());
    const std::size_t begin = codec.head_offset(layer, 0);
    const std::size_t end =
        layer + 1 < l.num_layers ? codec.head_offset(layer + 1, 0) : codec.conv_offset();
    for (std::size_t i = 0; i < pages[0].size(); ++i) {
      if (i < begin || i >= end) {
        ASSERT_EQ(pages[0][i], before[i]) << "layer " << layer << " byte " << i;
      }
    }
    for (const float o : in.out) ASSERT_TRUE(std::isfinite(o));
  }
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, FusedStepEquivalence, ::testing::ValuesIn(testing::instances()),
                         instance_name);

StateLayout gdn_int8(std::uint32_t layers, std::uint32_t heads, std::uint32_t dim) {
  StateLayout l = testing::head_layout(CodecId::int8, 0, dim, dim);
  l.num_layers = layers;
  l.num_heads = heads;
  return l;
}

TEST(FusedStep, NonFiniteHeadKeepsItsBytesAndIsReported) {
  for (const CodecId id : {CodecId::fp32, CodecId::int8}) {
    StateLayout l = gdn_int8(1, 4, 16);
    l.codec.id = id;
    const PageCodec codec(l);
    auto fused = initial_pages(codec, 2, 3);
    auto unfused = fused;
    const auto before = fused;
    StepBatch in(l, 2, 4, 5);
    in.v[(1 * 4 + 2) * 16 + 3] = std::numeric_limits<float>::infinity();  // request 1, head 2
    const auto ptrs = pointers(fused);
    support::WorkerPool pool(1);
    const StepResult result = fused_step(codec, 0, ptrs, in.view(), split_over(pool));
    EXPECT_EQ(result.rejected_heads, 1u);
    EXPECT_EQ(result.first_rejected_request, 1u);
    EXPECT_EQ(result.first_rejected_head, 2u);
    // Request 0 as unfused; request 1's head 2 as before, its other heads stepped.
    std::vector<float> expected(in.out.size());
    ASSERT_TRUE(unfused_step(codec, 0, unfused[0], in, 0, expected));
    EXPECT_EQ(testing::first_difference(fused[0], unfused[0]), -1);
    const std::size_t h2 = codec.head_offset(0, 2);
    const std::size_t h3 = codec.head_offset(0, 3);
    EXPECT_TRUE(std::equal(fused[1].begin() + static_cast<std::ptrdiff_t>(h2),
                           fused[1].begin() + static_cast<std::ptrdiff_t>(h3),
                           before[1].begin() + static_cast<std::ptrdiff_t>(h2)));
    EXPECT_FALSE(std::equal(fused[1].begin(), fused[1].begin() + static_cast<std::ptrdiff_t>(h2),
                            before[1].begin()));
    // The unfused path refuses the whole state of request 1.
    EXPECT_FALSE(unfused_step(codec, 0, unfused[1], in, 1, expected));
  }
}

TEST(FusedStep, RefusesInputsThatDoNotFitNamingTheField) {
  const PageCodec codec(gdn_int8(2, 4, 8));
  auto pages = initial_pages(codec, 2, 1);
  const auto ptrs = pointers(pages);
  const auto message = [&](const std::function<void(StepBatch&, std::uint32_t&)>& spoil,
                           std::span<std::byte* const> use = {}) {
    StepBatch in(codec.layout(), 2, 4, 9);
    std::uint32_t layer = 1;
    spoil(in, layer);
    try {
      (void)fused_step(codec, layer, use.empty() ? std::span<std::byte* const>(ptrs) : use,
                       in.view());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([](StepBatch&, std::uint32_t& layer) { layer = 2; }).find("layer 2"),
            std::string::npos);
  EXPECT_NE(message([](StepBatch& in, std::uint32_t&) { in.qk_heads = 3; }).find("qk_heads 3"),
            std::string::npos);
  EXPECT_NE(message([](StepBatch& in, std::uint32_t&) { in.v.pop_back(); }).find("v has 63"),
            std::string::npos);
  EXPECT_NE(
      message([](StepBatch& in, std::uint32_t&) { in.log_decay.push_back(0); }).find("log_decay"),
      std::string::npos);
  EXPECT_NE(message([](StepBatch& in, std::uint32_t&) { in.batch = 3; }).find("pages has 2"),
            std::string::npos);
  const std::vector<std::byte*> null_page = {ptrs[0], nullptr};
  EXPECT_NE(message([](StepBatch&, std::uint32_t&) {}, null_page).find("page of request 1 is null"),
            std::string::npos);
  // Nothing refused was written.
  auto fresh = initial_pages(codec, 2, 1);
  EXPECT_EQ(pages, fresh);
}

TEST(FusedStep, EmptyBatchDoesNothing) {
  const PageCodec codec(gdn_int8(1, 2, 4));
  StepBatch in(codec.layout(), 0, 2, 1);
  EXPECT_TRUE(fused_step(codec, 0, {}, in.view()).ok());
}

// ---------------------------------------------------------------------------------------
// Drift over 1,000 steps: FP32 recurrence vs the fused path vs the unfused path.

struct Drift {
  double fused = 0;
  double unfused = 0;
};

Drift drift_over(const StateLayout& layout, std::uint32_t steps) {
  const PageCodec codec(layout);
  const StateLayout& l = codec.layout();
  constexpr std::uint32_t kBatch = 2;
  auto fused = initial_pages(codec, kBatch, 40);
  auto unfused = fused;
  const auto ptrs = pointers(fused);
  // The FP32 reference starts from the same (decoded) state.
  std::vector<std::vector<float>> exact;
  for (auto& page : fused) {
    std::vector<std::byte> staged(codec.staged_bytes(DType::f32));
    codec.decode(page, DType::f32, staged);
    exact.push_back(testing::bytes_to_floats(std::span<const std::byte>(staged).first(
        codec.head_count() * l.key_dim * l.value_dim * 4)));
  }
  double err_fused = 0;
  double err_unfused = 0;
  double norm = 0;
  const std::size_t K = l.key_dim;
  const std::size_t V = l.value_dim;
  std::vector<float> residual(V);
  for (std::uint32_t t = 0; t < steps; ++t) {
    for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
      StepBatch in(l, kBatch, l.num_heads, 5000 + t * l.num_layers + layer);
      std::vector<float> out_unfused(in.out.size());
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        EXPECT_TRUE(unfused_step(codec, layer, unfused[b], in, b, out_unfused));
      }
      EXPECT_TRUE(fused_step(codec, layer, ptrs, in.view()).ok());
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        for (std::uint32_t h = 0; h < l.num_heads; ++h) {
          const std::size_t item = std::size_t{b} * l.num_heads + h;
          float* s = exact[b].data() + (std::size_t{layer} * l.num_heads + h) * K * V;
          std::vector<float> o(V);
          if (l.arch == Arch::kda) {
            kda_step({s, K * V}, l.key_dim, l.value_dim, {in.q.data() + item * K, K},
                     {in.k.data() + item * K, K}, {in.v.data() + item * V, V},
                     {in.log_decay.data() + item * K, K}, in.beta[item], residual, o);
          } else {
            gdn_step({s, K * V}, l.key_dim, l.value_dim, {in.q.data() + item * K, K},
                     {in.k.data() + item * K, K}, {in.v.data() + item * V, V}, in.log_decay[item],
                     in.beta[item], residual, o);
          }
          for (std::size_t j = 0; j < V; ++j) {
            const double e = o[j];
            err_fused += std::pow(in.out[item * V + j] - e, 2);
            err_unfused += std::pow(out_unfused[item * V + j] - e, 2);
            norm += e * e;
          }
        }
      }
    }
  }
  return {std::sqrt(err_fused / norm), std::sqrt(err_unfused / norm)};
}

TEST(FusedStepDrift, ThousandStepsDriftAsTheUnfusedPath) {
  constexpr std::uint32_t kSteps = 1000;
  struct Case {
    StateLayout layout;
    double bound;  // a loose sanity bound on the drift (the equality is the assertion)
  };
  // Every lossy codec: fp32 is the recurrence itself (no drift), the others round.
  std::vector<Case> cases;
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    for (const CodecId id : {CodecId::bf16, CodecId::fp16, CodecId::int8, CodecId::int6,
                             CodecId::int4, CodecId::dsq6, CodecId::dsq4}) {
      StateLayout l = gdn_int8(1, 4, 32);
      l.arch = arch;
      l.codec.id = id;
      cases.push_back({l, id == CodecId::int4 || id == CodecId::dsq4 ? 0.5 : 0.2});
    }
    const auto plan6 = testing::make_plan(
        arch, 1, 4, 32, 32, 6,
        [](std::size_t u) { return static_cast<std::uint8_t>(u % 3 == 0 ? 8 : 6); },
        testing::random_impact(8));
    cases.push_back({testing::plan_layout(plan6, CodecId::stepquant6), 0.2});
    const auto plan4 = testing::make_plan(
        arch, 1, 4, 32, 32, 4,
        [](std::size_t u) {
          return static_cast<std::uint8_t>(u % 3 == 0 ? 6 : u % 3 == 1 ? 4 : 2);
        },
        testing::random_impact(9));
    cases.push_back({testing::plan_layout(plan4, CodecId::stepquant4), 0.5});
  }
  for (const Case& c : cases) {
    const Drift d = drift_over(c.layout, kSteps);
    const std::string name =
        std::string(to_string(c.layout.arch)) + " " + to_string(c.layout.codec.id);
    EXPECT_EQ(d.fused, d.unfused) << name;
    EXPECT_GT(d.fused, 0.0) << name << ": a lossy codec drifts";
    EXPECT_LT(d.fused, c.bound) << name;
    std::printf("drift over %u steps, %s: fused %.3e, unfused %.3e\n", kSteps, name.c_str(),
                d.fused, d.unfused);
  }
}

// The step modes (StepPolicy): the full mode is the full fit every step; the light mode
// fits a page's heads lightly except on the steps whose number is a multiple of
// full_every; its no_refit fit is the no_refit variant's encoding, bit for bit; a codec
// without a light form (int8) encodes as always; the outputs come before the encode.
TEST(FusedStep, LightStepsRunBetweenFullFitsAndCountThemselves) {
  for (const Arch arch : {Arch::gdn, Arch::kda}) {
    const auto plan = testing::make_plan(
        arch, 1, 4, 32, 32, 6,
        [](std::size_t u) { return static_cast<std::uint8_t>(u % 3 == 0 ? 8 : 6); },
        testing::random_impact(8));
    const PageCodec codec(testing::plan_layout(plan, CodecId::stepquant6));
    StateLayout plain_layout = gdn_int8(1, 4, 32);
    plain_layout.arch = arch;
    const PageCodec plain(plain_layout);
    StateLayout no_refit_layout = testing::plan_layout(plan, CodecId::stepquant6);
    no_refit_layout.codec.variant = StepQuantVariant::no_refit;
    const PageCodec no_refit(no_refit_layout);
    for (const LightFit fit : {LightFit::no_refit, LightFit::carried, LightFit::grown}) {
      auto full_pages = initial_pages(codec, 2, 300);
      auto light_pages = full_pages;
      auto plain_pages = initial_pages(plain, 2, 300);
      const auto full_ptrs = pointers(full_pages);
      const auto light_ptrs = pointers(light_pages);
      const auto plain_ptrs = pointers(plain_pages);
      for (std::uint64_t step = 0; step < 8; ++step) {
        StepBatch in(codec.layout(), 2, 4, 400 + step);
        StepBatch again = in;
        StepPolicy light;
        light.mode = StepMode::light;
        light.full_every = 4;
        light.step = step;
        light.light.fit = fit;
        // From the light pages as they are now, the no_refit variant's full step.
        auto expected = light_pages;
        StepBatch same = in;
        const StepResult e = fused_step(no_refit, 0, pointers(expected), same.view());
        const StepResult a = fused_step(codec, 0, full_ptrs, in.view());
        const StepResult b = fused_step(codec, 0, light_ptrs, again.view(), {}, light);
        ASSERT_TRUE(a.ok() && b.ok() && e.ok());
        if (fit == LightFit::no_refit && step % 4 != 0) {
          for (std::size_t r = 0; r < 2; ++r) {
            EXPECT_EQ(testing::first_difference(light_pages[r], expected[r]), -1)
                << "step " << step << " page " << r;
          }
        }
        EXPECT_EQ(a.light_heads + a.fallback_heads, 0u);
        if (step % 4 == 0) {
          EXPECT_EQ(b.light_heads + b.fallback_heads, 0u) << "step " << step;
        } else {
          EXPECT_EQ(b.light_heads + b.fallback_heads, 8u) << "step " << step;
        }
        if (step == 0) {
          EXPECT_EQ(testing::first_difference(light_pages[0], full_pages[0]), -1);
        }
        // The readout comes from the state before it is stored: the same in every mode
        // until the stored states first differ (after the first light step).
        if (step <= 1) {
          EXPECT_TRUE(same_bits(in.out, again.out)) << "step " << step;
        }
        StepBatch third(plain.layout(), 2, 4, 400 + step);
        const StepResult c = fused_step(plain, 0, plain_ptrs, third.view(), {}, light);
        EXPECT_EQ(c.light_heads + c.fallback_heads, 0u);
      }
    }
  }
}

// Per-request step numbers (StepPolicy::steps): each request of one call is light or full
// by its own number, its bytes those of a call that numbers it alone; a list of the
// wrong length is refused before anything is written. measured_step_policy is light
// only for stepquant6 of variant full.
TEST(FusedStep, EachRequestIsLightOrFullByItsOwnStepNumber) {
  const auto plan = testing::make_plan(
      Arch::gdn, 1, 4, 32, 32, 6,
      [](std::size_t u) { return static_cast<std::uint8_t>(u % 3 == 0 ? 8 : 6); },
      testing::random_impact(18));
  const PageCodec codec(testing::plan_layout(plan, CodecId::stepquant6));
  StepPolicy policy = measured_step_policy(codec.layout().codec);
  ASSERT_EQ(policy.mode, StepMode::light);
  ASSERT_EQ(policy.full_every, 16u);
  ASSERT_EQ(policy.light.fit, LightFit::no_refit);

  auto pages = initial_pages(codec, 3, 500);
  const auto before = pages;
  const std::uint64_t numbers[] = {16, 3, 33};  // full, light, light
  policy.steps = numbers;
  StepBatch in(codec.layout(), 3, 4, 510);
  StepBatch copy = in;
  const StepResult r = fused_step(codec, 0, pointers(pages), in.view(), {}, policy);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.light_heads, 8u);
  for (std::uint32_t b = 0; b < 3; ++b) {
    std::vector<std::byte> alone = before[b];
    std::byte* page = alone.data();
    StepBatch one(codec.layout(), 1, 4, 0);
    const std::size_t q = codec.layout().num_heads * codec.layout().key_dim;
    const std::size_t v = codec.layout().num_heads * codec.layout().value_dim;
    const std::size_t h = codec.layout().num_heads;
    std::copy_n(copy.q.begin() + b * q, q, one.q.begin());
    std::copy_n(copy.k.begin() + b * q, q, one.k.begin());
    std::copy_n(copy.v.begin() + b * v, v, one.v.begin());
    std::copy_n(copy.log_decay.begin() + b * h, h, one.log_decay.begin());
    std::copy_n(copy.beta.begin() + b * h, h, one.beta.begin());
    StepPolicy single = policy;
    single.steps = {};
    single.step = numbers[b];
    ASSERT_TRUE(fused_step(codec, 0, {&page, 1}, one.view(), {}, single).ok());
    EXPECT_EQ(testing::first_difference(alone, pages[b]), -1) << "request " << b;
  }

  const std::uint64_t two[] = {1, 2};
  policy.steps = two;
  auto untouched = pages;
  StepBatch bad(codec.layout(), 3, 4, 520);
  try {
    (void)fused_step(codec, 0, pointers(untouched), bad.view(), {}, policy);
    ADD_FAILURE() << "two step numbers for three requests were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("policy.steps"), std::string::npos) << e.what();
  }
  for (std::uint32_t b = 0; b < 3; ++b) EXPECT_EQ(untouched[b], pages[b]);

  CodecSpec other;
  for (const CodecId id : {CodecId::fp32, CodecId::int8, CodecId::stepquant4, CodecId::dsq6}) {
    other.id = id;
    EXPECT_EQ(measured_step_policy(other).mode, StepMode::full) << to_string(id);
  }
  other.id = CodecId::stepquant6;
  other.variant = StepQuantVariant::no_refit;
  EXPECT_EQ(measured_step_policy(other).mode, StepMode::full);
}

}  // namespace
}  // namespace statepool::kernels
