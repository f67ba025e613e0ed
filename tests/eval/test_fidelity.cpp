// The short version of eval/run on the committed models: a trace of the FP32-state model
// reading the calibration text (Proverbs), plans calibrated from it with the library that
// `statepool-quant calibrate` runs, and the evaluation on the held-out text (John) for a
// few hundred tokens. It asserts what the method claims: at the same order of page bytes,
// stepquant6 stays closer to FP32 than int6 and stepquant4 closer than int4 (closer =
// lower mean state error and lower output error, statepool::eval::closer).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "statepool/calibration/calibrate.hpp"
#include "statepool/calibration/trace.hpp"
#include "statepool/eval/fidelity.hpp"
#include "statepool/eval/report.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace ev = statepool::eval;
namespace cal = statepool::calibration;
namespace kn = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
using statepool::testing::read_bytes;
using statepool::testing::TempDir;

namespace {

const std::string kEval = STATEPOOL_EVAL_DIR;

std::vector<std::uint8_t> text(const std::string& name) {
  const std::string bytes = read_bytes(kEval + "/" + name);
  return {bytes.begin(), bytes.end()};
}

class Fidelity : public ::testing::TestWithParam<std::string> {};

TEST_P(Fidelity, ShortRunSupportsTheClaims) {
  const auto model = ev::Model::load(kEval + "/models/" + GetParam());
  TempDir dir;
  const std::string trace_dir = dir.file("trace");
  ev::record_trace(model, text(model->calibration_text()), 4, 512, trace_dir, "test_eval_fidelity");
  const cal::TraceReader trace(trace_dir);
  ASSERT_EQ(trace.manifest().tokens, 2048u);

  std::vector<ev::CodecCase> cases{{"fp32", {kn::CodecId::fp32}, nullptr, {}},
                                   {"int6", {kn::CodecId::int6}, nullptr, {}},
                                   {"int4", {kn::CodecId::int4}, nullptr, {}}};
  for (std::uint32_t bits : {6u, 4u}) {
    cal::CalibrateOptions options;
    options.plan.budget_bits = bits;
    options.threads = 2;
    auto plan = std::make_shared<const sq::Plan>(cal::calibrate_trace(trace, options).plan);
    cases.push_back({"stepquant" + std::to_string(bits),
                     {bits == 6 ? kn::CodecId::stepquant6 : kn::CodecId::stepquant4},
                     std::move(plan), {}});
  }
  ev::FidelityOptions options;
  options.tokens = 384;
  options.prompt = 32;
  options.generate = 128;
  options.threads = 2;
  const ev::Report report{GetParam(), model, options,
                          ev::evaluate(model, text(model->heldout_text()), cases, options)};
  std::cout << ev::results_table(report);

  const ev::CodecResult& fp32 = *report.find("fp32");
  EXPECT_EQ(fp32.mean_state_error(1, options.tokens), 0.0);
  EXPECT_EQ(fp32.agreement, 1.0);
  EXPECT_FALSE(fp32.divergence.has_value());
  for (const ev::CodecResult& r : report.results) EXPECT_EQ(r.rejected_heads, 0u) << r.name;

  EXPECT_TRUE(ev::closer(*report.find("stepquant6"), *report.find("int6")))
      << "stepquant6 is not closer to FP32 than int6 on " << GetParam();
  EXPECT_TRUE(ev::closer(*report.find("stepquant4"), *report.find("int4")))
      << "stepquant4 is not closer to FP32 than int4 on " << GetParam();
  // Same order of bytes: the comparison is at (nearly) the same page size.
  const double ratio6 = static_cast<double>(report.find("stepquant6")->page_bytes) /
                        static_cast<double>(report.find("int6")->page_bytes);
  EXPECT_GT(ratio6, 0.9);
  EXPECT_LT(ratio6, 1.15);
}

INSTANTIATE_TEST_SUITE_P(Models, Fidelity,
                         ::testing::Values("gdn", "kda", "gdn-long", "kda-long", "gdn-fast",
                                           "gdn-fortunes"));

}  // namespace
