// Hybrid prefix snapshots through running daemons (docs/prefix-store.md, "Hybrid
// entries"): the recurrent state and the attention layers' KV blocks published together,
// the blocks encoded with each KV codec into further pages of the arena and decoded into
// another engine's staging buffer exactly as the CPU reference decodes them; the sizes at
// 10,000 tokens; NaN blocks, short ranges and blocks too large for the arena refused
// without publishing anything; and the blocks served by a second daemon through Redis.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>

#include "statepool/client.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/redis_server.hpp"
#include "statepoolctl_run.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::Status;
using statepool::testing::DaemonProcess;
using statepool::testing::RedisServer;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout hybrid_layout() {
  kernels::StateLayout l;
  l.name = "hybrid-demo";
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.codec.id = kernels::CodecId::int8;
  return l;
}

/// Four attention layers of 2 KV heads x 64 over `tokens` tokens.
kernels::KvBlocks blocks(kernels::KvCodecId codec, std::uint64_t tokens) {
  return kernels::KvBlocks{codec, 4, 128, 128, tokens};
}

/// An engine: a connection, an arena, one slot, and a staging buffer holding the state at
/// offset 0 and KV values at kv_offset().
struct Engine {
  client::Connection conn;
  client::LayoutInfo info;
  client::Arena arena;
  client::Staging staging;
  std::vector<client::Slot> slot;

  Engine(const std::string& socket, std::uint32_t pages, std::size_t kv_room)
      : conn(client::Connection::connect(options(socket))),
        info(conn.register_layout(hybrid_layout())),
        arena(conn.open_arena(info, pages)),
        staging(conn.open_staging(kv_offset() + kv_room)),
        slot(conn.allocate(arena, 1)) {}
  static client::Options options(const std::string& socket) {
    client::Options o;
    o.socket_path = socket;
    return o;
  }
  [[nodiscard]] std::uint64_t kv_offset() const { return info.state_bytes_f32; }
  /// Compresses a state drawn from `seed` into the slot.
  void park(std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    auto* values = reinterpret_cast<float*>(staging.bytes().data());
    for (std::size_t i = 0; i < info.state_bytes_f32 / 4; ++i) values[i] = normal(rng);
    conn.compress(slot[0], staging, 0);
  }
  /// Writes KV values of `b` in bf16 at kv_offset(), drawn from `seed` (keys with a few
  /// outlier channels, as trained models have them); returns them.
  std::vector<std::byte> stage_kv(const kernels::KvBlocks& b, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    const std::size_t count = kernels::kv_blocks_plain_bytes(b, kernels::DType::f32) / 4;
    std::vector<std::byte> out(count * 2);
    for (std::size_t i = 0; i < count; ++i) {
      const float scale = i % 128 == 5 ? 12.0f : 1.0f;
      const std::uint16_t bits = kernels::float_to_bf16_bits(scale * normal(rng));
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
    std::memcpy(staging.bytes().data() + kv_offset(), out.data(), out.size());
    return out;
  }
  [[nodiscard]] client::KvStaging kv_at(kernels::DType dtype) const {
    return client::KvStaging{staging.id(), kv_offset(), dtype};
  }
  std::vector<std::byte> kv_in_staging(std::size_t bytes) {
    const std::span<std::byte> s = staging.bytes().subspan(kv_offset(), bytes);
    return {s.begin(), s.end()};
  }
  std::vector<std::byte> page() {
    const std::span<std::byte> p = arena.page(slot[0]);
    return {p.begin(), p.end()};
  }
};

/// What a get must deliver: the CPU reference's encode, then decode into `dtype`.
std::vector<std::byte> reference(const kernels::KvBlocks& b, const std::vector<std::byte>& bf16,
                                 kernels::DType dtype) {
  std::vector<std::byte> encoded(kernels::kv_blocks_encoded_bytes(b));
  kernels::kv_encode_blocks(b, kernels::DType::bf16, bf16, encoded);
  std::vector<std::byte> out(kernels::kv_blocks_plain_bytes(b, dtype));
  kernels::kv_decode_blocks(b, encoded, dtype, out);
  return out;
}

client::TenantStats stats_of(client::Connection& conn) {
  return conn.stats().tenants.at(0);
}

template <class F>
Status status_of(F&& f) {
  try {
    f();
  } catch (const client::Error& e) {
    return e.status();
  }
  return Status::ok;
}

}  // namespace

