// config.json parsing: layer counts, linear geometry, KV geometry, parameter estimates,
// and errors that name the field.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/planner/model.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::planner {
namespace {

std::string model_path(const std::string& file) {
  return std::string(STATEPOOL_MODELS_DIR) + "/" + file;
}

std::string read_text(const std::string& file) {
  std::ifstream in(model_path(file));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

std::string error_of(const std::string& text) {
  try {
    (void)parse_model(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(PlannerModel, Qwen3NextUsesTheIntervalRule) {
  const ModelSpec m = load_model(model_path("qwen3-next-80b-a3b-instruct.json"));
  EXPECT_EQ(m.family, Family::qwen3_next);
  EXPECT_EQ(m.arch, kernels::Arch::gdn);
  EXPECT_EQ(m.num_layers, 48u);
  EXPECT_EQ(m.linear_layers, 36u);
  EXPECT_EQ(m.full_layers, 12u);
  EXPECT_EQ(m.linear_key_heads, 16u);
  EXPECT_EQ(m.linear_value_heads, 32u);
  EXPECT_EQ(m.linear_key_dim, 128u);
  EXPECT_EQ(m.linear_value_dim, 128u);
  EXPECT_EQ(m.conv_kernel, 4u);
  EXPECT_EQ(m.conv_channels, 2u * 16 * 128 + 32 * 128);  // 8192
  EXPECT_FALSE(m.state_dtype_declared);                  // no mamba_ssm_dtype
  EXPECT_EQ(m.attention, AttentionKind::gqa);
  EXPECT_EQ(m.kv_heads, 2u);
  EXPECT_EQ(m.head_dim, 256u);
  // 12 layers x (K + V) x 2 heads x 256 elements.
  EXPECT_EQ(m.kv_elements_per_token(), 12u * 2 * 2 * 256);
  // SOURCES.md: 79.67B without the MTP layer.
  EXPECT_NEAR(static_cast<double>(m.parameters), 79.67e9, 0.01e9);
}

TEST(PlannerModel, Qwen35DenseAndMoeReadTextConfig) {
  const ModelSpec dense = load_model(model_path("qwen3.5-27b.json"));
  EXPECT_EQ(dense.family, Family::qwen3_5);
  EXPECT_EQ(dense.linear_layers, 48u);
  EXPECT_EQ(dense.full_layers, 16u);
  EXPECT_EQ(dense.linear_value_heads, 48u);
  EXPECT_EQ(dense.conv_channels, 2u * 16 * 128 + 48 * 128);  // 10240
  EXPECT_EQ(dense.state_dtype, kernels::DType::f32);
  EXPECT_TRUE(dense.state_dtype_declared);
  EXPECT_EQ(dense.kv_heads, 4u);
  EXPECT_NEAR(static_cast<double>(dense.parameters), 26.90e9, 0.01e9);  // text, no MTP

  const ModelSpec same = load_model(model_path("qwen3.8-27b.json"));
  EXPECT_EQ(same.parameters, dense.parameters);
  EXPECT_EQ(same.linear_layers, dense.linear_layers);

  const ModelSpec big = load_model(model_path("qwen3.5-397b-a17b.json"));
  EXPECT_EQ(big.linear_layers, 45u);
  EXPECT_EQ(big.full_layers, 15u);
  EXPECT_EQ(big.linear_value_heads, 64u);
  // SOURCES.md: 396.35B without MTP and vision (the card's 397B).
  EXPECT_NEAR(static_cast<double>(big.parameters), 396.35e9, 0.01e9);

  const ModelSpec small = load_model(model_path("qwen3.5-35b-a3b.json"));
  EXPECT_EQ(small.linear_layers, 30u);
  EXPECT_EQ(small.full_layers, 10u);
  // 35.51B with MTP per SOURCES.md; the MTP layer (~0.85B) is not counted here.
  EXPECT_GT(small.parameters, 34'000'000'000u);
  EXPECT_LT(small.parameters, 35'510'000'000u);
}

TEST(PlannerModel, KimiLinearLayerListsAreOneBased) {
  const ModelSpec m = load_model(model_path("kimi-linear-48b-a3b-instruct.json"));
  EXPECT_EQ(m.family, Family::kimi_linear);
  EXPECT_EQ(m.arch, kernels::Arch::kda);
  EXPECT_EQ(m.linear_layers, 20u);
  EXPECT_EQ(m.full_layers, 7u);
  EXPECT_EQ(m.linear_value_heads, 32u);
  EXPECT_EQ(m.linear_key_dim, 128u);  // linear_attn_config.head_dim, not the top-level 72
  EXPECT_EQ(m.conv_channels, 3u * 32 * 128);
  EXPECT_EQ(m.attention, AttentionKind::mla);
  EXPECT_EQ(m.kv_lora_rank, 512u);
  EXPECT_EQ(m.qk_rope_head_dim, 64u);
  EXPECT_EQ(m.kv_elements_per_token(), 7u * (512 + 64));
  // SOURCES.md: measured from the safetensors, 49,122,681,728.
  EXPECT_EQ(m.parameters, 49'122'681'728u);
}

TEST(PlannerModel, MissingFieldsAreNamed) {
  const std::string qwen35 = read_text("qwen3.5-27b.json");
  EXPECT_NE(error_of(replace(qwen35, "\"linear_num_value_heads\"", "\"renamed\""))
                .find("missing text_config.linear_num_value_heads"),
            std::string::npos);
  const std::string next = read_text("qwen3-next-80b-a3b-instruct.json");
  EXPECT_NE(error_of(replace(next, "\"full_attention_interval\"", "\"renamed\""))
                .find("missing full_attention_interval"),
            std::string::npos);
  const std::string kimi = read_text("kimi-linear-48b-a3b-instruct.json");
  EXPECT_NE(error_of(replace(kimi, "\"short_conv_kernel_size\"", "\"renamed\""))
                .find("missing linear_attn_config.short_conv_kernel_size"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kimi, "\"kv_lora_rank\"", "\"renamed\"")).find("kv_lora_rank"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kimi, "24,\n      27\n", "24\n")).find("layer 27 missing"),
            std::string::npos);
}

TEST(PlannerModel, UnknownArchitectureIsNamed) {
  const std::string e = error_of(R"({"model_type": "llama", "hidden_size": 4096})");
  EXPECT_NE(e.find("unsupported architecture 'llama' (model_type)"), std::string::npos) << e;
  const std::string a = error_of(R"({"architectures": ["MambaForCausalLM"]})");
  EXPECT_NE(a.find("'MambaForCausalLM' (architectures)"), std::string::npos) << a;
  EXPECT_NE(error_of("{}").find("missing model_type"), std::string::npos);
  EXPECT_NE(error_of("[1, 2").find("not valid JSON"), std::string::npos);
  EXPECT_THROW((void)load_model(model_path("no-such-model.json")), std::runtime_error);
}

// --- Ranges: every numeric key parse_model reads ---------------------------------------

/// The config `text` with the key at `path` ("text_config.head_dim") set to `value`.
std::string set_key(const std::string& text, const std::string& path, boost::json::value value) {
  boost::json::value root = boost::json::parse(text);
  boost::json::object* obj = &root.as_object();
  std::string rest = path;
  for (std::size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
    obj = &obj->at(rest.substr(0, dot)).as_object();
  (*obj)[rest] = std::move(value);
  return boost::json::serialize(root);
}
std::string with_key(const std::string& file, const std::string& path, boost::json::value value) {
  return set_key(read_text(file), path, std::move(value));
}

struct KeyRange {
  const char* file;
  const char* key;  // as config.json spells it, enclosing objects first
  std::uint64_t min;
  std::uint64_t max;
};

// Regression: out-of-range values used to pass the parser and fail later inside the
// planner ("invalid layout: num_heads must be ...", naming no config key), or were only
// caught as "out of range" past 2^32, or not at all (the parameter sums wrapped around).
TEST(PlannerModel, EveryNumericKeyHasARangeNamedInTheMessage) {
  const char* q = "qwen3.5-27b.json";
  const char* moe = "qwen3.5-35b-a3b.json";
  const char* next = "qwen3-next-80b-a3b-instruct.json";
  const char* kimi = "kimi-linear-48b-a3b-instruct.json";
  const std::vector<KeyRange> keys = {
      {q, "text_config.hidden_size", 1, 65536},
      {q, "text_config.num_hidden_layers", 1, 1024},
      {q, "text_config.linear_num_key_heads", 1, 1024},
      {q, "text_config.linear_num_value_heads", 1, 1024},
      {q, "text_config.linear_key_head_dim", 1, 4096},
      {q, "text_config.linear_value_head_dim", 1, 4096},
      {q, "text_config.linear_conv_kernel_dim", 1, 65},
      {q, "text_config.num_attention_heads", 1, 1024},
      {q, "text_config.num_key_value_heads", 1, 1024},
      {q, "text_config.head_dim", 1, 4096},
      {q, "text_config.vocab_size", 1, 16777216},
      {q, "text_config.intermediate_size", 1, 262144},
      {moe, "text_config.num_experts", 1, 4096},
      {moe, "text_config.moe_intermediate_size", 1, 262144},
      {moe, "text_config.shared_expert_intermediate_size", 0, 262144},
      {next, "full_attention_interval", 1, 1024},
      {next, "num_hidden_layers", 1, 1024},
      {kimi, "hidden_size", 1, 65536},
      {kimi, "num_hidden_layers", 1, 1024},
      {kimi, "linear_attn_config.num_heads", 1, 1024},
      {kimi, "linear_attn_config.head_dim", 1, 4096},
      {kimi, "linear_attn_config.short_conv_kernel_size", 1, 65},
      {kimi, "num_attention_heads", 1, 1024},
      {kimi, "kv_lora_rank", 1, 65536},
      {kimi, "q_lora_rank", 1, 65536},
      {kimi, "qk_rope_head_dim", 1, 4096},
      {kimi, "qk_nope_head_dim", 1, 4096},
      {kimi, "v_head_dim", 1, 4096},
      {kimi, "vocab_size", 1, 16777216},
      {kimi, "num_experts", 1, 4096},
      {kimi, "moe_intermediate_size", 1, 262144},
      {kimi, "num_shared_experts", 0, 4096},
      {kimi, "first_k_dense_replace", 0, 27},  // at most num_hidden_layers
      {kimi, "intermediate_size", 1, 262144},
  };
  for (const KeyRange& k : keys) {
    const std::string range = std::string(k.key) + " must be between " + std::to_string(k.min) +
                              " and " + std::to_string(k.max) + ", got ";
    const auto expect = [&](boost::json::value value, const std::string& says) {
      const std::string e = error_of(with_key(k.file, k.key, std::move(value)));
      EXPECT_EQ(e, "config.json: " + says) << k.file;
    };
    expect(k.max + 1, range + std::to_string(k.max + 1));
    expect(std::int64_t{-1}, range + "-1");
    if (k.min > 0) expect(k.min - 1, range + std::to_string(k.min - 1));
    expect(1e9, range + "1000000000");  // a float with a whole value reads as that number
    expect(std::uint64_t{1} << 40, range + std::to_string(std::uint64_t{1} << 40));
    const std::string whole = std::string(k.key) + " must be a whole number between " +
                              std::to_string(k.min) + " and " + std::to_string(k.max) + ", got ";
    expect(2.5, whole + "2.5");
    expect("12", whole + "\"12\"");
    expect(true, whole + "true");
  }
  // The layer lists of Kimi-Linear: entries between 1 and num_hidden_layers.
  EXPECT_EQ(error_of(with_key(kimi, "linear_attn_config.kda_layers", boost::json::array{1, 2, 0})),
            "config.json: linear_attn_config.kda_layers[2] must be between 1 and 27, got 0");
  EXPECT_EQ(error_of(with_key(kimi, "linear_attn_config.full_attn_layers", boost::json::array{28})),
            "config.json: linear_attn_config.full_attn_layers[0] must be between 1 and 27, got 28");
  EXPECT_NE(error_of(with_key(kimi, "linear_attn_config.kda_layers", boost::json::array{1, 1}))
                .find("layer 1 listed twice"),
            std::string::npos);
}

TEST(PlannerModel, ValuesAtTheirBoundsAndWholeFloatsAreAccepted) {
  EXPECT_EQ(
      parse_model(with_key("qwen3.5-27b.json", "text_config.hidden_size", 5120.0)).hidden_size,
      5120u);
  const ModelSpec wide =
      parse_model(with_key("qwen3.5-27b.json", "text_config.linear_num_value_heads", 1024));
  EXPECT_EQ(wide.linear_value_heads, 1024u);
  EXPECT_EQ(kernels::validate(wide.state_layout()), "");
  const ModelSpec wide_conv =
      parse_model(with_key("qwen3.5-27b.json", "text_config.linear_conv_kernel_dim", 65));
  EXPECT_EQ(wide_conv.state_layout().conv_width, kernels::kMaxConvWidth);
  EXPECT_EQ(
      parse_model(with_key("kimi-linear-48b-a3b-instruct.json", "q_lora_rank", 65536)).kv_lora_rank,
      512u);
}

// Regression: 1e6 layers in a config with layer_types said "length differs"; the range of
// the key itself comes first.
TEST(PlannerModel, LayerCountIsCheckedBeforeTheLayerList) {
  EXPECT_EQ(error_of(with_key("qwen3.5-27b.json", "text_config.num_hidden_layers", 1000000)),
            "config.json: text_config.num_hidden_layers must be between 1 and 1024, got 1000000");
  EXPECT_EQ(error_of(with_key("qwen3.5-27b.json", "text_config.num_hidden_layers", 63)),
            "config.json: text_config.layer_types has 64 entries, text_config.num_hidden_layers "
            "is 63");
}

// Keys each within range whose combination the pool or the planner's arithmetic cannot
// take: the message names the keys and the limit.
TEST(PlannerModel, DerivedLimitsNameTheKeys) {
  // 2 x 16 x 128 + 1024 x 1024 conv channels.
  std::string e =
      error_of(set_key(with_key("qwen3-next-80b-a3b-instruct.json", "linear_num_value_heads", 1024),
                       "linear_value_head_dim", 1024));
  EXPECT_EQ(e,
            "config.json: the short-conv channels per layer, 2 x linear_num_key_heads x "
            "linear_key_head_dim + linear_num_value_heads x linear_value_head_dim = 1052672, "
            "must be at most 1048576");
  // 48 layers x 48 heads x 4096 x 128 x 4 B > 4 GiB.
  e = error_of(with_key("qwen3.5-27b.json", "text_config.linear_key_head_dim", 4096));
  EXPECT_NE(
      e.find("one request's FP32 state, 48 linear layers x text_config.linear_num_value_heads "
             "x text_config.linear_key_head_dim x text_config.linear_value_head_dim"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("must be at most the pool's page limit of 4294967296 bytes"), std::string::npos)
      << e;
  // 48 x 1024 x 4096 key rows of one value each: a page under 1 GiB, but no plan holds it.
  std::string rows = with_key("qwen3.5-27b.json", "text_config.linear_num_key_heads", 1);
  rows = set_key(rows, "text_config.linear_num_value_heads", 1024);
  rows = set_key(rows, "text_config.linear_key_head_dim", 4096);
  rows = set_key(rows, "text_config.linear_value_head_dim", 1);
  e = error_of(rows);
  EXPECT_NE(e.find("= 201326592 key rows of state, more than a STEPQuant plan describes (at most "
                   "67108864)"),
            std::string::npos)
      << e;
  // KV per token: 12 layers x 2 x 1024 x 256.
  e = error_of(with_key("qwen3-next-80b-a3b-instruct.json", "num_key_value_heads", 1024));
  EXPECT_EQ(e,
            "config.json: the KV cache per token, 12 full-attention layers x 2 x "
            "num_key_value_heads x head_dim = 6291456 elements, must be at most 262144");
  e = error_of(with_key("kimi-linear-48b-a3b-instruct.json", "kv_lora_rank", 65536));
  EXPECT_NE(e.find("7 full-attention layers x (kv_lora_rank + qk_rope_head_dim)"),
            std::string::npos)
      << e;
  e = error_of(with_key("qwen3.5-27b.json", "text_config.linear_num_value_heads", 40));
  EXPECT_EQ(e,
            "config.json: text_config.linear_num_value_heads (40) must be a multiple of "
            "text_config.linear_num_key_heads (16)");
}

// Regression: linear_conv_kernel_dim 1 failed the layout invariant "conv_channels and
// conv_width must both be 0 or both be non-zero". A causal conv of kernel k keeps the
// last k - 1 inputs; kernel 1 is a per-channel scale with no history: weights, no state.
TEST(PlannerModel, ConvKernelOneHasWeightsButNoConvState) {
  const ModelSpec four = load_model(model_path("qwen3.5-27b.json"));
  const ModelSpec one =
      parse_model(with_key("qwen3.5-27b.json", "text_config.linear_conv_kernel_dim", 1));
  EXPECT_EQ(one.conv_kernel, 1u);
  EXPECT_EQ(one.conv_channels, four.conv_channels);  // the model's channels, for the weights
  const kernels::StateLayout layout = one.state_layout();
  EXPECT_EQ(layout.conv_width, 0u);
  EXPECT_EQ(layout.conv_channels, 0u);
  EXPECT_EQ(kernels::validate(layout), "");
  EXPECT_EQ(four.parameters - one.parameters, 48ull * four.conv_channels * 3);
  const ModelSpec kda = parse_model(with_key("kimi-linear-48b-a3b-instruct.json",
                                             "linear_attn_config.short_conv_kernel_size", 1));
  EXPECT_EQ(kda.state_layout().conv_channels, 0u);
  EXPECT_NE(error_of(with_key("qwen3.5-27b.json", "text_config.linear_conv_kernel_dim", 0))
                .find("linear_conv_kernel_dim must be between 1 and 65, got 0"),
            std::string::npos);
}

// Regression: a directory passed as the model was read as empty text and reported as
// "not valid JSON"; file problems are now said as such (calibration::read_file).
TEST(PlannerModel, FileProblemsAreNamedNotParsed) {
  testing::TempDir dir;
  const auto message = [](const std::string& path) -> std::string {
    try {
      (void)load_model(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no runtime_error";
  };
  std::string e = message(dir.path());
  EXPECT_EQ(e, dir.path() + ": is a directory");
  e = message(dir.file("missing.json"));
  EXPECT_EQ(e, dir.file("missing.json") + ": cannot open: No such file or directory");
  const std::string big = dir.file("big.json");
  testing::write_bytes(big, std::string(kMaxModelConfigBytes + 1, ' '));
  EXPECT_NE(message(big).find("larger than the limit of 1048576"), std::string::npos);
  if (::geteuid() != 0) {  // root reads any file
    const std::string locked = dir.file("locked.json");
    testing::write_bytes(locked, read_text("qwen3.5-27b.json"));
    ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
    EXPECT_EQ(message(locked), locked + ": cannot open: Permission denied");
  }
}

}  // namespace
}  // namespace statepool::planner
