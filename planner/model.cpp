#include "statepool/planner/model.hpp"

#include <boost/json.hpp>

#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace statepool::planner {
namespace {

namespace json = boost::json;

/// Field access with error messages naming the full path ("text_config.head_dim").
class Fields {
 public:
  Fields(const json::object& obj, std::string prefix, std::string source)
      : obj_(&obj), prefix_(std::move(prefix)), source_(std::move(source)) {}

  [[noreturn]] void fail(std::string_view what, std::string_view name) const {
    throw std::invalid_argument(source_ + ": " + std::string(what) + " " + prefix_ +
                                std::string(name));
  }
  [[nodiscard]] const json::value* find(std::string_view name) const {
    const json::value* v = obj_->if_contains(name);
    return (v == nullptr || v->is_null()) ? nullptr : v;
  }
  [[nodiscard]] bool has(std::string_view name) const { return find(name) != nullptr; }

  [[nodiscard]] std::uint64_t u64(std::string_view name) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    return as_u64(*v, name);
  }
  [[nodiscard]] std::uint32_t u32(std::string_view name) const {
    const std::uint64_t v = u64(name);
    if (v > std::numeric_limits<std::uint32_t>::max()) fail("out of range:", name);
    return static_cast<std::uint32_t>(v);
  }
  /// A positive count.
  [[nodiscard]] std::uint32_t count(std::string_view name) const {
    const std::uint32_t v = u32(name);
    if (v == 0) fail("zero value for", name);
    return v;
  }
  [[nodiscard]] std::uint32_t u32_or(std::string_view name, std::uint32_t fallback) const {
    return has(name) ? u32(name) : fallback;
  }
  [[nodiscard]] std::string str_or(std::string_view name, std::string fallback) const {
    const json::value* v = find(name);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail("expected a string in", name);
    return std::string(v->get_string());
  }
  [[nodiscard]] bool bool_or(std::string_view name, bool fallback) const {
    const json::value* v = find(name);
    if (v == nullptr) return fallback;
    if (!v->is_bool()) fail("expected true/false in", name);
    return v->get_bool();
  }
  [[nodiscard]] std::vector<std::uint64_t> u64_list(std::string_view name) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    if (!v->is_array()) fail("expected a list in", name);
    std::vector<std::uint64_t> out;
    for (const json::value& item : v->get_array()) out.push_back(as_u64(item, name));
    return out;
  }
  [[nodiscard]] std::vector<std::string> str_list(std::string_view name) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    if (!v->is_array()) fail("expected a list in", name);
    std::vector<std::string> out;
    for (const json::value& item : v->get_array()) {
      if (!item.is_string()) fail("expected strings in", name);
      out.emplace_back(item.get_string());
    }
    return out;
  }
  [[nodiscard]] Fields sub(std::string_view name) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    if (!v->is_object()) fail("expected an object in", name);
    return Fields(v->get_object(), prefix_ + std::string(name) + ".", source_);
  }
  [[nodiscard]] const std::string& source() const { return source_; }

 private:
  [[nodiscard]] std::uint64_t as_u64(const json::value& v, std::string_view name) const {
    if (const auto* i = v.if_int64()) {
      if (*i < 0) fail("negative value in", name);
      return static_cast<std::uint64_t>(*i);
    }
    if (const auto* u = v.if_uint64()) return *u;
    fail("expected a non-negative integer in", name);
  }

  const json::object* obj_;
  std::string prefix_;
  std::string source_;
};

constexpr const char* kSupported = "supported: qwen3_next, qwen3_5, qwen3_5_moe, kimi_linear";

std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  return a * b;
}

