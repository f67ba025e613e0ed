// statepool-demo: every codec end to end against a running statepoold.
//
// Registers a Qwen3-Next-shaped GDN layout once per codec (the uniform codecs, plus
// stepquant6/stepquant4 for every --plan given), opens an arena per codec, stages
// recurrent states (the gated delta rule run on the inputs of a seeded synthetic "model",
// statepool/synthetic/trace.hpp, the same one `statepool-quant synth-trace` writes),
// parks them (compress) and resumes them (decompress), and reports page
// size, compression ratio, reconstruction error and request rates per codec. Each page is
// also decoded locally from the mapped arena and compared with the daemon's decompress,
// which checks that client and daemon agree on the page format. Then, native packed
// decode: the parked requests of every codec continue for --decode-tokens tokens with
// the fused step on their pages (client::DecodeStep, no daemon round trip), and their
// outputs are compared with an FP32 recurrence that was never compressed. Frees
// everything.
//
// Exit status: 0 success, 1 daemon error / mismatch, 2 usage error.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "statepool/client.hpp"
#include "statepool/decode_step.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/trace.hpp"
#include "statepool/tools/cli.hpp"

namespace {

namespace sc = statepool::client;
namespace sk = statepool::kernels;
namespace cal = statepool::calibration;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: statepool-demo [options]

Parks and resumes synthetic Qwen3-Next-shaped GDN states in a running statepoold with
every codec (fp32, bf16, fp16, int8, int6, int4, and stepquant6/stepquant4 for each
--plan) and reports page size, compression ratio, reconstruction error and request
rates; then every codec's parked states decode --decode-tokens more tokens natively, with
the fused step on their compressed pages, against an FP32 recurrence. The states come
from a seeded SYNTHETIC model (not a real LLM), the one `statepool-quant synth-trace
--model-seed S` writes calibration traces of.

options:
  --socket PATH    daemon socket (default: $STATEPOOL_SOCKET, else
                   /run/statepool/statepool.sock)
  --tenant NAME    tenant to connect as (default: the daemon's "default" tenant)
  --slots N        states per codec (default 4)
  --layers N       linear-attention layers (default 12; Qwen3-Next-80B has 36)
  --heads N        value heads per layer (default 32)
  --steps N        recurrence steps (tokens) behind each state (default 128)
  --decode-tokens N  tokens of native packed decode on the parked pages, per codec
                   (default 16; 0: none)
  --model-seed S   seed of the synthetic model's per-head parameters (default 7)
  --plan FILE      a STEPQuant plan calibrated for this layout (repeatable); adds the
                   codec stepquant6 or stepquant4 by the plan's budget
  --metrics URL    where statepoold's Prometheus metrics are, printed at the end
  --timeout MS     per-call timeout in milliseconds (default 60000)
  -h, --help       this text
)";

struct Args {
  sc::Options options;
  std::uint32_t slots = 4;
  std::uint32_t layers = 12;
  std::uint32_t heads = 32;
  std::uint32_t steps = 128;
  std::uint32_t decode_tokens = 16;
  std::uint64_t model_seed = 7;
  std::vector<std::string> plans;
  std::string metrics;
};

/// Reads the command line into `args`; returns the exit status to leave with now (--help,
/// a usage error), or nullopt to go on.
std::optional<int> parse(int argc, char** argv, Args& args) {
  namespace po = statepool::tools::po;
  using statepool::tools::bounded;
  args.options.socket_path = statepool::tools::default_socket();
  args.options.client_name = "statepool-demo";
  args.options.timeout = std::chrono::milliseconds(60000);
  auto timeout_ms = static_cast<std::uint64_t>(args.options.timeout.count());
  statepool::tools::CommandLine cli("statepool-demo", kUsage);
  // clang-format off
  cli.add_options()
      ("socket", po::value(&args.options.socket_path))
      ("tenant", po::value(&args.options.tenant))
      ("slots", bounded(args.slots, 1, 4096))
      ("layers", bounded(args.layers, 1, sk::kMaxLayers))
      ("heads", bounded(args.heads, 1, sk::kMaxHeads))
      ("steps", bounded(args.steps, 1, 100000))
      ("decode-tokens", bounded(args.decode_tokens, 0, 100000))
      ("model-seed", bounded(args.model_seed, 0, ~std::uint64_t{0} >> 1))
      ("plan", po::value(&args.plans))  // repeatable
      ("metrics", po::value(&args.metrics))
      ("timeout", bounded(timeout_ms, 1, 3600000));
  // clang-format on
  const auto exit_status = cli.parse(argc, argv);
  args.options.timeout = std::chrono::milliseconds(timeout_ms);
  return exit_status;
}

constexpr std::uint32_t kDim = 128;            // key_dim = value_dim (Qwen3-Next GDN)
constexpr std::uint32_t kConvChannels = 8192;  // q, k, v channels of the short convolution
constexpr std::uint32_t kConvWidth = 3;        // kernel size 4 -> 3 cached columns

sk::StateLayout demo_layout(const Args& args, sk::CodecId codec,
                            std::shared_ptr<const sk::stepquant::Plan> plan = nullptr) {
  sk::StateLayout l;
  l.name = std::string("demo-qwen3next-") + sk::to_string(codec);
  l.arch = sk::Arch::gdn;
  l.num_layers = args.layers;
  l.num_heads = args.heads;
  l.key_dim = kDim;
  l.value_dim = kDim;
  l.conv_channels = kConvChannels;
  l.conv_width = kConvWidth;
  l.conv_dtype = sk::DType::bf16;
  l.codec.id = codec;
  l.plan = std::move(plan);
  return l;
}

// Writes `args.slots` staged FP32 states (recurrent + bf16 conv) back to back into `dst`.
// Slot s is the state after `args.steps` tokens of token stream 1000 + s through the
// synthetic model: every (layer, head) runs the gated delta rule on its own inputs.
// `continuation[slot * layers + layer]` receives the inputs of the `args.decode_tokens`
// tokens that follow, for the native decode.
void stage_states(const Args& args, std::size_t state_bytes, std::span<std::byte> dst,
                  std::vector<cal::TokenBlock>& continuation) {
  continuation.resize(std::size_t{args.slots} * args.layers);
  const std::size_t head_values = static_cast<std::size_t>(kDim) * kDim;
  const std::size_t heads_per_state = static_cast<std::size_t>(args.layers) * args.heads;
  const std::size_t jobs = std::size_t{args.slots} * args.layers;  // one job: a layer of a slot
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  auto work = [&] {
    cal::TokenBlock block;
    std::vector<float> residual(kDim);
    for (std::size_t job = next++; job < jobs; job = next++) {
      const auto slot = static_cast<std::uint32_t>(job / args.layers);
      const auto layer = static_cast<std::uint32_t>(job % args.layers);
      statepool::synthetic::SyntheticOptions options;
      options.arch = sk::Arch::gdn;
      options.layers = args.layers;
      options.heads = args.heads;
      options.key_dim = kDim;
      options.value_dim = kDim;
      options.tokens = std::uint64_t{args.steps} + args.decode_tokens;
      options.model_seed = args.model_seed;
      options.token_seed = 1000 + slot;
      statepool::synthetic::SyntheticSource source(options);
      source.generate(layer, args.steps, block);
      if (args.decode_tokens > 0) source.generate(layer, args.decode_tokens, continuation[job]);
      for (std::uint32_t head = 0; head < args.heads; ++head) {
        auto* state = reinterpret_cast<float*>(dst.data() + std::size_t{slot} * state_bytes +
                                               (std::size_t{layer} * args.heads + head) *
                                                   head_values * sizeof(float));
        std::span<float> s(state, head_values);
        std::fill(s.begin(), s.end(), 0.0f);
        for (std::uint32_t t = 0; t < args.steps; ++t) {
          const std::size_t th = std::size_t{t} * args.heads + head;
          sk::gdn_step(s, kDim, kDim, std::span<const float>(block.q).subspan(th * kDim, kDim),
                       std::span<const float>(block.k).subspan(th * kDim, kDim),
                       std::span<const float>(block.v).subspan(th * kDim, kDim), block.g[th],
                       block.beta[th], residual, {});
        }
      }
      ++done;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
  std::size_t last_pct = 0;
  while (done.load() < jobs) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::size_t pct = 100 * done.load() / jobs;
    if (pct >= last_pct + 10) {
      std::cerr << "  synthesizing states: " << pct << "%\n";
      last_pct = pct;
    }
  }
  for (auto& t : pool) t.join();

  // Conv state: small values as a short convolution cache holds, in bf16.
  const std::size_t recurrent_bytes = heads_per_state * head_values * sizeof(float);
  const std::size_t conv_values =
      static_cast<std::size_t>(args.layers) * kConvChannels * kConvWidth;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (std::uint32_t s = 0; s < args.slots; ++s) {
    std::byte* conv = dst.data() + s * state_bytes + recurrent_bytes;
    for (std::size_t i = 0; i < conv_values; ++i) {
      const std::uint16_t bits = sk::float_to_bf16_bits(normal(rng));
      std::memcpy(conv + i * 2, &bits, 2);
    }
  }
}

struct ErrorStats {
  double rel_l2 = 0.0;
  double max_abs = 0.0;
};

ErrorStats compare(std::span<const std::byte> original, std::span<const std::byte> restored,
                   std::size_t values) {
  double diff2 = 0.0;
  double ref2 = 0.0;
  double max_abs = 0.0;
  for (std::size_t i = 0; i < values; ++i) {
    float a = 0.0f;
    float b = 0.0f;
    std::memcpy(&a, original.data() + i * sizeof(float), sizeof(float));
    std::memcpy(&b, restored.data() + i * sizeof(float), sizeof(float));
    const double d = static_cast<double>(a) - static_cast<double>(b);
    diff2 += d * d;
    ref2 += static_cast<double>(a) * static_cast<double>(a);
    max_abs = std::max(max_abs, std::abs(d));
  }
  return {ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2), max_abs};
}

// --- native packed decode -------------------------------------------------------------

/// The inputs of token `t` of layer `layer` for every slot, in the fused step's batch
/// layout ([slot][head][dim]), gathered from the per-(slot, layer) continuation blocks.
struct StepBatch {
  std::vector<float> q, k, v, g, beta, out;
};

void gather(const Args& args, const std::vector<cal::TokenBlock>& next, std::uint32_t layer,
            std::uint32_t t, StepBatch& b) {
  const std::size_t H = args.heads;
  const std::size_t S = args.slots;
  b.q.resize(S * H * kDim);
  b.k.resize(S * H * kDim);
  b.v.resize(S * H * kDim);
  b.g.resize(S * H);
  b.beta.resize(S * H);
  b.out.resize(S * H * kDim);
  for (std::size_t slot = 0; slot < S; ++slot) {
    const cal::TokenBlock& block = next[slot * args.layers + layer];
    const std::size_t from = std::size_t{t} * H;
    std::copy_n(block.q.begin() + from * kDim, H * kDim, b.q.begin() + slot * H * kDim);
    std::copy_n(block.k.begin() + from * kDim, H * kDim, b.k.begin() + slot * H * kDim);
    std::copy_n(block.v.begin() + from * kDim, H * kDim, b.v.begin() + slot * H * kDim);
    std::copy_n(block.g.begin() + from, H, b.g.begin() + slot * H);
    std::copy_n(block.beta.begin() + from, H, b.beta.begin() + slot * H);
  }
}

/// The FP32 recurrence, never compressed, from the staged originals: the outputs
/// [token][layer][slot][head][dim] of the decode tokens.
std::vector<float> fp32_outputs(const Args& args, std::size_t state_bytes,
                                std::span<const std::byte> originals,
                                const std::vector<cal::TokenBlock>& next) {
  const std::size_t head_values = std::size_t{kDim} * kDim;
  const std::size_t per_token = std::size_t{args.layers} * args.slots * args.heads * kDim;
  std::vector<float> out(per_token * args.decode_tokens);
  std::vector<float> state(head_values);
  std::vector<float> residual(kDim);
  for (std::uint32_t slot = 0; slot < args.slots; ++slot) {
    for (std::uint32_t layer = 0; layer < args.layers; ++layer) {
      const cal::TokenBlock& block = next[std::size_t{slot} * args.layers + layer];
      for (std::uint32_t head = 0; head < args.heads; ++head) {
        std::memcpy(state.data(),
                    originals.data() + std::size_t{slot} * state_bytes +
                        (std::size_t{layer} * args.heads + head) * head_values * sizeof(float),
                    head_values * sizeof(float));
        for (std::uint32_t t = 0; t < args.decode_tokens; ++t) {
          const std::size_t th = std::size_t{t} * args.heads + head;
          const std::size_t at =
              t * per_token + ((std::size_t{layer} * args.slots + slot) * args.heads + head) * kDim;
          sk::gdn_step(state, kDim, kDim, std::span<const float>(block.q).subspan(th * kDim, kDim),
                       std::span<const float>(block.k).subspan(th * kDim, kDim),
                       std::span<const float>(block.v).subspan(th * kDim, kDim), block.g[th],
                       block.beta[th], residual, std::span<float>(out).subspan(at, kDim));
        }
      }
    }
  }
  return out;
}

struct DecodeResult {
  double seconds = 0;
  double rel_l2 = 0;
  std::size_t rejected = 0;
};

/// `args.decode_tokens` tokens of every layer for every slot, stepped on the arena's pages.
DecodeResult native_decode(const Args& args, const sc::Arena& arena,
                           const std::vector<sc::Slot>& slots,
                           const std::vector<cal::TokenBlock>& next,
                           const std::vector<float>& reference) {
  std::vector<sc::SlotId> ids;
  for (const auto& slot : slots) ids.push_back(slot.id());
  sc::DecodeStep step(arena);
  const std::size_t per_layer = std::size_t{args.slots} * args.heads * kDim;
  StepBatch b;
  DecodeResult r;
  double diff2 = 0.0;
  double ref2 = 0.0;
  for (std::uint32_t t = 0; t < args.decode_tokens; ++t) {
    for (std::uint32_t layer = 0; layer < args.layers; ++layer) {
      gather(args, next, layer, t, b);
      const auto start = Clock::now();
      const sk::StepResult result = step.run(layer, ids,
                                             {.batch = args.slots,
                                              .q = b.q,
                                              .k = b.k,
                                              .v = b.v,
                                              .log_decay = b.g,
                                              .beta = b.beta,
                                              .out = b.out});
      r.seconds += std::chrono::duration<double>(Clock::now() - start).count();
      r.rejected += result.rejected_heads;
      const float* want = reference.data() + (std::size_t{t} * args.layers + layer) * per_layer;
      for (std::size_t i = 0; i < per_layer; ++i) {
        const double d = static_cast<double>(b.out[i]) - want[i];
        diff2 += d * d;
        ref2 += static_cast<double>(want[i]) * want[i];
      }
    }
  }
  r.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return r;
}

std::string sci(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", v);
  return text;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int run(const Args& args) {
  const sk::CodecId codecs[] = {sk::CodecId::fp32, sk::CodecId::bf16, sk::CodecId::fp16,
                                sk::CodecId::int8, sk::CodecId::int6, sk::CodecId::int4};
  // Plans first: a bad plan file is reported before anything is sent to the daemon.
  std::vector<std::shared_ptr<const sk::stepquant::Plan>> plans;
  for (const auto& file : args.plans) {
    plans.push_back(std::make_shared<const sk::stepquant::Plan>(sk::stepquant::load(file)));
    std::cout << "plan " << file << ": " << sk::stepquant::digest(*plans.back()) << ", budget "
              << plans.back()->budget_bits << " bits, " << plans.back()->pivots() << " pivots, "
              << plans.back()->source << "\n";
  }
  auto conn = sc::Connection::connect(args.options);
  std::cout << "connected to " << conn.server() << " at " << args.options.socket_path
            << " (protocol " << conn.protocol_version() << ")\n";

  // Register every codec's layout first: the staged state size is the same for all.
  // Each plan is installed before its stepquant layout is registered. install_plan is
  // idempotent and says whether the daemon already had the plan; registering first would
  // make the daemon answer not_found for a new plan (register_layout then installs it and
  // retries), and count that answer in statepool_errors_total on every demo run.
  std::vector<sc::LayoutInfo> layouts;
  for (const auto codec : codecs) layouts.push_back(conn.register_layout(demo_layout(args, codec)));
  for (const auto& plan : plans) {
    const auto codec = plan->budget_bits == 4 ? sk::CodecId::stepquant4 : sk::CodecId::stepquant6;
    const sc::PlanInfo installed = conn.install_plan(*plan);
    std::cout << "plan " << installed.digest
              << (installed.created ? ": installed in the daemon\n"
                                    : ": the daemon already had it\n");
    layouts.push_back(conn.register_layout(demo_layout(args, codec, plan)));
  }
  const auto& fp32 = layouts.front();
  const std::size_t state_bytes = fp32.state_bytes_f32;
  const std::size_t recurrent_values =
      static_cast<std::size_t>(args.layers) * args.heads * kDim * kDim;
  const std::size_t recurrent_bytes = recurrent_values * sizeof(float);
  std::cout << "layout: gdn, " << args.layers << " layers x " << args.heads << " heads x " << kDim
            << "x" << kDim << " fp32 state + conv " << kConvChannels << " ch x " << kConvWidth
            << " bf16 = " << statepool::support::format_bytes(state_bytes) << " per staged state; "
            << args.slots << " slot(s) per codec\n";

  // Staging: originals in the first half, resumed states in the second.
  const std::size_t half = state_bytes * args.slots;
  auto staging = conn.open_staging(2 * half);
  std::cerr << "staging " << statepool::support::format_bytes(2 * half) << "; synthesizing "
            << args.slots << " state(s) (" << args.steps
            << " gated-delta-rule steps per head on a SYNTHETIC model, seed " << args.model_seed
            << ")...\n";
  const auto synth_start = Clock::now();
  std::vector<cal::TokenBlock> next;
  stage_states(args, state_bytes, staging.bytes().first(half), next);
  std::cerr << "  done in " << statepool::tools::format_fixed(seconds_since(synth_start), 1)
            << " s\n";
  const auto originals = staging.bytes().first(half);
  const auto restored = staging.bytes().subspan(half, half);

  statepool::tools::Table table({"CODEC", "SLOTS", "PAGE", "VS FP32 PAGE", "REL L2 ERR",
                                 "MAX ABS ERR", "COMPRESS/S", "DECOMPRESS/S", "LOCAL DECODE"},
                                {false, true, true, true, true, true, true, true, false});
  bool all_ok = true;
  std::vector<std::vector<sc::Slot>> held;  // kept until the daemon's stats are shown
  std::vector<sc::Arena> arenas;            // and their arenas, for the native decode
  for (const auto& info : layouts) {
    const char* name = sk::to_string(info.layout.codec.id);
    std::cerr << "codec " << name << ": open arena, allocate, compress, decompress...\n";
    auto arena = conn.open_arena(info, args.slots);
    auto slots = conn.allocate(arena, args.slots);

    auto start = Clock::now();
    for (std::uint32_t s = 0; s < args.slots; ++s) {
      conn.compress(slots[s], staging, std::uint64_t{s} * state_bytes, sk::DType::f32);
    }
    const double compress_s = seconds_since(start);
    start = Clock::now();
    for (std::uint32_t s = 0; s < args.slots; ++s) {
      conn.decompress(slots[s], staging, half + std::uint64_t{s} * state_bytes, sk::DType::f32);
    }
    const double decompress_s = seconds_since(start);

    ErrorStats worst;
    bool conv_exact = true;
    bool local_match = arena.mapped() && arena.has_codec();
    std::vector<std::byte> decoded(arena.mapped() && arena.has_codec() ? state_bytes : 0);
    for (std::uint32_t s = 0; s < args.slots; ++s) {
      const auto orig = originals.subspan(std::size_t{s} * state_bytes, state_bytes);
      const auto back = restored.subspan(std::size_t{s} * state_bytes, state_bytes);
      const ErrorStats e = compare(orig, back, recurrent_values);
      worst.rel_l2 = std::max(worst.rel_l2, e.rel_l2);
      worst.max_abs = std::max(worst.max_abs, e.max_abs);
      conv_exact =
          conv_exact && std::memcmp(orig.data() + recurrent_bytes, back.data() + recurrent_bytes,
                                    state_bytes - recurrent_bytes) == 0;
      if (!decoded.empty()) {
        arena.codec().decode(arena.page(slots[s]), sk::DType::f32, decoded);
        local_match = local_match && std::memcmp(decoded.data(), back.data(), state_bytes) == 0;
      }
    }
    if (!conv_exact) {
      std::cerr << "statepool-demo: codec " << name
                << ": the conv state did not survive the round trip bit-exactly\n";
      all_ok = false;
    }
    if (decoded.size() > 0 && !local_match) {
      std::cerr << "statepool-demo: codec " << name
                << ": the page decoded here differs from the daemon's decompress\n";
      all_ok = false;
    }
    const double n = static_cast<double>(args.slots);
    table.add({name, std::to_string(args.slots), statepool::support::format_bytes(info.page_bytes),
               statepool::tools::format_ratio(static_cast<double>(fp32.page_bytes) /
                                              static_cast<double>(info.page_bytes)),
               sci(worst.rel_l2), sci(worst.max_abs),
               statepool::tools::format_fixed(n / compress_s, 1),
               statepool::tools::format_fixed(n / decompress_s, 1),
               decoded.empty() ? "n/a" : (local_match ? "identical" : "DIFFERS")});
    held.push_back(std::move(slots));
    arenas.push_back(std::move(arena));
  }

  std::cout << "\nper codec (rel. L2 and max abs error over the recurrent state, worst slot; "
               "rates from one pass):\n";
  table.print(std::cout, "  ");

  if (args.decode_tokens > 0) {
    std::cerr << "native decode: the FP32 reference for " << args.decode_tokens << " token(s)...\n";
    const auto reference = fp32_outputs(args, state_bytes, originals, next);
    statepool::tools::Table decode(
        {"CODEC", "PAGE", "TOKENS/S", "MS/LAYER", "OUTPUT REL L2", "NOT FINITE"},
        {false, true, true, true, true, true});
    for (std::size_t c = 0; c < layouts.size(); ++c) {
      if (!arenas[c].mapped() || !arenas[c].has_codec()) continue;  // a device arena
      std::cerr << "native decode: " << sk::to_string(layouts[c].layout.codec.id) << "...\n";
      const DecodeResult r = native_decode(args, arenas[c], held[c], next, reference);
      const double calls = static_cast<double>(args.decode_tokens) * args.layers;
      decode.add({sk::to_string(layouts[c].layout.codec.id),
                  statepool::support::format_bytes(layouts[c].page_bytes),
                  statepool::tools::format_fixed(
                      static_cast<double>(args.slots) * args.decode_tokens / r.seconds, 1),
                  statepool::tools::format_fixed(1e3 * r.seconds / calls, 3), sci(r.rel_l2),
                  std::to_string(r.rejected)});
      all_ok = all_ok && r.rejected == 0;
    }
    std::cout << "\nnative packed decode: " << args.decode_tokens << " more token(s) for the "
              << args.slots
              << " parked request(s) of each codec, every layer stepped on the "
                 "compressed pages (client::DecodeStep, "
              << std::max(1u, std::thread::hardware_concurrency())
              << " thread(s), no daemon round trip); outputs against an FP32 recurrence that "
                 "was never compressed (TOKENS/S: the batch's tokens per second, MS/LAYER: one "
                 "call for the whole batch):\n";
    decode.print(std::cout, "  ");
  }

  std::cout << "\ndaemon stats (slots still held):\n";
  statepool::tools::print_stats(std::cout, conn.stats());
  for (auto& slots : held) {
    const auto freed = conn.free(slots);
    if (freed != slots.size()) {
      std::cerr << "statepool-demo: the daemon freed " << freed << " of " << slots.size()
                << " slots\n";
      all_ok = false;
    }
  }
  staging.close();
  std::cout << "\nmetrics: "
            << (args.metrics.empty()
                    ? std::string("served by statepoold on its metrics address (pass --metrics URL "
                                  "to print it here); scrape /metrics with Prometheus")
                    : args.metrics)
            << "\n";
  std::cout << "slots freed and staging closed; the arenas stay with the daemon for reuse\n";
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const auto exit_status = parse(argc, argv, args)) return *exit_status;
  try {
    return run(args);
  } catch (const statepool::client::ConnectionError& e) {
    std::cerr << "statepool-demo: " << e.what() << '\n';
  } catch (const statepool::client::Error& e) {
    std::cerr << "statepool-demo: statepoold refused (" << statepool::status_name(e.status())
              << "): " << e.what() << '\n';
  } catch (const std::exception& e) {
    std::cerr << "statepool-demo: " << e.what() << '\n';
  }
  return 1;
}
