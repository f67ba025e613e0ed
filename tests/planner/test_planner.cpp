// Planner arithmetic: exact state page bytes by hand, KV bytes, KIVI/FlexGen formulas,
// concurrency and crossover on a small hand-computable model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "pool/pool.hpp"
#include "statepool/planner/planner.hpp"

namespace statepool::planner {
namespace {

using kernels::CodecId;

ModelSpec load(const std::string& file) {
  return load_model(std::string(STATEPOOL_MODELS_DIR) + "/" + file);
}

const CodecRow& row(const PlanReport& r, CodecId id) {
  for (const CodecRow& x : r.rows) {
    if (x.codec == id) return x;
  }
  throw std::logic_error("codec not in report");
}

PlanReport run(const ModelSpec& m, PlanInputs in = {}) {
  return plan(m, in);
}

TEST(Planner, PageAlignmentMatchesThePool) {
  EXPECT_EQ(kPageAlignment, service::kPageAlignment);
}

TEST(Planner, Qwen3NextStateBytesByHand) {
  const PlanReport r = run(load("qwen3-next-80b-a3b-instruct.json"));
  const std::uint64_t recurrent = 36ull * 32 * 128 * 128 * 4;
  EXPECT_EQ(recurrent, 75'497'472u);
  // Conv: 36 layers x (2*16*128 + 32*128 = 8192 channels) x (4 - 1) x 2 B (bf16).
  const std::uint64_t conv = 36ull * 8192 * 3 * 2;
  EXPECT_EQ(conv, 1'769'472u);
  const CodecRow& fp32 = row(r, CodecId::fp32);
  EXPECT_EQ(fp32.page_bytes, recurrent + conv);  // 77,266,944 (a multiple of 256)
  EXPECT_EQ(fp32.state_per_request, recurrent + conv);
  EXPECT_EQ(row(r, CodecId::bf16).page_bytes, recurrent / 2 + conv);
  EXPECT_DOUBLE_EQ(fp32.ratio_vs_fp32, 1.0);
  // KV: 12 layers x (K + V) x 2 heads x 256 x 2 B.
  EXPECT_DOUBLE_EQ(r.kv_per_token, 24'576.0);
  EXPECT_EQ(r.kv_per_request, 24'576ull * 32768);
}

TEST(Planner, Qwen35StateBytesByHand) {
  const PlanReport r = run(load("qwen3.5-27b.json"));
  const std::uint64_t recurrent = 48ull * 48 * 128 * 128 * 4;
  EXPECT_EQ(recurrent, 150'994'944u);
  const std::uint64_t conv = 48ull * (2 * 16 * 128 + 48 * 128) * 3 * 2;  // 2,949,120
  EXPECT_EQ(row(r, CodecId::fp32).page_bytes, recurrent + conv);
  EXPECT_DOUBLE_EQ(r.kv_per_token, 16.0 * 2 * 4 * 256 * 2);  // 65,536
}

TEST(Planner, KimiStateAndMlaBytesByHand) {
  const PlanReport r = run(load("kimi-linear-48b-a3b-instruct.json"));
  const std::uint64_t recurrent = 20ull * 32 * 128 * 128 * 4;  // 41,943,040
  const std::uint64_t conv = 20ull * (3 * 32 * 128) * 3 * 2;   // q, k, v convs: 1,474,560
  EXPECT_EQ(row(r, CodecId::fp32).page_bytes, recurrent + conv);
  // MLA: 7 layers x (512 latent + 64 rope) x 2 B, not 72-dim heads.
  EXPECT_DOUBLE_EQ(r.kv_per_token, 7.0 * 576 * 2);  // 8,064
}

TEST(Planner, CodecTableOrdersAndUsesNominalPlans) {
  const PlanReport r = run(load("qwen3-next-80b-a3b-instruct.json"));
  ASSERT_EQ(r.rows.size(), 6u);
  const CodecRow& sq6 = row(r, CodecId::stepquant6);
  const CodecRow& sq4 = row(r, CodecId::stepquant4);
  EXPECT_TRUE(sq6.nominal_plan);
  EXPECT_EQ(sq6.pivots, 16u);  // round(32/2304 * 1152 heads)
  EXPECT_LT(sq4.state_per_request, sq6.state_per_request);
  EXPECT_LT(sq6.state_per_request, row(r, CodecId::int8).state_per_request);
  EXPECT_LT(row(r, CodecId::int8).state_per_request, row(r, CodecId::bf16).state_per_request);
  for (const CodecRow& x : r.rows) {
    EXPECT_EQ(x.page_stride % 256, 0u);
    EXPECT_GE(x.page_stride, x.page_bytes);
    EXPECT_LT(x.page_stride - x.page_bytes, 256u);
  }
  // 6 bits + pivots + scales: between 4x and 5.33x smaller than FP32.
  EXPECT_GT(sq6.ratio_vs_fp32, 4.0);
  EXPECT_LT(sq6.ratio_vs_fp32, 32.0 / 6.0);
  EXPECT_NEAR(sq6.saving_vs_fp32, 1.0 - 1.0 / sq6.ratio_vs_fp32, 1e-12);
  EXPECT_NO_THROW((void)format_text(r));
  EXPECT_NE(format_json(r).find("\"stepquant6\""), std::string::npos);
}

TEST(Planner, FlexGenAndKiviMatchStepquantMd) {
  // FlexGen: 32 FP16 values (64 B) -> 16 B codes + 2 B scale + 2 B offset = 20 B.
  EXPECT_EQ(kv_stream_bytes(KvDtype::bf16, 32, 1, false), 64u);
  EXPECT_EQ(kv_stream_bytes(KvDtype::flexgen4, 32, 1, false), 20u);
  EXPECT_DOUBLE_EQ(64.0 / 20.0, 3.2);
  // KIVI at 10K tokens, 128 channels, keys per channel + values per token, newest 128 FP16.
  auto ratio = [](KvDtype kv) {
    const double fp16 = 2.0 * static_cast<double>(kv_stream_bytes(KvDtype::bf16, 128, 10000, true));
    const double q = static_cast<double>(kv_stream_bytes(kv, 128, 10000, true) +
                                         kv_stream_bytes(kv, 128, 10000, false));
    return fp16 / q;
  };
  EXPECT_NEAR(ratio(KvDtype::kivi2), 5.05, 0.005);
  EXPECT_NEAR(ratio(KvDtype::kivi4), 3.11, 0.005);
  EXPECT_NEAR(ratio(KvDtype::flexgen4), 3.20, 1e-12);
  // Short contexts stay entirely FP16.
  EXPECT_EQ(kv_stream_bytes(KvDtype::kivi2, 128, 100, true), 128u * 100 * 2);
  // Keys: 128 channels x ceil(32/32) groups x 12 B + 128 residual tokens in FP16.
  EXPECT_EQ(kv_stream_bytes(KvDtype::kivi2, 128, 160, true), 128u * 12 + 128u * 128 * 2);
  // Values: 32 tokens x 4 groups x 20 B + residual.
  EXPECT_EQ(kv_stream_bytes(KvDtype::kivi4, 128, 160, false), 32u * 4 * 20 + 128u * 128 * 2);
  EXPECT_EQ(kv_stream_bytes(KvDtype::fp8, 128, 10, false), 1280u);
}

// One source of truth: the planner's KV bytes are what kernels::kv_encode writes (keys
// for per_channel, values otherwise), for every dtype, names matching the kernels' codecs.
TEST(Planner, KvStreamBytesAreTheKernelsEncodedSizes) {
  for (const KvDtype kv :
       {KvDtype::bf16, KvDtype::fp8, KvDtype::kivi2, KvDtype::kivi4, KvDtype::flexgen4}) {
    EXPECT_STREQ(to_string(kv), kernels::to_string(kv_codec(kv)));
    for (const std::uint64_t tokens : {1ull, 100ull, 129ull, 161ull, 10000ull}) {
      for (const std::uint64_t channels : {1ull, 33ull, 128ull, 576ull}) {
        for (const bool per_channel : {true, false}) {
          const std::vector<float> x(tokens * channels, 0.25f);
          const kernels::KvStream s{kv_codec(kv),
                                    per_channel ? kernels::KvRole::keys : kernels::KvRole::values,
                                    tokens, channels};
          std::vector<std::byte> out(kv_stream_bytes(kv, channels, tokens, per_channel));
          EXPECT_NO_THROW(kernels::kv_encode(s, x, out))
              << to_string(kv) << " " << tokens << "x" << channels << " " << per_channel;
        }
      }
    }
  }
  // KIVI keys and values differ (per channel vs per token) once tokens pass the window.
  EXPECT_NE(kv_stream_bytes(KvDtype::kivi2, 33, 200, true),
            kv_stream_bytes(KvDtype::kivi2, 33, 200, false));
}

// 4 layers: 3 GDN + 1 full; one 16x16 linear head; one KV head of 16.
constexpr const char* kTiny = R"({
  "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
  "full_attention_interval": 4, "linear_num_key_heads": 1, "linear_num_value_heads": 1,
  "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
  "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16,
  "intermediate_size": 128, "vocab_size": 100})";

TEST(Planner, ConcurrencyAndCrossoverByHand) {
  ModelSpec m = parse_model(kTiny);
  EXPECT_EQ(m.linear_layers, 3u);
  EXPECT_EQ(m.full_layers, 1u);
  m.parameters = 1'000'000;  // 2,000,000 B at 16 bits
  PlanInputs in;
  in.codecs = {CodecId::fp32};
  in.context = 64;
  in.gpu_memory = 10'000'000;
  in.reserved = 0.0;
  const PlanReport r = plan(m, in);
  const CodecRow& x = r.rows.at(0);
  // State: 3 x 16 x 16 x 4 = 3072 + conv 3 x 48 ch x 3 x 2 = 864 -> 3936 -> stride 4096.
  EXPECT_EQ(x.page_bytes, 3936u);
  EXPECT_EQ(x.state_per_request, 4096u);
  // KV: 1 layer x 2 x 16 x 2 B = 64 B/token, x 64 tokens.
  EXPECT_EQ(r.kv_per_request, 4096u);
  EXPECT_EQ(r.weights, 2'000'000u);
  EXPECT_EQ(x.per_request, 8192u);
  EXPECT_EQ(x.max_concurrency, 976u);  // floor(8,000,000 / 8192)
  EXPECT_EQ(x.crossover, 489u);        // 488 x 4096 < 2,000,000 < 489 x 4096
  EXPECT_TRUE(x.crossover_fits);
  EXPECT_EQ(x.breakdown.concurrency, 976u);
  EXPECT_EQ(x.breakdown.total, 2'000'000u + 976u * 8192);
  EXPECT_EQ(x.breakdown.free, 10'000'000 - 2'000'000 - 976 * 8192);

  in.reserved = 0.5;
  in.slots = 2;  // 8192 state + 4096 KV per request
  in.concurrency = 100;
  const CodecRow y = plan(m, in).rows.at(0);  // a copy: the report is a temporary
  EXPECT_EQ(y.state_per_request, 8192u);
  EXPECT_EQ(y.max_concurrency, 244u);  // floor(3,000,000 / 12,288)
  EXPECT_EQ(y.crossover, 245u);        // 244 x 8192 = 1,998,848 < 2,000,000
  EXPECT_FALSE(y.crossover_fits);
  EXPECT_EQ(y.breakdown.concurrency, 100u);
  EXPECT_EQ(y.breakdown.state, 819'200u);

  in.gpu_memory = 1'000'000;  // weights alone do not fit
  EXPECT_EQ(plan(m, in).rows.at(0).max_concurrency, 0u);
}

TEST(Planner, WeightBytes) {
  EXPECT_EQ(weight_bytes(1280, 16), 2560u);
  EXPECT_EQ(weight_bytes(1280, 8), 1280u + 20u);  // one fp16 scale per 128 weights
  EXPECT_EQ(weight_bytes(1280, 4), 640u + 20u);
  EXPECT_THROW((void)weight_bytes(1280, 3), std::invalid_argument);
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

// Regression: --weights-bits said "must be 16, 8 or 4" for 5 but "must be a whole number
// between 4 and 16" for 32, and plan() "weight bits must be ..."; every input had two
// wordings (set_plan_input and plan()). One check per input now, one sentence.
TEST(Planner, OneSentencePerInputFromEveryDoor) {
  const ModelSpec m = load("qwen3.5-27b.json");
  const auto text = [](std::string_view name, std::string_view value) {
    return refusal([&] {
      PlanInputs in;
      (void)set_plan_input(in, name, value);
    });
  };
  const auto binary = [&](const std::function<void(PlanInputs&)>& set) {
    return refusal([&] {
      PlanInputs in;
      set(in);
      (void)plan(m, in);
    });
  };
  const std::string bits = "weights-bits must be 16, 8 or 4, got ";
  EXPECT_EQ(text("weights-bits", "5"), bits + "5");
  EXPECT_EQ(text("weights-bits", "32"), bits + "32");
  EXPECT_EQ(text("weights-bits", "0"), bits + "0");
  EXPECT_EQ(text("weights-bits", "-8"), bits + "'-8'");
  EXPECT_EQ(text("weights-bits", "eight"), bits + "'eight'");
  EXPECT_EQ(binary([](PlanInputs& in) { in.weight_bits = 5; }), bits + "5");
  EXPECT_EQ(binary([](PlanInputs& in) { in.weight_bits = 32; }), bits + "32");
  EXPECT_EQ(refusal([] { (void)weight_bytes(1280, 3); }), bits + "3");

  EXPECT_EQ(text("slots", "0"), "slots must be between 1 and 1024, got 0");
  EXPECT_EQ(binary([](PlanInputs& in) { in.slots = 0; }),
            "slots must be between 1 and 1024, got 0");
  EXPECT_EQ(text("tp", "1025"), "tp must be between 1 and 1024, got 1025");
  EXPECT_EQ(binary([](PlanInputs& in) { in.tp = 1025; }),
            "tp must be between 1 and 1024, got 1025");
  EXPECT_EQ(text("concurrency", "1048577"),
            "concurrency must be between 0 and 1048576, got 1048577");
  EXPECT_EQ(binary([](PlanInputs& in) { in.concurrency = 1048577; }),
            "concurrency must be between 0 and 1048576, got 1048577");
  EXPECT_EQ(text("reserved", "1"), "reserved must be a fraction in [0, 1), got 1");
  EXPECT_EQ(text("reserved", "0.1.2"), "reserved must be a fraction in [0, 1), got '0.1.2'");
  EXPECT_EQ(binary([](PlanInputs& in) { in.reserved = 1.0; }),
            "reserved must be a fraction in [0, 1), got 1");
  const std::string gpu =
      "gpu-memory must be between 1 B and 1.0 PiB (1125899906842624 bytes), got ";
  EXPECT_EQ(text("gpu-memory", "0"), gpu + "'0'");
  EXPECT_EQ(binary([](PlanInputs& in) { in.gpu_memory = 0; }), gpu + "0 bytes");
  EXPECT_EQ(text("kv", "fp4"), "kv must be bf16, fp8, kivi2, kivi4 or flexgen4, got 'fp4'");
  EXPECT_EQ(binary([](PlanInputs& in) { in.kv = static_cast<KvDtype>(9); }),
            "kv must be bf16, fp8, kivi2, kivi4 or flexgen4, got 9");
}

// Regression: --state-codec fp32,fp32,int6 printed the fp32 row twice.
TEST(Planner, ACodecNamedTwiceGetsOneRowWhereFirstNamed) {
  PlanInputs in;
  ASSERT_TRUE(set_plan_input(in, "state-codec", "int6,fp32,int6,fp32"));
  EXPECT_EQ(in.codecs, (std::vector<CodecId>{CodecId::int6, CodecId::fp32}));
  // Lists from the protocol are not parsed from text: plan() drops repeats itself.
  in.codecs = {CodecId::bf16, CodecId::int8, CodecId::bf16};
  const PlanReport r = plan(load("qwen3.5-27b.json"), in);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].codec, CodecId::bf16);
  EXPECT_EQ(r.rows[1].codec, CodecId::int8);
  EXPECT_EQ(r.inputs.codecs, (std::vector<CodecId>{CodecId::bf16, CodecId::int8}));
}

TEST(Planner, ConvKernelOnePlansAStateWithoutConv) {
  ModelSpec m = load("qwen3-next-80b-a3b-instruct.json");
  m.conv_kernel = 1;
  PlanInputs in;
  in.tp = 2;
  const PlanReport r = plan(m, in);
  EXPECT_EQ(r.layout.conv_width, 0u);
  EXPECT_EQ(r.layout.conv_channels, 0u);
  EXPECT_EQ(row(r, CodecId::fp32).page_bytes, 36ull * 16 * 128 * 128 * 4);
  EXPECT_NE(format_text(r).find("no conv state (conv kernel 1)"), std::string::npos);
}

// Every key at the top of its range where the derived limits allow (the largest
// parameter count and KV cache parse_model accepts), and every input at its bound: the
// counts must not wrap around 64 bits.
constexpr const char* kLargest = R"({
  "model_type": "qwen3_next", "hidden_size": 65536, "num_hidden_layers": 1024,
  "full_attention_interval": 1024, "linear_num_key_heads": 1, "linear_num_value_heads": 1,
  "linear_key_head_dim": 1, "linear_value_head_dim": 1, "linear_conv_kernel_dim": 65,
  "num_attention_heads": 1024, "num_key_value_heads": 32, "head_dim": 4096,
  "num_experts": 4096, "moe_intermediate_size": 262144,
  "shared_expert_intermediate_size": 262144, "vocab_size": 16777216})";