// --- Qwen3-Next / Qwen3.5 (GDN) -------------------------------------------------------
void parse_qwen(const Fields& t, const Fields& top, ModelSpec& m) {
  m.arch = kernels::Arch::gdn;
  m.hidden_size = t.count("hidden_size");
  m.num_layers = t.count("num_hidden_layers");
  if (t.has("layer_types")) {
    const auto types = t.str_list("layer_types");
    if (types.size() != m.num_layers)
      t.fail("length differs from num_hidden_layers:", "layer_types");
    for (const auto& type : types) {
      if (type == "full_attention") {
        ++m.full_layers;
      } else if (type == "linear_attention") {
        ++m.linear_layers;
      } else {
        t.fail("unknown layer type '" + type + "' in", "layer_types");
      }
    }
  } else {
    // Qwen3-Next: layer i (0-based) is full attention iff (i + 1) % interval == 0.
    const std::uint32_t interval = t.count("full_attention_interval");
    for (std::uint32_t i = 0; i < m.num_layers; ++i) {
      if ((i + 1) % interval == 0) {
        ++m.full_layers;
      } else {
        ++m.linear_layers;
      }
    }
  }
  m.linear_key_heads = t.count("linear_num_key_heads");
  m.linear_value_heads = t.count("linear_num_value_heads");
  m.linear_key_dim = t.count("linear_key_head_dim");
  m.linear_value_dim = t.count("linear_value_head_dim");
  m.conv_kernel = t.count("linear_conv_kernel_dim");
  m.conv_channels =
      2 * m.linear_key_heads * m.linear_key_dim + m.linear_value_heads * m.linear_value_dim;
  const std::string ssm = t.str_or("mamba_ssm_dtype", "");
  if (ssm == "float32") {
    m.state_dtype = kernels::DType::f32;
    m.state_dtype_declared = true;
  } else if (ssm == "bfloat16") {
    m.state_dtype = kernels::DType::bf16;
    m.state_dtype_declared = true;
  } else if (ssm.empty()) {
    m.state_dtype = kernels::DType::bf16;
  } else {
    t.fail("unsupported value '" + ssm + "' in", "mamba_ssm_dtype");
  }

  m.attention = AttentionKind::gqa;
  m.attention_heads = t.count("num_attention_heads");
  m.kv_heads = t.count("num_key_value_heads");
  m.head_dim = t.count("head_dim");

  // Parameters (see docs/capacity.md, "Parameter count").
  const std::uint64_t h = m.hidden_size;
  const std::uint64_t vocab = t.count("vocab_size");
  const bool tied = t.has("tie_word_embeddings") ? t.bool_or("tie_word_embeddings", false)
                                                 : top.bool_or("tie_word_embeddings", false);
  const std::uint64_t kh = m.linear_key_heads, vh = m.linear_value_heads;
  const std::uint64_t kd = m.linear_key_dim, vd = m.linear_value_dim;
  // GDN: q,k,v,z projections, b and a (one per value head), conv, dt_bias, A_log, gated
  // norm (one value head wide), out projection.
  const std::uint64_t gdn = h * (2 * kh * kd + 2 * vh * vd) + h * 2 * vh +
                            std::uint64_t{m.conv_channels} * m.conv_kernel + 2 * vh + vd +
                            vh * vd * h;
  // Gated attention (q projection doubled by the output gate), q/k norms.
  const std::uint64_t nh = m.attention_heads, nkv = m.kv_heads, hd = m.head_dim;
  const bool gate = m.family == Family::qwen3_next ? true : t.bool_or("attn_output_gate", true);
  const std::uint64_t attn = h * nh * hd * (gate ? 2 : 1) + 2 * h * nkv * hd + nh * hd * h + 2 * hd;
  std::uint64_t mlp = 0;
  if (t.has("num_experts")) {
    const std::uint64_t experts = t.count("num_experts");
    const std::uint64_t moe = t.count("moe_intermediate_size");
    const std::uint64_t shared = t.u32_or("shared_expert_intermediate_size", 0);
    // Router, routed experts (gate/up/down), shared expert and its sigmoid gate.
    mlp = experts * h + experts * 3 * h * moe + 3 * h * shared + (shared > 0 ? h : 0);
  } else {
    mlp = 3 * h * t.count("intermediate_size");
  }
  m.embedding_parameters = vocab * h * (tied ? 1 : 2);
  m.parameters = m.embedding_parameters + h + m.linear_layers * gdn + m.full_layers * attn +
                 m.num_layers * (mlp + 2 * h);
}

