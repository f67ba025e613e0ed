#include "statepool/planner/model.hpp"

#include <boost/json.hpp>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "statepool/support/read_file.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::planner {
namespace {

namespace json = boost::json;

/// A JSON value for a message: numbers as written, text quoted and clipped.
std::string shown(const json::value& v) {
  if (const auto* i = v.if_int64()) return std::to_string(*i);
  if (const auto* u = v.if_uint64()) return std::to_string(*u);
  if (const auto* d = v.if_double()) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", *d);
    return text;
  }
  std::string text = json::serialize(v);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

/// Field access with error messages naming the full path ("text_config.head_dim").
class Fields {
 public:
  Fields(const json::object& obj, std::string prefix, std::string source)
      : obj_(&obj), prefix_(std::move(prefix)), source_(std::move(source)) {}

  [[noreturn]] void fail(std::string_view what, std::string_view name) const {
    throw std::invalid_argument(source_ + ": " + std::string(what) + " " + key(name));
  }
  /// "SOURCE: KEY must be ..., got VALUE".
  [[noreturn]] void fail_range(std::string_view name, std::uint64_t min, std::uint64_t max,
                               std::string_view got, bool whole = true) const {
    throw std::invalid_argument(
        source_ + ": " + key(name) + " must be " + (whole ? "" : "a whole number ") + "between " +
        std::to_string(min) + " and " + std::to_string(max) + ", got " + std::string(got));
  }
  /// Any other problem of the whole: "SOURCE: TEXT".
  [[noreturn]] void fail_text(const std::string& text) const {
    throw std::invalid_argument(source_ + ": " + text);
  }
  /// The key as config.json spells it, with its enclosing objects ("text_config.head_dim").
  [[nodiscard]] std::string key(std::string_view name) const { return prefix_ + std::string(name); }
  [[nodiscard]] const json::value* find(std::string_view name) const {
    const json::value* v = obj_->if_contains(name);
    return (v == nullptr || v->is_null()) ? nullptr : v;
  }
  [[nodiscard]] bool has(std::string_view name) const { return find(name) != nullptr; }