TEST(Planner, TheLargestAcceptedConfigStaysExact) {
  const ModelSpec m = parse_model(kLargest);
  EXPECT_EQ(m.kv_elements_per_token(), kMaxKvElementsPerToken);
  // The routed experts alone: 1024 layers x 4096 x 3 x 65536 x 262144 = 3 x 2^56.
  const std::uint64_t experts = 1024ull * 4096 * 3 * 65536 * 262144;
  EXPECT_GT(m.parameters, experts);
  EXPECT_LT(m.parameters, experts + experts / 100);
  PlanInputs in;
  in.context = kMaxContext;
  in.slots = kMaxSlots;
  in.concurrency = kMaxConcurrency;
  in.gpu_memory = kMaxGpuMemory;
  in.weight_bits = 16;
  const PlanReport r = plan(m, in);
  EXPECT_EQ(r.weights, m.parameters * 2);
  EXPECT_EQ(r.kv_per_request, kMaxKvElementsPerToken * 2 * kMaxContext);
  for (const CodecRow& row : r.rows) {
    const Breakdown& b = row.breakdown;
    EXPECT_EQ(b.state / kMaxConcurrency, row.state_per_request);
    EXPECT_EQ(b.kv / kMaxConcurrency, r.kv_per_request);
    EXPECT_EQ(b.total - b.state - b.kv, b.weights);
    EXPECT_GT(b.total, std::uint64_t{1} << 63);  // past int64: free is clamped, not wrapped
    EXPECT_EQ(b.free, -std::numeric_limits<std::int64_t>::max());
  }
}

