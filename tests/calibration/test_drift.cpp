// The key experiment of STEPQuant (STEPQUANT.md, "The recurrence"): the state is
// re-quantized after every step, so quantization errors feed back; slow-decaying heads
// keep theirs for thousands of steps. A plan that gives those heads more bits (and the
// fast ones fewer) must drift less from the FP32 run than uniform 6-bit at the same or a
// larger page size.
//
// Setup: one GDN layer, heads with mean log-decay -0.0005 (errors live ~1000 steps) and
// -0.5 (forgotten within a few), synthetic inputs (testing/synthetic_trace.hpp's SyntheticSource).
// A stepquant6 plan is calibrated on one token stream (2048 tokens, FP32, no quantization
// in the loop); the drift is measured on another (4096 tokens): the FP32 recurrence, and
// the same recurrence with the whole state encoded and decoded through a PageCodec after
// every step (stepquant6 + plan; int6 with the group size whose page is at least as large;
// int6 with the default group of 128). Reported: relative L2 error of all outputs o_t
// against the FP32 run (and per decay class), and of the final state.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "statepool/calibration/accumulator.hpp"
#include "statepool/calibration/plan_builder.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/trace.hpp"

namespace statepool::calibration {
namespace {

namespace kn = kernels;
namespace sq = kernels::stepquant;
using kernels::gdn_step;
using kernels::kda_step;
using kernels::normalize_qk;
using synthetic::SyntheticOptions;
using synthetic::SyntheticSource;

constexpr std::uint32_t kHeads = 8;  // 4 long-lived, 4 short-lived
constexpr std::uint32_t kDim = 64;   // K = V
constexpr std::uint64_t kCalibrationTokens = 2048;
constexpr std::uint64_t kEvalTokens = 4096;
constexpr float kSlow = -0.0005f;
constexpr float kFast = -0.5f;

SyntheticOptions options(std::uint64_t tokens, std::uint64_t token_seed) {
  SyntheticOptions o;
  o.arch = kn::Arch::gdn;
  o.layers = 1;
  o.heads = kHeads;
  o.key_dim = kDim;
  o.value_dim = kDim;
  o.tokens = tokens;
  o.token_seed = token_seed;
  o.model_seed = 2024;
  for (std::uint32_t h = 0; h < kHeads; ++h) {
    o.head_log_decay.push_back(h % 2 == 0 ? kSlow : kFast);
  }
  return o;
}

bool slow_head(std::uint32_t h) {
  return h % 2 == 0;
}

std::shared_ptr<const sq::Plan> calibrate_plan(const sq::Plan** out_report_plan, Report* report,
                                               std::uint32_t budget = 6) {
  SyntheticSource source(options(kCalibrationTokens, 11));
  TokenBlock block;
  source.generate(0, kCalibrationTokens, block);
  LayerAccumulator accumulator(kn::Arch::gdn, 0, kHeads, kDim, kDim, AccumulatorOptions{});
  std::vector<float> state(std::size_t{kHeads} * kDim * kDim, 0.0f);
  std::vector<float> residual(kDim);
  for (std::uint64_t t = 0; t < block.count; ++t) {
    for (std::uint32_t h = 0; h < kHeads; ++h) {
      const std::size_t i = t * kHeads + h;
      const std::span<float> s(state.data() + std::size_t{h} * kDim * kDim, kDim * kDim);
      const std::span<const float> q(block.q.data() + i * kDim, kDim);
      const std::span<const float> k(block.k.data() + i * kDim, kDim);
      gdn_step(s, kDim, kDim, q, k, {block.v.data() + i * kDim, kDim}, block.g[i], block.beta[i],
               residual, {});
      accumulator.add(h, q, k, {&block.g[i], 1}, block.beta[i], s);
    }
  }
  PlanOptions plan_options;
  plan_options.budget_bits = budget;
  plan_options.pivots = 0;  // the nominal budget exactly
  const LayerCosts costs = measure_layer(accumulator, plan_options);
  PlanResult result =
      build_plan(PlanShape{kn::Arch::gdn, 1, kHeads, kDim, kDim},
                 std::span<const LayerCosts>(&costs, 1), plan_options, kCalibrationTokens);
  *report = result.report;
  auto plan = std::make_shared<const sq::Plan>(std::move(result.plan));
  *out_report_plan = plan.get();
  return plan;
}

struct Drift {
  std::string name;
  std::size_t page_bytes = 0;
  double output_error = 0.0;       // all heads
  double output_error_slow = 0.0;  // long-lived heads
  double output_error_fast = 0.0;  // short-lived heads
  double state_error = 0.0;        // final state
  double light_share = -1.0;       // fused steps: head steps that had a light fit; else < 0
};

// Runs the evaluation stream; codec == nullptr is the FP32 reference. Returns outputs
// [token][head][V] and the final state.
void run(const kn::PageCodec* codec, std::vector<float>& outputs, std::vector<float>& state) {
  SyntheticSource source(options(kEvalTokens, 12));
  TokenBlock block;
  source.generate(0, kEvalTokens, block);
  state.assign(std::size_t{kHeads} * kDim * kDim, 0.0f);
  outputs.assign(kEvalTokens * kHeads * kDim, 0.0f);
  std::vector<float> residual(kDim);
  std::vector<std::byte> page(codec ? codec->page_bytes() : 0);
  for (std::uint64_t t = 0; t < kEvalTokens; ++t) {
    for (std::uint32_t h = 0; h < kHeads; ++h) {
      const std::size_t i = t * kHeads + h;
      gdn_step({state.data() + std::size_t{h} * kDim * kDim, kDim * kDim}, kDim, kDim,
               {block.q.data() + i * kDim, kDim}, {block.k.data() + i * kDim, kDim},
               {block.v.data() + i * kDim, kDim}, block.g[i], block.beta[i], residual,
               {outputs.data() + i * kDim, kDim});
    }
    if (codec != nullptr) {  // the stored state is what gets quantized, every step
      codec->encode(std::as_bytes(std::span<const float>(state)), kn::DType::f32, page);
      codec->decode(page, kn::DType::f32, std::as_writable_bytes(std::span<float>(state)));
    }
  }
}

// The evaluation stream through the fused step (decode, step, encode in one call per
// token, as a serving engine runs it) with `policy`: the step mode.
// Returns the share of head steps that had a light fit.
double run_stepped(const kn::PageCodec& codec, const kn::StepPolicy& policy,
                   std::vector<float>& outputs, std::vector<float>& state) {
  SyntheticSource source(options(kEvalTokens, 12));
  TokenBlock block;
  source.generate(0, kEvalTokens, block);
  outputs.assign(kEvalTokens * kHeads * kDim, 0.0f);
  std::vector<std::byte> page(codec.page_bytes());
  state.assign(std::size_t{kHeads} * kDim * kDim, 0.0f);
  codec.encode(std::as_bytes(std::span<const float>(state)), kn::DType::f32, page);
  std::byte* pages[] = {page.data()};
  const std::size_t hk = std::size_t{kHeads} * kDim;
  std::uint64_t light = 0;
  for (std::uint64_t t = 0; t < kEvalTokens; ++t) {
    kn::StepInputs in;
    in.batch = 1;
    in.q = {block.q.data() + t * hk, hk};
    in.k = {block.k.data() + t * hk, hk};
    in.v = {block.v.data() + t * hk, hk};
    in.log_decay = {block.g.data() + t * kHeads, kHeads};
    in.beta = {block.beta.data() + t * kHeads, kHeads};
    in.out = {outputs.data() + t * hk, hk};
    kn::StepPolicy at = policy;
    at.step = t;
    const kn::StepResult r = kn::fused_step(codec, 0, pages, in, {}, at);
    if (!r.ok()) throw std::runtime_error("the fused step rejected a head at token " +
                                          std::to_string(t));
    light += r.light_heads;
  }
  codec.decode(page, kn::DType::f32, std::as_writable_bytes(std::span<float>(state)));
  return static_cast<double>(light) / static_cast<double>(kEvalTokens * kHeads);
}

Drift compare(const std::string& name, std::size_t page_bytes, const std::vector<float>& out,
              const std::vector<float>& state, const std::vector<float>& ref_out,
              const std::vector<float>& ref_state) {
  Drift d;
  d.name = name;
  d.page_bytes = page_bytes;
  double err[2] = {0, 0};
  double ref[2] = {0, 0};
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto head = static_cast<std::uint32_t>((i / kDim) % kHeads);
    const int cls = slow_head(head) ? 0 : 1;
    const double e = static_cast<double>(out[i]) - ref_out[i];
    err[cls] += e * e;
    ref[cls] += static_cast<double>(ref_out[i]) * ref_out[i];
  }
  d.output_error = std::sqrt((err[0] + err[1]) / (ref[0] + ref[1]));
  d.output_error_slow = std::sqrt(err[0] / ref[0]);
  d.output_error_fast = std::sqrt(err[1] / ref[1]);
  double se = 0.0;
  double sr = 0.0;
  for (std::size_t i = 0; i < state.size(); ++i) {
    const double e = static_cast<double>(state[i]) - ref_state[i];
    se += e * e;
    sr += static_cast<double>(ref_state[i]) * ref_state[i];
  }
  d.state_error = std::sqrt(se / sr);
  return d;
}

Drift measure(const std::string& name, const kn::PageCodec* codec,
              const std::vector<float>& ref_out, const std::vector<float>& ref_state) {
  std::vector<float> out;
  std::vector<float> state;
  run(codec, out, state);
  return compare(name, codec ? codec->page_bytes() : 0, out, state, ref_out, ref_state);
}

Drift measure_stepped(const std::string& name, const kn::PageCodec& codec,
                      const kn::StepPolicy& policy, const std::vector<float>& ref_out,
                      const std::vector<float>& ref_state) {
  std::vector<float> out;
  std::vector<float> state;
  const double light_share = run_stepped(codec, policy, out, state);
  Drift d = compare(name, codec.page_bytes(), out, state, ref_out, ref_state);
  d.light_share = light_share;
  return d;
}

std::string describe(const Drift& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%-29s page %6zu B: output drift %.4e (slow heads %.4e, fast %.4e), final state "
                "%.4e",
                d.name.c_str(), d.page_bytes, d.output_error, d.output_error_slow,
                d.output_error_fast, d.state_error);
  std::string text = buf;
  if (d.light_share >= 0.0) {
    std::snprintf(buf, sizeof buf, ", light %5.1f%%", 100.0 * d.light_share);
    text += buf;
  }
  return text;
}

