#include "statepool/eval/model.hpp"

#include <algorithm>
#include <boost/crc.hpp>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "statepool/calibration/npy.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/support/read_file.hpp"

namespace statepool::eval {

namespace json = boost::json;
namespace kn = kernels;

namespace {

constexpr std::size_t kMaxTensorBytes = 256u << 20;
constexpr std::size_t kMaxManifestBytes = 1u << 20;

std::string crc32_hex(std::string_view bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  char text[9];
  std::snprintf(text, sizeof text, "%08x", static_cast<unsigned>(crc.checksum()));
  return text;
}

/// The manifest, with the path for messages.
struct Manifest {
  std::string path;
  json::object root;

  [[noreturn]] void fail(const std::string& what) const { throw ModelError(path + ": " + what); }

  const json::value& at(const json::object& object, std::string_view key,
                        const std::string& where) const {
    const json::value* value = object.if_contains(key);
    if (value == nullptr) fail(where + "missing \"" + std::string(key) + "\"");
    return *value;
  }
  std::string text(const json::object& object, std::string_view key,
                   const std::string& where = "") const {
    const json::value& value = at(object, key, where);
    if (!value.is_string()) fail(where + "\"" + std::string(key) + "\" must be a string");
    return std::string(value.get_string());
  }
  std::uint32_t number(std::string_view key, std::uint32_t min, std::uint32_t max) const {
    const json::value& value = at(root, key, "");
    const auto* n = value.if_int64();
    if (n == nullptr || *n < min || *n > max) {
      fail("\"" + std::string(key) + "\" must be an integer between " + std::to_string(min) +
           " and " + std::to_string(max) + ", got " + json::serialize(value));
    }
    return static_cast<std::uint32_t>(*n);
  }
};

Manifest read_manifest(const std::string& dir) {
  Manifest m;
  m.path = (std::filesystem::path(dir) / "manifest.json").string();
  std::string text;
  try {
    text = support::read_file(m.path, kMaxManifestBytes);
  } catch (const std::exception& e) {
    throw ModelError(std::string(e.what()) + " (is " + dir + " a model directory written by " +
                     "eval/train.py?)");
  }
  boost::system::error_code ec;
  json::value value = json::parse(text, ec);
  if (ec) m.fail("not valid JSON: " + ec.message());
  if (!value.is_object()) m.fail("must hold a JSON object");
  m.root = std::move(value.get_object());
  return m;
}

ModelConfig parse_config(const Manifest& m) {
  static const std::set<std::string> known = {
      "format",  "arch",    "vocab",     "d_model",    "layers",
      "heads",   "key_dim", "value_dim", "mlp_hidden", "gate_rank",
      "rms_eps", "tensors", "reference", "training",   "calibration_text"};
  for (const auto& entry : m.root) {
    if (known.count(std::string(entry.key())) == 0)
      m.fail("unknown key \"" + std::string(entry.key()) + "\"");
  }
  if (const std::string format = m.text(m.root, "format"); format != kModelFormat)
    m.fail("format is \"" + format + "\", this build reads \"" + kModelFormat + "\"");
  ModelConfig c;
  const std::string arch = m.text(m.root, "arch");
  if (arch == "gdn") {
    c.arch = kn::Arch::gdn;
  } else if (arch == "kda") {
    c.arch = kn::Arch::kda;
  } else {
    m.fail("\"arch\" must be \"gdn\" or \"kda\", got \"" + arch + "\"");
  }
  c.vocab = m.number("vocab", 256, 256);
  c.d_model = m.number("d_model", 1, 4096);
  c.layers = m.number("layers", 1, 64);
  c.heads = m.number("heads", 1, 64);
  c.key_dim = m.number("key_dim", 1, 512);
  c.value_dim = m.number("value_dim", 1, 512);
  c.mlp_hidden = m.number("mlp_hidden", 1, 16384);
  c.gate_rank =
      c.arch == kn::Arch::gdn ? m.number("gate_rank", 0, 0) : m.number("gate_rank", 1, 1024);
  const json::value& eps = m.at(m.root, "rms_eps", "");
  const double e = eps.is_double() ? eps.get_double() : -1.0;
  if (!(e > 0.0 && e < 1.0))
    m.fail("\"rms_eps\" must be a number in (0, 1), got " + json::serialize(eps));
  c.rms_eps = static_cast<float>(e);
  return c;
}

/// Reads one listed file: checks its CRC-32 against `entry` and returns its values after
/// checking the .npy header against `shape`.
std::vector<float> read_tensor(const Manifest& m, const std::string& dir, const std::string& name,
                               const json::object& entry, const std::vector<std::uint64_t>& shape) {
  const std::string where = "tensor \"" + name + "\": ";
  const std::string file = m.text(entry, "file", where);
  if (file.find('/') != std::string::npos || file.empty() || file[0] == '.')
    m.fail(where + "\"file\" must be a plain file name, got \"" + file + "\"");
  if (const std::string dtype = m.text(entry, "dtype", where); dtype != "float32")
    m.fail(where + "dtype is \"" + dtype + "\", only float32 is read");
  const json::value& listed = m.at(entry, "shape", where);
  std::vector<std::uint64_t> listed_shape;
  if (listed.is_array()) {
    for (const json::value& d : listed.get_array()) {
      if (!d.is_int64() || d.get_int64() < 0) m.fail(where + "\"shape\" must list sizes");
      listed_shape.push_back(static_cast<std::uint64_t>(d.get_int64()));
    }
  }
  if (listed_shape != shape) {
    m.fail(where + "shape " + json::serialize(listed) + ", this configuration needs " +
           calibration::shape_text(shape));
  }
  const std::string path = (std::filesystem::path(dir) / file).string();
  std::string bytes;
  try {
    bytes = support::read_file(path, kMaxTensorBytes);
  } catch (const std::exception& e) {
    throw ModelError(std::string(e.what()) + " (listed in " + m.path + ")");
  }
  const std::string crc = crc32_hex(bytes);
  if (const std::string want = m.text(entry, "crc32", where); crc != want) {
    throw ModelError(path + ": CRC-32 is " + crc + ", " + m.path + " says " + want +
                     ": the file is damaged or was changed (restore it, e.g. `git checkout " +
                     path + "`, or retrain with eval/train.py)");
  }
  const auto raw = std::as_bytes(std::span<const char>(bytes));
  calibration::NpyHeader header;
  try {
    header = calibration::parse_npy_header(raw, path);
  } catch (const calibration::NpyError& e) {
    throw ModelError(e.what());
  }
  if (header.shape != shape)
    throw ModelError(path + ": holds " + calibration::shape_text(header.shape) + ", expected " +
                     calibration::shape_text(shape));
  const std::uint64_t values = header.values();
  if (raw.size() != header.data_offset + values * sizeof(float))
    throw ModelError(path + ": " + std::to_string(raw.size()) + " bytes, a " +
                     calibration::shape_text(shape) + " float32 file has " +
                     std::to_string(header.data_offset + values * sizeof(float)));
  std::vector<float> out(values);
  std::memcpy(out.data(), raw.data() + header.data_offset, values * sizeof(float));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]))
      throw ModelError(path + ": value " + std::to_string(i) + " is not finite");
  }
  return out;
}

