// statepool-eval end to end, as eval/run uses it: trace -> statepool-quant calibrate -> run,
// with the outputs it writes; and its command-line and input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "statepool/testing/daemon.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace {

using statepool::testing::Exit;
using statepool::testing::read_bytes;
using statepool::testing::TempDir;

const std::string kEval = STATEPOOL_EVAL_DIR;

Exit run(const TempDir& dir, const std::string& tool, std::vector<std::string> args) {
  args.insert(args.begin(), tool);
  return statepool::testing::run_program(args, dir.path());
}

Exit eval(const TempDir& dir, std::vector<std::string> args) {
  return run(dir, STATEPOOL_EVAL_PATH, std::move(args));
}

#define EXPECT_EXIT_WITH(exit, status, text)                                   \
  do {                                                                         \
    const Exit& e_ = (exit);                                                   \
    EXPECT_EQ(e_.code, status) << e_.stderr_text;                              \
    EXPECT_NE(e_.stderr_text.find(text), std::string::npos) << e_.stderr_text; \
  } while (0)

TEST(EvalCli, TraceCalibrateRun) {
  TempDir dir;
  const std::string model = kEval + "/models/gdn";
  const Exit trace =
      eval(dir, {"trace", "--model", model, "--text", kEval + "/data/calibration.txt", "--out",
                 dir.file("trace"), "--sequences", "2", "--sequence-length", "256"});
  ASSERT_EQ(trace.code, 0) << trace.stderr_text;
  EXPECT_NE(trace.stdout_text.find("wrote trace"), std::string::npos);
  EXPECT_NE(read_bytes(dir.file("trace/manifest.txt")).find("sequence_starts 0 256"),
            std::string::npos);
  // A second trace into the same directory is refused: nothing is overwritten.
  EXPECT_EXIT_WITH(eval(dir, {"trace", "--model", model, "--text", kEval + "/data/calibration.txt",
                              "--out", dir.file("trace")}),
                   1, "error:");

  const Exit calibrate = run(dir, STATEPOOL_QUANT_PATH,
                             {"calibrate", "--trace", dir.file("trace"), "--out",
                              dir.file("plan6.spqp"), "--budget", "6"});
  ASSERT_EQ(calibrate.code, 0) << calibrate.stderr_text;
  EXPECT_NE(calibrate.stdout_text.find("output costs"), std::string::npos);

  const Exit r = eval(dir, {"run",
                            "--model",
                            model,
                            "--text",
                            kEval + "/data/heldout.txt",
                            "--plan6",
                            dir.file("plan6.spqp"),
                            "--codecs",
                            "fp32,int6,stepquant6,stepquant6-temporal",
                            "--tokens",
                            "96",
                            "--generate",
                            "16",
                            "--prompt",
                            "8",
                            "--threads",
                            "2",
                            "--markdown",
                            dir.file("gdn.md"),
                            "--csv",
                            dir.file("gdn.csv"),
                            "--claims",
                            dir.file("gdn.claims"),
                            "--title",
                            "GDN test"});
  ASSERT_EQ(r.code, 0) << r.stderr_text;
  EXPECT_NE(r.stdout_text.find("stepquant6-temporal"), std::string::npos) << r.stdout_text;
  EXPECT_NE(r.stderr_text.find("4 cases, 96 tokens each"), std::string::npos) << r.stderr_text;
  const std::string md = read_bytes(dir.file("gdn.md"));
  EXPECT_EQ(md.rfind("## GDN test", 0), 0u) << md;
  EXPECT_NE(md.find("| stepquant6 |"), std::string::npos);
  const std::string csv = read_bytes(dir.file("gdn.csv"));
  EXPECT_EQ(csv.rfind("t,fp32,int6,stepquant6,stepquant6-temporal\n", 0), 0u);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 97);
  const std::string claims = read_bytes(dir.file("gdn.claims"));
  EXPECT_NE(claims.find("\tstepquant6 is closer to FP32 than int6\n"), std::string::npos) << claims;
  EXPECT_NE(claims.find("\tstepquant6: both axes beat the temporal axis alone\n"),
            std::string::npos);

  // The step modes (eval/step-modes): the full fit and each setting per window.
  const Exit modes = eval(dir, {"modes", "--model", model, "--text", kEval + "/data/heldout.txt",
                                "--plan6", dir.file("plan6.spqp"), "--offsets", "0,512",
                                "--tokens", "64", "--every", "4,0", "--variants",
                                "norefit,impact+clamp", "--tsv", dir.file("modes.tsv")});
  ASSERT_EQ(modes.code, 0) << modes.stderr_text;
  EXPECT_NE(modes.stdout_text.find("| 512 | stepquant6 light N=4 norefit |"), std::string::npos)
      << modes.stdout_text;
  EXPECT_NE(modes.stdout_text.find("| 0 | stepquant6 light N=inf impact+clamp |"),
            std::string::npos)
      << modes.stdout_text;
  const std::string tsv = read_bytes(dir.file("modes.tsv"));
  EXPECT_EQ(tsv.rfind("window\tcase\tppl_delta_pct\t", 0), 0u) << tsv;
  // 2 windows x (the full fit + 2 periods x 2 settings), and the header.
  EXPECT_EQ(std::count(tsv.begin(), tsv.end(), '\n'), 11) << tsv;
  // With N = 4, three steps in four are cheap ones; the fit without the refit never
  // falls back.
  const auto at = tsv.find("0\tstepquant6 light N=4 norefit\t");
  ASSERT_NE(at, std::string::npos) << tsv;
  const std::string line = tsv.substr(at, tsv.find('\n', at) - at);
  EXPECT_TRUE(line.ends_with("\t0.7500\t0.0000")) << line;
}

TEST(EvalCli, BadCommandLinesAndInputs) {
  TempDir dir;
  const std::string model = kEval + "/models/kda";
  const std::string text = kEval + "/data/heldout.txt";
  EXPECT_EXIT_WITH(eval(dir, {}), 2, "no command given");
  EXPECT_EXIT_WITH(eval(dir, {"score"}), 2, "unknown command 'score'");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--text", text}), 2, "model");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--model", model, "--text", text, "--tokens", "0"}), 2,
                   "--tokens must be between 1 and");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--model", model, "--text", text, "--codecs", "stepquant4"}),
                   2, "unknown or unavailable case 'stepquant4'");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--model", dir.path(), "--text", text}), 1, "manifest.json");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--model", model, "--text", dir.file("missing.txt")}), 1,
                   "missing.txt");
  EXPECT_EXIT_WITH(eval(dir, {"run", "--model", model, "--text", kEval + "/data/SOURCES.md",
                              "--tokens", "100000"}),
                   1, "needs 100001 bytes of text");
  EXPECT_EXIT_WITH(
      eval(dir, {"run", "--model", model, "--text", text, "--plan6", dir.file("none.spqp")}), 1,
      "none.spqp");
  EXPECT_EXIT_WITH(eval(dir, {"modes", "--model", model, "--text", text}), 2,
                   "give --plan6, --plan4 or both");
  EXPECT_EXIT_WITH(eval(dir, {"modes", "--model", model, "--text", text, "--plan6", "x",
                              "--variants", "absmax,fastest"}),
                   2, "--variants: unknown 'fastest'");
  EXPECT_EXIT_WITH(eval(dir, {"modes", "--model", model, "--text", text, "--plan6", "x",
                              "--every", "4,x"}),
                   2, "--every: 'x' is not a number");
  const Exit help = eval(dir, {"help", "run"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.stdout_text.find("--plan6-nopivots"), std::string::npos);
}

}  // namespace