/// The plan's head widths, "8s 4f ...": s for a slow head, f for a fast one.
std::string describe_widths(const sq::Plan& plan) {
  std::string widths;
  for (std::uint32_t h = 0; h < kHeads; ++h) {
    widths += (h ? " " : "") + std::to_string(plan.width(0, h)) + (slow_head(h) ? "s" : "f");
  }
  return widths;
}

kn::StateLayout layout(kn::CodecId id, std::uint32_t group, std::shared_ptr<const sq::Plan> plan,
                       kn::StepQuantVariant variant = kn::StepQuantVariant::full) {
  kn::StateLayout l;
  l.name = "drift";
  l.arch = kn::Arch::gdn;
  l.num_layers = 1;
  l.num_heads = kHeads;
  l.key_dim = kDim;
  l.value_dim = kDim;
  l.codec.id = id;
  l.codec.group_size = group;
  l.codec.variant = variant;
  l.plan = std::move(plan);
  return l;
}

TEST(Drift, StepQuant6DriftsLessThanInt6OverALongRecurrence) {
  const sq::Plan* plan_view = nullptr;
  Report report;
  const std::shared_ptr<const sq::Plan> plan = calibrate_plan(&plan_view, &report);
  const std::string widths = describe_widths(*plan);
  // The point of the method: long-lived heads get the bits.
  for (std::uint32_t h = 0; h < kHeads; ++h) {
    for (std::uint32_t o = 0; o < kHeads; ++o) {
      if (slow_head(h) && !slow_head(o)) {
        EXPECT_GT(plan->width(0, h), plan->width(0, o))
            << "widths (s = slow, f = fast): " << widths;
      }
    }
  }

  const kn::PageCodec sq6(layout(kn::CodecId::stepquant6, 0, plan));
  // int6 at the same or a larger page: the largest group size (most values per scale)
  // whose page is still at least as large as the stepquant6 page.
  std::uint32_t matched_group = 0;
  for (const std::uint32_t group : {128u, 64u, 32u, 16u, 8u}) {
    if (kn::PageCodec(layout(kn::CodecId::int6, group, nullptr)).page_bytes() >= sq6.page_bytes()) {
      matched_group = group;
      break;
    }
  }
  ASSERT_NE(matched_group, 0u);
  const kn::PageCodec int6_matched(layout(kn::CodecId::int6, matched_group, nullptr));
  const kn::PageCodec int6_default(layout(kn::CodecId::int6, 0, nullptr));

  std::vector<float> ref_out;
  std::vector<float> ref_state;
  run(nullptr, ref_out, ref_state);
  const Drift step = measure("stepquant6 + plan", &sq6, ref_out, ref_state);
  const Drift matched =
      measure("int6 group " + std::to_string(matched_group), &int6_matched, ref_out, ref_state);
  const Drift plain = measure("int6 group 128", &int6_default, ref_out, ref_state);
  // The paper's ablation, for the record (not asserted): each axis alone.
  const kn::PageCodec spatial(
      layout(kn::CodecId::stepquant6, 0, plan, kn::StepQuantVariant::spatial_only));
  const kn::PageCodec temporal(
      layout(kn::CodecId::stepquant6, 0, plan, kn::StepQuantVariant::temporal_only));
  const Drift spatial_only = measure("stepquant6 spatial", &spatial, ref_out, ref_state);
  const Drift temporal_only = measure("stepquant6 temporal", &temporal, ref_out, ref_state);
  const std::string table = "plan widths (s = slow, f = fast): " + widths + "\n" + describe(step) +
                            "\n" + describe(matched) + "\n" + describe(plain) + "\n" +
                            describe(spatial_only) + "\n" + describe(temporal_only);
  std::printf("%s\n", table.c_str());
  RecordProperty("drift", table);

  EXPECT_GE(int6_matched.page_bytes(), sq6.page_bytes());
  EXPECT_LT(step.output_error, matched.output_error) << table;
  EXPECT_LT(step.state_error, matched.state_error) << table;
  EXPECT_LT(step.output_error, plain.output_error) << table;
  EXPECT_LT(step.state_error, plain.state_error) << table;
}