// --- Kimi-Linear (KDA + MLA) ----------------------------------------------------------
void parse_kimi(const Fields& t, ModelSpec& m) {
  m.arch = kernels::Arch::kda;
  m.hidden_size = t.count("hidden_size");
  m.num_layers = t.count("num_hidden_layers");
  const Fields la = t.sub("linear_attn_config");
  // 1-based layer lists.
  const auto kda = la.u64_list("kda_layers");
  const auto full = la.u64_list("full_attn_layers");
  std::vector<int> seen(m.num_layers, 0);
  auto mark = [&](const std::vector<std::uint64_t>& list, std::string_view name) {
    for (const std::uint64_t layer : list) {
      if (layer < 1 || layer > m.num_layers) la.fail("1-based layer out of range in", name);
      if (seen[layer - 1]++ != 0) la.fail("layer listed twice in", name);
    }
  };
  mark(kda, "kda_layers");
  mark(full, "full_attn_layers");
  for (std::uint32_t i = 0; i < m.num_layers; ++i) {
    if (seen[i] == 0) la.fail("layer " + std::to_string(i + 1) + " missing from", "kda_layers");
  }
  m.linear_layers = static_cast<std::uint32_t>(kda.size());
  m.full_layers = static_cast<std::uint32_t>(full.size());
  // The top-level head_dim (hidden / heads) is used by neither attention type.
  const std::uint32_t heads = la.count("num_heads");
  const std::uint32_t hd = la.count("head_dim");
  m.linear_key_heads = m.linear_value_heads = heads;
  m.linear_key_dim = m.linear_value_dim = hd;
  m.conv_kernel = la.count("short_conv_kernel_size");
  m.conv_channels = 3 * heads * hd;  // separate q, k and v short convolutions
  m.state_dtype = kernels::DType::bf16;
  m.state_dtype_declared = false;

  m.attention = AttentionKind::mla;
  m.attention_heads = t.count("num_attention_heads");
  m.kv_lora_rank = t.count("kv_lora_rank");
  m.qk_rope_head_dim = t.count("qk_rope_head_dim");
  const std::uint64_t nope = t.count("qk_nope_head_dim");
  const std::uint64_t vdim = t.count("v_head_dim");

  const std::uint64_t h = m.hidden_size;
  const std::uint64_t vocab = t.count("vocab_size");
  const bool tied = t.bool_or("tie_word_embeddings", false);
  const std::uint64_t p = std::uint64_t{heads} * hd;
  // KDA: q/k/v projections, three short convs, f (a: hidden->head_dim, b: ->p), g (same),
  // beta projection (one per head), A_log, dt_bias, output norm, output projection.
  const std::uint64_t kda_params = 3 * h * p + 3 * p * m.conv_kernel + 2 * (h * hd + hd * p) +
                                   h * heads + heads + p + hd + h * p;
  const std::uint64_t H = m.attention_heads, r = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  std::uint64_t q_proj = h * H * (nope + rope);
  if (t.has("q_lora_rank")) {
    const std::uint64_t qr = t.count("q_lora_rank");
    q_proj = h * qr + qr + qr * H * (nope + rope);
  }
  // MLA: q, kv_a (latent + rope key), latent norm, kv_b, output projection.
  const std::uint64_t mla = q_proj + h * (r + rope) + r + r * H * (nope + vdim) + H * vdim * h;
  const std::uint64_t experts = t.count("num_experts");
  const std::uint64_t moe_i = t.count("moe_intermediate_size");
  const std::uint64_t shared = t.u32_or("num_shared_experts", 0);
  // Router weight + score-correction bias, routed and shared experts.
  const std::uint64_t moe =
      experts * h + experts + experts * 3 * h * moe_i + shared * 3 * h * moe_i;
  const std::uint64_t dense_layers = t.u32_or("first_k_dense_replace", 0);
  if (dense_layers > m.num_layers)
    t.fail("larger than num_hidden_layers:", "first_k_dense_replace");
  const std::uint64_t dense = dense_layers > 0 ? 3 * h * t.count("intermediate_size") : 0;
  m.embedding_parameters = vocab * h * (tied ? 1 : 2);
  m.parameters = m.embedding_parameters + h + m.linear_layers * kda_params + m.full_layers * mla +
                 dense_layers * dense + (m.num_layers - dense_layers) * moe + m.num_layers * 2 * h;
}

}  // namespace

