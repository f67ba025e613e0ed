// The fused decode step on the GPU (kernels/cuda/step_kernels.hpp), per layer and token,
// side by side for every page codec, against the fp32 pages of the same kernel and
// against the card's device-to-device copy bandwidth measured in the same run.
//
//   bench_gpu_fused_step [--batches LIST] [--codecs LIST] [--modes LIST] [--every N]
//                        [--iters N] [--device N]
//
// Shapes and codecs as bench_fused_step (the host path): one linear layer, K = V = 128,
// qwen3-next (GDN, 32 value heads, 16 q/k heads) and kimi-linear (KDA, 32 heads, a gate
// per key channel); by default fp32, bf16, int8, stepquant6, stepquant4 (--codecs), the
// stepquant ones with testing::mixed_width_plan.
// Per row: device time of one launch for the batch, "x fp32" = fp32's time / this one's,
// "moved" = bytes the step must move (each page's layer read and written once, plus the
// inputs and outputs) per second, "x copy" = that rate over the rate at which a
// cudaMemcpyAsync of the batch's FP32 layer bytes moves bytes (read + write).
// Exits 0 with a note when no GPU is present.

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "gpu_common.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/cuda/step_kernels.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/decode_step.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::bench::check;
using statepool::bench::DeviceBytes;
using statepool::bench::median_gpu_seconds;
using statepool::kernels::Arch;
using statepool::kernels::CodecId;
using statepool::kernels::DType;
using statepool::kernels::PageCodec;
using statepool::kernels::StateLayout;
namespace cuda = statepool::kernels::cuda;

struct Options {
  std::string batches = "1,32,128,512";
  std::string codecs = "fp32,bf16,int8,stepquant6,stepquant4";
  std::uint32_t iters = 10;
  std::uint32_t device = 0;
  std::string modes = "full,light";
  std::uint32_t every = 16;
};

constexpr const char* kUsage =
    "usage: bench_gpu_fused_step [--batches LIST] [--codecs LIST] [--modes LIST] [--every N]\n"
    "                            [--iters N] [--device N]\n"
    "  --batches LIST  comma-separated batch sizes (default 1,32,128,512)\n"
    "  --codecs LIST   comma-separated codecs, fp32 first for the x fp32 column\n"
    "                  (default fp32,bf16,int8,stepquant6,stepquant4)\n"
    "  --modes LIST    step modes, one table each: full, light (default full,light; a light\n"
    "                  launch runs the kernel with the no_refit page format)\n"
    "  --every N       light mode: the full fit on every N-th step (default 16)\n"
    "  --iters N       timed launches per measurement, median reported (default 10)\n"
    "  --device N      CUDA device ordinal (default 0)\n";

std::optional<int> parse(int argc, char** argv, Options& o) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_gpu_fused_step", kUsage);
  // clang-format off
  cli.add_options()
      ("batches", boost::program_options::value(&o.batches))
      ("codecs", boost::program_options::value(&o.codecs))
      ("modes", boost::program_options::value(&o.modes))
      ("every", bounded(o.every, 2, 1000000))
      ("iters", bounded(o.iters, 1, 1000000))
      ("device", bounded(o.device, 0, 1023));
  // clang-format on
  return cli.parse(argc, argv);
}

template <class T>
void upload(const DeviceBytes& to, const std::vector<T>& from) {
  check(cudaMemcpy(to.get(), from.data(), from.size() * sizeof(T), cudaMemcpyHostToDevice),
        "cudaMemcpy");
}

