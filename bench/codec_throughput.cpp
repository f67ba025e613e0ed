// CPU codec throughput: encode and decode of whole pages, against memcpy of the same
// FP32 bytes measured in the same run.
//
//   bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]
//                          [--kv-tokens N] [--kv-channels N]
//
// Layout: GDN, K = V = 128, conv 4096 channels x 3 in bf16, `layers` x `heads` heads.
// The state is synthetic (gated delta rule, statepool/synthetic/state.hpp). Throughput is bytes of
// the f32 staged state (recurrent FP32 + raw conv) per second, median of `iters` timed runs after
// one warm-up; "x memcpy" is that throughput divided by memcpy's.
//
// stepquant6 runs with testing::mixed_width_plan (plans.hpp), not a calibrated plan: every
// head at 6 bits except every 16th head (from 3) at 8 bits, every 16th (from 7) at 4
// bits, and up to two FP16 pivot heads; unit impact factors. dsq6 needs no plan.
//
// KV-cache codecs (kernels/kv.hpp), after the state codecs: one attention layer's keys and
// values, `kv-tokens` x `kv-channels` each (default 10,000 x 1,024: 8 KV heads of 128),
// from and to bf16 as engines hold them (Gaussian values with per-channel scales and a few
// outlier channels, as keys have). Throughput is bytes of that bf16 input per second (keys
// + values), against memcpy of the same bytes; the ratio is bf16 bytes / encoded bytes.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <memory>

#include "common.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
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
  std::uint32_t kv_tokens = 10000;
  std::uint32_t kv_channels = 1024;
};

constexpr const char* kUsage =
    "usage: bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]\n"
    "  --layers N  linear-attention layers (default 8)\n"
    "  --heads N   heads per layer (default 16)\n"
    "  --iters N   timed runs per measurement, median reported (default 15)\n"
    "  --steps N   recurrence steps of the synthetic state (default 64)\n"
    "  --kv-tokens N    tokens of the KV-cache streams (default 10000)\n"
    "  --kv-channels N  channels of each KV stream, heads x head_dim (default 1024)\n";

// The options, or the exit status to leave with now (--help, a usage error).
std::optional<int> parse(int argc, char** argv, Options& o) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_codec_throughput", kUsage);
  // clang-format off
  cli.add_options()
      ("layers", bounded(o.layers, 1, 1000000))
      ("heads", bounded(o.heads, 1, 1000000))
      ("iters", bounded(o.iters, 1, 1000000))
      ("steps", bounded(o.steps, 1, 1000000))
      ("kv-tokens", bounded(o.kv_tokens, 1, 1000000))
      ("kv-channels", bounded(o.kv_channels, 1, 65536));
  // clang-format on
  return cli.parse(argc, argv);
}

std::shared_ptr<const stepquant::Plan> bench_plan(const Options& o) {
  return statepool::testing::mixed_width_plan(statepool::kernels::Arch::gdn, o.layers, o.heads, 6,
                                              "bench_codec_throughput");
}

StateLayout make_layout(const Options& o, CodecId codec) {
  StateLayout layout = statepool::bench::gdn_layout(o.layers, o.heads, 4096, codec);
  if (codec == CodecId::stepquant6 || codec == CodecId::stepquant4) {
    layout.plan = bench_plan(o);
  }
  return layout;
}

