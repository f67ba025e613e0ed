// Batched snapshot requests (protocol version 2, docs/protocol.md "Batched snapshot
// requests") through a running daemon: lookups from the index, puts that skip present
// keys before reading a byte, gets straight into the caller's memory in the engine's own
// layout (value-major heads, the conv state apart, strided KV rows), per-entry failures,
// whole-batch refusals, and memory a client lends (RegisterMemory), sealed or not.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using statepool::Status;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout layout(kernels::CodecId codec = kernels::CodecId::int8) {
  kernels::StateLayout l;
  l.name = "batch";
  l.num_layers = 2;
  l.num_heads = 3;
  l.key_dim = 32;
  l.value_dim = 16;
  l.conv_channels = 24;
  l.conv_width = 3;
  l.conv_dtype = kernels::DType::f32;
  l.codec.id = codec;
  return l;
}

client::SnapshotKey key(int i) {
  return client::SnapshotKey{"prefix-" + std::to_string(i), 64u * static_cast<unsigned>(i + 1)};
}

std::vector<float> values(std::size_t n, std::uint64_t seed) {
  return statepool::synthetic::gaussian_values(n, seed, 0.05f);
}

/// An engine on its own connection: an arena of the layout and a staging buffer.
struct Engine {
  client::Connection conn;
  client::LayoutInfo info;
  client::Arena arena;
  client::Staging staging;
  Engine(const DaemonProcess& daemon, kernels::StateLayout l, std::uint64_t staging_bytes,
         std::uint32_t pages = 32)
      : conn(client::Connection::connect(client_options(daemon))),
        info(conn.register_layout(l)),
        arena(conn.open_arena(info, pages)),
        staging(conn.open_staging(staging_bytes)) {}
  [[nodiscard]] std::size_t state_bytes() const { return info.state_bytes_f32; }
  [[nodiscard]] std::size_t recurrent_bytes() const {
    return arena.codec().staged_bytes(kernels::DType::f32) - arena.codec().conv_bytes();
  }
  std::span<std::byte> at(std::size_t offset, std::size_t bytes) {
    return staging.bytes().subspan(offset, bytes);
  }
};

void put_floats(std::span<std::byte> out, const std::vector<float>& v) {
  ASSERT_EQ(out.size(), v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
}

std::vector<float> floats_of(std::span<const std::byte> bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

/// A packed staged state ([L][H][K][V], conv after) turned value-major ([L][H][V][K]).
std::vector<float> value_major(const kernels::StateLayout& l, const std::vector<float>& packed) {
  std::vector<float> out(packed.size());
  const std::size_t head = std::size_t{l.key_dim} * l.value_dim;
  const std::size_t heads = std::size_t{l.num_layers} * l.num_heads;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t k = 0; k < l.key_dim; ++k)
      for (std::size_t v = 0; v < l.value_dim; ++v)
        out[h * head + v * l.key_dim + k] = packed[h * head + k * l.value_dim + v];
  std::copy(packed.begin() + static_cast<std::ptrdiff_t>(heads * head), packed.end(),
            out.begin() + static_cast<std::ptrdiff_t>(heads * head));
  return out;
}

/// What Compress then Decompress of `packed` gives: the state every get must return.
std::vector<float> round_trip(const kernels::PageCodec& codec, const std::vector<float>& packed) {
  std::vector<std::byte> page(codec.page_bytes());
  codec.encode(std::as_bytes(std::span(packed)), kernels::DType::f32, page);
  std::vector<float> out(packed.size());
  codec.decode(page, kernels::DType::f32, std::as_writable_bytes(std::span(out)));
  return out;
}

}  // namespace

