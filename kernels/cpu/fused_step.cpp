// The fused decode step on the host (fused_step.hpp): per (request, head), the codec's
// decode_head into a per-thread FP32 scratch head, step_head (the AVX2/baseline clones of
// step_internal.hpp), and the codec's encode_head_checked (encode_head_light on a light
// step of StepMode::light, decided per request: StepPolicy::steps) into a scratch copy of
// the head's bytes, which replaces the page's bytes only when the new state is finite.
// fp32 pages skip the second scratch: the FP32 scratch is checked, then copied into the
// page (an fp32 head is exactly K V floats, no padding).

#include "statepool/kernels/fused_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "codecs_internal.hpp"
#include "step_internal.hpp"

namespace statepool::kernels {
namespace {

void check_span(const char* name, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw std::invalid_argument("fused step: " + std::string(name) + " has " + std::to_string(got) +
                                " values, expected " + std::to_string(expected));
  }
}

std::uint32_t qk_heads_of(const StateLayout& layout, const StepInputs& in) {
  return in.qk_heads == 0 ? layout.num_heads : in.qk_heads;
}

struct Scratch {
  std::vector<float> state;
  std::vector<float> residual;
  std::vector<std::byte> head;
};

Scratch& scratch(const StateLayout& layout) {
  thread_local Scratch s;
  const std::size_t values = std::size_t{layout.key_dim} * layout.value_dim;
  if (s.state.size() < values) s.state.resize(values);
  if (s.residual.size() < layout.value_dim) s.residual.resize(layout.value_dim);
  return s;
}

}  // namespace

StepPolicy measured_step_policy(const CodecSpec& codec) noexcept {
  StepPolicy policy;
  if (codec.id == CodecId::stepquant6 && codec.variant == StepQuantVariant::full) {
    policy.mode = StepMode::light;
    policy.full_every = 16;
    policy.light.fit = LightFit::no_refit;
  }
  return policy;
}

std::string step_problem(const StateLayout& layout, std::uint32_t layer, std::uint32_t qk_heads) {
  if (layer >= layout.num_layers) {
    return "layer " + std::to_string(layer) + " does not exist; the layout has " +
           std::to_string(layout.num_layers) + " layers";
  }
  const std::uint32_t qk = qk_heads == 0 ? layout.num_heads : qk_heads;
  if (qk > layout.num_heads || layout.num_heads % qk != 0) {
    return "qk_heads " + std::to_string(qk) + " must divide num_heads " +
           std::to_string(layout.num_heads);
  }
  return {};
}

void check_step(const PageCodec& codec, std::uint32_t layer, std::span<std::byte* const> pages,
                const StepInputs& in) {
  const StateLayout& l = codec.layout();
  if (const std::string problem = step_problem(l, layer, in.qk_heads); !problem.empty()) {
    throw std::invalid_argument("fused step: " + problem);
  }
  const std::uint32_t qk = qk_heads_of(l, in);
  const std::size_t B = in.batch;
  const std::size_t H = l.num_heads;
  check_span("pages", pages.size(), B);
  check_span("q", in.q.size(), B * qk * l.key_dim);
  check_span("k", in.k.size(), B * qk * l.key_dim);
  check_span("v", in.v.size(), B * H * l.value_dim);
  check_span("log_decay", in.log_decay.size(), B * H * (l.arch == Arch::kda ? l.key_dim : 1u));
  check_span("beta", in.beta.size(), B * H);
  check_span("out", in.out.size(), B * H * l.value_dim);
  for (std::size_t b = 0; b < B; ++b) {
    if (pages[b] == nullptr) {
      throw std::invalid_argument("fused step: page of request " + std::to_string(b) + " is null");
    }
  }
}

