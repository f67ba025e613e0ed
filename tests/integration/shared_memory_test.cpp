// Shared memory is hostile (docs/architecture.md, "Memory a client can write"): a client
// thread rewrites its staging buffer and its arena while the same client's compress,
// decompress, copy, snapshot put/get (hybrid, with KV blocks of every KV codec) and
// export/import run, for every codec. Values flip between NaN and finite in a tight loop
// (the daemon must not check one reading and use another), bursts of NaN, +-Inf, huge and
// random bit patterns come and go, and random bytes land in pages and snapshot pages.
//
// Asserted: the daemon lives through it; every reply is a status docs/protocol.md lists
// for that request (never `internal`); the daemon logs no error; and it stops cleanly at
// the end (exit status 0: its pool self-check at exit found nothing).
//
// Bounded in time (kSecondsPerCodec per codec, at least kMinRounds rounds each); seeded
// (STATEPOOL_STRESS_SEED repeats a run's choices; the interleaving still varies).
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/plans.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
using statepool::Status;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

constexpr auto kSecondsPerCodec = 1500ms;
constexpr int kMinRounds = 40;
constexpr std::uint32_t kArenaPages = 12;

std::uint64_t stress_seed() {
  if (const char* text = std::getenv("STATEPOOL_STRESS_SEED"); text != nullptr && *text != '\0')
    return std::strtoull(text, nullptr, 0);
  return 20261205;
}

struct Target {
  std::string name;
  kernels::StateLayout layout;
};

/// Every codec on heads large enough that a scan takes a while (128 x 128), with conv
/// states; STEPQuant with plans of every width and pivots, GDN and KDA, and its ablations.
std::vector<Target> targets() {
  std::vector<Target> out;
  using statepool::testing::Shape;
  const Shape gdn{kernels::Arch::gdn, 128, 128, 0, 2, 3, 64, 3, kernels::DType::bf16};
  for (const kernels::CodecId id :
       {kernels::CodecId::fp32, kernels::CodecId::bf16, kernels::CodecId::fp16,
        kernels::CodecId::int8, kernels::CodecId::int6, kernels::CodecId::int4,
        kernels::CodecId::dsq6, kernels::CodecId::dsq4}) {
    out.push_back({kernels::to_string(id), statepool::testing::shaped(id, gdn)});
  }
  using statepool::testing::plan_layout;
  out.push_back(
      {"stepquant6_gdn", plan_layout(statepool::testing::gdn_plan6(), kernels::CodecId::stepquant6,
                                     kernels::StepQuantVariant::full, 10, 3)});
  out.push_back({"stepquant6_gdn_spatial_only",
                 plan_layout(statepool::testing::gdn_plan6(), kernels::CodecId::stepquant6,
                             kernels::StepQuantVariant::spatial_only)});
  out.push_back({"stepquant6_gdn_temporal_only",
                 plan_layout(statepool::testing::gdn_plan6(), kernels::CodecId::stepquant6,
                             kernels::StepQuantVariant::temporal_only)});
  out.push_back({"stepquant4_gdn",
                 plan_layout(statepool::testing::gdn_plan4(), kernels::CodecId::stepquant4)});
  using statepool::testing::mixed_width_plan;
  out.push_back(
      {"stepquant4_kda", plan_layout(*mixed_width_plan(kernels::Arch::kda, 1, 3, 4, "stress test"),
                                     kernels::CodecId::stepquant4)});
  out.push_back(
      {"stepquant6_kda", plan_layout(*mixed_width_plan(kernels::Arch::kda, 2, 2, 6, "stress test"),
                                     kernels::CodecId::stepquant6)});
  for (Target& t : out) t.layout.name = "stress-" + t.name;
  return out;
}

constexpr kernels::KvCodecId kKvCodecs[] = {kernels::KvCodecId::bf16, kernels::KvCodecId::fp8,
                                            kernels::KvCodecId::kivi2, kernels::KvCodecId::kivi4,
                                            kernels::KvCodecId::flexgen4};
constexpr kernels::DType kKvDtypes[] = {kernels::DType::bf16, kernels::DType::f32,
                                        kernels::DType::f16};

