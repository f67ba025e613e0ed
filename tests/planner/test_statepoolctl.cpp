// statepoolctl's offline side: plan, and what plan and fits check before any daemon is
// asked (the model config, the plan inputs, options a command does not take). No daemon:
// the commands that need one are pointed at a socket that does not exist, so reaching it
// would be a connection error, not the message under test.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <string>

#include "statepool/testing/temp_dir.hpp"
#include "statepoolctl_run.hpp"

namespace statepool {
namespace {

using statepool::testing::model_path;
using statepool::testing::statepoolctl;
using statepool::testing::ToolRun;

constexpr const char* kNoDaemon = "--socket /nonexistent/statepool.sock";

/// One line on stderr, the given exit status, no usage.
void expect_one_line(const ToolRun& run, int code, const std::string& line) {
  EXPECT_EQ(run.code, code) << run.output;
  EXPECT_EQ(run.output, "statepoolctl: " + line + "\n");
}

/// The usage error of the shared prologue: the message, a blank line, the usage, exit 2.
void expect_usage(const ToolRun& run, const std::string& message) {
  EXPECT_EQ(run.code, 2) << run.output;
  EXPECT_EQ(run.output.rfind("statepoolctl: " + message + "\n\nusage: statepoolctl", 0), 0u)
      << run.output;
}

class StatepoolctlPlan : public ::testing::Test {
 protected:
  /// A copy of docs/models/`file` with `from` replaced by `to`.
  std::string edited(const std::string& file, const std::string& from, const std::string& to) {
    std::string text = statepool::testing::model_text(file);
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    const std::string path = dir_.file("edited-" + std::to_string(++edits_) + ".json");
    testing::write_bytes(path, text);
    return path;
  }
  testing::TempDir dir_;
  int edits_ = 0;
};

// Regression: out-of-range config values exited 2 with the whole usage, naming the
// planner's internal layout fields ("invalid layout: num_heads must be ...").
TEST_F(StatepoolctlPlan, AnOutOfRangeConfigValueIsOneLineNamingTheKey) {
  const std::string heads = edited("qwen3.5-27b.json", "\"linear_num_value_heads\": 48",
                                   "\"linear_num_value_heads\": 1000000000");
  expect_one_line(statepoolctl("plan --model " + heads), 1,
                  heads +
                      ": text_config.linear_num_value_heads must be between 1 and 1024, got "
                      "1000000000");
  const std::string layers = edited("qwen3-next-80b-a3b-instruct.json", "\"num_hidden_layers\": 48",
                                    "\"num_hidden_layers\": 1000000");
  expect_one_line(statepoolctl("plan --model " + layers), 1,
                  layers + ": num_hidden_layers must be between 1 and 1024, got 1000000");
  // fits reads the model before asking a daemon: the same line, no connection error.
  expect_one_line(statepoolctl(std::string(kNoDaemon) + " fits --model " + layers), 1,
                  layers + ": num_hidden_layers must be between 1 and 1024, got 1000000");
}

// Regression: linear_conv_kernel_dim 1 failed the layout's invariant (conv_width 0 with
// conv channels). A kernel of 1 keeps no history: there is no conv state.
TEST_F(StatepoolctlPlan, ConvKernelOneIsPlannedWithoutConvState) {
  const std::string one =
      edited("qwen3.5-27b.json", "\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 1");
  const ToolRun run = statepoolctl("plan --model " + one);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("48 layers x 48 heads x 128 x 128, no conv state (conv kernel 1)"),
            std::string::npos)
      << run.output;
  const ToolRun json = statepoolctl("plan --json --state-codec fp32 --model " + one);
  ASSERT_EQ(json.code, 0) << json.output;
  const auto v = boost::json::parse(json.output);
  EXPECT_EQ(v.at("model").at("conv_kernel").as_int64(), 1);
  EXPECT_EQ(v.at("codecs").at(0).at("page_bytes").as_int64(), 48ll * 48 * 128 * 128 * 4);
  const std::string zero =
      edited("qwen3.5-27b.json", "\"linear_conv_kernel_dim\": 4", "\"linear_conv_kernel_dim\": 0");
  expect_one_line(statepoolctl("plan --model " + zero), 1,
                  zero + ": text_config.linear_conv_kernel_dim must be between 1 and 65, got 0");
}

// Regression: --weights-bits 5 said "must be 16, 8 or 4", 32 "must be a whole number
// between 4 and 16".
TEST_F(StatepoolctlPlan, WeightsBitsHasOneMessage) {
  const std::string model = " --model " + model_path("qwen3.5-27b.json");
  expect_usage(statepoolctl("plan --weights-bits 5" + model),
               "--weights-bits must be 16, 8 or 4, got 5");
  expect_usage(statepoolctl("plan --weights-bits 32" + model),
               "--weights-bits must be 16, 8 or 4, got 32");
  expect_usage(statepoolctl("plan --weights-bits=-4" + model),
               "--weights-bits must be 16, 8 or 4, got '-4'");
  EXPECT_EQ(statepoolctl("plan --weights-bits 4" + model).code, 0);
}

// Regression: --state-codec fp32,fp32,int6 printed two fp32 rows.
TEST_F(StatepoolctlPlan, ARepeatedStateCodecIsOneRow) {
  const ToolRun run = statepoolctl("plan --json --state-codec int6,fp32,int6,fp32 --model " +
                                   model_path("qwen3.5-27b.json"));
  ASSERT_EQ(run.code, 0) << run.output;
  const boost::json::value v = boost::json::parse(run.output);
  const auto& rows = v.at("codecs").as_array();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("codec").as_string(), "int6");
  EXPECT_EQ(rows[1].at("codec").as_string(), "fp32");
  expect_usage(
      statepoolctl("plan --state-codec fp32,,int6 --model " + model_path("qwen3.5-27b.json")),
      "--state-codec: empty codec name in 'fp32,,int6' (all or a comma-separated list "
      "of fp32, bf16, fp16, int8, int6, int4, stepquant6, stepquant4, dsq6, dsq4)");
}