StepResult fused_step_items(const PageCodec& codec, std::uint32_t layer,
                            std::span<std::byte* const> pages, const StepInputs& in,
                            std::size_t first, std::size_t last, const StepPolicy& policy) {
  const StateLayout& l = codec.layout();
  const Codec& c = codec.codec();
  const std::uint32_t K = l.key_dim;
  const std::uint32_t V = l.value_dim;
  const std::uint32_t H = l.num_heads;
  const std::uint32_t group = H / qk_heads_of(l, in);
  const bool kda = l.arch == Arch::kda;
  const bool raw_fp32 = c.id() == CodecId::fp32;
  const std::size_t values = std::size_t{K} * V;
  Scratch& s = scratch(l);
  StepResult result;

  for (std::size_t item = first; item < last; ++item) {
    const auto request = static_cast<std::uint32_t>(item / H);
    const auto head = static_cast<std::uint32_t>(item % H);
    const std::size_t qk_index = std::size_t{request} * (H / group) + head / group;
    const std::size_t bytes = c.head_bytes(layer, head);
    std::byte* page_head = pages[request] + codec.head_offset(layer, head);
    const std::span<float> state(s.state.data(), values);
    const bool light = is_light_request(policy, request);

    c.decode_head(layer, head, {page_head, bytes}, state);
    const float* q = in.q.data() + qk_index * K;
    const float* k = in.k.data() + qk_index * K;
    const float* v = in.v.data() + item * V;
    float* o = in.out.data() + item * V;
    if (kda) {
      detail::step_head_kda(state.data(), K, V, q, k, v, in.log_decay.data() + item * K,
                            in.beta[item], s.residual.data(), o);
    } else {
      detail::step_head_gdn(state.data(), K, V, q, k, v, in.log_decay[item], in.beta[item],
                            s.residual.data(), o);
    }

    bool finite = false;
    if (raw_fp32) {
      finite = detail::all_finite(state);
      if (finite) std::memcpy(page_head, state.data(), values * sizeof(float));
    } else {
      if (s.head.size() < bytes) s.head.resize(bytes);
      if (light) {
        StepUpdate update;
        update.k = {k, K};
        update.u = {s.residual.data(), V};
        if (kda) {
          const float* g = in.log_decay.data() + item * K;
          update.decay_max = std::exp(*std::max_element(g, g + K));
        } else {
          update.decay_max = std::exp(in.log_decay[item]);
        }
        const LightEncode how = c.encode_head_light(layer, head, state, {page_head, bytes},
                                                    {s.head.data(), bytes}, policy.light, update);
        finite = how != LightEncode::non_finite;
        result.light_heads += how == LightEncode::light ? 1 : 0;
        result.fallback_heads += how == LightEncode::fell_back ? 1 : 0;
      } else {
        finite = c.encode_head_checked(layer, head, state, {s.head.data(), bytes});
      }
      if (finite) std::memcpy(page_head, s.head.data(), bytes);
    }
    if (!finite) {
      if (result.rejected_heads++ == 0) {
        result.first_rejected_request = request;
        result.first_rejected_head = head;
      }
    }
  }
  return result;
}

void merge(StepResult& into, const StepResult& other) noexcept {
  into.light_heads += other.light_heads;
  into.fallback_heads += other.fallback_heads;
  if (other.rejected_heads == 0) return;
  const bool earlier = into.rejected_heads == 0 ||
                       other.first_rejected_request < into.first_rejected_request ||
                       (other.first_rejected_request == into.first_rejected_request &&
                        other.first_rejected_head < into.first_rejected_head);
  if (earlier) {
    into.first_rejected_request = other.first_rejected_request;
    into.first_rejected_head = other.first_rejected_head;
  }
  into.rejected_heads += other.rejected_heads;
}

StepResult fused_step(const PageCodec& codec, std::uint32_t layer,
                      std::span<std::byte* const> pages, const StepInputs& in,
                      const ParallelFor& parallel, const StepPolicy& policy) {
  check_step(codec, layer, pages, in);
  if (!policy.steps.empty()) check_span("policy.steps", policy.steps.size(), in.batch);
  const std::size_t items = std::size_t{in.batch} * codec.layout().num_heads;
  if (!parallel || items <= 1) {
    return fused_step_items(codec, layer, pages, in, 0, items, policy);
  }
  std::mutex mutex;
  StepResult result;
  // One head is tens of microseconds of work: chunks of a few heads keep the claiming
  // cheap and the load balanced.
  const std::size_t grain = std::clamp<std::size_t>(items / 64, 1, 8);
  parallel(items, grain, [&](std::size_t first, std::size_t last) {
    const StepResult part = fused_step_items(codec, layer, pages, in, first, last, policy);
    const std::lock_guard lock(mutex);
    merge(result, part);
  });
  return result;
}

}  // namespace statepool::kernels
