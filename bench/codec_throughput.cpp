// CPU codec throughput: encode and decode of whole pages, against memcpy of the same
// FP32 bytes measured in the same run.
//
//   bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]
//                          [--kv-tokens N] [--kv-channels N] [--view]
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
//
// --view adds the staged views (kernels/staged_view.hpp) beside the packed layout, in the
// same run: the state value-major (each head [V][K], SGLang's and vLLM's order) with the
// conv state in a buffer of its own, encoded from f32 and decoded to f32 and bf16; and the
// KV blocks as rows of SGLang's page_first host pool ([2][size][layers][row], 4 layers of
// kv-tokens / 4 tokens). Throughput as above, and the view's time over the packed one's.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <memory>

#include "common.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/staged_view.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/staged_views.hpp"
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
  bool view = false;
};

constexpr const char* kUsage =
    "usage: bench_codec_throughput [--layers N] [--heads N] [--iters N] [--steps N]\n"
    "  --layers N  linear-attention layers (default 8)\n"
    "  --heads N   heads per layer (default 16)\n"
    "  --iters N   timed runs per measurement, median reported (default 15)\n"
    "  --steps N   recurrence steps of the synthetic state (default 64)\n"
    "  --kv-tokens N    tokens of the KV-cache streams (default 10000)\n"
    "  --kv-channels N  channels of each KV stream, heads x head_dim (default 1024)\n"
    "  --view      also staged views: value-major states, page_first KV rows\n";

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
      ("kv-channels", bounded(o.kv_channels, 1, 65536))
      ("view", boost::program_options::bool_switch(&o.view));
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

/// Every head of `recurrent` ([K][V] values of `width` bytes, 128 x 128) transposed.
std::vector<std::byte> value_major(std::span<const std::byte> recurrent, std::size_t width) {
  return statepool::testing::transpose_heads(recurrent, 128, 128, width);
}

// The state value-major with the conv state apart, against the packed layout.
void state_view_section(const Options& o, const std::vector<std::byte>& staged) {
  namespace k = statepool::kernels;
  const PageCodec fp32(make_layout(o, CodecId::fp32));
  const std::size_t conv = fp32.conv_bytes();
  const std::size_t recurrent = staged.size() - conv;
  std::vector<std::byte> heads = value_major({staged.data(), recurrent}, 4);
  std::vector<std::byte> conv_in(staged.end() - static_cast<std::ptrdiff_t>(conv), staged.end());
  std::vector<std::byte> back(staged.size());
  std::vector<std::byte> back_bf16(fp32.staged_bytes(DType::bf16));
  std::vector<std::byte> heads_out(recurrent);
  std::vector<std::byte> heads_bf16(recurrent / 2);
  std::vector<std::byte> conv_out(conv);
  const k::StateView in{heads, conv_in, DType::f32, k::HeadOrder::value_major};
  const k::StateView out{heads_out, conv_out, DType::f32, k::HeadOrder::value_major};
  const k::StateView out_bf16{heads_bf16, conv_out, DType::bf16, k::HeadOrder::value_major};
  const auto gbs = [&](double seconds) {
    return static_cast<double>(staged.size()) / seconds / 1e9;
  };
  std::printf(
      "\nstaged view: value-major heads ([V][K]), conv state apart, one thread; GB/s of the f32 "
      "state as above, \"x packed\" = packed time / view time\n");
  std::printf("%-10s %12s %9s %12s %9s %14s %9s\n", "codec", "encode GB/s", "x packed",
              "decode GB/s", "x packed", "dec bf16 GB/s", "x packed");
  for (const CodecId id : {CodecId::fp32, CodecId::bf16, CodecId::int8, CodecId::int6,
                           CodecId::int4, CodecId::dsq6, CodecId::stepquant6}) {
    const PageCodec page(make_layout(o, id));
    std::vector<std::byte> bytes(page.page_bytes());
    const double enc = median_seconds(o.iters, [&] { page.encode(staged, DType::f32, bytes); });
    const double enc_view = median_seconds(o.iters, [&] { page.encode(in, bytes); });
    const double dec = median_seconds(o.iters, [&] { page.decode(bytes, DType::f32, back); });
    const double dec_view = median_seconds(o.iters, [&] { page.decode(bytes, out); });
    const double dec16 =
        median_seconds(o.iters, [&] { page.decode(bytes, DType::bf16, back_bf16); });
    const double dec16_view = median_seconds(o.iters, [&] { page.decode(bytes, out_bf16); });
    std::printf("%-10s %12.2f %9.2f %12.2f %9.2f %14.2f %9.2f\n", k::to_string(id), gbs(enc_view),
                enc / enc_view, gbs(dec_view), dec / dec_view, gbs(dec16_view), dec16 / dec16_view);
  }
}

