// CPU codec throughput: encode and decode of whole pages, against memcpy of the same
// FP32 bytes measured in the same run.
//
//   bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]
//
// Layout: GDN, K = V = 128, conv 4096 channels x 3 in bf16, `layers` x `heads` heads.
// The state is synthetic (gated delta rule, synthetic_state.hpp). Throughput is bytes of the
// f32 staged state (recurrent FP32 + raw conv) per second, median of `iters` timed runs
// after one warm-up; "x memcpy" is that throughput divided by memcpy's.
//
// stepquant6 runs with bench::synthetic_plan (common.hpp), not a calibrated plan: every
// head at 6 bits except every 16th head (from 3) at 8 bits, every 16th (from 7) at 4
// bits, and up to two FP16 pivot heads; unit impact factors. dsq6 needs no plan.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <memory>

#include "common.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/synthetic_state.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::bench::median_seconds;

using statepool::kernels::CodecId;
using statepool::kernels::DType;
using statepool::kernels::PageCodec;
using statepool::kernels::StateLayout;
namespace stepquant = statepool::kernels::stepquant;

struct Options {
  std::uint32_t layers = 8;
  std::uint32_t heads = 16;
  std::uint32_t iters = 15;
  std::uint32_t steps = 64;
};

constexpr const char* kUsage =
    "usage: bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]\n"
    "  --layers N  linear-attention layers (default 8)\n"
    "  --heads N   heads per layer (default 16)\n"
    "  --iters N   timed runs per measurement, median reported (default 15)\n"
    "  --steps N   recurrence steps of the synthetic state (default 64)\n";

// The options, or the exit status to leave with now (--help, a usage error).
std::optional<int> parse(int argc, char** argv, Options& o) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_codec_throughput", kUsage);
  // clang-format off
  cli.add_options()
      ("layers", bounded(o.layers, 1, 1000000))
      ("heads", bounded(o.heads, 1, 1000000))
      ("iters", bounded(o.iters, 1, 1000000))
      ("steps", bounded(o.steps, 1, 1000000));
  // clang-format on
  return cli.parse(argc, argv);
}

std::shared_ptr<const stepquant::Plan> bench_plan(const Options& o) {
  return statepool::bench::synthetic_plan(statepool::kernels::Arch::gdn, o.layers, o.heads, 6,
                                          "bench_codec_throughput");
}

StateLayout make_layout(const Options& o, CodecId codec) {
  StateLayout layout = statepool::bench::gdn_layout(o.layers, o.heads, 4096, codec);
  if (codec == CodecId::stepquant6 || codec == CodecId::stepquant4) {
    layout.plan = bench_plan(o);
  }
  return layout;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto exit_status = parse(argc, argv, o)) {
    return *exit_status;
  }
  try {
    const PageCodec reference_layout(make_layout(o, CodecId::fp32));
    const std::size_t state_bytes = reference_layout.staged_bytes(DType::f32);
    std::printf(
        "layout: %u layers x %u heads x 128 x 128, conv 4096 x 3 bf16; "
        "f32 staged state %.1f MB; synthetic state, %u steps; median of %u runs\n",
        o.layers, o.heads, static_cast<double>(state_bytes) / 1e6, o.steps, o.iters);

    const std::vector<std::byte> staged = statepool::testing::synthetic_staged_state(
        make_layout(o, CodecId::fp32), o.steps, 1, DType::f32);
    std::vector<std::byte> copy(state_bytes);
    std::vector<std::byte> back(state_bytes);

    const double memcpy_s =
        median_seconds(o.iters, [&] { std::memcpy(copy.data(), staged.data(), state_bytes); });
    const double memcpy_gbs = static_cast<double>(state_bytes) / memcpy_s / 1e9;

    {
      const auto plan = bench_plan(o);
      std::size_t count[17] = {};
      for (const auto w : plan->widths) {
        ++count[w];
      }
      std::printf(
          "stepquant6 plan (synthetic, not calibrated; unit impact): %zu heads at 6 bits, "
          "%zu at 8, %zu at 4, %zu fp16 pivots; %.3f bits per value nominal\n",
          count[6], count[8], count[4], count[16], plan->average_width());
    }

    std::printf("\n%-10s %10s %7s %12s %9s %12s %9s\n", "codec", "page MB", "ratio", "encode GB/s",
                "x memcpy", "decode GB/s", "x memcpy");
    std::printf("%-10s %10.2f %7.2f %12.2f %9.2f %12.2f %9.2f\n", "memcpy",
                static_cast<double>(state_bytes) / 1e6, 1.0, memcpy_gbs, 1.0, memcpy_gbs, 1.0);
    for (const CodecId id : {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int8,
                             CodecId::int6, CodecId::int4, CodecId::dsq6, CodecId::stepquant6}) {
      const PageCodec page(make_layout(o, id));
      std::vector<std::byte> bytes(page.page_bytes());
      const double enc_s = median_seconds(o.iters, [&] { page.encode(staged, DType::f32, bytes); });
      const double dec_s = median_seconds(o.iters, [&] { page.decode(bytes, DType::f32, back); });
      const double enc_gbs = static_cast<double>(state_bytes) / enc_s / 1e9;
      const double dec_gbs = static_cast<double>(state_bytes) / dec_s / 1e9;
      std::printf("%-10s %10.2f %7.2f %12.2f %9.2f %12.2f %9.2f\n",
                  statepool::kernels::to_string(id), static_cast<double>(page.page_bytes()) / 1e6,
                  page.compression_ratio(), enc_gbs, enc_gbs / memcpy_gbs, dec_gbs,
                  dec_gbs / memcpy_gbs);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec_throughput: %s\n", e.what());
    return 1;
  }
}
