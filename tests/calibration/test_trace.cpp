// Calibration traces (trace.hpp, synthetic_trace.hpp): manifest parsing, writing and
// reading back, and bad traces refused with messages naming the file.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "statepool/calibration/trace.hpp"
#include "statepool/synthetic/trace.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::calibration {
namespace {

using synthetic::synthetic_manifest;
using synthetic::SyntheticOptions;
using synthetic::SyntheticSource;
using synthetic::write_synthetic_trace;
using testing::TempDir;

SyntheticOptions small(kernels::Arch arch) {
  SyntheticOptions o;
  o.arch = arch;
  o.layers = 2;
  o.heads = 3;
  o.key_dim = 8;
  o.value_dim = 4;
  o.tokens = 50;
  o.sequence_length = 20;
  return o;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(Manifest, ParsesAndFormatsRoundTrip) {
  TraceManifest m = synthetic_manifest(small(kernels::Arch::kda));
  EXPECT_EQ(m.sequence_starts, (std::vector<std::uint64_t>{0, 20, 40}));
  const TraceManifest back = parse_manifest(format_manifest(m), "m");
  EXPECT_EQ(back.arch, kernels::Arch::kda);
  EXPECT_EQ(back.layers, 2u);
  EXPECT_EQ(back.heads, 3u);
  EXPECT_EQ(back.key_dim, 8u);
  EXPECT_EQ(back.value_dim, 4u);
  EXPECT_EQ(back.tokens, 50u);
  EXPECT_EQ(back.sequence_starts, m.sequence_starts);
  EXPECT_TRUE(back.synthetic);
  EXPECT_EQ(back.source, m.source);
  EXPECT_EQ(back.gate_values(), 8u);
}

TEST(Manifest, RejectsBadManifests) {
  const std::string base =
      "format statepool-trace-1\narch gdn\nlayers 1\nheads 2\nkey_dim 4\nvalue_dim 4\n";
  EXPECT_NO_THROW((void)parse_manifest(base + "tokens 10 # comment\n", "m"));
  const auto err = [&](const std::string& text) {
    return message_of([&] { (void)parse_manifest(text, "m.txt"); });
  };
  EXPECT_NE(err(base).find("missing required key 'tokens'"), std::string::npos);
  EXPECT_NE(err(base + "tokens 10\ncolour red\n").find("line 8: unknown key 'colour'"),
            std::string::npos);
  EXPECT_NE(err(base + "tokens 10\ntokens 11\n").find("appears twice"), std::string::npos);
  EXPECT_NE(err(base + "tokens ten\n").find("not a non-negative integer"), std::string::npos);
  EXPECT_NE(err(base + "tokens 10\nsequence_starts 0 5 5\n").find("strictly increasing"),
            std::string::npos);
  EXPECT_NE(err(base + "tokens 10\nsequence_starts 3\n").find("begin with 0"), std::string::npos);
  EXPECT_NE(err(base + "tokens 10\nsequence_starts 0 10\n").find("past the last token"),
            std::string::npos);
  EXPECT_NE(err("format statepool-trace-9\n").find("not supported"), std::string::npos);
  EXPECT_NE(err("arch mamba\n").find("gdn or kda"), std::string::npos);
}

TEST(Trace, WritesAndReadsBackTheSyntheticInputs) {
  for (const auto arch : {kernels::Arch::gdn, kernels::Arch::kda}) {
    TempDir dir;
    const SyntheticOptions o = small(arch);
    write_synthetic_trace(dir.path(), o, {}, 7);  // blocks of 7 tokens
    const TraceReader reader(dir.path());
    EXPECT_TRUE(reader.manifest().synthetic);
    SyntheticSource source(o);
    for (std::uint32_t layer = 0; layer < o.layers; ++layer) {
      TokenBlock expected;
      source.generate(layer, o.tokens, expected);
      TokenBlock got;
      reader.read(layer, 10, 25, got);
      const std::size_t n = o.heads;
      ASSERT_EQ(got.q.size(), 25 * n * o.key_dim);
      EXPECT_TRUE(std::equal(got.q.begin(), got.q.end(), expected.q.begin() + 10 * n * o.key_dim));
      EXPECT_TRUE(
          std::equal(got.v.begin(), got.v.end(), expected.v.begin() + 10 * n * o.value_dim));
      const std::size_t G = arch == kernels::Arch::gdn ? 1 : o.key_dim;
      EXPECT_TRUE(std::equal(got.g.begin(), got.g.end(), expected.g.begin() + 10 * n * G));
      EXPECT_TRUE(std::equal(got.beta.begin(), got.beta.end(), expected.beta.begin() + 10 * n));
      for (const float g : got.g) EXPECT_LT(g, 0.0f);
    }
  }
}

TEST(Trace, SyntheticHeadsSpanLongAndShortLifetimes) {
  SyntheticOptions o = small(kernels::Arch::gdn);
  o.heads = 8;
  const SyntheticSource source(o);
  float slowest = -1.0f;
  float fastest = 0.0f;
  for (std::uint32_t h = 0; h < o.heads; ++h) {
    slowest = std::max(slowest, source.nominal_log_decay(0, h));
    fastest = std::min(fastest, source.nominal_log_decay(0, h));
  }
  EXPECT_GT(slowest, -0.002f);
  EXPECT_LT(fastest, -0.3f);
  o.head_log_decay = {-0.1f};
  EXPECT_THROW(SyntheticSource{o}, std::invalid_argument);  // one per head
}

TEST(Trace, RefusesBadTracesNamingTheFile) {
  TempDir dir;
  EXPECT_NE(message_of([&] { TraceReader r(dir.path()); }).find("manifest.txt: cannot open"),
            std::string::npos);
  const SyntheticOptions o = small(kernels::Arch::gdn);
  write_synthetic_trace(dir.path(), o);
  EXPECT_NE(message_of([&] { write_synthetic_trace(dir.path(), o); }).find("already holds a trace"),
            std::string::npos);

  // A g file with a positive gate and a beta file with a logit.
  TokenBlock block;
  SyntheticSource source(o);
  source.generate(1, o.tokens, block);
  block.g[5 * o.heads + 2] = 0.25f;
  write_npy(trace_file(dir.path(), 1, "g"), std::vector<std::uint64_t>{o.tokens, o.heads}, block.g);
  const TraceReader reader2(dir.path());
  TokenBlock out;
  const std::string g_error = message_of([&] { reader2.read(1, 0, o.tokens, out); });
  EXPECT_NE(g_error.find("layer1.g.npy: token 5 head 2: log-decay 0.25"), std::string::npos)
      << g_error;
  EXPECT_NO_THROW(reader2.read(1, 6, 10, out));
  block.beta[7 * o.heads + 1] = 3.0f;
  write_npy(trace_file(dir.path(), 0, "beta"), std::vector<std::uint64_t>{o.tokens, o.heads},
            block.beta);
  // (An open reader keeps reading the file it opened: write_npy replaces it by rename.)
  const TraceReader reader3(dir.path());
  const std::string beta_error = message_of([&] { reader3.read(0, 0, 20, out); });
  EXPECT_NE(beta_error.find("layer0.beta.npy: token 7 head 1: beta 3"), std::string::npos)
      << beta_error;

  // Wrong shape and a missing file.
  write_npy(trace_file(dir.path(), 0, "v"), std::vector<std::uint64_t>{o.tokens, o.heads, 5},
            std::vector<float>(o.tokens * o.heads * 5));
  const std::string shape_error = message_of([&] { TraceReader r(dir.path()); });
  EXPECT_NE(shape_error.find("layer0.v.npy: shape [50, 3, 5] does not match the manifest, "
                             "expected [50, 3, 4]"),
            std::string::npos)
      << shape_error;
  std::filesystem::remove(trace_file(dir.path(), 0, "v"));
  EXPECT_NE(message_of([&] { TraceReader r(dir.path()); }).find("layer0.v.npy: cannot open"),
            std::string::npos);
}

TEST(Trace, UnfinishedWriterLeavesNoTrace) {
  TempDir dir;
  {
    TraceWriter writer(dir.path(), synthetic_manifest(small(kernels::Arch::gdn)));
    writer.begin_layer(0);
    SyntheticSource source(small(kernels::Arch::gdn));
    TokenBlock block;
    source.generate(0, 50, block);
    writer.append(block);
    writer.end_layer();
    writer.begin_layer(1);
    EXPECT_THROW(writer.finish(), TraceError);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace statepool::calibration
