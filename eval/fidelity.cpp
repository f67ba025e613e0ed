#include "statepool/eval/fidelity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "statepool/calibration/trace.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::eval {

namespace kn = kernels;

namespace {

std::uint32_t argmax(std::span<const float> logits) {
  return static_cast<std::uint32_t>(std::max_element(logits.begin(), logits.end()) -
                                    logits.begin());
}

/// Softmax probabilities of `logits` into `p` (double, for the sums).
void softmax(std::span<const float> logits, std::vector<double>& p) {
  p.resize(logits.size());
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(logits[i] - max);
  for (double& value : p) value /= sum;
}

double relative_error(std::span<const float> approx, std::span<const float> exact) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const double e = exact[i];
    diff += (approx[i] - e) * (approx[i] - e);
    norm += e * e;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

/// The decoder's greedy continuation of text[0, prompt): `generate` bytes, or up to the
/// first byte that differs from `reference` (then `divergence` is its 1-based position).
std::vector<std::uint32_t> greedy(Decoder& decoder, std::span<const std::uint8_t> text,
                                  const FidelityOptions& o,
                                  const std::vector<std::uint32_t>* reference,
                                  std::optional<std::uint32_t>* divergence) {
  decoder.reset();
  std::span<const float> logits;
  for (std::uint32_t i = 0; i < o.prompt; ++i) logits = decoder.step(text[i]);
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < o.generate; ++i) {
    const std::uint32_t next = argmax(logits);
    out.push_back(next);
    if (reference != nullptr && (*reference)[i] != next) {
      *divergence = i + 1;
      break;
    }
    logits = decoder.step(next);
  }
  return out;
}

CodecResult run_case(const std::shared_ptr<const Model>& model, std::span<const std::uint8_t> text,
                     const CodecCase& c, const FidelityOptions& o,
                     const std::vector<std::uint32_t>& fp32_generated) {
  const auto start = std::chrono::steady_clock::now();
  const kn::PageCodec codec(model->layout(c.spec, c.plan));
  const kn::PageCodec exact(model->layout(kn::CodecSpec{kn::CodecId::fp32}));
  Decoder approx(model, codec, c.policy);
  Decoder reference(model, exact);
  CodecResult r;
  r.name = c.name;
  r.page_bytes = codec.page_bytes();
  r.bits_per_value =
      8.0 * static_cast<double>(r.page_bytes) / static_cast<double>(approx.state_values());
  std::vector<float> s_approx(approx.state_values());
  std::vector<float> s_exact(approx.state_values());
  std::vector<double> p_approx, p_exact;
  std::uint64_t agree = 0;
  double nll = 0, tv = 0;
  r.state_error.reserve(o.tokens);
  for (std::uint64_t t = 0; t < o.tokens; ++t) {
    const std::span<const float> la = approx.step(text[t]);
    const std::span<const float> le = reference.step(text[t]);
    agree += argmax(la) == argmax(le) ? 1 : 0;
    softmax(la, p_approx);
    softmax(le, p_exact);
    nll -= std::log(p_approx[text[t + 1]]);
    double diff = 0;
    for (std::size_t i = 0; i < p_exact.size(); ++i) diff += std::fabs(p_approx[i] - p_exact[i]);
    tv += diff / 2;
    approx.state(s_approx);
    reference.state(s_exact);
    r.state_error.push_back(static_cast<float>(relative_error(s_approx, s_exact)));
  }
  const auto n = static_cast<double>(o.tokens);
  r.nll = nll / n;
  r.agreement = static_cast<double>(agree) / n;
  r.output_error = tv / n;
  const auto stepped = static_cast<double>(std::max<std::size_t>(approx.stepped_heads(), 1));
  r.light_fraction = static_cast<double>(approx.light_heads()) / stepped;
  r.fallback_fraction = static_cast<double>(approx.fallback_heads()) / stepped;
  greedy(approx, text, o, &fp32_generated, &r.divergence);
  r.rejected_heads = approx.rejected_heads();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void check_text(std::span<const std::uint8_t> text, std::uint64_t needed, const char* what) {
  if (text.size() < needed) {
    throw std::invalid_argument(std::string(what) + " needs " + std::to_string(needed) +
                                " bytes of text, got " + std::to_string(text.size()));
  }
}

}  // namespace

double CodecResult::perplexity() const {
  return std::exp(nll);
}