kernels::KvBlocks kv_blocks(kernels::KvCodecId codec) {
  return kernels::KvBlocks{codec, 2, 64, 64, 48};
}

/// Rewrites the words of a client's memory in every way a careless or hostile engine
/// could, until stopped: `inputs` are what the daemon reads to encode (states, KV values),
/// `output` what it writes, `arena` the mapped arena. Its stores are volatile: none may be
/// merged or dropped.
class Mutator {
 public:
  Mutator(std::vector<std::span<std::byte>> inputs, std::span<std::byte> output,
          std::span<std::byte> arena, std::uint64_t seed)
      : inputs_(std::move(inputs)),
        output_(output),
        arena_(arena),
        thread_([this, seed] { run(seed); }) {}
  ~Mutator() { stop(); }
  Mutator(const Mutator&) = delete;
  Mutator& operator=(const Mutator&) = delete;

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  using Word = volatile std::uint32_t;

  static Word& word(std::span<std::byte> region, std::mt19937_64& rng) {
    return reinterpret_cast<Word*>(region.data())[rng() % (region.size() / 4)];
  }

  static std::uint32_t special(std::mt19937_64& rng) {
    const float values[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            1e30f,
                            std::numeric_limits<float>::denorm_min()};
    const std::size_t pick = rng() % (std::size(values) + 2);
    if (pick >= std::size(values)) return static_cast<std::uint32_t>(rng());  // any bits
    return kernels::float_bits(values[pick]);
  }

  [[nodiscard]] bool stopped() const { return stop_.load(std::memory_order_relaxed); }