/// y = W x, W row-major [rows][cols].
void matvec(const std::vector<float>& w, std::size_t rows, std::size_t cols, const float* x,
            float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = w.data() + r * cols;
    float sum = 0.0f;
    for (std::size_t c = 0; c < cols; ++c) sum += row[c] * x[c];
    y[r] = sum;
  }
}

/// out = x / sqrt(mean(x^2) + eps) * weight, over n values.
void rms_norm(const float* x, std::size_t n, const std::vector<float>& weight, float eps,
              float* out) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

/// PyTorch's softplus (beta 1, threshold 20).
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
  return x * sigmoid(x);
}

}  // namespace

namespace {

/// One tensor of a layer: its name after "layers.{l}.", its shape, where it goes.
struct LayerTensor {
  const char* name;
  std::vector<std::uint64_t> shape;
  std::vector<float> Model::Layer::*member;
};

/// The tensors of one layer of a model of `c`, in manifest order.
std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  using L = Model::Layer;
  const std::uint64_t d = c.d_model, h = c.heads, k = c.key_dim, v = c.value_dim;
  std::vector<LayerTensor> out{
      {"attn_norm", {d}, &L::attn_norm}, {"q", {h * k, d}, &L::q}, {"k", {h * k, d}, &L::k},
      {"v", {h * v, d}, &L::v},          {"b", {h, d}, &L::b},     {"b.bias", {h}, &L::b_bias},
      {"A_log", {h}, &L::A_log}};
  if (c.arch == kn::Arch::kda) {
    out.push_back({"a_down", {c.gate_rank, d}, &L::a_down});
    out.push_back({"a", {h * k, c.gate_rank}, &L::a});
    out.push_back({"dt_bias", {h * k}, &L::dt_bias});
  } else {
    out.push_back({"a", {h, d}, &L::a});
    out.push_back({"dt_bias", {h}, &L::dt_bias});
  }
  out.push_back({"o_norm", {v}, &L::o_norm});
  out.push_back({"o", {d, h * v}, &L::o});
  out.push_back({"mlp_norm", {d}, &L::mlp_norm});
  out.push_back({"up", {c.mlp_hidden, d}, &L::up});
  out.push_back({"down", {d, c.mlp_hidden}, &L::down});
  return out;
}

