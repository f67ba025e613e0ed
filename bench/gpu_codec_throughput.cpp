// GPU codec throughput, side by side on one card: device-to-device copy bandwidth (the
// ceiling), then compress (staged FP32 -> page) and decompress (page -> staged FP32) of
// Qwen3-Next-sized states (36 layers x 32 heads x 128 x 128, bf16 conv state of 8192 x 3)
// batched over N slots in one launch, per codec. Throughput is counted in bytes of FP32
// state per second (what an engine moves) and as a fraction of the copy rate (bytes a
// device-to-device copy moves per second; a compress reads the state and writes a smaller
// page, so it moves fewer bytes than a copy of the state and may pass 1.0).
//
// Usage: see kUsage. Prints a table; exits 0 with a note when no GPU is present.

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "gpu_common.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/plans.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::kernels::CodecId;
using statepool::kernels::DType;
using statepool::kernels::PageCodec;
using statepool::kernels::StateLayout;
namespace cuda = statepool::kernels::cuda;

using statepool::bench::check;
using statepool::bench::DeviceBytes;
using statepool::bench::median_gpu_seconds;

StateLayout layout_for(const statepool::bench::CodecChoice& choice) {
  const CodecId codec = choice.id;
  if (codec == CodecId::stepquant4 || codec == CodecId::stepquant6) {
    // The calibrated-looking plans of statepool::testing, at Qwen3-Next's shape.
    const std::uint32_t budget = codec == CodecId::stepquant4 ? 4 : 6;
    // Mixed widths averaging the budget, 16 FP16 pivot heads (the paper's share on 1152
    // heads), random impact factors: every path of the kernels runs.
    const auto width = [budget](std::size_t unit) -> std::uint8_t {
      if (unit % 72 == 0) return 16;
      static constexpr std::uint8_t k6[] = {4, 6, 8};
      static constexpr std::uint8_t k4[] = {2, 4, 6, 4};
      return budget == 6 ? k6[unit % 3] : k4[unit % 4];
    };
    StateLayout layout = statepool::testing::plan_layout(
        statepool::testing::make_plan(statepool::kernels::Arch::gdn, 36, 32, 128, 128, budget,
                                      width, statepool::testing::random_impact(11)),
        codec, choice.variant);
    layout.conv_channels = 8192;
    layout.conv_width = 3;
    layout.conv_dtype = DType::bf16;
    return layout;
  }
  return statepool::bench::gdn_layout(36, 32, 8192, codec);
}

constexpr const char* kUsage =
    "usage: bench_gpu_codec_throughput [--slots N,N] [--codecs C,C] [--iters N] [--device N]\n"
    "  --slots N,N   batch sizes (default 64,512)\n"
    "  --codecs C,C  codecs (default fp32,bf16,int8,int6,int4,dsq6,stepquant6,stepquant4);\n"
    "                stepquant4/6 take an ablation variant: stepquant6:spatial_only,\n"
    "                stepquant6:temporal_only\n"
    "  --iters N     timed runs per figure, median reported (default 10)\n"
    "  --device N    CUDA device ordinal (default 0)\n";

struct Row {
  std::string codec;
  std::uint32_t slots;
  double ratio;
  double compress_gbs;
  double decompress_gbs;
  double compress_of_ceiling;
  double decompress_of_ceiling;
};

}  // namespace

