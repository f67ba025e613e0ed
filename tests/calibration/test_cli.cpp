// statepool-quant end to end (the binary, path baked in at build time): the happy paths
// and every error path exits non-zero with a clear message and writes nothing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "statepool/calibration/npy.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/daemon.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::calibration {
namespace {

using testing::TempDir;

struct Result {
  int status = -1;
  std::string out;
  std::string err;
};

Result run(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), STATEPOOL_QUANT_PATH);
  const testing::Exit e = testing::run_program(args, dir.path());
  if (e.code < 0) ADD_FAILURE() << "cannot run " << STATEPOOL_QUANT_PATH;
  return {e.code, e.stdout_text, e.stderr_text};
}

#define EXPECT_FAILS_WITH(result, code, text)                                \
  do {                                                                       \
    const Result& r_ = (result);                                             \
    EXPECT_EQ(r_.status, code) << r_.err;                                    \
    EXPECT_NE(r_.err.find(text), std::string::npos) << "stderr: " << r_.err; \
  } while (0)

TEST(Cli, HelpAndUsageErrors) {
  TempDir dir;
  const Result help = run(dir, {"--help"});
  EXPECT_EQ(help.status, 0);
  for (const char* word : {"calibrate", "synth-trace", "codec", "SYNTHETIC"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(run(dir, {"help", "codec"}).status, 0);
  EXPECT_NE(run(dir, {"calibrate", "--help"}).out.find("--budget"), std::string::npos);
  EXPECT_FAILS_WITH(run(dir, {}), 2, "no command given");
  EXPECT_FAILS_WITH(run(dir, {"help", "frobnicate"}), 2, "unknown command 'frobnicate'");
  EXPECT_FAILS_WITH(run(dir, {"frobnicate"}), 2, "unknown command 'frobnicate'");
  // program_options' own messages name the option (the tools share one prologue).
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--out", dir.file("p")}), 2,
                    "the option '--trace' is required but missing");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--budget", "5"}), 2,
                    "--budget must be 6 or 4");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--colour", "red"}), 2,
                    "unrecognised option '--colour'");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--trace", "y", "--out", "p"}), 2,
                    "option '--trace' cannot be specified more than once");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--threads", "-1"}), 2,
                    "--threads expects a number, got '-1'");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--reservoir=0"}), 2,
                    "--reservoir must be between 1 and 4294967295, got 0");
  // A usage error prints the message, a blank line and the command's usage.
  EXPECT_NE(
      run(dir, {"calibrate", "--trace", "x"}).err.find("\n\nusage: statepool-quant calibrate"),
      std::string::npos);
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--gamma", "abc"}), 2,
                    "--gamma must be a number");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", "x", "--out", "p", "--cost", "mse"}), 2,
                    "--cost must be output, relative or absolute, got 'mse'");
  EXPECT_FAILS_WITH(run(dir, {"synth-trace", "--out", dir.file("t"), "--arch", "mamba"}), 2,
                    "--arch must be gdn or kda");
  EXPECT_FAILS_WITH(run(dir, {"codec", "squash", "--in", "a", "--out", "b"}), 2,
                    "unknown codec mode 'squash'");
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "int5", "--in", "a", "--out", "b"}),
                    2, "unknown codec 'int5'");
}

TEST(Cli, CalibrateRefusesBadTracesAndWritesNothing) {
  TempDir dir;
  const std::string plan = dir.file("plan.spqp");
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", dir.file("none"), "--out", plan}), 1,
                    "manifest.txt: cannot open");
  ASSERT_EQ(run(dir, {"synth-trace", "--out", dir.file("t"), "--arch", "gdn", "--layers", "1",
                      "--heads", "4", "--key-dim", "16", "--value-dim", "16", "--tokens", "64"})
                .status,
            0);
  EXPECT_FAILS_WITH(
      run(dir, {"calibrate", "--trace", dir.file("t"), "--out", plan, "--pivots", "4"}), 1,
      "pivots leave too few bits");
  std::filesystem::remove(dir.file("t/layer0.k.npy"));
  EXPECT_FAILS_WITH(run(dir, {"calibrate", "--trace", dir.file("t"), "--out", plan}), 1,
                    "layer0.k.npy: cannot open");
  EXPECT_FALSE(testing::exists(plan));
  EXPECT_TRUE(testing::leftovers_of(plan).empty()) << "a failed calibrate leaves no temporary";
}