TEST(HybridSnapshots, KvBlocksOfEveryCodecTravelWithTheStateToAnotherEngine) {
  DaemonProcess daemon({}, true);
  const std::size_t room = kernels::kv_blocks_plain_bytes(blocks({}, 300), kernels::DType::f32);
  Engine publisher(daemon.socket_path(), 256, room);  // pages of 8 KiB: KV takes up to 75
  Engine reader(daemon.socket_path(), 8, room);
  std::uint32_t seed = 1;
  for (const kernels::KvCodecId codec :
       {kernels::KvCodecId::bf16, kernels::KvCodecId::fp8, kernels::KvCodecId::kivi2,
        kernels::KvCodecId::kivi4, kernels::KvCodecId::flexgen4}) {
    SCOPED_TRACE(kernels::to_string(codec));
    const kernels::KvBlocks b = blocks(codec, 300);  // past KIVI's 128-token FP16 window
    publisher.park(seed);
    const std::vector<std::byte> state = publisher.page();
    const std::vector<std::byte> kv = publisher.stage_kv(b, seed);
    const client::SnapshotKey key{std::string("chat/system-") + kernels::to_string(codec), 300};
    const client::SnapshotPut put = publisher.conn.put_snapshot(
        publisher.slot[0], key, client::SnapshotKv{b, publisher.kv_at(kernels::DType::bf16)});
    ASSERT_TRUE(put.created);
    ASSERT_TRUE(put.kv);
    EXPECT_EQ(*put.kv, b);
    EXPECT_EQ(put.kv_bytes, kernels::kv_blocks_encoded_bytes(b));
    const std::uint64_t page = publisher.info.page_bytes;
    EXPECT_EQ(put.pages, 1 + (put.kv_bytes + page - 1) / page);
    // A second publication stands aside and reports the entry that stood.
    const client::SnapshotPut again = publisher.conn.put_snapshot(publisher.slot[0], key);
    EXPECT_FALSE(again.created);
    EXPECT_EQ(again.pages, put.pages);

    for (const kernels::DType dtype :
         {kernels::DType::f32, kernels::DType::bf16, kernels::DType::f16}) {
      std::memset(reader.staging.bytes().data(), 0, reader.staging.bytes().size());
      const client::SnapshotGet got =
          reader.conn.get_snapshot(key, reader.slot[0], reader.kv_at(dtype));
      ASSERT_TRUE(got.hit);
      EXPECT_EQ(got.tier, "pool");
      ASSERT_TRUE(got.kv);
      EXPECT_EQ(*got.kv, b);
      EXPECT_TRUE(got.kv_delivered);
      EXPECT_EQ(reader.page(), state);
      EXPECT_EQ(reader.kv_in_staging(kernels::kv_blocks_plain_bytes(b, dtype)),
                reference(b, kv, dtype))
          << "as " << kernels::to_string(dtype);
    }
    // Without a range the state is copied and the blocks are only named.
    const client::SnapshotGet named = reader.conn.get_snapshot(key, reader.slot[0]);
    EXPECT_TRUE(named.hit);
    EXPECT_TRUE(named.kv);
    EXPECT_FALSE(named.kv_delivered);
    ++seed;
  }
  // statepoolctl shows the blocks (text and JSON).
  using statepool::testing::statepoolctl;
  const std::string ctl = "--socket " + daemon.socket_path() + " ";
  const auto text = statepoolctl(ctl + "snapshots chat/system-kivi2");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("kivi2 4x300 tok"), std::string::npos) << text.output;
  const auto json = statepoolctl(ctl + "snapshots --json chat/system-flexgen4");
  ASSERT_EQ(json.code, 0) << json.output;
  const boost::json::object row =
      boost::json::parse(json.output).at("snapshots").as_array().at(0).as_object();
  EXPECT_EQ(row.at("kv").at("codec").as_string(), "flexgen4");
  EXPECT_EQ(row.at("kv").at("tokens").to_number<std::uint64_t>(), 300u);
  EXPECT_EQ(row.at("kv").at("bytes").to_number<std::uint64_t>(),
            kernels::kv_blocks_encoded_bytes(blocks(kernels::KvCodecId::flexgen4, 300)));
  EXPECT_GT(row.at("pages").to_number<std::uint32_t>(), 1u);
  EXPECT_EQ(row.at("layout_digest").as_string().size(), 16u);

  const client::SnapshotList list = publisher.conn.list_snapshots("chat/", 0);
  ASSERT_EQ(list.snapshots.size(), 5u);
  for (const client::SnapshotInfo& s : list.snapshots) {
    ASSERT_TRUE(s.kv);
    EXPECT_EQ(s.kv_bytes, kernels::kv_blocks_encoded_bytes(*s.kv));
    EXPECT_EQ(s.pages, 1 + (s.kv_bytes + s.page_bytes - 1) / s.page_bytes);
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}

