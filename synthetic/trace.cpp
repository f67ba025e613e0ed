#include "statepool/synthetic/trace.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "statepool/calibration/seed.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/synthetic/random.hpp"

namespace statepool::synthetic {
namespace {

using calibration::mix_seed;
using calibration::TokenBlock;
using calibration::TraceManifest;
using calibration::TraceWriter;

constexpr double kSlowestRate = 5e-4;
constexpr double kFastestRate = 0.7;
constexpr float kJitter = 0.25f;

}  // namespace

struct SyntheticSource::Stream {
  explicit Stream(std::uint64_t seed) : rng(seed) {}
  PortableNormal rng;
  std::uint64_t next_token = 0;
};

TraceManifest synthetic_manifest(const SyntheticOptions& options) {
  TraceManifest m;
  m.arch = options.arch;
  m.layers = options.layers;
  m.heads = options.heads;
  m.key_dim = options.key_dim;
  m.value_dim = options.value_dim;
  m.tokens = options.tokens;
  m.sequence_starts.clear();
  const std::uint64_t length =
      options.sequence_length == 0 ? options.tokens : options.sequence_length;
  for (std::uint64_t start = 0; start < options.tokens; start += length) {
    m.sequence_starts.push_back(start);
  }
  if (m.sequence_starts.empty()) {
    m.sequence_starts.push_back(0);
  }
  m.synthetic = true;
  m.source = "synthetic (statepool-quant synth-trace, model seed " +
             std::to_string(options.model_seed) + ", token seed " +
             std::to_string(options.token_seed) + ")";
  return m;
}

SyntheticSource::SyntheticSource(SyntheticOptions options) : options_(std::move(options)) {
  const SyntheticOptions& o = options_;
  if (const std::string problem = synthetic_manifest(o).validate(); !problem.empty()) {
    throw std::invalid_argument("synthetic trace: " + problem);
  }
  if (!o.head_log_decay.empty()) {
    if (o.head_log_decay.size() != o.heads) {
      throw std::invalid_argument("synthetic trace: head_log_decay needs one value per head (" +
                                  std::to_string(o.heads) + ")");
    }
    for (const float g : o.head_log_decay) {
      if (!(g < 0.0f) || !std::isfinite(g)) {
        throw std::invalid_argument(
            "synthetic trace: head_log_decay values must be finite and < 0");
      }
    }
  }
  const std::size_t K = o.key_dim;
  const std::size_t V = o.value_dim;
  models_.reserve(std::size_t{o.layers} * o.heads);
  for (std::uint32_t layer = 0; layer < o.layers; ++layer) {
    for (std::uint32_t head = 0; head < o.heads; ++head) {
      PortableNormal rng(mix_seed(o.model_seed ^ mix_seed((std::uint64_t{layer} << 32) | head)));
      HeadModel m;
      double centre = 0.0;
      if (!o.head_log_decay.empty()) {
        centre = o.head_log_decay[head];
      } else {
        // Spread over the heads, rotated per layer: slot (head + layer) % heads.
        const double f = (static_cast<double>((head + layer) % o.heads) + 0.5) / o.heads;
        centre = -std::exp(std::log(kSlowestRate) +
                           f * (std::log(kFastestRate) - std::log(kSlowestRate)));
      }
      if (o.arch == kernels::Arch::gdn) {
        m.log_decay.assign(1, static_cast<float>(centre));
      } else {
        m.log_decay.resize(K);
        for (float& g : m.log_decay) {
          const double rate = std::clamp(-centre * std::exp(0.75 * rng.next()), 1e-4, 2.0);
          g = static_cast<float>(-rate);
        }
      }
      m.key_bias.assign(K, 0.0f);
      m.query_bias.assign(K, 0.0f);
      for (std::size_t r = 0; r < std::max<std::size_t>(1, K / 32); ++r) {
        const float sign = rng.below(2) == 0 ? 1.0f : -1.0f;
        m.key_bias[rng.below(K)] = sign * static_cast<float>(2.0 + 2.0 * rng.uniform());
      }
      for (std::size_t r = 0; r < std::max<std::size_t>(1, K / 16); ++r) {
        m.query_bias[rng.below(K)] = static_cast<float>(1.5 + 2.5 * rng.uniform());
      }
      m.column_scale.resize(V);
      for (float& c : m.column_scale) {
        c = std::exp(0.3f * rng.next());
      }
      for (std::size_t r = 0; r < std::max<std::size_t>(1, V / 32); ++r) {
        m.column_scale[rng.below(V)] *= static_cast<float>(4.0 + 4.0 * rng.uniform());
      }
      models_.push_back(std::move(m));
    }
  }
  for (std::uint32_t layer = 0; layer < o.layers; ++layer) {
    streams_.push_back(
        std::make_shared<Stream>(mix_seed(o.token_seed ^ mix_seed(0xA11CEull + layer))));
  }
}

const SyntheticSource::HeadModel& SyntheticSource::model(std::uint32_t layer,
                                                         std::uint32_t head) const {
  if (layer >= options_.layers || head >= options_.heads) {
    throw std::out_of_range("synthetic trace: layer " + std::to_string(layer) + " head " +
                            std::to_string(head) + " out of range");
  }
  return models_[std::size_t{layer} * options_.heads + head];
}

float SyntheticSource::nominal_log_decay(std::uint32_t layer, std::uint32_t head,
                                         std::uint32_t row) const {
  const HeadModel& m = model(layer, head);
  return m.log_decay.size() == 1 ? m.log_decay[0] : m.log_decay.at(row);
}

void SyntheticSource::generate(std::uint32_t layer, std::uint64_t count, TokenBlock& out) {
  const SyntheticOptions& o = options_;
  (void)model(layer, 0);
  Stream& stream = *streams_[layer];
  const std::size_t K = o.key_dim;
  const std::size_t V = o.value_dim;
  const std::size_t G = o.arch == kernels::Arch::gdn ? 1 : K;
  const std::size_t H = o.heads;
  out.first = stream.next_token;
  out.count = count;
  const std::size_t n = static_cast<std::size_t>(count) * H;
  out.q.resize(n * K);
  out.k.resize(n * K);
  out.v.resize(n * V);
  out.g.resize(n * G);
  out.beta.resize(n);
  // exp(kJitter N) has mean exp(kJitter^2 / 2): divide it out to keep the nominal mean.
  const float jitter_norm = std::exp(-0.5f * kJitter * kJitter);
  PortableNormal& rng = stream.rng;
  for (std::size_t t = 0; t < count; ++t) {
    for (std::size_t h = 0; h < H; ++h) {
      const HeadModel& m = models_[std::size_t{layer} * H + h];
      const std::size_t index = t * H + h;
      float* q = out.q.data() + index * K;
      float* k = out.k.data() + index * K;
      for (std::size_t i = 0; i < K; ++i) {
        k[i] = rng.next() + m.key_bias[i];
        q[i] = rng.next() + m.query_bias[i];
      }
      kernels::normalize_qk(std::span<float>(q, K), std::span<float>(k, K));
      float* v = out.v.data() + index * V;
      for (std::size_t j = 0; j < V; ++j) {
        v[j] = rng.next() * m.column_scale[j];
      }
      const float jitter = std::exp(kJitter * rng.next()) * jitter_norm;
      for (std::size_t r = 0; r < G; ++r) {
        out.g[index * G + r] = m.log_decay[r] * jitter;
      }
      out.beta[index] = 1.0f / (1.0f + std::exp(-rng.next()));
    }
  }
  stream.next_token += count;
}

void write_synthetic_trace(const std::string& dir, const SyntheticOptions& options,
                           const std::function<void(std::uint32_t layer)>& progress,
                           std::uint64_t block_tokens) {
  SyntheticSource source(options);
  TraceWriter writer(dir, synthetic_manifest(options));
  TokenBlock block;
  const std::uint64_t step = std::max<std::uint64_t>(1, block_tokens);
  for (std::uint32_t layer = 0; layer < options.layers; ++layer) {
    writer.begin_layer(layer);
    for (std::uint64_t first = 0; first < options.tokens; first += step) {
      source.generate(layer, std::min(step, options.tokens - first), block);
      writer.append(block);
    }
    writer.end_layer();
    if (progress) {
      progress(layer);
    }
  }
  writer.finish();
}

}  // namespace statepool::synthetic