TEST(Cli, SynthCalibrateAndCodecSession) {
  TempDir dir;
  const Result synth =
      run(dir, {"synth-trace", "--out", dir.file("trace"), "--arch", "gdn", "--layers", "2",
                "--heads", "4", "--key-dim", "32", "--value-dim", "32", "--tokens", "512",
                "--sequence-length", "256", "--seed", "3"});
  ASSERT_EQ(synth.status, 0) << synth.err;
  EXPECT_NE(synth.out.find("SYNTHETIC trace written"), std::string::npos) << synth.out;

  const std::string plan = dir.file("plan.spqp");
  const Result cal = run(dir, {"calibrate", "--trace", dir.file("trace"), "--out", plan, "--report",
                               dir.file("report.txt"), "--pivots", "1"});
  ASSERT_EQ(cal.status, 0) << cal.err;
  EXPECT_NE(cal.out.find("STEPQuant plan: gdn, 2 layers x 4 heads"), std::string::npos) << cal.out;
  EXPECT_NE(cal.out.find("NOTE: calibrated on a SYNTHETIC trace"), std::string::npos);
  EXPECT_NE(cal.err.find("layer 2/2"), std::string::npos) << "progress on stderr: " << cal.err;
  // The pivot is used, or the report says why not.
  const std::string report = testing::read_bytes(dir.file("report.txt"));
  EXPECT_TRUE(report.find("pivots (fp16)") != std::string::npos ||
              report.find("pivots: 0 of the 1 allowed") != std::string::npos)
      << report;
  EXPECT_TRUE(testing::exists(plan));

  // A state shaped like the plan: [2, 4, 32, 32].
  kernels::StateLayout layout;
  layout.num_layers = 2;
  layout.num_heads = 4;
  layout.key_dim = 32;
  layout.value_dim = 32;
  const std::vector<std::byte> staged =
      synthetic::synthetic_staged_state(layout, 200, 5, kernels::DType::f32);
  std::vector<float> values(staged.size() / 4);
  std::memcpy(values.data(), staged.data(), staged.size());
  const std::string state = dir.file("state.npy");
  write_npy(state, std::vector<std::uint64_t>{2, 4, 32, 32}, values);

  const Result rt = run(dir, {"codec", "roundtrip", "--codec", "stepquant6", "--plan", plan, "--in",
                              state, "--out", dir.file("rt.npy")});
  ASSERT_EQ(rt.status, 0) << rt.err;
  EXPECT_NE(rt.out.find("layer 1 head 3:"), std::string::npos) << rt.out;
  EXPECT_NE(rt.out.find("bits/value"), std::string::npos) << rt.out;
  EXPECT_NE(rt.out.find("x smaller than FP32"), std::string::npos) << rt.out;
  EXPECT_EQ(read_npy(dir.file("rt.npy")).shape, (std::vector<std::uint64_t>{2, 4, 32, 32}));

  const std::string page = dir.file("state.page");
  ASSERT_EQ(run(dir, {"codec", "encode", "--codec", "stepquant6", "--plan", plan, "--in", state,
                      "--out", page})
                .status,
            0);
  const Result dec =
      run(dir, {"codec", "decode", "--plan", plan, "--in", page, "--out", dir.file("dec.npy")});
  ASSERT_EQ(dec.status, 0) << dec.err;
  EXPECT_EQ(read_npy(dir.file("dec.npy")).data, read_npy(dir.file("rt.npy")).data)
      << "decode(encode(x)) is the roundtrip's reconstruction";

  // int6 on a rank-3 state, no plan needed.
  write_npy(dir.file("s3.npy"), std::vector<std::uint64_t>{4, 32, 32},
            std::span<const float>(values).first(4 * 32 * 32));
  const Result int6 = run(dir, {"codec", "roundtrip", "--codec", "int6", "--in", dir.file("s3.npy"),
                                "--out", dir.file("s3rt.npy"), "--group-size", "64"});
  ASSERT_EQ(int6.status, 0) << int6.err;
  EXPECT_NE(int6.out.find("layer 0 head 3:"), std::string::npos) << int6.out;

  // --- errors: non-zero exit, a message, nothing written ---
  const std::string out = dir.file("never.npy");
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "roundtrip", "--codec", "stepquant6", "--in", state, "--out", out}), 2,
      "stepquant6 needs --plan");
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "stepquant6", "--plan", plan, "--in",
                              dir.file("s3.npy"), "--out", out}),
                    1, "does not fit this state");
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "stepquant6", "--plan", plan,
                              "--arch", "kda", "--in", state, "--out", out}),
                    1, "is for gdn");
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "int6", "--in", dir.file("none.npy"),
                              "--out", out}),
                    1, "none.npy: cannot open");
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "stepquant6", "--plan",
                              dir.file("state.npy"), "--in", state, "--out", out}),
                    1, "state.npy");
  // float64 and wrong-rank inputs.
  std::string f8 = testing::read_bytes(dir.file("s3.npy"));
  f8.replace(f8.find("<f4"), 3, "<f8");
  testing::write_bytes(dir.file("f8.npy"), f8);
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "roundtrip", "--codec", "int6", "--in", dir.file("f8.npy"), "--out", out}),
      1, "'<f8' is not supported");
  write_npy(dir.file("r2.npy"), std::vector<std::uint64_t>{32, 32}, std::vector<float>(1024));
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "encode", "--codec", "int6", "--in", dir.file("r2.npy"), "--out", out}), 1,
      "got shape [32, 32]");
  std::vector<float> nan_values(4 * 32 * 32, 1.0f);
  nan_values[100] = NAN;
  write_npy(dir.file("nan.npy"), std::vector<std::uint64_t>{4, 32, 32}, nan_values);
  EXPECT_FAILS_WITH(run(dir, {"codec", "roundtrip", "--codec", "int6", "--in", dir.file("nan.npy"),
                              "--out", out}),
                    1, "non-finite value nan");
  // Decode: plan missing, wrong plan, truncated page.
  EXPECT_FAILS_WITH(run(dir, {"codec", "decode", "--in", page, "--out", out}), 2,
                    "pass that plan with --plan");
  ASSERT_EQ(run(dir, {"calibrate", "--trace", dir.file("trace"), "--out", dir.file("other.spqp"),
                      "--gamma", "0"})
                .status,
            0);
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "decode", "--plan", dir.file("other.spqp"), "--in", page, "--out", out}),
      1, "is not the plan");
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "decode", "--plan", plan, "--codec", "int6", "--in", page, "--out", out}),
      1, "encoded with stepquant6");
  const std::string bytes = testing::read_bytes(page);
  testing::write_bytes(dir.file("short.page"), bytes.substr(0, bytes.size() - 5));
  EXPECT_FAILS_WITH(
      run(dir, {"codec", "decode", "--plan", plan, "--in", dir.file("short.page"), "--out", out}),
      1, "truncated?");
  EXPECT_FAILS_WITH(run(dir, {"codec", "decode", "--in", state, "--out", out}), 1,
                    "not a statepool-quant page file");
  EXPECT_FALSE(testing::exists(out));
  EXPECT_TRUE(testing::leftovers_of(out).empty()) << "a failed decode leaves no temporary";
}

}  // namespace
}  // namespace statepool::calibration