// The sizes the issue names, from real entries of a daemon: 10,000 tokens, keys and
// values of 128 channels, against FP16.
TEST(HybridSnapshots, EncodedSizesAtTenThousandTokensReproduceTheKnownRatios) {
  DaemonProcess daemon({}, true);
  const kernels::KvBlocks shape{kernels::KvCodecId::bf16, 1, 128, 128, 10000};
  Engine engine(daemon.socket_path(), 1024,  // of 8 KiB: the four entries take ~820
                kernels::kv_blocks_plain_bytes(shape, kernels::DType::bf16));
  engine.park(3);
  std::vector<std::pair<kernels::KvCodecId, double>> expected{{kernels::KvCodecId::kivi2, 5.05},
                                                              {kernels::KvCodecId::kivi4, 3.11},
                                                              {kernels::KvCodecId::flexgen4, 3.20},
                                                              {kernels::KvCodecId::fp8, 2.00}};
  for (const auto& [codec, ratio] : expected) {
    kernels::KvBlocks b = shape;
    b.codec = codec;
    (void)engine.stage_kv(b, 4);
    const client::SnapshotPut put = engine.conn.put_snapshot(
        engine.slot[0], client::SnapshotKey{std::string("10k-") + kernels::to_string(codec), 10000},
        client::SnapshotKv{b, engine.kv_at(kernels::DType::bf16)});
    ASSERT_TRUE(put.created);
    const double fp16 = static_cast<double>(kernels::kv_blocks_plain_bytes(b, kernels::DType::f16));
    EXPECT_NEAR(fp16 / static_cast<double>(put.kv_bytes), ratio, 0.005)
        << kernels::to_string(codec) << ": " << put.kv_bytes << " bytes";
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}

TEST(HybridSnapshots, BadKvBlocksAndRangesAreClearErrorsThatPublishNothing) {
  DaemonProcess daemon({}, true);
  const kernels::KvBlocks b = blocks(kernels::KvCodecId::kivi2, 200);
  Engine engine(daemon.socket_path(), 64,  // the blocks take 36 pages
                kernels::kv_blocks_plain_bytes(b, kernels::DType::f32));
  engine.park(5);
  const std::vector<std::byte> state = engine.page();
  // A NaN in layer 3's values.
  (void)engine.stage_kv(b, 6);
  const std::uint16_t nan = kernels::float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  const std::size_t last = kernels::kv_blocks_plain_bytes(b, kernels::DType::bf16) - 2;
  std::memcpy(engine.staging.bytes().data() + engine.kv_offset() + last, &nan, 2);
  const client::SnapshotKey key{"bad", 200};
  const client::SnapshotKv kv{b, engine.kv_at(kernels::DType::bf16)};
  EXPECT_EQ(status_of([&] { (void)engine.conn.put_snapshot(engine.slot[0], key, kv); }),
            Status::not_finite);
  EXPECT_FALSE(engine.conn.get_snapshot(key, engine.slot[0]).hit);
  EXPECT_EQ(stats_of(engine.conn).snapshots, 0u);
  EXPECT_EQ(engine.conn.stats().arenas.at(0).snapshot_pages, 0u);

  // A range past the staging buffer's end; blocks of more pages than the arena has;
  // ill-formed blocks.
  client::SnapshotKv past = kv;
  past.values.offset = engine.staging.bytes().size() - 10;
  EXPECT_EQ(status_of([&] { (void)engine.conn.put_snapshot(engine.slot[0], key, past); }),
            Status::invalid_argument);
  client::SnapshotKv huge = kv;
  huge.blocks.tokens = 400000;  // 800 kB of bf16 keys: ~100 pages, the arena has 64
  huge.values.offset = 0;
  huge.blocks.layers = 1;
  huge.blocks.key_channels = 1;
  huge.blocks.value_channels = 0;
  huge.blocks.codec = kernels::KvCodecId::bf16;
  EXPECT_EQ(status_of([&] { (void)engine.conn.put_snapshot(engine.slot[0], key, huge); }),
            Status::invalid_argument);
  client::SnapshotKv empty = kv;
  empty.blocks.layers = 0;
  EXPECT_EQ(status_of([&] { (void)engine.conn.put_snapshot(engine.slot[0], key, empty); }),
            Status::invalid_argument);
  EXPECT_EQ(stats_of(engine.conn).snapshots, 0u);

  // A good entry, then a get into a range too short: refused, the slot untouched.
  (void)engine.stage_kv(b, 7);
  ASSERT_TRUE(engine.conn.put_snapshot(engine.slot[0], key, kv).created);
  engine.park(8);
  const std::vector<std::byte> other = engine.page();
  client::KvStaging short_range = engine.kv_at(kernels::DType::f32);
  short_range.offset =
      engine.staging.bytes().size() - kernels::kv_blocks_plain_bytes(b, kernels::DType::f32) + 4;
  EXPECT_EQ(status_of([&] { (void)engine.conn.get_snapshot(key, engine.slot[0], short_range); }),
            Status::invalid_argument);
  EXPECT_EQ(engine.page(), other);
  EXPECT_EQ(engine.conn.get_snapshot(key, engine.slot[0]).tier, "pool");
  EXPECT_EQ(engine.page(), state);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}

TEST(HybridSnapshots, ASecondDaemonServesTheKvBlocksThroughRedis) {
  if (!statepool::testing::redis_tools_available()) {
    GTEST_SKIP() << statepool::testing::redis_tools_missing();
  }
  RedisServer redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  const std::vector<std::string> args{"--snapshot-remote",         url,
                                      "--snapshot-remote-timeout", "200ms",
                                      "--snapshot-host-capacity",  "64MiB"};
  DaemonProcess first(args, true);
  DaemonProcess second(args, true);
  const kernels::KvBlocks b = blocks(kernels::KvCodecId::kivi4, 500);
  const std::size_t room = kernels::kv_blocks_plain_bytes(b, kernels::DType::f32);
  Engine a(first.socket_path(), 64, room);
  Engine c(second.socket_path(), 8, room);
  a.park(21);
  const std::vector<std::byte> state = a.page();
  const std::vector<std::byte> kv = a.stage_kv(b, 21);
  const client::SnapshotKey key{"sha256:shared-hybrid-prompt", 500};
  ASSERT_TRUE(
      a.conn.put_snapshot(a.slot[0], key, client::SnapshotKv{b, a.kv_at(kernels::DType::bf16)})
          .created);

  const auto deadline = std::chrono::steady_clock::now() + 5s;
  client::SnapshotGet got;
  while (!got.hit && std::chrono::steady_clock::now() < deadline) {
    got = c.conn.get_snapshot(key, c.slot[0], c.kv_at(kernels::DType::f32));
    if (!got.hit) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(got.hit) << second.log();
  EXPECT_EQ(got.tier, "remote");
  EXPECT_TRUE(got.kv_delivered);
  EXPECT_EQ(c.page(), state);
  EXPECT_EQ(c.kv_in_staging(room), reference(b, kv, kernels::DType::f32));
  // Again, from the second daemon's host tier.
  std::memset(c.staging.bytes().data(), 0, c.staging.bytes().size());
  const client::SnapshotGet host =
      c.conn.get_snapshot(key, c.slot[0], c.kv_at(kernels::DType::bf16));
  EXPECT_EQ(host.tier, "host");
  EXPECT_EQ(c.kv_in_staging(room / 2), reference(b, kv, kernels::DType::bf16));
  // The remote value holds the page and the encoded blocks: about their sum.
  const auto keys = redis.query({"KEYS", "statepool:snap:2:*"});
  ASSERT_EQ(keys.elements.size(), 1u);
  const long long bytes = redis.query({"STRLEN", keys.elements[0].text}).integer;
  const auto payload =
      static_cast<long long>(a.info.page_bytes + kernels::kv_blocks_encoded_bytes(b));
  EXPECT_GE(bytes, payload);
  EXPECT_LT(bytes, payload + 512);
  EXPECT_EQ(first.stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second.stop(SIGTERM, 10s), 0);
}

// statepoolctl snapshot-get / snapshot-put: a hybrid snapshot out of one daemon into a
// file and into another daemon, byte for byte; a corrupted file, a missing key and a
// tenant without an arena of the layout are clear errors that publish nothing.
TEST(HybridSnapshots, StatepoolctlMovesASnapshotThroughAFileToAnotherDaemon) {
  DaemonProcess first({}, true);
  DaemonProcess second({}, true);
  const kernels::KvBlocks b = blocks(kernels::KvCodecId::flexgen4, 160);
  const std::size_t room = kernels::kv_blocks_plain_bytes(b, kernels::DType::f32);
  Engine a(first.socket_path(), 64, room);
  Engine c(second.socket_path(), 64, room);
  a.park(31);
  const std::vector<std::byte> state = a.page();
  const std::vector<std::byte> kv = a.stage_kv(b, 31);
  const client::SnapshotKey key{"chat/system-v4", 160};
  ASSERT_TRUE(
      a.conn.put_snapshot(a.slot[0], key, client::SnapshotKv{b, a.kv_at(kernels::DType::bf16)})
          .created);

  using statepool::testing::statepoolctl;
  const std::string file = ::testing::TempDir() + "/system-v4.snap";
  const auto got = statepoolctl("--socket " + first.socket_path() +
                                " snapshot-get chat/system-v4 160 --out " + file);
  ASSERT_EQ(got.code, 0) << got.output;
  EXPECT_NE(got.output.find("bytes written to " + file), std::string::npos) << got.output;
  EXPECT_NE(got.output.find("flexgen4 KV blocks"), std::string::npos) << got.output;
  const std::string value = statepool::support::read_file(file, std::size_t{1} << 30);
  EXPECT_EQ(value.size(), 80 + std::string("default").size() + key.prefix.size() +
                              a.info.page_bytes + kernels::kv_blocks_encoded_bytes(b));

  const std::string ctl2 = "--socket " + second.socket_path() + " ";
  const auto put = statepoolctl(ctl2 + "snapshot-put " + file);
  ASSERT_EQ(put.code, 0) << put.output;
  EXPECT_NE(put.output.find("published in arena 1"), std::string::npos) << put.output;
  const client::SnapshotGet hit = c.conn.get_snapshot(key, c.slot[0], c.kv_at(kernels::DType::f32));
  ASSERT_TRUE(hit.hit);
  EXPECT_TRUE(hit.kv_delivered);
  EXPECT_EQ(c.page(), state);
  EXPECT_EQ(c.kv_in_staging(room), reference(b, kv, kernels::DType::f32));
  const auto again = statepoolctl(ctl2 + "snapshot-put --json " + file);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(boost::json::parse(again.output).at("created").as_bool(), false);

  // One flipped byte in the KV blocks: refused by the checksum, nothing changes.
  std::string bad = value;
  bad[bad.size() - 100] = static_cast<char>(bad[bad.size() - 100] ^ 0x10);
  const std::string bad_file = ::testing::TempDir() + "/bad.snap";
  statepool::support::write_file_atomic(bad_file, std::as_bytes(std::span(bad)));
  ASSERT_EQ(c.conn.delete_snapshot(key), 1u);
  const auto refused = statepoolctl(ctl2 + "snapshot-put " + bad_file);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("checksum mismatch"), std::string::npos) << refused.output;
  EXPECT_EQ(stats_of(c.conn).snapshots, 0u);
  // Not a snapshot at all; a missing key; a daemon whose tenant has no arena of the layout.
  const auto junk = statepoolctl(ctl2 + "snapshot-put " + STATEPOOLCTL_PATH);
  EXPECT_NE(junk.code, 0);
  EXPECT_NE(junk.output.find("not a snapshot value"), std::string::npos) << junk.output;
  const auto missing = statepoolctl("--socket " + first.socket_path() +
                                    " snapshot-get chat/other 160 --out " + file);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.output.find("no snapshot of chat/other at position 160"), std::string::npos)
      << missing.output;
  DaemonProcess third({}, true);  // no engine there: no arena of the layout
  const auto no_arena = statepoolctl("--socket " + third.socket_path() + " snapshot-put " + file);
  EXPECT_NE(no_arena.code, 0);
  EXPECT_NE(no_arena.output.find("no arena of the snapshot's layout"), std::string::npos)
      << no_arena.output;
  // Usage errors.
  EXPECT_EQ(statepoolctl(ctl2 + "snapshot-get chat/system-v4 160").code, 2);
  EXPECT_EQ(statepoolctl(ctl2 + "snapshots --out x").code, 2);
  EXPECT_EQ(first.stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second.stop(SIGTERM, 10s), 0);
  EXPECT_EQ(third.stop(SIGTERM, 10s), 0);
}