// Regression: a directory given as --model was "not valid JSON (incomplete JSON)".
TEST_F(StatepoolctlPlan, FileProblemsAreSaidAsSuch) {
  expect_one_line(statepoolctl("plan --model " + dir_.path()), 1,
                  dir_.path() + ": is a directory");
  expect_one_line(statepoolctl("plan --model " + dir_.file("missing.json")), 1,
                  dir_.file("missing.json") + ": cannot open: No such file or directory");
  expect_one_line(statepoolctl(std::string(kNoDaemon) + " fits --model " + dir_.path()), 1,
                  dir_.path() + ": is a directory");
  // install-plan reads its file before connecting, too.
  expect_one_line(statepoolctl(std::string(kNoDaemon) + " install-plan " + dir_.path()), 1,
                  "cannot read plan file " + dir_.path() + ": Is a directory");
}

// A plan input the model cannot take is the operator's choice, not the config's: exit 2,
// but in one line (the command line itself is well formed).
TEST_F(StatepoolctlPlan, AnInputTheModelCannotTakeIsOneLine) {
  expect_one_line(statepoolctl("plan --tp 3 --model " + model_path("qwen3.5-27b.json")), 2,
                  "plan: tp 3 does not divide the linear heads (16 key / 48 value)");
}

// Empty strings, and options the command never reads, were taken silently (an empty
// --tenant meant the default tenant; fits ignored --context).
TEST_F(StatepoolctlPlan, EmptyAndInapplicableOptionsAreUsageErrors) {
  const std::string model = " --model " + model_path("qwen3.5-27b.json");
  expect_usage(statepoolctl("ping --socket ''"),
               "--socket must not be empty (leave it out for $STATEPOOL_SOCKET or the default)");
  expect_usage(statepoolctl("ping --tenant ''"),
               "--tenant must not be empty (leave it out for the daemon's default tenant)");
  expect_usage(statepoolctl("plan --model ''"), "--model must not be empty");
  expect_usage(statepoolctl("install-plan ''"), "install-plan: the plan file name is empty");
  expect_usage(statepoolctl("ping --tp 2"), "--tp applies to plan and fits only");
  expect_usage(statepoolctl("stats" + model), "--model applies to plan and fits only");
  expect_usage(statepoolctl("stats --count 3"), "--count applies to ping only");
  expect_usage(statepoolctl("fits --context 4096" + model),
               "--context does not apply to fits (it takes --model, --tp, --slots and "
               "--state-codec)");
  expect_usage(statepoolctl("plan --slots 0" + model), "--slots must be between 1 and 1024, got 0");
  expect_usage(statepoolctl("plan --concurrency=-1" + model),
               "--concurrency must be between 0 and 1048576, got '-1'");
}

}  // namespace
}  // namespace statepool