  /// A required whole number in [min, max] (max at most 2^32 - 1).
  [[nodiscard]] std::uint32_t number(std::string_view name, std::uint32_t min,
                                     std::uint32_t max) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    return static_cast<std::uint32_t>(as_number(*v, name, min, max));
  }
  /// An optional one: `fallback` when absent or null.
  [[nodiscard]] std::uint32_t number_or(std::string_view name, std::uint32_t fallback,
                                        std::uint32_t min, std::uint32_t max) const {
    return has(name) ? number(name, min, max) : fallback;
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
  /// A required list of whole numbers in [min, max]; an entry's message names it
  /// ("linear_attn_config.kda_layers[3] must be between 1 and 27, got 0").
  [[nodiscard]] std::vector<std::uint32_t> number_list(std::string_view name, std::uint32_t min,
                                                       std::uint32_t max) const {
    const json::value* v = find(name);
    if (v == nullptr) fail("missing", name);
    if (!v->is_array()) fail("expected a list in", name);
    std::vector<std::uint32_t> out;
    for (const json::value& item : v->get_array()) {
      const std::string entry = std::string(name) + "[" + std::to_string(out.size()) + "]";
      out.push_back(static_cast<std::uint32_t>(as_number(item, entry, min, max)));
    }
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
  // Integers, and floats with a whole value (48.0, 1e9): JSON does not tell them apart.
  [[nodiscard]] std::uint64_t as_number(const json::value& v, std::string_view entry,
                                        std::uint64_t min, std::uint64_t max) const {
    bool whole = true;
    bool in_range = false;
    std::uint64_t value = 0;
    if (const auto* i = v.if_int64()) {
      in_range =
          *i >= 0 && static_cast<std::uint64_t>(*i) >= min && static_cast<std::uint64_t>(*i) <= max;
      value = static_cast<std::uint64_t>(*i);
    } else if (const auto* u = v.if_uint64()) {
      in_range = *u >= min && *u <= max;
      value = *u;
    } else if (const auto* d = v.if_double()) {
      whole = std::isfinite(*d) && std::floor(*d) == *d;
      // max < 2^53: a whole double in range converts exactly.
      in_range = whole && *d >= static_cast<double>(min) && *d <= static_cast<double>(max);
      if (in_range) value = static_cast<std::uint64_t>(*d);
    } else {
      whole = false;
    }
    if (!in_range) fail_range(entry, min, max, shown(v), whole);
    return value;
  }

  const json::object* obj_;
  std::string prefix_;
  std::string source_;
};

constexpr const char* kSupported = "supported: qwen3_next, qwen3_5, qwen3_5_moe, kimi_linear";

std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  return a * b;
}

using kernels::kMaxHeadDim;
using kernels::kMaxHeads;
using kernels::kMaxLayers;

/// The config.json keys behind the linear-attention geometry, for the derived limits'
/// messages.
struct StateKeys {
  std::string heads;      ///< the state heads (value heads)
  std::string key_dim;    ///< K
  std::string value_dim;  ///< V
  std::string conv;       ///< how the conv channels are counted
};

/// Limits of combinations of keys (each key being within its range): the whole state of
/// one request, tp = 1, must be a layout the pool can hold, and the KV cache per token
/// bounded, so that plan()'s byte counts stay exact (planner.hpp, "Input bounds").
void check_derived(const Fields& t, const ModelSpec& m, const StateKeys& keys) {
  const auto count = [](std::uint64_t v) { return std::to_string(v); };
  if (m.linear_layers == 0) t.fail_text("no linear-attention layers in config");
  if (m.conv_kernel > 1 && m.conv_channels > kernels::kMaxConvChannels) {
    t.fail_text("the short-conv channels per layer, " + keys.conv + " = " + count(m.conv_channels) +
                ", must be at most " + count(kernels::kMaxConvChannels));
  }
  const std::uint64_t rows =
      std::uint64_t{m.linear_layers} * m.linear_value_heads * m.linear_key_dim;
  const std::uint64_t conv =
      m.conv_kernel > 1 ? std::uint64_t{m.linear_layers} * m.conv_channels * (m.conv_kernel - 1) * 2
                        : 0;
  const std::uint64_t fp32_page = rows * m.linear_value_dim * 4 + conv;
  if (fp32_page > kernels::kMaxPageBytes) {
    t.fail_text("one request's FP32 state, " + count(m.linear_layers) + " linear layers x " +
                keys.heads + " x " + keys.key_dim + " x " + keys.value_dim +
                " x 4 B + the conv state = " + count(fp32_page) +
                " bytes, must be at most the pool's page limit of " +
                count(kernels::kMaxPageBytes) + " bytes");
  }
  // stepquant rows are sized with a nominal plan, one impact factor per key row; a plan
  // holding more could be neither stored nor installed (kMaxPlanBytes).
  const std::uint64_t max_rows = kernels::stepquant::kMaxPlanBytes / sizeof(float);
  if (rows > max_rows) {
    t.fail_text(count(m.linear_layers) + " linear layers x " + keys.heads + " x " + keys.key_dim +
                " = " + count(rows) +
                " key rows of state, more than a STEPQuant plan describes (at most " +
                count(max_rows) + ")");
  }
  const std::uint64_t kv = m.kv_elements_per_token();
  if (kv > kMaxKvElementsPerToken) {
    const std::string how = m.attention == AttentionKind::mla
                                ? count(m.full_layers) + " full-attention layers x (" +
                                      t.key("kv_lora_rank") + " + " + t.key("qk_rope_head_dim") +
                                      ")"
                                : count(m.full_layers) + " full-attention layers x 2 x " +
                                      t.key("num_key_value_heads") + " x " + t.key("head_dim");
    t.fail_text("the KV cache per token, " + how + " = " + count(kv) +
                " elements, must be at most " + count(kMaxKvElementsPerToken));
  }
  // Every limit of kernels::validate() is covered above; this only guards that promise.
  if (const std::string problem = kernels::validate(m.state_layout()); !problem.empty())
    t.fail_text("the linear-attention state is not one the pool can hold: " + problem);
}

// --- Qwen3-Next / Qwen3.5 (GDN) -------------------------------------------------------
void parse_qwen(const Fields& t, const Fields& top, ModelSpec& m) {
  m.arch = kernels::Arch::gdn;
  m.hidden_size = t.number("hidden_size", 1, kMaxHiddenSize);
  m.num_layers = t.number("num_hidden_layers", 1, kMaxLayers);
  if (t.has("layer_types")) {
    const auto types = t.str_list("layer_types");
    if (types.size() != m.num_layers) {
      t.fail_text(t.key("layer_types") + " has " + std::to_string(types.size()) + " entries, " +
                  t.key("num_hidden_layers") + " is " + std::to_string(m.num_layers));
    }
    for (const auto& type : types) {
      if (type == "full_attention") {
        ++m.full_layers;
      } else if (type == "linear_attention") {
        ++m.linear_layers;
      } else {
        t.fail("unknown layer type '" + type.substr(0, 40) + "' in", "layer_types");
      }
    }
  } else {
    // Qwen3-Next: layer i (0-based) is full attention iff (i + 1) % interval == 0.
    const std::uint32_t interval = t.number("full_attention_interval", 1, kMaxLayers);
    for (std::uint32_t i = 0; i < m.num_layers; ++i) {
      if ((i + 1) % interval == 0) {
        ++m.full_layers;
      } else {
        ++m.linear_layers;
      }
    }
  }
  m.linear_key_heads = t.number("linear_num_key_heads", 1, kMaxHeads);
  m.linear_value_heads = t.number("linear_num_value_heads", 1, kMaxHeads);
  m.linear_key_dim = t.number("linear_key_head_dim", 1, kMaxHeadDim);
  m.linear_value_dim = t.number("linear_value_head_dim", 1, kMaxHeadDim);
  m.conv_kernel = t.number("linear_conv_kernel_dim", 1, kMaxConvKernel);
  // At most 3 x 2^22: no overflow in 32 bits.
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
    t.fail("unsupported value '" + ssm.substr(0, 40) + "' in", "mamba_ssm_dtype");
  }

