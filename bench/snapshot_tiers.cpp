// Prefix-state snapshots per tier (docs/prefix-store.md): the latency and throughput of a
// GetSnapshot hit served by the pool, the host tier and the remote store (Redis), for a
// Qwen3-Next-sized state stored compressed (int6, 6 bits like stepquant6) and as FP32,
// beside the CPU recurrence that recomputes the state token by token without a hit, all in
// one run. Hybrid entries too: the same state with the KV blocks of the model's attention
// layers at --kv-tokens tokens (Qwen3-Next-80B: 12 layers, 2 KV heads of 256), stored as
// KIVI-2 and as BF16, delivered decoded into the reader's staging buffer (BF16).
//
//   bench_snapshot_tiers --publisher SOCKET --reader SOCKET [--layers N] [--heads N]
//                        [--iters N] [--tokens N] [--kv-layers N] [--kv-tokens N]
//
// --publisher: a daemon with a host tier and a remote store (--snapshot-host-capacity,
// --snapshot-remote); --reader: another daemon with the same remote store and no host
// tier, so each of its lookups goes to Redis. scripts/bench starts all three.
//
// Tiers are measured as a client sees them: one GetSnapshot round trip, copy into the
// slot included. Host: the publisher's pool copy is evicted (a live slot takes its page),
// so its lookups are served by its host tier. Recompute: the gated delta rule of every
// layer and head for --tokens tokens on one core (the linear-attention layers only: no
// attention, no MLP, no projections), so the break-even prefix length it prints is a
// lower bound of what a hit saves.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/tools/cli.hpp"

