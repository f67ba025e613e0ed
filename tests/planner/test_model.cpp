// config.json parsing: layer counts, linear geometry, KV geometry, parameter estimates,
// and errors that name the field.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "statepool/planner/model.hpp"

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

}  // namespace
}  // namespace statepool::planner