  m.attention = AttentionKind::gqa;
  m.attention_heads = t.number("num_attention_heads", 1, kMaxHeads);
  m.kv_heads = t.number("num_key_value_heads", 1, kMaxHeads);
  m.head_dim = t.number("head_dim", 1, kMaxHeadDim);

  // Parameters (see docs/capacity.md, "Parameter count"). The key ranges bound every
  // term: a layer stays below 2^49, the whole model below 2^60.
  const std::uint64_t h = m.hidden_size;
  const std::uint64_t vocab = t.number("vocab_size", 1, kMaxVocabSize);
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
    const std::uint64_t experts = t.number("num_experts", 1, kMaxExperts);
    const std::uint64_t moe = t.number("moe_intermediate_size", 1, kMaxIntermediateSize);
    const std::uint64_t shared =
        t.number_or("shared_expert_intermediate_size", 0, 0, kMaxIntermediateSize);
    // Router, routed experts (gate/up/down), shared expert and its sigmoid gate.
    mlp = experts * h + experts * 3 * h * moe + 3 * h * shared + (shared > 0 ? h : 0);
  } else {
    mlp = 3 * h * t.number("intermediate_size", 1, kMaxIntermediateSize);
  }
  m.embedding_parameters = vocab * h * (tied ? 1 : 2);
  m.parameters = m.embedding_parameters + h + m.linear_layers * gdn + m.full_layers * attn +
                 m.num_layers * (mlp + 2 * h);
  if (m.linear_value_heads % m.linear_key_heads != 0) {
    // Each value head reads one key head.
    t.fail_text(t.key("linear_num_value_heads") + " (" + std::to_string(m.linear_value_heads) +
                ") must be a multiple of " + t.key("linear_num_key_heads") + " (" +
                std::to_string(m.linear_key_heads) + ")");
  }
  check_derived(
      t, m,
      {t.key("linear_num_value_heads"), t.key("linear_key_head_dim"),
       t.key("linear_value_head_dim"),
       "2 x " + t.key("linear_num_key_heads") + " x " + t.key("linear_key_head_dim") + " + " +
           t.key("linear_num_value_heads") + " x " + t.key("linear_value_head_dim")});
}

