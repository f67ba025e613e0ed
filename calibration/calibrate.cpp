#include "statepool/calibration/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "parallel.hpp"
#include "statepool/kernels/recurrence.hpp"

namespace statepool::calibration {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::gdn_step;
using kernels::kda_step;
using kernels::normalize_qk;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string rate_text(std::uint64_t tokens, double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
  return buf;
}

std::string seconds_text(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", seconds);
  return buf;
}

}  // namespace

void accumulate_layer(const TraceReader& trace, std::uint32_t layer, LayerAccumulator& accumulator,
                      const CalibrateOptions& options, const ProgressFn& progress) {
  const TraceManifest& m = trace.manifest();
  if (accumulator.arch() != m.arch || accumulator.heads() != m.heads ||
      accumulator.key_dim() != m.key_dim || accumulator.value_dim() != m.value_dim) {
    throw std::invalid_argument("accumulate_layer: accumulator shape differs from the trace");
  }
  const std::size_t H = m.heads;
  const std::size_t K = m.key_dim;
  const std::size_t V = m.value_dim;
  const std::size_t G = m.gate_values();
  const std::uint64_t block = std::max<std::uint64_t>(1, options.block_tokens);

  struct HeadWork {
    std::vector<float> state, q, k, residual;
  };
  std::vector<HeadWork> work(H);
  detail::HeadThreads threads(options.threads);
  for (HeadWork& w : work) {
    w.state.assign(K * V, 0.0f);
    w.q.resize(K);
    w.k.resize(K);
    w.residual.resize(V);
  }

  TokenBlock inputs;
  std::size_t next_start = 0;  // index into sequence_starts
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  for (std::uint64_t first = 0; first < m.tokens;) {
    // Blocks never straddle a sequence start, so every head resets at the same token.
    std::uint64_t end = std::min(first + block, m.tokens);
    if (next_start < m.sequence_starts.size() && m.sequence_starts[next_start] == first) {
      for (HeadWork& w : work) {
        std::fill(w.state.begin(), w.state.end(), 0.0f);
      }
      accumulator.end_sequence();
      ++next_start;
    }
    if (next_start < m.sequence_starts.size()) {
      end = std::min(end, m.sequence_starts[next_start]);
    }
    trace.read(layer, first, end - first, inputs);
    threads.for_each(H, [&](std::size_t h) {
      HeadWork& w = work[h];
      for (std::uint64_t t = 0; t < inputs.count; ++t) {
        const std::size_t index = static_cast<std::size_t>(t) * H + h;
        std::copy_n(inputs.q.begin() + static_cast<std::ptrdiff_t>(index * K), K, w.q.begin());
        std::copy_n(inputs.k.begin() + static_cast<std::ptrdiff_t>(index * K), K, w.k.begin());
        normalize_qk(w.q, w.k);
        const std::span<const float> v(inputs.v.data() + index * V, V);
        const std::span<const float> g(inputs.g.data() + index * G, G);
        const float beta = inputs.beta[index];
        if (m.arch == kernels::Arch::gdn) {
          gdn_step(w.state, m.key_dim, m.value_dim, w.q, w.k, v, g[0], beta, w.residual, {});
        } else {
          kda_step(w.state, m.key_dim, m.value_dim, w.q, w.k, v, g, beta, w.residual, {});
        }
        accumulator.add(static_cast<std::uint32_t>(h), w.q, w.k, g, beta, w.state);
      }
    });
    first = end;
    if (progress && std::chrono::duration<double>(Clock::now() - last_report).count() >= 10.0) {
      last_report = Clock::now();
      progress("  layer " + std::to_string(layer) + ": " + std::to_string(first) + "/" +
               std::to_string(m.tokens) + " tokens, " + rate_text(first, seconds_since(start)) +
               " tokens/s");
    }
  }
}

PlanResult calibrate_trace(const TraceReader& trace, const CalibrateOptions& options,
                           const ProgressFn& progress) {
  const TraceManifest& m = trace.manifest();
  PlanOptions plan_options = options.plan;
  plan_options.threads = options.threads;
  if (plan_options.source.empty()) {
    plan_options.source = "statepool-quant calibrate, trace " + trace.dir() +
                          (m.synthetic ? " (SYNTHETIC)" : "") +
                          (m.source.empty() ? "" : ", " + m.source);
  }
  std::vector<LayerCosts> costs;
  costs.reserve(m.layers);
  const Clock::time_point start = Clock::now();
  for (std::uint32_t layer = 0; layer < m.layers; ++layer) {
    const Clock::time_point layer_start = Clock::now();
    AccumulatorOptions accumulator_options = options.accumulator;
    accumulator_options.probe_horizon = plan_options.horizon;
    if (plan_options.cost != CostModel::output) accumulator_options.probe_every = 0;
    LayerAccumulator accumulator(m.arch, layer, m.heads, m.key_dim, m.value_dim,
                                 accumulator_options);
    accumulate_layer(trace, layer, accumulator, options, progress);
    const double run_seconds = seconds_since(layer_start);
    costs.push_back(measure_layer(accumulator, plan_options));
    if (progress) {
      progress("layer " + std::to_string(layer + 1) + "/" + std::to_string(m.layers) + ": " +
               std::to_string(m.tokens) + " tokens in " + seconds_text(run_seconds) + " s (" +
               rate_text(m.tokens, run_seconds) + " tokens/s), " +
               std::to_string(accumulator.stored_snapshots()) + " snapshots, costs in " +
               seconds_text(seconds_since(layer_start) - run_seconds) + " s");
    }
  }
  PlanShape shape{m.arch, m.layers, m.heads, m.key_dim, m.value_dim};
  PlanResult result = build_plan(shape, costs, plan_options, m.tokens);
  if (progress) {
    progress("plan built, " + seconds_text(seconds_since(start)) + " s in all");
  }
  return result;
}

}  // namespace statepool::calibration