TEST(SnapshotBatches, PutLookupGetRoundTripStraightIntoTheCallersMemory) {
  DaemonProcess daemon({});
  const kernels::StateLayout l = layout();
  constexpr int kKeys = 5;
  Engine probe(daemon, l, 4096);
  const std::size_t state = probe.state_bytes();
  Engine a(daemon, l, kKeys * state);
  EXPECT_EQ(a.conn.protocol_version(), 2u);
  EXPECT_EQ(a.conn.max_batch_keys(), 8192u);

  std::vector<std::vector<float>> originals;
  std::vector<client::SnapshotPutEntry> puts;
  for (int i = 0; i < kKeys; ++i) {
    originals.push_back(values(state / sizeof(float), 10 + i));
    put_floats(a.at(i * state, state), originals.back());
    client::SnapshotPutEntry e;
    e.key = key(i);
    e.state = client::StateRange{a.staging.id(), i * state};
    puts.push_back(e);
  }
  const client::SnapshotPuts put = a.conn.put_snapshots(a.arena.id(), puts);
  EXPECT_EQ(put.created, static_cast<std::uint32_t>(kKeys));
  EXPECT_EQ(put.existing, 0u);
  EXPECT_EQ(put.bytes, kKeys * state);
  for (const auto& r : put.results) EXPECT_TRUE(r.created) << r.message;

  // Another engine of the namespace: keys 0..4 present, 7 absent, in order.
  Engine b(daemon, l, kKeys * state);
  std::vector<client::SnapshotKey> keys{key(0), key(1), key(7), key(2)};
  client::SnapshotLookup found = b.conn.lookup_snapshots(b.arena.id(), keys);
  ASSERT_EQ(found.found.size(), 4u);
  EXPECT_EQ(found.found[0], client::SnapshotTier::pool);
  EXPECT_EQ(found.found[2], client::SnapshotTier::none);
  EXPECT_EQ(found.found[3], client::SnapshotTier::pool);
  EXPECT_EQ(found.leading, 2u);
  found = b.conn.lookup_snapshots(b.arena.id(), keys, true, /*stop_at_miss=*/true);
  EXPECT_EQ(found.found[3], client::SnapshotTier::none);  // not asked after the miss
  EXPECT_EQ(found.leading, 2u);
  // Another pool's keys of the same pages ride along (a hybrid engine's states beside its
  // KV pages): here keys 0 and 2 under an fp32 arena, where only key 2 was published; with
  // stop_at_miss only the pages before the first miss are asked.
  Engine fp32(daemon, layout(kernels::CodecId::fp32), state);
  put_floats(fp32.at(0, state), originals[2]);
  client::SnapshotPutEntry other;
  other.key = key(2);
  other.state = client::StateRange{fp32.staging.id(), 0};
  ASSERT_EQ(fp32.conn.put_snapshots(fp32.arena.id(), std::span(&other, 1)).created, 1u);
  const std::vector<client::LookupAlso> also{{fp32.arena.id(), {key(0), key(2)}}};
  found = b.conn.lookup_snapshots(b.arena.id(), std::vector{key(0), key(2), key(7), key(1)}, true,
                                  false, also);
  ASSERT_EQ(found.also.size(), 1u);
  EXPECT_EQ(found.also[0], (std::vector{client::SnapshotTier::none, client::SnapshotTier::pool}));
  const std::vector<client::LookupAlso> shifted{{fp32.arena.id(), {key(0), key(2), key(2)}}};
  found = b.conn.lookup_snapshots(b.arena.id(), std::vector{key(0), key(7), key(2)}, true, true,
                                  shifted);
  EXPECT_EQ(found.leading, 1u);
  EXPECT_EQ(found.also[0], (std::vector{client::SnapshotTier::none, client::SnapshotTier::none,
                                        client::SnapshotTier::none}));
  // A lookup reads nothing: no hit is counted.
  EXPECT_EQ(b.conn.stats().tenants.at(0).snapshot_hits, 0u);

  std::vector<client::SnapshotGetEntry> gets;
  for (int i = 0; i < kKeys; ++i) {
    client::SnapshotGetEntry e;
    e.key = key(kKeys - 1 - i);  // any order
    e.state = client::StateRange{b.staging.id(), i * state};
    gets.push_back(e);
  }
  const client::SnapshotGets got = b.conn.get_snapshots(b.arena.id(), gets);
  EXPECT_EQ(got.hits, static_cast<std::uint32_t>(kKeys));
  EXPECT_EQ(got.bytes, kKeys * state);
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_EQ(got.results[i].tier, client::SnapshotTier::pool);
    EXPECT_EQ(floats_of(b.at(i * state, state)),
              round_trip(b.arena.codec(), originals[kKeys - 1 - i]))
        << "entry " << i;
  }
  EXPECT_EQ(b.conn.stats().tenants.at(0).snapshot_hits, static_cast<std::uint64_t>(kKeys));
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, ValueMajorHeadsAndAConvStateApartAreTheEnginesOwnLayout) {
  DaemonProcess daemon({});
  for (const kernels::CodecId codec :
       {kernels::CodecId::fp32, kernels::CodecId::bf16, kernels::CodecId::int6}) {
    SCOPED_TRACE(kernels::to_string(codec));
    const kernels::StateLayout l = layout(codec);
    Engine probe(daemon, l, 4096);
    const std::size_t state = probe.state_bytes();
    const std::size_t recurrent = probe.recurrent_bytes();
    const std::size_t conv = state - recurrent;
    // Recurrent parts at 0 and `state`, conv states far away at 4 * state.
    Engine e(daemon, l, 6 * state);
    const std::vector<float> packed = values(state / sizeof(float), 77);
    const std::vector<float> engine = value_major(l, packed);
    std::memcpy(e.at(0, recurrent).data(), engine.data(), recurrent);
    std::memcpy(e.at(4 * state, conv).data(),
                reinterpret_cast<const std::byte*>(engine.data()) + recurrent, conv);
    client::SnapshotPutEntry put;
    put.key = key(100 + static_cast<int>(codec));
    put.state =
        client::StateRange{e.staging.id(), 0, kernels::DType::f32, true, e.staging.id(), 4 * state};
    ASSERT_EQ(e.conn.put_snapshots(e.arena.id(), std::span(&put, 1)).created, 1u);

    // The page is the one Compress of the packed state writes: a packed get returns it.
    client::SnapshotGetEntry packed_get;
    packed_get.key = put.key;
    packed_get.state = client::StateRange{e.staging.id(), state};
    ASSERT_EQ(e.conn.get_snapshots(e.arena.id(), std::span(&packed_get, 1)).hits, 1u);
    const std::vector<float> expected = round_trip(e.arena.codec(), packed);
    EXPECT_EQ(floats_of(e.at(state, state)), expected);

    // And a value-major get writes the same values transposed, the conv state apart.
    client::SnapshotGetEntry engine_get;
    engine_get.key = put.key;
    engine_get.state = client::StateRange{e.staging.id(), 2 * state,      kernels::DType::f32,
                                          true,           e.staging.id(), 5 * state};
    ASSERT_EQ(e.conn.get_snapshots(e.arena.id(), std::span(&engine_get, 1)).hits, 1u);
    const std::vector<float> want = value_major(l, expected);
    const auto got_recurrent = floats_of(e.at(2 * state, recurrent));
    const auto got_conv = floats_of(e.at(5 * state, conv));
    EXPECT_TRUE(std::equal(got_recurrent.begin(), got_recurrent.end(), want.begin()));
    EXPECT_TRUE(std::equal(got_conv.begin(), got_conv.end(),
                           want.begin() + static_cast<std::ptrdiff_t>(recurrent / sizeof(float))));
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, PresentKeysAreSkippedBeforeAByteIsReadAndEntriesFailAlone) {
  DaemonProcess daemon({});
  const kernels::StateLayout l = layout();
  Engine probe(daemon, l, 4096);
  const std::size_t state = probe.state_bytes();
  Engine e(daemon, l, 4 * state);
  put_floats(e.at(0, state), values(state / sizeof(float), 1));
  std::vector<float> bad = values(state / sizeof(float), 2);
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  put_floats(e.at(state, state), bad);

  auto entry = [&](int k, std::size_t offset) {
    client::SnapshotPutEntry p;
    p.key = key(k);
    p.state = client::StateRange{e.staging.id(), offset};
    return p;
  };
  // Key 1 twice in one batch (the second stands aside), key 2 from a NaN state.
  std::vector<client::SnapshotPutEntry> first{entry(1, 0), entry(1, 0), entry(2, state),
                                              entry(3, 0)};
  const client::SnapshotPuts put = e.conn.put_snapshots(e.arena.id(), first);
  EXPECT_EQ(put.created, 2u);
  EXPECT_EQ(put.existing, 1u);
  EXPECT_EQ(put.failed, 1u);
  EXPECT_TRUE(put.results[0].created);
  EXPECT_EQ(put.results[1].status, Status::ok);
  EXPECT_FALSE(put.results[1].created);
  EXPECT_EQ(put.results[2].status, Status::not_finite) << put.results[2].message;
  EXPECT_NE(put.results[2].message.find("non-finite"), std::string::npos) << put.results[2].message;
  EXPECT_TRUE(put.results[3].created);

  // Key 1 again, now from the NaN state: skipped before its bytes are read, so no error.
  const client::SnapshotPuts again =
      e.conn.put_snapshots(e.arena.id(), std::vector{entry(1, state)});
  EXPECT_EQ(again.existing, 1u);
  EXPECT_EQ(again.results[0].status, Status::ok);
  EXPECT_EQ(again.bytes, 0u);
  // The failed key was not published; the pool is consistent and holds 2 snapshots.
  const auto found = e.conn.lookup_snapshots(e.arena.id(), std::vector{key(1), key(2), key(3)});
  EXPECT_EQ(found.found[1], client::SnapshotTier::none);
  EXPECT_EQ(e.conn.stats().arenas.at(0).snapshot_pages, 2u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, AMalformedBatchIsRefusedWholeAndOverTheCapsToo) {
  DaemonProcess daemon({"--max-batch-keys", "4", "--max-batch-bytes", "1MiB"});
  kernels::StateLayout l = layout();
  Engine probe(daemon, l, 4096);
  const std::size_t state = probe.state_bytes();
  Engine e(daemon, l, 2 * state);
  EXPECT_EQ(e.conn.max_batch_keys(), 4u);
  EXPECT_EQ(e.conn.max_batch_bytes(), 1u << 20);
  put_floats(e.at(0, state), values(state / sizeof(float), 3));
  std::vector<client::SnapshotPutEntry> entries(2);
  entries[0].key = key(0);
  entries[0].state = client::StateRange{e.staging.id(), 0};
  entries[1].key = key(1);
  entries[1].state = client::StateRange{e.staging.id(), 2 * state};  // past the buffer's end
  try {
    (void)e.conn.put_snapshots(e.arena.id(), entries);
    ADD_FAILURE() << "a range past the staging buffer was accepted";
  } catch (const client::Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("exceeds"), std::string::npos) << error.what();
  }
  EXPECT_EQ(e.conn.lookup_snapshots(e.arena.id(), std::vector{key(0)}).leading,
            0u);  // nothing done

  // Nine keys go as three requests of at most four (the client splits them).
  std::vector<client::SnapshotKey> nine;
  for (int i = 0; i < 9; ++i) nine.push_back(key(i));
  EXPECT_EQ(e.conn.lookup_snapshots(e.arena.id(), nine).found.size(), 9u);

  // A raw request over --max-batch-keys is refused whole; the connection stays usable.
  statepool::testing::RawPeer raw(daemon.socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 2, 2).Union()));
  ASSERT_TRUE(raw.send_frame(b));
  ASSERT_TRUE(raw.read_reply().has_value());
  b.Clear();
  std::vector<flatbuffers::Offset<wire::SnapshotKey>> keys;
  for (int i = 0; i < 5; ++i)
    keys.push_back(wire::CreateSnapshotKey(b, b.CreateVector(std::vector<std::uint8_t>{'k'}), i));
  b.Finish(wire::CreateRequest(
      b, 2, wire::RequestBody::LookupSnapshots,
      wire::CreateLookupSnapshots(b, e.arena.id(), b.CreateVector(keys)).Union()));
  ASSERT_TRUE(raw.send_frame(b));
  const auto reply = raw.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::invalid_argument);
  EXPECT_NE(std::string(r->message()->c_str()).find("--max-batch-keys"), std::string::npos);

  // Over --max-batch-bytes: a state of more than 1 MiB in one request.
  l.num_layers = 8;
  l.key_dim = 128;
  l.value_dim = 128;  // 8 x 3 x 64 KiB = 1.5 MiB
  Engine big(daemon, l, 2u << 20);
  client::SnapshotPutEntry one;
  one.key = key(50);
  one.state = client::StateRange{big.staging.id(), 0};
  try {
    (void)big.conn.put_snapshots(big.arena.id(), std::span(&one, 1));
    ADD_FAILURE() << "a batch over --max-batch-bytes was accepted";
  } catch (const client::Error& error) {
    EXPECT_EQ(error.status(), Status::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("--max-batch-bytes"), std::string::npos);
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, KvBlocksInStridedEngineLayoutsAndOtherCodecsMiss) {
  DaemonProcess daemon({});
  const kernels::StateLayout l = layout();
  Engine probe(daemon, l, 4096);
  const std::size_t state = probe.state_bytes();
  // Four layers, 64 tokens, 2 x 32 channels, bf16 KV, kept token-major as SGLang's
  // page_first host pool: row (t, l) at t * L * C + l * C, values in a second half.
  const kernels::KvBlocks blocks{kernels::KvCodecId::bf16, 4, 64, 64, 64};
  const std::size_t row = 64 * 2;  // bf16
  const std::size_t half = blocks.tokens * blocks.layers * row;
  Engine e(daemon, l, state + 4 * half);
  put_floats(e.at(0, state), values(state / sizeof(float), 4));
  const std::vector<float> kv = values(blocks.tokens * blocks.layers * 64 * 2, 5);
  for (std::size_t i = 0; i < kv.size(); ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(kv[i]);
    const std::uint16_t bf = static_cast<std::uint16_t>(bits >> 16);  // bf16 exactly
    std::memcpy(e.at(state + i * 2, 2).data(), &bf, 2);
  }
  client::SnapshotPutEntry put;
  put.key = key(9);
  put.state = client::StateRange{e.staging.id(), 0};
  put.kv = blocks;
  put.kv_range = client::KvRange{
      e.staging.id(), kernels::DType::bf16, state, 0, state + half, row, blocks.layers * row};
  const auto done = e.conn.put_snapshots(e.arena.id(), std::span(&put, 1));
  ASSERT_EQ(done.created, 1u) << done.results[0].message;

  // Read back into the packed order (layer 0 keys, layer 0 values, ...).
  client::SnapshotGetEntry get;
  get.key = put.key;
  get.kv_range = client::KvRange{e.staging.id(), kernels::DType::bf16, state + 2 * half};
  const auto got = e.conn.get_snapshots(e.arena.id(), std::span(&get, 1));
  ASSERT_EQ(got.hits, 1u);
  EXPECT_TRUE(got.results[0].kv_delivered);
  ASSERT_TRUE(got.results[0].kv.has_value());
  for (std::size_t layer = 0; layer < blocks.layers; ++layer)
    for (std::size_t role = 0; role < 2; ++role)
      for (std::size_t t = 0; t < blocks.tokens; ++t) {
        const auto from = e.at(state + role * half + t * blocks.layers * row + layer * row, row);
        const auto to =
            e.at(state + 2 * half + ((layer * 2 + role) * blocks.tokens + t) * row, row);
        ASSERT_EQ(std::memcmp(from.data(), to.data(), row), 0)
            << "layer " << layer << " role " << role << " token " << t;
      }
  // KV blocks that do not fit the given range: that entry fails alone.
  get.kv_range = client::KvRange{e.staging.id(), kernels::DType::bf16, state + 3 * half + 8};
  client::SnapshotGetEntry plain;
  plain.key = put.key;
  std::vector<client::SnapshotGetEntry> two{get, plain};
  const auto mixed = e.conn.get_snapshots(e.arena.id(), two);
  EXPECT_EQ(mixed.results[0].status, Status::invalid_argument) << mixed.results[0].message;
  EXPECT_TRUE(mixed.results[1].hit);

  // Another codec's arena has its own entries: a miss, never the int8 page.
  Engine other(daemon, layout(kernels::CodecId::fp32), state);
  EXPECT_EQ(other.conn.lookup_snapshots(other.arena.id(), std::vector{key(9)}).leading, 0u);
  client::SnapshotGetEntry miss;
  miss.key = key(9);
  miss.state = client::StateRange{other.staging.id(), 0};
  EXPECT_EQ(other.conn.get_snapshots(other.arena.id(), std::span(&miss, 1)).hits, 0u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, LentMemoryIsReadAndWrittenInPlaceAndShrinkingItBreaksOnlyTheLoan) {
  DaemonProcess daemon({});
  const kernels::StateLayout l = layout();
  Engine e(daemon, l, 4096);
  const std::size_t state = e.state_bytes();
  const std::size_t bytes = 4 * state;
  for (const bool sealable : {true, false}) {
    SCOPED_TRACE(sealable ? "sealable memfd" : "memfd without sealing");
    const int fd = ::memfd_create("engine-pool", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    auto* mine =
        static_cast<std::byte*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(mine, MAP_FAILED);
    bool sealed = false;
    client::Staging lent = e.conn.register_memory(fd, bytes, "engine-pool", &sealed);
    EXPECT_EQ(sealed, sealable);
    const std::vector<float> original = values(state / sizeof(float), sealable ? 6 : 7);
    std::memcpy(mine, original.data(), state);
    client::SnapshotPutEntry put;
    put.key = key(sealable ? 20 : 21);
    put.state = client::StateRange{lent.id(), 0};
    ASSERT_EQ(e.conn.put_snapshots(e.arena.id(), std::span(&put, 1)).created, 1u);
    client::SnapshotGetEntry get;
    get.key = put.key;
    get.state = client::StateRange{lent.id(), state};
    ASSERT_EQ(e.conn.get_snapshots(e.arena.id(), std::span(&get, 1)).hits, 1u);
    EXPECT_EQ(floats_of({mine + state, state}), round_trip(e.arena.codec(), original));
    if (sealable) {
      EXPECT_NE(::ftruncate(fd, 0), 0);  // the daemon sealed it against shrinking
    } else {
      ::munmap(mine, bytes);
      ASSERT_EQ(::ftruncate(fd, 0), 0);  // the client shrinks it under the daemon
      get.state = client::StateRange{lent.id(), 2 * state};
      const auto broken = e.conn.get_snapshots(e.arena.id(), std::span(&get, 1));
      EXPECT_EQ(broken.results[0].status, Status::invalid_argument);
      EXPECT_NE(broken.results[0].message.find("shrank"), std::string::npos)
          << broken.results[0].message;
      EXPECT_GT(e.conn.ping().count(), 0);  // the daemon and the connection live on
    }
    if (sealable) ::munmap(mine, bytes);
    lent.close();
    ::close(fd);
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(SnapshotBatches, DescriptorsComeOnlyWithRegisterMemoryAndVersionOneHasNoBatches) {
  DaemonProcess daemon({});
  // A version-1 connection: the batched requests are refused, the connection stays.
  statepool::testing::RawPeer v1(daemon.socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 1, 1).Union()));
  ASSERT_TRUE(v1.send_frame(b));
  ASSERT_TRUE(v1.read_reply().has_value());
  b.Clear();
  const auto k = wire::CreateSnapshotKey(b, b.CreateVector(std::vector<std::uint8_t>{'k'}), 1);
  b.Finish(wire::CreateRequest(b, 2, wire::RequestBody::LookupSnapshots,
                               wire::CreateLookupSnapshots(b, 1, b.CreateVector(&k, 1)).Union()));
  ASSERT_TRUE(v1.send_frame(b));
  auto reply = v1.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::invalid_argument);
  EXPECT_NE(std::string(r->message()->c_str()).find("protocol version 2"), std::string::npos);

  // RegisterMemory without its descriptor, flagged: a protocol error that closes.
  statepool::testing::RawPeer v2(daemon.socket_path());
  b.Clear();
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 2, 2).Union()));
  ASSERT_TRUE(v2.send_frame(b));
  ASSERT_TRUE(v2.read_reply().has_value());
  b.Clear();
  b.Finish(wire::CreateRequest(b, 3, wire::RequestBody::RegisterMemory,
                               wire::CreateRegisterMemory(b, 4096).Union()));
  ASSERT_TRUE(v2.send_frame(b, protocol::kFlagFdAttached));
  reply = v2.read_reply();
  ASSERT_TRUE(reply.has_value());
  r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::protocol_error);
  EXPECT_TRUE(v2.closed_by_peer());
  EXPECT_GT(client::Connection::connect(client_options(daemon)).ping().count(), 0);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}