// --- Kimi-Linear (KDA + MLA) ----------------------------------------------------------
void parse_kimi(const Fields& t, ModelSpec& m) {
  m.arch = kernels::Arch::kda;
  m.hidden_size = t.number("hidden_size", 1, kMaxHiddenSize);
  m.num_layers = t.number("num_hidden_layers", 1, kMaxLayers);
  const Fields la = t.sub("linear_attn_config");
  // 1-based layer lists.
  const auto kda = la.number_list("kda_layers", 1, m.num_layers);
  const auto full = la.number_list("full_attn_layers", 1, m.num_layers);
  std::vector<int> seen(m.num_layers, 0);
  auto mark = [&](const std::vector<std::uint32_t>& list, std::string_view name) {
    for (const std::uint32_t layer : list) {
      if (seen[layer - 1]++ != 0)
        la.fail("layer " + std::to_string(layer) + " listed twice in", name);
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
  const std::uint32_t heads = la.number("num_heads", 1, kMaxHeads);
  const std::uint32_t hd = la.number("head_dim", 1, kMaxHeadDim);
  m.linear_key_heads = m.linear_value_heads = heads;
  m.linear_key_dim = m.linear_value_dim = hd;
  m.conv_kernel = la.number("short_conv_kernel_size", 1, kMaxConvKernel);
  m.conv_channels = 3 * heads * hd;  // separate q, k and v short convolutions; < 2^24
  m.state_dtype = kernels::DType::bf16;
  m.state_dtype_declared = false;

  m.attention = AttentionKind::mla;
  m.attention_heads = t.number("num_attention_heads", 1, kMaxHeads);
  m.kv_lora_rank = t.number("kv_lora_rank", 1, kMaxLoraRank);
  m.qk_rope_head_dim = t.number("qk_rope_head_dim", 1, kMaxHeadDim);
  const std::uint64_t nope = t.number("qk_nope_head_dim", 1, kMaxHeadDim);
  const std::uint64_t vdim = t.number("v_head_dim", 1, kMaxHeadDim);

  const std::uint64_t h = m.hidden_size;
  const std::uint64_t vocab = t.number("vocab_size", 1, kMaxVocabSize);
  const bool tied = t.bool_or("tie_word_embeddings", false);
  const std::uint64_t p = std::uint64_t{heads} * hd;
  // KDA: q/k/v projections, three short convs, f (a: hidden->head_dim, b: ->p), g (same),
  // beta projection (one per head), A_log, dt_bias, output norm, output projection.
  const std::uint64_t kda_params = 3 * h * p + 3 * p * m.conv_kernel + 2 * (h * hd + hd * p) +
                                   h * heads + heads + p + hd + h * p;
  const std::uint64_t H = m.attention_heads, r = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  std::uint64_t q_proj = h * H * (nope + rope);
  if (t.has("q_lora_rank")) {
    const std::uint64_t qr = t.number("q_lora_rank", 1, kMaxLoraRank);
    q_proj = h * qr + qr + qr * H * (nope + rope);
  }
  // MLA: q, kv_a (latent + rope key), latent norm, kv_b, output projection.
  const std::uint64_t mla = q_proj + h * (r + rope) + r + r * H * (nope + vdim) + H * vdim * h;
  const std::uint64_t experts = t.number("num_experts", 1, kMaxExperts);
  const std::uint64_t moe_i = t.number("moe_intermediate_size", 1, kMaxIntermediateSize);
  const std::uint64_t shared = t.number_or("num_shared_experts", 0, 0, kMaxExperts);
  // Router weight + score-correction bias, routed and shared experts.
  const std::uint64_t moe =
      experts * h + experts + experts * 3 * h * moe_i + shared * 3 * h * moe_i;
  const std::uint64_t dense_layers = t.number_or("first_k_dense_replace", 0, 0, m.num_layers);
  const std::uint64_t dense =
      dense_layers > 0 ? 3 * h * t.number("intermediate_size", 1, kMaxIntermediateSize) : 0;
  m.embedding_parameters = vocab * h * (tied ? 1 : 2);
  m.parameters = m.embedding_parameters + h + m.linear_layers * kda_params + m.full_layers * mla +
                 dense_layers * dense + (m.num_layers - dense_layers) * moe +
                 std::uint64_t{m.num_layers} * 2 * h;
  check_derived(t, m,
                {la.key("num_heads"), la.key("head_dim"), la.key("head_dim"),
                 "3 x " + la.key("num_heads") + " x " + la.key("head_dim")});
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
  layout.conv_width = conv_kernel > 0 ? conv_kernel - 1 : 0;
  layout.conv_channels = layout.conv_width > 0 ? conv_channels : 0;
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
      throw std::invalid_argument(src + ": unsupported architecture '" + a.substr(0, 64) +
                                  "' (architectures); " + kSupported);
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
    throw std::invalid_argument(src + ": unsupported architecture '" + type.substr(0, 64) +
                                "' (model_type); " + kSupported);
  }
  return m;
}

ModelSpec load_model(const std::string& path) {
  return parse_model(support::read_file(path, kMaxModelConfigBytes), path);
}

}  // namespace statepool::planner
