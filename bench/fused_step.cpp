// The fused decode step on the host (kernels/fused_step.hpp, the path of client::DecodeStep)
// per layer and token, side by side for every page codec, against the fp32 pages of the
// same step and against a parallel memcpy measured in the same run.
//
//   bench_fused_step [--batches LIST] [--codecs LIST] [--modes LIST] [--every N] [--iters N]
//                    [--threads N] [--steps N]
//
// Shapes (one linear layer, K = V = 128):
//   qwen3-next  GDN, 32 value heads, 16 q/k heads, one gate per head
//   kimi-linear KDA, 32 heads, q/k per head, one gate per key channel
// Codecs: fp32, bf16, int8, stepquant6, stepquant4; the stepquant plans are
// testing::mixed_width_plan (plans.hpp), not calibrated plans. Every page starts from the same
// synthetic state (statepool/synthetic/state.hpp); inputs are seeded random, q and k normalised.
//
// Per row: time of one call for the whole batch (median of `iters` after a warm-up),
// "x fp32" = fp32's time / this codec's time at the same batch, "moved" = the bytes one
// call must move (each page's layer read and written once, plus q, k, v, gates, beta and
// outputs) per second, "x copy" = that rate over the rate at which a memcpy of the
// batch's FP32 layer bytes moves bytes (read + write), with the same threads.
// --modes full,light,carried prints one table per step mode (docs/codecs.md, "Step
// modes"): the light and carried tables time light steps alone (a step whose number is not
// a multiple of --every; light: the measured light fit, without the refit; carried: the
// page's column scales with fresh absmax row scales, the rejected plan); a page's mean over
// N steps is ((N - 1) light + full) / N. fp32, bf16 and int8 have no light form: their
// rows measure the same step in every table.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/support/worker_pool.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/decode_step.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::bench::median_seconds;
using statepool::kernels::Arch;
using statepool::kernels::CodecId;
using statepool::kernels::DType;
using statepool::kernels::PageCodec;
using statepool::kernels::StateLayout;

struct Options {
  std::string batches = "1,32,128,512";
  std::string codecs = "fp32,bf16,int8,stepquant6,stepquant4";
  std::uint32_t iters = 5;
  std::uint32_t threads = 0;
  std::uint32_t steps = 32;
  std::string modes = "full";
  std::uint32_t every = 16;
};

constexpr const char* kUsage =
    "usage: bench_fused_step [--batches LIST] [--codecs LIST] [--modes LIST] [--every N]\n"
    "                        [--iters N] [--threads N] [--steps N]\n"
    "  --batches LIST  comma-separated batch sizes (default 1,32,128,512)\n"
    "  --codecs LIST   comma-separated codecs, fp32 first for the x fp32 column\n"
    "                  (default fp32,bf16,int8,stepquant6,stepquant4)\n"
    "  --modes LIST    step modes, one table each: full, light, carried (default full)\n"
    "  --every N       light mode: the full fit on every N-th step (default 16)\n"
    "  --iters N       timed calls per measurement, median reported (default 5)\n"
    "  --threads N     threads per call, the caller's included (default: every core)\n"
    "  --steps N       recurrence steps of the synthetic starting state (default 32)\n";

std::optional<int> parse(int argc, char** argv, Options& o) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_fused_step", kUsage);
  // clang-format off
  cli.add_options()
      ("batches", boost::program_options::value(&o.batches))
      ("codecs", boost::program_options::value(&o.codecs))
      ("modes", boost::program_options::value(&o.modes))
      ("every", bounded(o.every, 2, 1000000))
      ("iters", bounded(o.iters, 1, 1000000))
      ("threads", bounded(o.threads, 0, 4096))
      ("steps", bounded(o.steps, 1, 1000000));
  // clang-format on
  return cli.parse(argc, argv);
}