std::string layer_prefix(std::uint32_t layer) {
  return "layers." + std::to_string(layer) + ".";
}

}  // namespace

std::vector<TensorInfo> Model::expected_tensors(const ModelConfig& c) {
  std::vector<TensorInfo> out{{"embed", {c.vocab, c.d_model}}};
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    for (const LayerTensor& t : layer_tensors(c))
      out.push_back({layer_prefix(l) + t.name, t.shape});
  }
  out.push_back({"final_norm", {c.d_model}});
  return out;
}

// A text file named by the manifest: a path relative to eval/ ("data/....txt"), inside it.
std::string text_file(const Manifest& m, const json::object& object, std::string_view key,
                      const std::string& where, const std::string& fallback) {
  if (!object.contains(key)) return fallback;
  const std::string path = m.text(object, key, where);
  const bool inside = path.starts_with("data/") && path.find("..") == std::string::npos &&
                      path.size() <= 256 && path.find('\0') == std::string::npos;
  if (!inside) {
    m.fail(where + "\"" + std::string(key) + "\" must name a file in eval/data/, got \"" + path +
           "\"");
  }
  return path;
}

std::shared_ptr<const Model> Model::load(const std::string& dir) {
  const Manifest m = read_manifest(dir);
  std::shared_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->config_ = parse_config(m);
  model->calibration_text_ = text_file(m, m.root, "calibration_text", "", "data/calibration.txt");
  if (const json::value* reference = m.root.if_contains("reference");
      reference != nullptr && reference->is_object()) {
    model->heldout_text_ =
        text_file(m, reference->get_object(), "text", "reference: ", "data/heldout.txt");
  }
  const ModelConfig& c = model->config_;
  if (const json::value* training = m.root.if_contains("training")) {
    model->training_ = json::serialize(*training);
  }
  const json::value& tensors_value = m.at(m.root, "tensors", "");
  if (!tensors_value.is_object()) m.fail("\"tensors\" must be an object");
  const json::object& tensors = tensors_value.get_object();
  const std::vector<TensorInfo> expected = expected_tensors(c);
  std::set<std::string> names;
  for (const TensorInfo& t : expected) names.insert(t.name);
  for (const auto& entry : tensors) {
    if (names.count(std::string(entry.key())) == 0)
      m.fail("lists tensor \"" + std::string(entry.key()) + "\", which a " + kn::to_string(c.arch) +
             " model of this configuration does not have");
  }
  std::map<std::string, std::vector<float>> values;
  for (const TensorInfo& t : expected) {
    const json::value* entry = tensors.if_contains(t.name);
    if (entry == nullptr) m.fail("tensor \"" + t.name + "\" is missing");
    if (!entry->is_object()) m.fail("tensor \"" + t.name + "\" must be an object");
    values[t.name] = read_tensor(m, dir, t.name, entry->get_object(), t.shape);
  }
  const auto take = [&](const std::string& name) { return std::move(values.at(name)); };
  model->embed_ = take("embed");
  model->final_norm_ = take("final_norm");
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    Layer layer;
    for (const LayerTensor& t : layer_tensors(c)) layer.*t.member = take(layer_prefix(l) + t.name);
    model->layers_.push_back(std::move(layer));
  }
  return model;
}