statepool::bench::StepRow measure(const statepool::bench::StepShape& shape, CodecId id,
                                  std::uint32_t batch, const Options& o,
                                  statepool::kernels::StepMode mode, cudaStream_t stream) {
  const PageCodec codec(statepool::bench::step_layout(shape, id, "bench_gpu_fused_step"));
  const StateLayout& l = codec.layout();
  const std::size_t page = codec.page_bytes();
  const auto staged = statepool::synthetic::synthetic_staged_state(l, 32, 1, DType::f32);
  std::vector<std::byte> one(page);
  codec.encode(staged, DType::f32, one);
  DeviceBytes arena(page * batch);
  for (std::uint32_t b = 0; b < batch; ++b) {
    check(cudaMemcpy(arena.get() + b * page, one.data(), page, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  statepool::testing::StepBatch in(l, batch, shape.qk_heads, 7);
  std::vector<std::uint32_t> slot_ids(batch);
  for (std::uint32_t b = 0; b < batch; ++b) slot_ids[b] = b;
  DeviceBytes q(in.q.size() * 4), k(in.k.size() * 4), v(in.v.size() * 4),
      g(in.log_decay.size() * 4), beta(in.beta.size() * 4), out(in.out.size() * 4),
      slots(batch * 4);
  upload(q, in.q);
  upload(k, in.k);
  upload(v, in.v);
  upload(g, in.log_decay);
  upload(beta, in.beta);
  upload(slots, slot_ids);
  const cuda::DevicePageFormat format(codec, DType::f32);
  // A light step: the same kernel with the no_refit page format (docs/codecs.md).
  const cuda::PageFormatView view = mode == statepool::kernels::StepMode::light
                                        ? cuda::light_step_view(format.view())
                                        : format.view();
  const cuda::StepView s{.num_heads = l.num_heads,
                         .batch = batch,
                         .qk_heads = shape.qk_heads,
                         .q = reinterpret_cast<const float*>(q.get()),
                         .k = reinterpret_cast<const float*>(k.get()),
                         .v = reinterpret_cast<const float*>(v.get()),
                         .log_decay = reinterpret_cast<const float*>(g.get()),
                         .beta = reinterpret_cast<const float*>(beta.get()),
                         .out = reinterpret_cast<float*>(out.get()),
                         .pages = reinterpret_cast<std::uint8_t*>(arena.get()),
                         .page_stride = page,
                         .page_count = batch,
                         .slots = reinterpret_cast<const std::uint32_t*>(slots.get())};
  statepool::bench::StepRow m;
  m.seconds = median_gpu_seconds(o.iters, stream, [&] {
    check(cuda::fused_step_pages(view, s, stream), "fused_step_pages");
  });
  m.layer_bytes = static_cast<double>(codec.conv_offset());
  m.moved = statepool::bench::StepRow::moved_bytes(m.layer_bytes, batch,
                                                   in.q.size() + in.k.size() + in.v.size() +
                                                       in.log_decay.size() + in.beta.size() +
                                                       in.out.size() + batch);  // + the slot ids
  return m;
}

double copy_rate(std::size_t bytes, const Options& o, cudaStream_t stream) {
  DeviceBytes from(bytes);
  DeviceBytes to(bytes);
  check(cudaMemset(from.get(), 1, bytes), "cudaMemset");
  const double s = median_gpu_seconds(o.iters, stream, [&] {
    check(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
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
    modes = statepool::bench::parse_step_modes(o.modes, false);
  } catch (const std::invalid_argument& e) {
    return statepool::tools::report_usage_error("bench_gpu_fused_step", e.what(), kUsage);
  }
  try {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("bench_gpu_fused_step: no CUDA device; nothing measured\n");
      return 0;
    }
    check(cudaSetDevice(static_cast<int>(o.device)), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, static_cast<int>(o.device)), "cudaGetDeviceProperties");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    std::printf(
        "fused step on %s, one layer per launch, K = V = 128; median of %u launches; "
        "synthetic states and synthetic stepquant plans (unit impact)\n",
        prop.name, o.iters);
    for (const statepool::bench::BenchStepMode& mode : modes) {
      statepool::bench::print_step_mode(mode, modes.size(), o.every);
      statepool::bench::print_step_tables(
          lists.batches, lists.codecs, "us", "copy",
          [&](std::size_t bytes) { return copy_rate(bytes, o, stream); },
          [&](const statepool::bench::StepShape& shape, CodecId id, std::uint32_t batch) {
            return measure(shape, id, batch, o, mode.mode, stream);
          });
    }
    (void)cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_fused_step: %s\n", e.what());
    return 1;
  }
}