TEST(Planner, TensorParallelDividesHeads) {
  const ModelSpec m = load("qwen3-next-80b-a3b-instruct.json");
  PlanInputs in;
  in.tp = 2;
  const PlanReport r = plan(m, in);
  // 16 value heads, conv 2*8*128 + 16*128 = 4096 channels per rank.
  EXPECT_EQ(row(r, CodecId::fp32).page_bytes, 36ull * 16 * 128 * 128 * 4 + 36ull * 4096 * 3 * 2);
  EXPECT_DOUBLE_EQ(r.kv_per_token, 12'288.0);  // 1 KV head per rank
  EXPECT_EQ(r.weights, (m.parameters * 2 + 1) / 2);
  in.tp = 4;  // 2 KV heads over 4 ranks: each rank holds a replica of one
  EXPECT_DOUBLE_EQ(plan(m, in).kv_per_token, 12'288.0);
  in.tp = 3;
  EXPECT_THROW((void)plan(m, in), std::invalid_argument);
  // MLA latent is not divided.
  PlanInputs k;
  k.tp = 2;
  EXPECT_DOUBLE_EQ(plan(load("kimi-linear-48b-a3b-instruct.json"), k).kv_per_token, 8064.0);
}

TEST(Planner, GpuMemorySizesAndBadInputs) {
  // Sizes are support::parse_size's (tests/support/test_size.cpp); the planner adds its
  // bounds, 1 B to 1 PiB.
  PlanInputs sized;
  const auto gpu_memory = [&](std::string_view text) {
    EXPECT_TRUE(set_plan_input(sized, "gpu-memory", text));
    return sized.gpu_memory;
  };
  EXPECT_EQ(gpu_memory("141GiB"), 141ull << 30);
  EXPECT_EQ(gpu_memory("80GB"), 80'000'000'000u);
  EXPECT_EQ(gpu_memory("1.5 KiB"), 1536u);
  EXPECT_EQ(gpu_memory("4096"), 4096u);
  EXPECT_EQ(gpu_memory("1PiB"), kMaxGpuMemory);
  EXPECT_THROW((void)set_plan_input(sized, "gpu-memory", "lots"), std::invalid_argument);
  EXPECT_THROW((void)set_plan_input(sized, "gpu-memory", "12XB"), std::invalid_argument);
  EXPECT_THROW((void)set_plan_input(sized, "gpu-memory", "0"), std::invalid_argument);
  EXPECT_THROW((void)set_plan_input(sized, "gpu-memory", "1025TiB"), std::invalid_argument);
  EXPECT_EQ(sized.gpu_memory, kMaxGpuMemory) << "a refused value changes nothing";
  const ModelSpec m = load("qwen3.5-27b.json");
  PlanInputs in;
  in.reserved = 1.0;
  EXPECT_THROW((void)plan(m, in), std::invalid_argument);
  in.reserved = 0.1;
  in.weight_bits = 5;
  EXPECT_THROW((void)plan(m, in), std::invalid_argument);
}

}  // namespace
}  // namespace statepool::planner

namespace statepool::planner {
namespace {

TEST(Planner, InputsOutsideTheirBoundsAreRefused) {
  const ModelSpec m = load_model(std::string(STATEPOOL_MODELS_DIR) + "/qwen3.5-27b.json");
  const auto refused = [&](PlanInputs in, const std::string& says) {
    try {
      (void)plan(m, in);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  PlanInputs in;
  in.context = kMaxContext + 1;
  refused(in, "context must be between 1 and 16777216");
  in = {};
  in.slots = kMaxSlots + 1;
  refused(in, "slots must be between 1 and 1024");
  in = {};
  in.tp = 0;
  refused(in, "tp must be between 1 and 1024");
  in = {};
  in.gpu_memory = kMaxGpuMemory + 1;
  refused(in,
          "gpu-memory must be between 1 B and 1.0 PiB (1125899906842624 bytes), got "
          "1125899906842625 bytes");
  in = {};
  in.concurrency = kMaxConcurrency + 1;
  refused(in, "concurrency must be between 0 and 1048576, got 1048577");
  // At the bounds every byte count still fits: the breakdown adds up exactly.
  in = {};
  in.context = kMaxContext;
  in.slots = kMaxSlots;
  in.concurrency = kMaxConcurrency;
  in.gpu_memory = kMaxGpuMemory;
  const PlanReport r = plan(m, in);
  for (const CodecRow& row : r.rows) {
    const Breakdown& b = row.breakdown;
    EXPECT_EQ(b.state, kMaxConcurrency * row.state_per_request);
    EXPECT_EQ(b.kv, kMaxConcurrency * r.kv_per_request);
    EXPECT_EQ(b.total, b.weights + b.state + b.kv);
    EXPECT_LT(b.total, std::uint64_t{1} << 63);
    EXPECT_EQ(b.free, static_cast<std::int64_t>(r.usable) - static_cast<std::int64_t>(b.total));
  }
}

}  // namespace
}  // namespace statepool::planner