/// bf16 keys or values: N(0, 1) times a per-channel scale in [0.25, 4], every 61st channel
/// an outlier channel (x 20).
/// tokens x channels bf16 values shaped like keys or values (synthetic::channel_scaled_values).
std::vector<std::byte> kv_values(std::uint64_t tokens, std::uint64_t channels, std::uint64_t seed) {
  const std::vector<float> v = statepool::synthetic::channel_scaled_values(tokens, channels, seed);
  std::vector<std::byte> out(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t b = statepool::kernels::float_to_bf16_bits(v[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

void kv_section(const Options& o) {
  namespace k = statepool::kernels;
  const std::uint64_t tokens = o.kv_tokens;
  const std::uint64_t channels = o.kv_channels;
  const std::vector<std::byte> keys = kv_values(tokens, channels, 11);
  const std::vector<std::byte> values = kv_values(tokens, channels, 12);
  const std::size_t plain_bytes = keys.size() + values.size();
  std::vector<std::byte> copy(plain_bytes);
  std::vector<std::byte> back_k(keys.size());
  std::vector<std::byte> back_v(values.size());
  const double memcpy_s = median_seconds(o.iters, [&] {
    std::memcpy(copy.data(), keys.data(), keys.size());
    std::memcpy(copy.data() + keys.size(), values.data(), values.size());
  });
  const double memcpy_gbs = static_cast<double>(plain_bytes) / memcpy_s / 1e9;
  std::printf(
      "\nKV cache: one layer, keys + values, %llu tokens x %llu channels each, bf16 in and out "
      "(%.1f MB)\n",
      static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(channels),
      static_cast<double>(plain_bytes) / 1e6);
  std::printf("%-10s %10s %7s %12s %9s %12s %9s %10s\n", "kv codec", "bytes MB", "ratio",
              "encode GB/s", "x memcpy", "decode GB/s", "x memcpy", "rel RMS");
  std::printf("%-10s %10.2f %7.2f %12.2f %9.2f %12.2f %9.2f %10s\n", "memcpy",
              static_cast<double>(plain_bytes) / 1e6, 1.0, memcpy_gbs, 1.0, memcpy_gbs, 1.0, "-");
  for (const k::KvCodecId codec : {k::KvCodecId::bf16, k::KvCodecId::fp8, k::KvCodecId::kivi4,
                                   k::KvCodecId::kivi2, k::KvCodecId::flexgen4}) {
    const k::KvStream ks{codec, k::KvRole::keys, tokens, channels};
    const k::KvStream vs{codec, k::KvRole::values, tokens, channels};
    std::vector<std::byte> enc_k(k::kv_encoded_bytes(ks));
    std::vector<std::byte> enc_v(k::kv_encoded_bytes(vs));
    const double enc_s = median_seconds(o.iters, [&] {
      k::kv_encode(ks, DType::bf16, keys, enc_k);
      k::kv_encode(vs, DType::bf16, values, enc_v);
    });
    const double dec_s = median_seconds(o.iters, [&] {
      k::kv_decode(ks, enc_k, DType::bf16, back_k);
      k::kv_decode(vs, enc_v, DType::bf16, back_v);
    });
    // Relative RMS error of the decoded values, keys and values together.
    double err = 0;
    double ref = 0;
    for (const auto& [in, out] : {std::pair{&keys, &back_k}, std::pair{&values, &back_v}}) {
      for (std::size_t i = 0; i < in->size(); i += 2) {
        std::uint16_t a = 0;
        std::uint16_t b = 0;
        std::memcpy(&a, in->data() + i, 2);
        std::memcpy(&b, out->data() + i, 2);
        const double x = k::bf16_bits_to_float(a);
        const double d = x - k::bf16_bits_to_float(b);
        err += d * d;
        ref += x * x;
      }
    }
    const std::size_t encoded = enc_k.size() + enc_v.size();
    const double enc_gbs = static_cast<double>(plain_bytes) / enc_s / 1e9;
    const double dec_gbs = static_cast<double>(plain_bytes) / dec_s / 1e9;
    std::printf("%-10s %10.2f %7.2f %12.2f %9.2f %12.2f %9.2f %10.2e\n", k::to_string(codec),
                static_cast<double>(encoded) / 1e6,
                static_cast<double>(plain_bytes) / static_cast<double>(encoded), enc_gbs,
                enc_gbs / memcpy_gbs, dec_gbs, dec_gbs / memcpy_gbs, std::sqrt(err / ref));
  }
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

    const std::vector<std::byte> staged = statepool::synthetic::synthetic_staged_state(
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
    kv_section(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec_throughput: %s\n", e.what());
    return 1;
  }
}