  void run(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (!stopped()) {
      switch (rng() % 4) {
        case 0: {  // one value flips between what it was and another, fast
          // As 32-bit words that are the same kind of value in f32 and in each 16-bit
          // half (bf16 and f16 alike): NaN, -Inf, huge finite, tiny (denormal) finite.
          constexpr std::uint32_t kFlips[] = {0x7fc07fc0u, 0xff80fc00u, 0x7bff7bffu, 0x00010001u};
          Word& w = word(inputs_[rng() % inputs_.size()], rng);
          const std::uint32_t was = w;
          const std::uint32_t bad = kFlips[rng() % std::size(kFlips)];
          for (int i = 0; i < 50000 && !stopped(); ++i) {
            w = bad;
            w = was;
          }
          break;
        }
        case 1: {  // a burst of specials, there for a moment, then taken back
          std::vector<std::pair<Word*, std::uint32_t>> saved;
          const std::size_t n = 1 + rng() % 64;
          for (std::size_t i = 0; i < n; ++i) {
            Word& w =
                rng() % 8 == 0 ? word(output_, rng) : word(inputs_[rng() % inputs_.size()], rng);
            saved.emplace_back(&w, w);
            w = special(rng);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
          for (auto it = saved.rbegin(); it != saved.rend(); ++it) *it->first = it->second;
          break;
        }
        case 2: {  // random words anywhere in the arena: pages, snapshot and KV pages
          const std::size_t n = 1 + rng() % 256;
          for (std::size_t i = 0; i < n; ++i) word(arena_, rng) = static_cast<std::uint32_t>(rng());
          break;
        }
        default: {  // a run of page words flips between two patterns while it is read
          const std::size_t words = arena_.size() / 4;
          const std::size_t at = rng() % words;
          const std::size_t n = std::min<std::size_t>(words - at, 1 + rng() % 512);
          Word* run = reinterpret_cast<Word*>(arena_.data()) + at;
          const auto a = static_cast<std::uint32_t>(rng());
          for (int round = 0; round < 200 && !stopped(); ++round) {
            for (std::size_t i = 0; i < n; ++i) run[i] = round % 2 == 0 ? a : ~a;
          }
          break;
        }
      }
    }
  }

  std::vector<std::span<std::byte>> inputs_;
  std::span<std::byte> output_;
  std::span<std::byte> arena_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Fills `bytes` with normal values in `dtype` (f32, bf16 or f16).
void fill(std::span<std::byte> bytes, kernels::DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  if (dtype == kernels::DType::f32) {
    for (std::size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      const float v = normal(rng);
      std::memcpy(bytes.data() + i, &v, 4);
    }
    return;
  }
  for (std::size_t i = 0; i + 2 <= bytes.size(); i += 2) {
    const std::uint16_t v = dtype == kernels::DType::bf16
                                ? kernels::float_to_bf16_bits(normal(rng))
                                : kernels::float_to_half_bits(normal(rng));
    std::memcpy(bytes.data() + i, &v, 2);
  }
}

enum class Op {
  compress_f32,
  compress_bf16,
  decompress_f32,
  decompress_bf16,
  copy,
  put,
  get,
  move
};

const char* op_name(Op op) {
  switch (op) {
    case Op::compress_f32: return "Compress(f32)";
    case Op::compress_bf16: return "Compress(bf16)";
    case Op::decompress_f32: return "Decompress(f32)";
    case Op::decompress_bf16: return "Decompress(bf16)";
    case Op::copy: return "Copy";
    case Op::put: return "PutSnapshot";
    case Op::get: return "GetSnapshot";
    case Op::move: return "ExportSnapshot+ImportSnapshot";
  }
  return "?";
}

/// The statuses docs/protocol.md (section 6.1) lists for each request that can come from
/// this client's own doing; `internal` is never among them.
std::set<Status> allowed(Op op) {
  switch (op) {
    case Op::compress_f32:
    case Op::compress_bf16: return {Status::ok, Status::not_finite};
    case Op::put: return {Status::ok, Status::not_finite};
    // A value the mutator changed between export and import fails its CRC.
    case Op::move: return {Status::ok, Status::invalid_argument};
    default: return {Status::ok};
  }
}

}  // namespace

TEST(SharedMemory, AClientRewritingItsMemoryDuringEveryRequestGetsDocumentedRepliesOnly) {
  const std::uint64_t seed = stress_seed();
  std::printf("STATEPOOL_STRESS_SEED=%llu\n", static_cast<unsigned long long>(seed));
  DaemonProcess daemon({"--workers", "2", "--snapshot-host-capacity", "16MiB"});
  std::mt19937_64 rng(seed);
  // replies[codec][op][status]
  std::map<std::string, std::map<std::string, std::map<Status, int>>> replies;

  for (const Target& target : targets()) {
    SCOPED_TRACE(target.name);
    client::Options options;
    options.socket_path = daemon.socket_path();
    client::Connection conn = client::Connection::connect(options);
    const client::LayoutInfo info = conn.register_layout(target.layout);
    client::Arena arena = conn.open_arena(info, kArenaPages);
    std::vector<client::Slot> slots = conn.allocate(arena, 2);
    // What the daemon reads, each in a staging buffer of its own and exactly its size (a
    // scan that runs past its end leaves the mapping): the state in f32 and in bf16, the KV
    // values in each dtype. Then one buffer for what it writes: a decompressed state, the
    // KV values a get delivers, an exported value (imported again).
    std::uint64_t kv_bytes = 0;
    for (const kernels::KvCodecId c : kKvCodecs)
      kv_bytes =
          std::max(kv_bytes, kernels::kv_blocks_plain_bytes(kv_blocks(c), kernels::DType::f32));
    client::Staging state32 = conn.open_staging(info.state_bytes_f32);
    client::Staging state16 = conn.open_staging(info.state_bytes_bf16);
    std::vector<client::Staging> kv_in;
    for (const kernels::DType d : kKvDtypes) {
      kv_in.push_back(conn.open_staging(kv_bytes));
      fill(kv_in.back().bytes(), d, rng);
    }
    fill(state32.bytes(), kernels::DType::f32, rng);
    fill(state16.bytes(), kernels::DType::bf16, rng);
    const std::uint64_t kv_out_at = info.state_bytes_f32;
    const std::uint64_t export_at = kv_out_at + kv_bytes;
    const std::uint64_t export_room =
        info.page_bytes * kArenaPages + (std::uint64_t{1} << 16);  // page, KV pages, header
    client::Staging out = conn.open_staging(export_at + export_room);
    conn.compress(slots[0], state32, 0);  // a valid page to start from

    std::vector<std::span<std::byte>> inputs{state32.bytes(), state16.bytes()};
    for (const client::Staging& k : kv_in) inputs.push_back(k.bytes());
    Mutator mutator(inputs, out.bytes(), arena.data(), rng());
    std::vector<client::SnapshotKey> keys;
    const auto deadline = std::chrono::steady_clock::now() + kSecondsPerCodec;
    for (int round = 0; round < kMinRounds || std::chrono::steady_clock::now() < deadline;
         ++round) {
      const auto op = static_cast<Op>(rng() % 8);
      const kernels::KvCodecId kv_codec = kKvCodecs[rng() % std::size(kKvCodecs)];
      const std::size_t kv_pick = rng() % std::size(kKvDtypes);
      const kernels::DType kv_dtype = kKvDtypes[kv_pick];
      Status status = Status::ok;
      std::string message;
      try {
        switch (op) {
          case Op::compress_f32: conn.compress(slots[0], state32, 0, kernels::DType::f32); break;
          case Op::compress_bf16: conn.compress(slots[0], state16, 0, kernels::DType::bf16); break;
          case Op::decompress_f32:
            conn.decompress(slots[rng() % 2], out, 0, kernels::DType::f32);
            break;
          case Op::decompress_bf16:
            conn.decompress(slots[rng() % 2], out, 0, kernels::DType::bf16);
            break;
          case Op::copy: conn.copy(slots[0], slots[1]); break;
          case Op::put: {
            client::SnapshotKey key{"stress-" + std::to_string(round), 0};
            (void)conn.put_snapshot(
                slots[rng() % 2], key,
                client::SnapshotKv{kv_blocks(kv_codec), {kv_in[kv_pick].id(), 0, kv_dtype}});
            keys.push_back(std::move(key));
            break;
          }
          case Op::get:
            if (!keys.empty()) {
              (void)conn.get_snapshot(keys[rng() % keys.size()], slots[1],
                                      client::KvStaging{out.id(), kv_out_at, kv_dtype});
            }
            break;
          case Op::move:
            if (!keys.empty()) {
              const client::SnapshotKey& key = keys[rng() % keys.size()];
              const client::SnapshotExport value = conn.export_snapshot(key, &out, export_at);
              if (value.found && value.value_bytes <= export_room) {
                // The value goes back under its own key: put is idempotent, so this checks
                // the value (CRC, header) and finds the key already there.
                (void)conn.import_snapshot(out, export_at, value.value_bytes);
              }
            }
            break;
        }
      } catch (const client::ConnectionError& e) {
        mutator.stop();
        const bool gone = !daemon.running();
        FAIL() << op_name(op) << " on " << target.name << ": the connection broke: " << e.what()
               << (gone ? " (statepoold is gone, exit status " +
                              std::to_string(daemon.stop(SIGKILL, 1s)) + ": 128+N is signal N)"
                        : std::string());
      } catch (const client::Error& e) {
        status = e.status();
        message = e.what();
      }
      ++replies[target.name][op_name(op)][status];
      if (allowed(op).count(status) == 0) {
        ADD_FAILURE() << op_name(op) << " on " << target.name << " answered "
                      << statepool::status_name(status) << ": " << message;
      }
    }
    mutator.stop();
    ASSERT_TRUE(daemon.running());
    // Leave nothing behind: the slots, the snapshots' pages go with the arena.
    for (client::Slot& s : slots) s.free();
    for (const client::SnapshotKey& key : keys) (void)conn.delete_snapshot(key);
  }

  for (const auto& [codec, ops] : replies) {
    std::string line = codec + ":";
    for (const auto& [op, statuses] : ops) {
      line += " " + op;
      for (const auto& [status, n] : statuses)
        line += std::string(" ") + statepool::status_name(status) + "=" + std::to_string(n);
      line += ";";
    }
    std::printf("%s\n", line.c_str());
  }
  ASSERT_TRUE(daemon.running());
  const std::string log = daemon.log();
  EXPECT_EQ(log.find(" ERROR "), std::string::npos) << log;
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << "the pool's self-check at exit failed";
}