kn::StateLayout Model::layout(kn::CodecSpec codec,
                              std::shared_ptr<const kn::stepquant::Plan> plan) const {
  kn::StateLayout layout;
  layout.name = "eval-" + std::string(kn::to_string(config_.arch));
  layout.arch = config_.arch;
  layout.num_layers = config_.layers;
  layout.num_heads = config_.heads;
  layout.key_dim = config_.key_dim;
  layout.value_dim = config_.value_dim;
  layout.codec = codec;
  layout.plan = std::move(plan);
  return layout;
}

Reference load_reference(const Model& model) {
  const Manifest m = read_manifest(model.dir());
  const json::value& entry = m.at(m.root, "reference", "");
  if (!entry.is_object()) m.fail("\"reference\" must be an object");
  const json::value& tokens = m.at(entry.get_object(), "tokens", "reference: ");
  if (!tokens.is_int64() || tokens.get_int64() < 1 || tokens.get_int64() > 1'000'000)
    m.fail("reference: \"tokens\" must be a positive integer");
  Reference ref;
  ref.tokens = static_cast<std::uint64_t>(tokens.get_int64());
  ref.logits = read_tensor(m, model.dir(), "reference", entry.get_object(),
                           {ref.tokens, model.config().vocab});
  return ref;
}

Decoder::Decoder(std::shared_ptr<const Model> model, const kn::PageCodec& codec,
                 const kn::StepPolicy& policy)
    : model_(std::move(model)), codec_(codec), policy_(policy) {
  const ModelConfig& c = model_->config();
  const kn::StateLayout& l = codec.layout();
  if (l.arch != c.arch || l.num_layers != c.layers || l.num_heads != c.heads ||
      l.key_dim != c.key_dim || l.value_dim != c.value_dim || l.conv_channels != 0) {
    throw std::invalid_argument("Decoder: the codec's layout is not this model's state shape");
  }
  page_.resize(codec.page_bytes());
  const std::uint32_t gates = c.arch == kn::Arch::kda ? c.heads * c.key_dim : c.heads;
  inputs_.resize(c.layers);
  for (LayerInputs& in : inputs_) {
    in.q.resize(std::size_t{c.heads} * c.key_dim);
    in.k.resize(std::size_t{c.heads} * c.key_dim);
    in.v.resize(std::size_t{c.heads} * c.value_dim);
    in.g.resize(gates);
    in.beta.resize(c.heads);
  }
  x_.resize(c.d_model);
  h_.resize(c.d_model);
  out_.resize(std::size_t{c.heads} * c.value_dim);
  o_.resize(std::size_t{c.heads} * c.value_dim);
  hidden_.resize(c.mlp_hidden);
  rank_.resize(c.gate_rank);
  gate_.resize(gates);
  logits_.resize(c.vocab);
  reset();
}

