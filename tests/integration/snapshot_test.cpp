// Prefix-state snapshots through a running daemon (docs/prefix-store.md): one engine
// publishes, an engine of another tenant in the same snapshot namespace resumes from it
// bit for bit, a tenant outside the namespace misses; eviction for live slots, pins,
// list and delete, the snapshot outliving its publisher, the metrics, and statepoolctl's
// snapshot commands.
#include <gtest/gtest.h>

#include <signal.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "statepool/client.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepoolctl_run.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::Status;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout demo_layout() {
  kernels::StateLayout l;
  l.name = "snapshot-demo";
  l.num_layers = 2;
  l.num_heads = 2;
  l.key_dim = 32;
  l.value_dim = 32;
  l.conv_channels = 16;
  l.conv_width = 3;
  l.codec.id = kernels::CodecId::int8;
  return l;
}

/// One engine: a connection of a tenant with an arena, a staging buffer and slots.
struct Engine {
  client::Connection conn;
  client::LayoutInfo layout;
  client::Arena arena;
  client::Staging staging;

  Engine(const std::string& socket, const std::string& tenant, std::uint32_t pages)
      : conn(client::Connection::connect(options(socket, tenant))),
        layout(conn.register_layout(demo_layout())),
        arena(conn.open_arena(layout, pages)),
        staging(conn.open_staging(layout.state_bytes_f32)) {}

  static client::Options options(const std::string& socket, const std::string& tenant) {
    client::Options o;
    o.socket_path = socket;
    o.tenant = tenant;
    return o;
  }
  /// Stages a state drawn from `seed`: FP32 recurrent values, BF16 conv values.
  void stage(std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::span<std::byte> bytes = staging.bytes();
    const kernels::StateLayout& l = layout.layout;
    const std::size_t recurrent = std::size_t{l.num_layers} * l.num_heads * l.key_dim * l.value_dim;
    auto* values = reinterpret_cast<float*>(bytes.data());
    for (std::size_t i = 0; i < recurrent; ++i) values[i] = normal(rng);
    std::memset(bytes.data() + recurrent * 4, 0, bytes.size() - recurrent * 4);
  }
  /// The state of `slot`, decompressed.
  std::vector<std::byte> state(const client::Slot& slot) {
    conn.decompress(slot, staging, 0);
    const std::span<std::byte> bytes = staging.bytes().first(layout.state_bytes_f32);
    return {bytes.begin(), bytes.end()};
  }
};

/// The tenant's row of a Stats reply (a peer running as root sees every tenant).
client::TenantStats tenant_stats(client::Connection& conn, const std::string& name) {
  for (const client::TenantStats& t : conn.stats().tenants) {
    if (t.tenant == name) return t;
  }
  ADD_FAILURE() << "no tenant " << name << " in Stats";
  return {};
}

class Snapshots : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    const std::string config = dir_ + "/snapshots.conf";
    std::ofstream(config) << "[tenant.alice]\nsnapshot-namespace = team\n"
                             "[tenant.carol]\nsnapshot-namespace = team\n"
                             "[tenant.bob]\n";
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--config", config}, true);
  }
  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace

TEST_F(Snapshots, AnEngineOfAnotherTenantInTheNamespaceResumesFromTheSnapshotBitForBit) {
  Engine alice(daemon_->socket_path(), "alice", 8);
  std::vector<client::Slot> mine = alice.conn.allocate(alice.arena, 1);
  alice.stage(7);
  alice.conn.compress(mine[0], alice.staging, 0);
  const std::vector<std::byte> published = alice.state(mine[0]);

  const client::SnapshotKey key{"sha256:system-prompt-v3", 1024};
  const client::SnapshotPut put = alice.conn.put_snapshot(mine[0], key);
  EXPECT_TRUE(put.created);
  EXPECT_EQ(put.page_bytes, alice.layout.page_bytes);
  EXPECT_FALSE(alice.conn.put_snapshot(mine[0], key).created);  // idempotent
  // The snapshot is immutable: the publisher's slot moves on.
  alice.stage(8);
  alice.conn.compress(mine[0], alice.staging, 0);

  Engine carol(daemon_->socket_path(), "carol", 4);
  EXPECT_NE(carol.arena.id(), alice.arena.id());
  std::vector<client::Slot> hers = carol.conn.allocate(carol.arena, 1);
  const client::SnapshotGet got = carol.conn.get_snapshot(key, hers[0]);
  ASSERT_TRUE(got.hit) << daemon_->log();
  EXPECT_EQ(carol.state(hers[0]), published);

  Engine bob(daemon_->socket_path(), "bob", 4);
  std::vector<client::Slot> his = bob.conn.allocate(bob.arena, 1);
  EXPECT_FALSE(bob.conn.get_snapshot(key, his[0]).hit);
  EXPECT_TRUE(bob.conn.list_snapshots().snapshots.empty());
  EXPECT_EQ(bob.conn.list_snapshots().snapshot_namespace, "bob");

  const client::SnapshotList list = carol.conn.list_snapshots("sha256:");
  EXPECT_EQ(list.snapshot_namespace, "team");
  ASSERT_EQ(list.snapshots.size(), 1u);
  const client::SnapshotInfo& s = list.snapshots[0];
  EXPECT_EQ(s.key.prefix, key.prefix);
  EXPECT_EQ(s.key.position, 1024u);
  EXPECT_EQ(s.tenant, "alice");
  EXPECT_EQ(s.layout_name, "snapshot-demo");
  EXPECT_EQ(s.codec, kernels::CodecId::int8);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.page_bytes, alice.layout.page_bytes);
  EXPECT_EQ(s.fp32_bytes, alice.layout.fp32_bytes);
  EXPECT_FALSE(s.pinned);

  // The publisher pays for the page; the hit and the miss count for the readers.
  const client::TenantStats publisher = tenant_stats(alice.conn, "alice");
  EXPECT_EQ(publisher.snapshots, 1u);
  EXPECT_EQ(publisher.snapshot_bytes, alice.layout.page_bytes);
  EXPECT_EQ(tenant_stats(alice.conn, "carol").snapshots, 0u);
  for (const client::ArenaStats& a : alice.conn.stats().arenas) {
    if (a.arena_id != alice.arena.id()) continue;
    EXPECT_EQ(a.snapshot_pages, 1u);
    EXPECT_EQ(a.pages_used, 2u);
  }
  EXPECT_EQ(tenant_stats(carol.conn, "carol").snapshot_hits, 1u);
  EXPECT_EQ(tenant_stats(bob.conn, "bob").snapshot_misses, 1u);

  const std::string metrics = statepool::testing::http_get(daemon_->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("statepool_snapshots{tenant=\"alice\",tier=\"pool\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("statepool_snapshot_lookups_total{tenant=\"carol\",result=\"hit\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("statepool_snapshot_lookups_total{tenant=\"bob\",result=\"miss\"} 1"),
            std::string::npos);
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}

TEST_F(Snapshots, LiveSlotsEvictUnpinnedSnapshotsAndPinnedOnesStay) {
  Engine alice(daemon_->socket_path(), "alice", 4);
  std::vector<client::Slot> slot = alice.conn.allocate(alice.arena, 1);
  alice.stage(1);
  alice.conn.compress(slot[0], alice.staging, 0);
  for (const char* p : {"a", "b", "c"}) alice.conn.put_snapshot(slot[0], {p, 1});
  EXPECT_EQ(alice.conn.pin_snapshot({"b", 1}), 1u);

  // A fourth snapshot in a full arena evicts the oldest unpinned one.
  const client::SnapshotPut d = alice.conn.put_snapshot(slot[0], {"d", 1});
  EXPECT_TRUE(d.created);
  EXPECT_EQ(d.evicted, 1u);
  EXPECT_FALSE(alice.conn.get_snapshot({"a", 1}, slot[0]).hit);

  // Live slots come first: two more slots evict "c" and "d", never the pinned "b".
  std::vector<client::Slot> more = alice.conn.allocate(alice.arena, 2);
  EXPECT_EQ(more.size(), 2u);
  try {
    (void)alice.conn.allocate(alice.arena, 1);
    ADD_FAILURE() << "allocate succeeded with only a pinned snapshot left";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), Status::pool_exhausted);
    EXPECT_NE(std::string(e.what()).find("pinned or being read"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(alice.conn.get_snapshot({"b", 1}, more[0]).hit);
  EXPECT_EQ(alice.state(more[0]), alice.state(slot[0]));
  EXPECT_EQ(tenant_stats(alice.conn, "alice").snapshot_evictions, 3u);

  // Deleting the pinned one frees its page.
  EXPECT_EQ(alice.conn.delete_snapshot({"b", 1}), 1u);
  EXPECT_EQ(alice.conn.allocate(alice.arena, 1).size(), 1u);
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}

TEST_F(Snapshots, ASnapshotOutlivesItsPublisherAndBadKeysAreClearErrors) {
  const client::SnapshotKey key{std::string("\x00\xff\x10", 3), 77};
  std::vector<std::byte> published;
  {
    Engine alice(daemon_->socket_path(), "alice", 4);
    std::vector<client::Slot> slot = alice.conn.allocate(alice.arena, 1);
    alice.stage(3);
    alice.conn.compress(slot[0], alice.staging, 0);
    published = alice.state(slot[0]);
    EXPECT_TRUE(alice.conn.put_snapshot(slot[0], key).created);
  }  // alice disconnects; her slot is reclaimed after the grace period, the snapshot stays
  Engine carol(daemon_->socket_path(), "carol", 4);
  std::vector<client::Slot> slot = carol.conn.allocate(carol.arena, 1);
  ASSERT_TRUE(carol.conn.get_snapshot(key, slot[0]).hit);
  EXPECT_EQ(carol.state(slot[0]), published);

  for (const std::string& prefix : {std::string(), std::string(257, 'k')}) {
    try {
      (void)carol.conn.get_snapshot({prefix, 1}, slot[0]);
      ADD_FAILURE() << "a prefix of " << prefix.size() << " bytes was accepted";
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("prefix"), std::string::npos) << e.what();
    }
  }
  try {
    (void)carol.conn.list_snapshots({}, 10001);
    ADD_FAILURE() << "a list limit of 10001 was accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
  }
  EXPECT_TRUE(carol.conn.healthy());
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}

TEST_F(Snapshots, StatepoolctlListsPinsAndDeletesByTextOrHexKey) {
  Engine alice(daemon_->socket_path(), "alice", 4);
  std::vector<client::Slot> slot = alice.conn.allocate(alice.arena, 1);
  alice.stage(5);
  alice.conn.compress(slot[0], alice.staging, 0);
  alice.conn.put_snapshot(slot[0], {"chat/system", 12});
  alice.conn.put_snapshot(slot[0], {std::string("\x9f\x86\xd0", 3), 40});
  const std::string ctl = "--socket " + daemon_->socket_path() + " --tenant carol ";
  using statepool::testing::statepoolctl;

  const auto text = statepoolctl(ctl + "snapshots");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("2 snapshots in namespace 'team'"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("chat/system"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("hex:9f86d0"), std::string::npos) << text.output;

  const auto json = statepoolctl(ctl + "snapshots --json --hex 9f86");
  ASSERT_EQ(json.code, 0) << json.output;
  const boost::json::object v = boost::json::parse(json.output).as_object();
  EXPECT_EQ(v.at("snapshot_namespace").as_string(), "team");
  const boost::json::array& rows = v.at("snapshots").as_array();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("key_hex").as_string(), "9f86d0");
  EXPECT_EQ(rows[0].at("position").to_number<std::uint64_t>(), 40u);
  EXPECT_EQ(rows[0].at("tenant").as_string(), "alice");
  EXPECT_EQ(rows[0].at("codec").as_string(), "int8");
  EXPECT_TRUE(rows[0].at("kv").is_null());  // a plain entry
  EXPECT_EQ(rows[0].at("pages").to_number<std::uint32_t>(), 1u);

  const auto pin = statepoolctl(ctl + "snapshot-pin chat/system 12");
  EXPECT_EQ(pin.code, 0) << pin.output;
  EXPECT_EQ(pin.output, "1 snapshot of chat/system at position 12 pinned\n");
  bool pinned = false;
  for (const auto& s : alice.conn.list_snapshots("chat/").snapshots) pinned = s.pinned;
  EXPECT_TRUE(pinned);
  EXPECT_EQ(statepoolctl(ctl + "snapshot-unpin chat/system 12").code, 0);
  const auto gone = statepoolctl(ctl + "snapshot-delete --json --hex 9f86d0 40");
  EXPECT_EQ(gone.code, 0) << gone.output;
  EXPECT_EQ(gone.output, "{\"deleted\":1}\n");
  EXPECT_EQ(alice.conn.list_snapshots().snapshots.size(), 1u);

  // Bad command lines are usage errors (exit 2) and reach no daemon.
  for (const std::string bad :
       {"snapshot-pin chat/system", "snapshot-pin chat/system -1", "snapshot-delete --hex 9f8 40",
        "snapshots --limit 0", "snapshot-pin '' 3", "stats --hex"}) {
    const auto run = statepoolctl(ctl + bad);
    EXPECT_EQ(run.code, 2) << bad << ": " << run.output;
  }
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}