// The paper's stronger claim: a 4-bit budget beats uniform 6-bit, because the allocation
// moves bits from the heads that forget fast (2 bits) to the long-lived ones. Here, where
// half of the heads keep an error for ~2000 steps, it holds with a page 0.73x the size.
// (On the small trained models of eval/ it does not hold on every measure, not even on
// those with long-lived heads: there the fast heads' 2-bit error, read at the very next
// token, costs the output more than int6's accumulation; eval/README.md.)
TEST(Drift, StepQuant4DriftsLessThanInt6WhereHeadsLiveLong) {
  const sq::Plan* plan_view = nullptr;
  Report report;
  const std::shared_ptr<const sq::Plan> plan = calibrate_plan(&plan_view, &report, 4);
  const std::string widths = describe_widths(*plan);
  const kn::PageCodec sq4(layout(kn::CodecId::stepquant4, 0, plan));
  const kn::PageCodec int6(layout(kn::CodecId::int6, 0, nullptr));
  const kn::PageCodec int4(layout(kn::CodecId::int4, 0, nullptr));
  std::vector<float> ref_out;
  std::vector<float> ref_state;
  run(nullptr, ref_out, ref_state);
  const Drift step = measure("stepquant4 + plan", &sq4, ref_out, ref_state);
  const Drift six = measure("int6 group 128", &int6, ref_out, ref_state);
  const Drift four = measure("int4 group 128", &int4, ref_out, ref_state);
  const std::string table = "plan widths (s = slow, f = fast): " + widths + "\n" + describe(step) +
                            "\n" + describe(six) + "\n" + describe(four);
  std::printf("%s\n", table.c_str());
  RecordProperty("drift", table);

  EXPECT_LT(sq4.page_bytes(), int6.page_bytes());
  EXPECT_LT(step.output_error, six.output_error) << table;
  EXPECT_LT(step.state_error, six.state_error) << table;
  EXPECT_LT(step.output_error, four.output_error) << table;
  EXPECT_LT(step.state_error, four.state_error) << table;
}