std::size_t Decoder::state_values() const noexcept {
  const ModelConfig& c = model_->config();
  return std::size_t{c.layers} * c.heads * c.key_dim * c.value_dim;
}

void Decoder::reset() {
  const std::vector<std::byte> zero(codec_.staged_bytes(kn::DType::f32));
  codec_.encode(zero, kn::DType::f32, page_);
  steps_ = 0;
}

void Decoder::state(std::span<float> out) const {
  if (out.size() != state_values()) throw std::invalid_argument("Decoder::state: wrong size");
  codec_.decode(page_, kn::DType::f32, std::as_writable_bytes(out));
}

std::span<const float> Decoder::step(std::uint32_t token) {
  const ModelConfig& c = model_->config();
  if (token >= c.vocab) throw std::invalid_argument("Decoder::step: token out of range");
  const std::size_t d = c.d_model, h = c.heads, kd = c.key_dim, vd = c.value_dim;
  std::copy_n(model_->embed().data() + token * d, d, x_.data());
  std::byte* const page = page_.data();
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    const Model::Layer& w = model_->layers()[l];
    LayerInputs& in = inputs_[l];
    rms_norm(x_.data(), d, w.attn_norm, c.rms_eps, h_.data());
    matvec(w.q, h * kd, d, h_.data(), in.q.data());
    matvec(w.k, h * kd, d, h_.data(), in.k.data());
    matvec(w.v, h * vd, d, h_.data(), in.v.data());
    for (std::size_t head = 0; head < h; ++head) {
      kn::normalize_qk(std::span(in.q).subspan(head * kd, kd),
                       std::span(in.k).subspan(head * kd, kd));
    }
    matvec(w.b, h, d, h_.data(), in.beta.data());
    for (std::size_t head = 0; head < h; ++head) {
      in.beta[head] = sigmoid(in.beta[head] + w.b_bias[head]);
    }
    if (c.arch == kn::Arch::kda) {
      matvec(w.a_down, c.gate_rank, d, h_.data(), rank_.data());
      matvec(w.a, h * kd, c.gate_rank, rank_.data(), gate_.data());
    } else {
      matvec(w.a, h, d, h_.data(), gate_.data());
    }
    const std::size_t per_head = gate_.size() / h;
    for (std::size_t i = 0; i < gate_.size(); ++i) {
      in.g[i] = -std::exp(w.A_log[i / per_head]) * softplus(gate_[i] + w.dt_bias[i]);
    }
    kn::StepInputs step;
    step.batch = 1;
    step.q = in.q;
    step.k = in.k;
    step.v = in.v;
    step.log_decay = in.g;
    step.beta = in.beta;
    step.out = out_;
    kn::StepPolicy policy = policy_;
    policy.step = steps_;
    const kn::StepResult result = kn::fused_step(codec_, l, std::span(&page, 1), step, {}, policy);
    rejected_ += result.rejected_heads;
    stepped_ += h;
    light_ += result.light_heads;
    fallback_ += result.fallback_heads;
    for (std::size_t head = 0; head < h; ++head) {
      rms_norm(out_.data() + head * vd, vd, w.o_norm, c.rms_eps, o_.data() + head * vd);
    }
    matvec(w.o, d, h * vd, o_.data(), h_.data());
    for (std::size_t i = 0; i < d; ++i) x_[i] += h_[i];
    rms_norm(x_.data(), d, w.mlp_norm, c.rms_eps, h_.data());
    matvec(w.up, c.mlp_hidden, d, h_.data(), hidden_.data());
    for (float& value : hidden_) value = silu(value);
    matvec(w.down, d, c.mlp_hidden, hidden_.data(), h_.data());
    for (std::size_t i = 0; i < d; ++i) x_[i] += h_[i];
  }
  ++steps_;
  rms_norm(x_.data(), d, model_->final_norm(), c.rms_eps, h_.data());
  matvec(model_->embed(), c.vocab, d, h_.data(), logits_.data());
  return logits_;
}

}  // namespace statepool::eval