int main(int argc, char** argv) {
  std::string slots_text = "64,512";
  std::string codecs_text = "fp32,bf16,int8,int6,int4,dsq6,stepquant6,stepquant4";
  std::uint32_t iters = 10;
  std::uint32_t device = 0;
  {
    using statepool::tools::bounded;
    statepool::tools::CommandLine cli("bench_gpu_codec_throughput", kUsage);
    // clang-format off
    cli.add_options()
        ("slots", boost::program_options::value(&slots_text))
        ("codecs", boost::program_options::value(&codecs_text))
        ("iters", bounded(iters, 1, 1000))
        ("device", bounded(device, 0, 1023));
    // clang-format on
    if (const auto exit_status = cli.parse(argc, argv)) return *exit_status;
  }
  std::vector<std::uint32_t> batches;
  std::vector<statepool::bench::CodecChoice> codecs;
  try {
    batches = statepool::bench::parse_batches(slots_text, "--slots");
    codecs = statepool::bench::parse_codec_choices(codecs_text, "--codecs");
  } catch (const std::invalid_argument& e) {
    return statepool::tools::report_usage_error("bench_gpu_codec_throughput", e.what(), kUsage);
  }

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure (run scripts/gpu-check on a GPU machine)\n");
    return 0;
  }
  try {
    check(cudaSetDevice(static_cast<int>(device)), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, static_cast<int>(device)), "cudaGetDeviceProperties");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

    // The ceiling: a large device-to-device copy (reads and writes 1 GiB).
    const std::size_t copy_bytes = std::size_t{1} << 30;
    DeviceBytes copy_src(copy_bytes);
    DeviceBytes copy_dst(copy_bytes);
    check(cudaMemset(copy_src.get(), 1, copy_bytes), "cudaMemset");
    const double copy_s = median_gpu_seconds(iters, stream, [&] {
      check(cudaMemcpyAsync(copy_dst.get(), copy_src.get(), copy_bytes, cudaMemcpyDeviceToDevice,
                            stream),
            "cudaMemcpyAsync");
    });
    // Bytes copied per second (each is read and written once): the ceiling a compress or
    // decompress of the same state is measured against.
    const double ceiling = static_cast<double>(copy_bytes) / copy_s;
    std::printf("device %u: %s, %.1f GiB; device-to-device copy %.0f GB/s\n", device, prop.name,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30), ceiling / 1e9);

    std::vector<Row> rows;
    for (const statepool::bench::CodecChoice& choice : codecs) {
      const StateLayout layout = layout_for(choice);
      const PageCodec codec(layout);
      const std::size_t staged_bytes = codec.staged_bytes(DType::f32);
      const std::size_t stride = (codec.page_bytes() + 255) / 256 * 256;
      const auto host_state =
          statepool::synthetic::synthetic_staged_state(layout, 64, 7, DType::f32);
      const cuda::DevicePageFormat format(codec, DType::f32);
      for (const std::uint32_t slots : batches) {
        DeviceBytes staged(staged_bytes * slots);
        DeviceBytes pages(stride * slots);
        check(cudaMemcpy(staged.get(), host_state.data(), staged_bytes, cudaMemcpyHostToDevice),
              "cudaMemcpy");
        for (std::uint32_t s = 1; s < slots; ++s) {
          check(cudaMemcpy(staged.get() + s * staged_bytes, staged.get(), staged_bytes,
                           cudaMemcpyDeviceToDevice),
                "cudaMemcpy");
        }
        std::vector<const void*> staged_in(slots);
        std::vector<void*> staged_out(slots);
        std::vector<const void*> pages_in(slots);
        std::vector<void*> pages_out(slots);
        for (std::uint32_t s = 0; s < slots; ++s) {
          staged_out[s] = staged.get() + s * staged_bytes;
          staged_in[s] = staged_out[s];
          pages_out[s] = pages.get() + s * stride;
          pages_in[s] = pages_out[s];
        }
        DeviceBytes ptrs(4 * sizeof(void*) * slots);
        auto* table = reinterpret_cast<void**>(ptrs.get());
        check(cudaMemcpy(table, staged_in.data(), sizeof(void*) * slots, cudaMemcpyHostToDevice),
              "cudaMemcpy");
        check(cudaMemcpy(table + slots, pages_out.data(), sizeof(void*) * slots,
                         cudaMemcpyHostToDevice),
              "cudaMemcpy");
        const auto* d_staged_in = reinterpret_cast<const void* const*>(table);
        auto* d_pages_out = reinterpret_cast<void* const*>(table + slots);
        auto* d_pages_in = reinterpret_cast<const void* const*>(table + slots);
        auto* d_staged_out = reinterpret_cast<void* const*>(table);

        const double compress_s = median_gpu_seconds(iters, stream, [&] {
          check(cuda::encode_pages(format.view(), d_staged_in, d_pages_out, slots, nullptr, stream),
                "encode_pages");
        });
        const double decompress_s = median_gpu_seconds(iters, stream, [&] {
          check(cuda::decode_pages(format.view(), d_pages_in, d_staged_out, slots, stream),
                "decode_pages");
        });
        const double state = static_cast<double>(staged_bytes) * slots;
        Row row;
        row.codec = choice.name();
        row.slots = slots;
        row.ratio = codec.compression_ratio();
        row.compress_gbs = state / compress_s / 1e9;
        row.decompress_gbs = state / decompress_s / 1e9;
        row.compress_of_ceiling = state / compress_s / ceiling;
        row.decompress_of_ceiling = state / decompress_s / ceiling;
        rows.push_back(row);
        std::fflush(stdout);
      }
    }
    std::printf("\n%-23s %6s %6s | %12s %8s | %12s %8s\n", "codec", "slots", "ratio", "compress",
                "of copy", "decompress", "of copy");
    for (const Row& r : rows) {
      std::printf("%-23s %6u %5.2fx | %7.0f GB/s %7.2fx | %7.0f GB/s %7.2fx\n", r.codec.c_str(),
                  r.slots, r.ratio, r.compress_gbs, r.compress_of_ceiling, r.decompress_gbs,
                  r.decompress_of_ceiling);
    }
    std::printf(
        "(GB/s of FP32 state; 'of copy': against a device-to-device copy of the same "
        "bytes, %.0f GB/s)\n",
        ceiling / 1e9);
    (void)cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_codec_throughput: %s\n", e.what());
    return 1;
  }
  return 0;
}