// The step modes (issue 47, docs/codecs.md "Step modes"): the fused step with the full
// fit every step against the light fits, over the same 4096 tokens, at 6 and 4 bits, for
// full-fit periods N = 2, 4, 16, 64 and never: the fit without the refit, the carried
// column scales with absmax or row-impact row scales (and the latter with the clamp
// trigger of 5%), and the grown column scales, each with the share of head steps that had
// a light fit (the rest fell back or were full-fit steps). The chosen setting (stepquant6,
// the fit without the refit between full fits every 16 steps) must drift at most 1.5x as
// much as the full fit; the others are printed.
TEST(Drift, StepModesOverALongRecurrence) {
  std::vector<float> ref_out;
  std::vector<float> ref_state;
  run(nullptr, ref_out, ref_state);
  std::string table;
  for (const std::uint32_t budget : {6u, 4u}) {
    const sq::Plan* plan_view = nullptr;
    Report report;
    const std::shared_ptr<const sq::Plan> plan = calibrate_plan(&plan_view, &report, budget);
    const kn::CodecId id = budget == 6 ? kn::CodecId::stepquant6 : kn::CodecId::stepquant4;
    const kn::PageCodec codec(layout(id, 0, plan));
    const std::string name(kn::to_string(id));
    const Drift full = measure_stepped(name + " full", codec, {}, ref_out, ref_state);
    table += describe(full) + "\n";
    struct Variant {
      const char* label;
      kn::LightOptions light;
    };
    const auto carried = [](sq::RowRule rule, float clamp_fraction) {
      return kn::LightOptions{kn::LightFit::carried, rule, clamp_fraction};
    };
    const Variant variants[] = {
        {"norefit", {kn::LightFit::no_refit, sq::RowRule::absmax, 1.0f}},
        {"absmax", carried(sq::RowRule::absmax, 1.0f)},
        {"impact", carried(sq::RowRule::impact, 1.0f)},
        {"impact+clamp", carried(sq::RowRule::impact, 0.05f)},
        {"grown", {kn::LightFit::grown, sq::RowRule::absmax, 1.0f}},
    };
    for (const std::uint32_t n : {2u, 4u, 16u, 64u, 0u}) {
      for (const Variant& v : variants) {
        const std::string label = v.label;
        const kn::LightFit fit = v.light.fit;
        kn::StepPolicy policy;
        policy.mode = kn::StepMode::light;
        policy.full_every = n;
        policy.light = v.light;
        const Drift d = measure_stepped(
            name + " N=" + (n == 0 ? std::string("inf") : std::to_string(n)) + " " + label,
            codec, policy, ref_out, ref_state);
        char ratio[64];
        std::snprintf(ratio, sizeof ratio, "  (x%.2f output, x%.2f state)",
                      d.output_error / full.output_error, d.state_error / full.state_error);
        table += describe(d) + ratio + "\n";
        if (budget == 6 && n == 16 && fit == kn::LightFit::no_refit) {
          EXPECT_LE(d.output_error, 1.5 * full.output_error) << describe(d);
          EXPECT_LE(d.state_error, 1.5 * full.state_error) << describe(d);
          EXPECT_GT(d.output_error, 0.0);
          EXPECT_DOUBLE_EQ(d.light_share, 15.0 / 16.0);  // steps 0, 16, 32, ... full
        }
      }
    }
  }
  std::printf("%s", table.c_str());
  RecordProperty("step_modes", table);
}

}  // namespace
}  // namespace statepool::calibration