// KV blocks as rows of a page_first pool, against the packed order.
void kv_view_section(const Options& o) {
  namespace k = statepool::kernels;
  constexpr std::uint32_t kLayers = 4;
  const std::uint64_t tokens = std::max<std::uint64_t>(1, o.kv_tokens / kLayers);
  const std::uint64_t channels = o.kv_channels;
  const std::uint64_t row = channels * 2;
  const std::vector<std::byte> keys = kv_values(tokens * kLayers, channels, 11);
  const std::vector<std::byte> values = kv_values(tokens * kLayers, channels, 12);
  // The packed order (layer 0 keys, layer 0 values, ...) and page_first [2][tokens][L][row].
  std::vector<std::byte> packed(keys.size() + values.size());
  std::vector<std::byte> pool(packed.size());
  for (std::uint64_t l = 0; l < kLayers; ++l) {
    for (std::uint64_t t = 0; t < tokens; ++t) {
      const std::uint64_t from = (l * tokens + t) * row;
      std::memcpy(packed.data() + (2 * l * tokens + t) * row, keys.data() + from, row);
      std::memcpy(packed.data() + ((2 * l + 1) * tokens + t) * row, values.data() + from, row);
      std::memcpy(pool.data() + (t * kLayers + l) * row, keys.data() + from, row);
      std::memcpy(pool.data() + ((tokens + t) * kLayers + l) * row, values.data() + from, row);
    }
  }
  std::vector<std::byte> back(packed.size());
  std::vector<std::byte> pool_back(pool.size());
  const auto view_of = [&](std::vector<std::byte>& bytes, const k::KvBlocks& kv) {
    k::KvView v;
    v.layer_stride = row;
    v.token_stride = kLayers * row;
    v.dtype = DType::bf16;
    const std::uint64_t extent =
        k::kv_view_extent(kv, channels, DType::bf16, v.layer_stride, v.token_stride);
    v.keys = std::span(bytes).first(extent);
    v.values = std::span(bytes).subspan(bytes.size() / 2, extent);
    return v;
  };
  const auto gbs = [&](double seconds) {
    return static_cast<double>(packed.size()) / seconds / 1e9;
  };
  std::printf(
      "\nKV view: %u layers x %llu tokens x %llu channels, keys + values, bf16, as rows of "
      "SGLang's page_first pool; one thread; \"x packed\" = packed time / view time\n",
      kLayers, static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(channels));
  std::printf("%-10s %12s %9s %12s %9s\n", "kv codec", "encode GB/s", "x packed", "decode GB/s",
              "x packed");
  for (const k::KvCodecId codec : {k::KvCodecId::bf16, k::KvCodecId::fp8, k::KvCodecId::kivi4,
                                   k::KvCodecId::kivi2, k::KvCodecId::flexgen4}) {
    const k::KvBlocks kv{codec, kLayers, static_cast<std::uint32_t>(channels),
                         static_cast<std::uint32_t>(channels), tokens};
    const std::size_t streams = 2 * kLayers;
    std::vector<std::byte> encoded(k::kv_blocks_encoded_bytes(kv));
    const k::KvView in = view_of(pool, kv);
    const k::KvView out = view_of(pool_back, kv);
    const double enc =
        median_seconds(o.iters, [&] { k::kv_encode_blocks(kv, DType::bf16, packed, encoded); });
    const double enc_view =
        median_seconds(o.iters, [&] { k::kv_encode_view(kv, in, encoded, 0, streams); });
    const double dec =
        median_seconds(o.iters, [&] { k::kv_decode_blocks(kv, encoded, DType::bf16, back); });
    const double dec_view =
        median_seconds(o.iters, [&] { k::kv_decode_view(kv, encoded, out, 0, streams); });
    std::printf("%-10s %12.2f %9.2f %12.2f %9.2f\n", k::to_string(codec), gbs(enc_view),
                enc / enc_view, gbs(dec_view), dec / dec_view);
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
    if (o.view) state_view_section(o, staged);
    kv_section(o);
    if (o.view) kv_view_section(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec_throughput: %s\n", e.what());
    return 1;
  }
}