double CodecResult::mean_state_error(std::size_t first, std::size_t last) const {
  last = std::min(last, state_error.size());
  if (first < 1 || first > last) return 0;
  double sum = 0;
  for (std::size_t t = first; t <= last; ++t) sum += state_error[t - 1];
  return sum / static_cast<double>(last - first + 1);
}

std::vector<CodecResult> evaluate(std::shared_ptr<const Model> model,
                                  std::span<const std::uint8_t> text,
                                  std::span<const CodecCase> cases, const FidelityOptions& options,
                                  const ProgressFn& progress) {
  if (options.tokens < 1) throw std::invalid_argument("evaluate: tokens must be at least 1");
  check_text(text, options.tokens + 1, "teacher forcing");
  check_text(text, options.prompt, "the greedy prompt");
  for (const CodecCase& c : cases) {
    try {
      (void)kn::PageCodec(model->layout(c.spec, c.plan));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(c.name + ": " + e.what());
    }
  }
  const kn::PageCodec exact(model->layout(kn::CodecSpec{kn::CodecId::fp32}));
  Decoder reference(model, exact);
  const std::vector<std::uint32_t> fp32_generated =
      greedy(reference, text, options, nullptr, nullptr);

  std::vector<CodecResult> results(cases.size());
  std::mutex progress_mutex;  // `progress` is called from every worker
  const auto run = [&](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      results[i] = run_case(model, text, cases[i], options, fp32_generated);
      if (progress) {
        char line[160];
        std::snprintf(line, sizeof line, "%s: perplexity %.4f, state error at t=%zu %.4f (%.1f s)",
                      results[i].name.c_str(), results[i].perplexity(),
                      results[i].state_error.size(), results[i].state_error.back(),
                      results[i].seconds);
        const std::lock_guard lock(progress_mutex);
        progress(line);
      }
    }
  };
  if (options.threads <= 1) {
    run(0, cases.size());
  } else {  // parallel_for runs chunks on the calling thread too
    support::WorkerPool pool(options.threads - 1);
    pool.parallel_for(cases.size(), 1, run);
  }
  return results;
}

void record_trace(std::shared_ptr<const Model> model, std::span<const std::uint8_t> text,
                  std::uint64_t sequences, std::uint64_t sequence_length, const std::string& dir,
                  const std::string& source) {
  if (sequences < 1 || sequence_length < 1)
    throw std::invalid_argument("record_trace: sequences and sequence length must be positive");
  check_text(text, sequences * sequence_length, "record_trace");
  const ModelConfig& c = model->config();
  calibration::TraceManifest manifest;
  manifest.arch = c.arch;
  manifest.layers = c.layers;
  manifest.heads = c.heads;
  manifest.key_dim = c.key_dim;
  manifest.value_dim = c.value_dim;
  manifest.tokens = sequences * sequence_length;
  manifest.sequence_starts.clear();
  for (std::uint64_t s = 0; s < sequences; ++s)
    manifest.sequence_starts.push_back(s * sequence_length);
  manifest.source = source;
  // Every layer's inputs for every token, then the layers one after the other (the
  // writer's order).
  std::vector<calibration::TokenBlock> blocks(c.layers);
  for (calibration::TokenBlock& b : blocks) b.count = manifest.tokens;
  const kn::PageCodec exact(model->layout(kn::CodecSpec{kn::CodecId::fp32}));
  Decoder decoder(model, exact);
  for (std::uint64_t t = 0; t < manifest.tokens; ++t) {
    if (t % sequence_length == 0) decoder.reset();
    (void)decoder.step(text[t]);
    for (std::uint32_t l = 0; l < c.layers; ++l) {
      const LayerInputs& in = decoder.inputs()[l];
      calibration::TokenBlock& b = blocks[l];
      b.q.insert(b.q.end(), in.q.begin(), in.q.end());
      b.k.insert(b.k.end(), in.k.begin(), in.k.end());
      b.v.insert(b.v.end(), in.v.begin(), in.v.end());
      b.g.insert(b.g.end(), in.g.begin(), in.g.end());
      b.beta.insert(b.beta.end(), in.beta.begin(), in.beta.end());
    }
  }
  calibration::TraceWriter writer(dir, manifest);
  for (std::uint32_t l = 0; l < c.layers; ++l) {
    writer.begin_layer(l);
    writer.append(blocks[l]);
    writer.end_layer();
    blocks[l] = {};
  }
  writer.finish();
}

}  // namespace statepool::eval