statepool::bench::StepRow measure(const statepool::bench::StepShape& shape, CodecId id,
                                  std::uint32_t batch, const Options& o,
                                  const statepool::kernels::StepPolicy& policy,
                                  statepool::support::WorkerPool* pool) {
  const PageCodec codec(statepool::bench::step_layout(shape, id, "bench_fused_step"));
  const StateLayout& l = codec.layout();
  const std::size_t page = codec.page_bytes();
  // One arena-like block of pages, every page the same synthetic state.
  const auto staged = statepool::synthetic::synthetic_staged_state(l, o.steps, 1, DType::f32);
  std::vector<std::byte> arena(page * batch);
  codec.encode(staged, DType::f32, {arena.data(), page});
  for (std::uint32_t b = 1; b < batch; ++b) std::memcpy(&arena[b * page], arena.data(), page);
  std::vector<std::byte*> pages;
  for (std::uint32_t b = 0; b < batch; ++b) pages.push_back(&arena[b * page]);
  statepool::testing::StepBatch in(l, batch, shape.qk_heads, 7);
  const auto inputs = in.view();

  statepool::kernels::ParallelFor parallel;
  if (pool != nullptr) {
    parallel = [pool](std::size_t count, std::size_t grain, const auto& fn) {
      pool->parallel_for(count, grain, fn);
    };
  }
  statepool::bench::StepRow m;
  m.seconds = median_seconds(o.iters, [&] {
    const auto result =
        statepool::kernels::fused_step(codec, 0, pages, inputs, parallel, policy);
    if (!result.ok()) throw std::runtime_error("a state became non-finite");
  });
  m.layer_bytes = static_cast<double>(codec.conv_offset());
  m.moved = statepool::bench::StepRow::moved_bytes(m.layer_bytes, batch,
                                                   in.q.size() + in.k.size() + in.v.size() +
                                                       in.log_decay.size() + in.beta.size() +
                                                       in.out.size());
  return m;
}

/// Bytes per second a memcpy of `bytes` moves (read + write), split like the step.
double copy_rate(std::size_t bytes, const Options& o, statepool::support::WorkerPool* pool) {
  std::vector<std::byte> from(bytes, std::byte{1});
  std::vector<std::byte> to(bytes);
  constexpr std::size_t kChunk = 1 << 20;
  const std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  const auto copy = [&](std::size_t first, std::size_t last) {
    for (std::size_t c = first; c < last; ++c) {
      const std::size_t begin = c * kChunk;
      std::memcpy(&to[begin], &from[begin], std::min(kChunk, bytes - begin));
    }
  };
  const double s = median_seconds(o.iters, [&] {
    if (pool == nullptr) {
      copy(0, chunks);
    } else {
      pool->parallel_for(chunks, 1, copy);
    }
  });
  return 2.0 * static_cast<double>(bytes) / s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto exit_status = parse(argc, argv, o)) return *exit_status;
  statepool::bench::StepLists lists;
  std::vector<statepool::bench::BenchStepMode> modes;
  try {
    lists = statepool::bench::parse_step_lists(o.batches, o.codecs);
    modes = statepool::bench::parse_step_modes(o.modes, true);
  } catch (const std::invalid_argument& e) {
    return statepool::tools::report_usage_error("bench_fused_step", e.what(), kUsage);
  }
  try {
    const unsigned threads =
        o.threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : o.threads;
    std::optional<statepool::support::WorkerPool> workers;
    if (threads > 1) workers.emplace(threads - 1);
    statepool::support::WorkerPool* pool = workers ? &*workers : nullptr;
    std::printf(
        "fused step, one layer per call, K = V = 128; %u thread(s); median of %u calls; "
        "synthetic states (%u steps) and synthetic stepquant plans (unit impact)\n",
        threads, o.iters, o.steps);

    for (const statepool::bench::BenchStepMode& mode : modes) {
      statepool::kernels::StepPolicy policy;
      policy.mode = mode.mode;
      policy.light = mode.light;
      policy.full_every = o.every;
      policy.step = 1;  // a light step (never a multiple of --every)
      statepool::bench::print_step_mode(mode, modes.size(), o.every);
      statepool::bench::print_step_tables(
          lists.batches, lists.codecs, "ms", "memcpy",
          [&](std::size_t bytes) { return copy_rate(bytes, o, pool); },
          [&](const statepool::bench::StepShape& shape, CodecId id, std::uint32_t batch) {
            return measure(shape, id, batch, o, policy, pool);
          });
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fused_step: %s\n", e.what());
    return 1;
  }
}