const char* to_string(Family family) noexcept {
  switch (family) {
    case Family::qwen3_next: return "qwen3_next";
    case Family::qwen3_5: return "qwen3_5";
    case Family::kimi_linear: return "kimi_linear";
  }
  return "?";
}

const char* to_string(AttentionKind kind) noexcept {
  return kind == AttentionKind::gqa ? "gqa" : "mla";
}

kernels::StateLayout ModelSpec::state_layout() const {
  kernels::StateLayout layout;
  layout.name = model_type;
  layout.arch = arch;
  layout.num_layers = linear_layers;
  layout.num_heads = linear_value_heads;
  layout.key_dim = linear_key_dim;
  layout.value_dim = linear_value_dim;
  layout.conv_channels = conv_channels;
  layout.conv_width = conv_kernel > 0 ? conv_kernel - 1 : 0;
  layout.conv_dtype = kernels::DType::bf16;
  layout.codec.id = kernels::CodecId::fp32;
  return layout;
}

std::uint64_t ModelSpec::kv_elements_per_token() const noexcept {
  if (attention == AttentionKind::mla) {
    return mul(full_layers, std::uint64_t{kv_lora_rank} + qk_rope_head_dim);
  }
  return mul(full_layers, 2ull * kv_heads * head_dim);
}

ModelSpec parse_model(std::string_view json_text, std::string_view source) {
  const std::string src(source);
  boost::system::error_code ec;
  const json::value root = json::parse(json_text, ec);
  if (ec) throw std::invalid_argument(src + ": not valid JSON (" + ec.message() + ")");
  if (!root.is_object()) throw std::invalid_argument(src + ": expected a JSON object");
  const Fields top(root.get_object(), "", src);

  ModelSpec m;
  std::string type = top.str_or("model_type", "");
  if (type.empty()) {
    const json::value* arch = top.find("architectures");
    if (arch == nullptr) top.fail("missing", "model_type");
    const auto names = top.str_list("architectures");
    if (names.empty()) top.fail("missing", "model_type");
    const std::string& a = names.front();
    if (a == "Qwen3NextForCausalLM")
      type = "qwen3_next";
    else if (a == "Qwen3_5ForConditionalGeneration" || a == "Qwen3_5ForCausalLM")
      type = "qwen3_5";
    else if (a == "Qwen3_5MoeForConditionalGeneration" || a == "Qwen3_5MoeForCausalLM")
      type = "qwen3_5_moe";
    else if (a == "KimiLinearForCausalLM")
      type = "kimi_linear";
    else
      throw std::invalid_argument(src + ": unsupported architecture '" + a + "' (architectures); " +
                                  kSupported);
  }
  m.model_type = type;
  if (type == "qwen3_next") {
    m.family = Family::qwen3_next;
    parse_qwen(top, top, m);
  } else if (type == "qwen3_5" || type == "qwen3_5_moe") {
    m.family = Family::qwen3_5;
    parse_qwen(top.sub("text_config"), top, m);
  } else if (type == "qwen3_5_text" || type == "qwen3_5_moe_text") {
    m.family = Family::qwen3_5;  // a bare text config
    parse_qwen(top, top, m);
  } else if (type == "kimi_linear") {
    m.family = Family::kimi_linear;
    parse_kimi(top, m);
  } else {
    throw std::invalid_argument(src + ": unsupported architecture '" + type + "' (model_type); " +
                                kSupported);
  }
  if (m.linear_layers == 0) top.fail("no linear-attention layers in", "config");
  if (m.arch == kernels::Arch::gdn && m.linear_value_heads % m.linear_key_heads != 0) {
    top.fail("value heads not a multiple of key heads:", "linear_num_value_heads");
  }
  return m;
}

ModelSpec load_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open model config " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read model config " + path);
  return parse_model(text.str(), path);
}

}  // namespace statepool::planner