namespace {

namespace sc = statepool::client;
namespace kernels = statepool::kernels;
namespace synthetic = statepool::synthetic;

struct Args {
  std::string publisher;
  std::string reader;
  std::uint32_t layers = 36;  // Qwen3-Next-80B-A3B: 36 of its 48 layers are GDN
  std::uint32_t heads = 32;   // value heads, 128 x 128 each
  std::uint32_t iters = 5;
  std::uint32_t tokens = 8;
  std::uint32_t kv_layers = 12;     // Qwen3-Next-80B-A3B: 12 full-attention layers
  std::uint32_t kv_channels = 512;  // 2 KV heads x 256
  std::uint32_t kv_tokens = 4096;
};

constexpr const char* kUsage =
    "usage: bench_snapshot_tiers --publisher SOCKET --reader SOCKET [--layers N] [--heads N]\n"
    "                            [--iters N] [--tokens N]\n"
    "  --publisher SOCKET  a statepoold with --snapshot-host-capacity and --snapshot-remote\n"
    "  --reader SOCKET     another statepoold with the same --snapshot-remote, no host tier\n"
    "  --layers N          GDN layers of the state (default 36: Qwen3-Next-80B)\n"
    "  --heads N           heads per layer, 128 x 128 each (default 32)\n"
    "  --iters N           timed lookups per tier (median; default 5)\n"
    "  --tokens N          tokens the recurrence runs to time one token (default 8)\n"
    "  --kv-layers N       attention layers of the hybrid entries (default 12; 0: none)\n"
    "  --kv-tokens N       tokens of their KV blocks (default 4096)\n";

sc::Options options(const std::string& socket) {
  sc::Options o;
  o.socket_path = socket;
  o.timeout = std::chrono::milliseconds(120000);
  return o;
}

kernels::StateLayout layout(const Args& args, kernels::CodecId codec) {
  kernels::StateLayout l;
  l.name = std::string("bench-tiers-") + kernels::to_string(codec);
  l.num_layers = args.layers;
  l.num_heads = args.heads;
  l.key_dim = 128;
  l.value_dim = 128;
  l.codec.id = codec;
  return l;
}

struct Row {
  std::string codec;
  std::string tier;
  double page_mb = 0;  ///< the entry's bytes: the page, and the encoded KV blocks
  double seconds = 0;
};

/// Median seconds of `iters` hits of `key` into `slot`, each checked to come from `tier`
/// (and, with `kv`, to deliver the KV blocks there).
double time_hits(sc::Connection& conn, const sc::SnapshotKey& key, const sc::Slot& slot,
                 const std::string& tier, std::uint32_t iters,
                 const std::optional<sc::KvStaging>& kv = std::nullopt) {
  return statepool::bench::median_seconds(iters, [&] {
    const sc::SnapshotGet got = conn.get_snapshot(key, slot, kv);
    if (!got.hit || got.tier != tier || (kv && !got.kv_delivered)) {
      throw std::runtime_error("expected a hit from the " + tier + " tier, got " +
                               (got.hit ? "one from " + got.tier : std::string("a miss")));
    }
  });
}

/// One entry per tier: the state in `codec`, with KV blocks in `kv` when set.
void measure(const Args& args, kernels::CodecId codec, std::optional<kernels::KvCodecId> kv,
             std::vector<Row>& rows) {
  sc::Connection pub = sc::Connection::connect(options(args.publisher));
  sc::Connection rd = sc::Connection::connect(options(args.reader));
  const sc::LayoutInfo info = pub.register_layout(layout(args, codec));
  const sc::LayoutInfo rinfo = rd.register_layout(layout(args, codec));
  std::optional<kernels::KvBlocks> blocks;
  std::uint64_t kv_plain = 0;
  std::uint32_t kv_pages = 0;
  if (kv) {
    blocks =
        kernels::KvBlocks{*kv, args.kv_layers, args.kv_channels, args.kv_channels, args.kv_tokens};
    kv_plain = kernels::kv_blocks_plain_bytes(*blocks, kernels::DType::bf16);
    const std::uint64_t encoded = kernels::kv_blocks_encoded_bytes(*blocks);
    kv_pages = static_cast<std::uint32_t>((encoded + info.page_bytes - 1) / info.page_bytes);
  }
  // A slot, the snapshot (and its KV pages), a reader slot.
  sc::Arena arena = pub.open_arena(info, 3 + kv_pages);
  sc::Arena rarena = rd.open_arena(rinfo, 1);
  sc::Staging staging = pub.open_staging(info.state_bytes_f32 + kv_plain);
  sc::Staging rstaging = rd.open_staging(std::max<std::uint64_t>(kv_plain, 1));
  std::vector<sc::Slot> slots = pub.allocate(arena, 2);
  std::vector<sc::Slot> rslot = rd.allocate(rarena, 1);
  auto* values = reinterpret_cast<float*>(staging.bytes().data());
  synthetic::fill_gaussian({values, info.state_bytes_f32 / 4}, 7, 1.0f);
  std::vector<float> kv_floats(kv_plain / 2);
  synthetic::fill_gaussian(kv_floats, 8, 1.0f);
  auto* kv_values = reinterpret_cast<std::uint16_t*>(staging.bytes().data() + info.state_bytes_f32);
  for (std::size_t i = 0; i < kv_floats.size(); ++i) {
    kv_values[i] = kernels::float_to_bf16_bits(kv_floats[i]);
  }
  pub.compress(slots[0], staging, 0);
  std::string name = kernels::to_string(codec);
  if (kv) name += std::string("+") + kernels::to_string(*kv);
  const sc::SnapshotKey key{"bench/" + name, args.kv_tokens};
  pub.delete_snapshot(key);  // a clean start if an earlier run left it
  std::optional<sc::SnapshotKv> put_kv;
  std::optional<sc::KvStaging> pub_kv;
  std::optional<sc::KvStaging> rd_kv;
  if (blocks) {
    put_kv = sc::SnapshotKv{*blocks, {staging.id(), info.state_bytes_f32, kernels::DType::bf16}};
    pub_kv = put_kv->values;  // decoded back over the values it was published from
    rd_kv = sc::KvStaging{rstaging.id(), 0, kernels::DType::bf16};
  }
  const sc::SnapshotPut put = pub.put_snapshot(slots[0], key, put_kv);
  if (!put.created) throw std::runtime_error("put did not create");
  const double mb = static_cast<double>(info.page_bytes + put.kv_bytes) / 1e6;
  rows.push_back({name, "pool", mb, time_hits(pub, key, slots[1], "pool", args.iters, pub_kv)});
  // The remote write is asynchronous: wait for it on the reader.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!rd.get_snapshot(key, rslot[0]).hit) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("the reader never found the snapshot in the remote store");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  rows.push_back({name, "remote", mb, time_hits(rd, key, rslot[0], "remote", args.iters, rd_kv)});
  // A live slot takes the snapshot's page: it is demoted to the host tier.
  std::vector<sc::Slot> third = pub.allocate(arena, 1 + kv_pages);
  rows.push_back({name, "host", mb, time_hits(pub, key, slots[1], "host", args.iters, pub_kv)});
  pub.delete_snapshot(key);
}

/// Seconds per token of the recurrence over the whole state (every layer and head), on one
/// core.
double recompute_seconds_per_token(const Args& args) {
  constexpr std::uint32_t K = 128, V = 128;
  std::vector<float> state(std::size_t{args.layers} * args.heads * K * V, 0.0f);
  std::vector<float> q(K, 0.1f), k(K, 0.1f), v(V, 0.5f), residual(V), out(V);
  kernels::normalize_qk(q, k);
  const double seconds = statepool::bench::median_seconds(3, [&] {
    for (std::uint32_t t = 0; t < args.tokens; ++t) {
      for (std::size_t h = 0; h < std::size_t{args.layers} * args.heads; ++h) {
        kernels::gdn_step(std::span<float>(state).subspan(h * K * V, K * V), K, V, q, k, v, -0.05f,
                          0.5f, residual, out);
      }
    }
  });
  return seconds / args.tokens;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  using statepool::tools::bounded;
  namespace po = statepool::tools::po;
  statepool::tools::CommandLine cli("bench_snapshot_tiers", kUsage);
  // clang-format off
  cli.add_options()
      ("publisher", po::value(&args.publisher))
      ("reader", po::value(&args.reader))
      ("layers", bounded(args.layers, 1, 1024))
      ("heads", bounded(args.heads, 1, 1024))
      ("iters", bounded(args.iters, 1, 1000))
      ("tokens", bounded(args.tokens, 1, 100000))
      ("kv-layers", bounded(args.kv_layers, 0, 1024))
      ("kv-tokens", bounded(args.kv_tokens, 1, 1u << 20));
  // clang-format on
  if (const auto exit_status = cli.parse(argc, argv, [&](const po::variables_map&) {
        if (args.publisher.empty() || args.reader.empty()) {
          throw statepool::tools::UsageError("--publisher and --reader are both needed");
        }
      })) {
    return *exit_status;
  }
  try {
    std::vector<Row> rows;
    for (const kernels::CodecId codec : {kernels::CodecId::int6, kernels::CodecId::fp32}) {
      measure(args, codec, std::nullopt, rows);
    }
    if (args.kv_layers > 0) {
      for (const kernels::KvCodecId kv : {kernels::KvCodecId::kivi2, kernels::KvCodecId::bf16}) {
        measure(args, kernels::CodecId::int6, kv, rows);
      }
    }
    const double per_token = recompute_seconds_per_token(args);
    std::printf("state: %u GDN layers x %u heads x 128 x 128 (%.1f MB in FP32)\n", args.layers,
                args.heads, static_cast<double>(args.layers) * args.heads * 128 * 128 * 4 / 1e6);
    if (args.kv_layers > 0) {
      std::printf(
          "hybrid entries: + KV blocks of %u attention layers x %u tokens x %u channels "
          "(%.1f MB in BF16), delivered as BF16\n",
          args.kv_layers, args.kv_tokens, args.kv_channels,
          2.0 * args.kv_layers * args.kv_tokens * args.kv_channels * 2 / 1e6);
    }
    std::printf("%-11s %-7s %10s %10s %10s %16s\n", "entry", "tier", "entry MB", "get ms", "GB/s",
                "vs reference");
    for (const Row& r : rows) {
      // State-only entries against fp32, hybrid ones against the same state with bf16 KV.
      const bool hybrid = r.codec.find('+') != std::string::npos;
      const std::string reference = hybrid ? "int6+bf16" : "fp32";
      double ref = 0;
      for (const Row& o : rows) {
        if (o.codec == reference && o.tier == r.tier) ref = o.seconds;
      }
      std::printf("%-11s %-7s %10.1f %10.2f %10.2f %10.2fx %-5s\n", r.codec.c_str(), r.tier.c_str(),
                  r.page_mb, r.seconds * 1e3, r.page_mb / 1e3 / r.seconds, ref / r.seconds,
                  reference.c_str());
    }
    std::printf("recompute (CPU recurrence, 1 core): %.2f ms per token of prefix\n",
                per_token * 1e3);
    for (const Row& r : rows) {
      if (r.codec != "int6" && r.codec != "int6+kivi2") continue;
      const bool hybrid = r.codec != "int6";
      std::printf("  an %-10s %-6s hit costs as much as recomputing %.1f tokens%s\n",
                  r.codec.c_str(), r.tier.c_str(), r.seconds / per_token,
                  hybrid ? " of the state (of a prefix of --kv-tokens)" : "");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_snapshot_tiers: %s\n", e.what());
    return 1;
  }
}
