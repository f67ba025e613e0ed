// The prefix-state store's tiers with real parts (docs/prefix-store.md, "Tiers"): two
// statepoold processes sharing a real redis-server (and a three-node Redis Cluster), the
// second serving a key only the first published; the first publication of a key standing
// in Redis whoever publishes it again; a corrupted remote value and a Redis killed mid-run
// are misses with a warning and a metric, never a failed request; a lookup that asks Redis
// while a write is in flight (held at a proxy) is answered without waiting for it; and
// the pool's evictions counted as demotions only while the host tier holds the snapshot.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/redis_proxy.hpp"
#include "statepool/testing/redis_server.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::DaemonProcess;
using statepool::testing::RedisCluster;
using statepool::testing::RedisProxy;
using statepool::testing::RedisServer;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout layout() {
  kernels::StateLayout l;
  l.name = "tiers-demo";
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.codec.id = kernels::CodecId::int6;
  return l;
}

/// One engine on one daemon: an arena (of `pages` pages), a staging buffer, one slot.
struct Engine {
  client::Connection conn;
  client::LayoutInfo info;
  client::Arena arena;
  client::Staging staging;
  std::vector<client::Slot> slot;

  explicit Engine(const std::string& socket, std::uint32_t pages = 16)
      : conn(client::Connection::connect(options(socket))),
        info(conn.register_layout(layout())),
        arena(conn.open_arena(info, pages)),
        staging(conn.open_staging(info.state_bytes_f32)),
        slot(conn.allocate(arena, 1)) {}
  static client::Options options(const std::string& socket) {
    client::Options o;
    o.socket_path = socket;
    return o;
  }
  /// Compresses a state drawn from `seed` into the slot; returns the page's bytes.
  std::vector<std::byte> park(std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    auto* values = reinterpret_cast<float*>(staging.bytes().data());
    for (std::size_t i = 0; i < info.state_bytes_f32 / 4; ++i) values[i] = normal(rng);
    conn.compress(slot[0], staging, 0);
    return page();
  }
  std::vector<std::byte> page() {
    const std::span<std::byte> p = arena.page(slot[0]);
    return {p.begin(), p.end()};
  }
};

/// A daemon whose snapshot tiers use `remote` (and a host tier unless `host` is empty).
std::unique_ptr<DaemonProcess> daemon_with(const std::string& remote, const std::string& host) {
  std::vector<std::string> args{"--snapshot-remote", remote, "--snapshot-remote-timeout", "200ms"};
  if (!host.empty()) args.insert(args.end(), {"--snapshot-host-capacity", host});
  return std::make_unique<DaemonProcess>(args, true);
}

/// get_snapshot until a hit (the remote write is asynchronous) or `patience` runs out.
client::SnapshotGet get_eventually(Engine& engine, const client::SnapshotKey& key,
                                   std::chrono::milliseconds patience = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (true) {
    client::SnapshotGet got = engine.conn.get_snapshot(key, engine.slot[0]);
    if (got.hit || std::chrono::steady_clock::now() > deadline) return got;
    std::this_thread::sleep_for(20ms);
  }
}

double metric(DaemonProcess& daemon, const std::string& series) {
  const std::string text = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

/// Waits until `done()` (the daemon's background work: a remote write, a host-tier
/// publication) or `patience` runs out; returns done().
template <class Done>
bool eventually(Done done, std::chrono::milliseconds patience = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  return done();
}

class SnapshotTiers : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!statepool::testing::redis_tools_available()) {
      GTEST_SKIP() << statepool::testing::redis_tools_missing();
    }
  }
};

}  // namespace

TEST_F(SnapshotTiers, ASecondDaemonServesAPrefixOnlyTheFirstPublished) {
  RedisServer redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  auto first = daemon_with(url, "16MiB");
  auto second = daemon_with(url, "16MiB");
  Engine a(first->socket_path());
  Engine b(second->socket_path());

  const std::vector<std::byte> published = a.park(11);
  const client::SnapshotKey key{"sha256:shared-system-prompt", 2048};
  ASSERT_TRUE(a.conn.put_snapshot(a.slot[0], key).created);

  const client::SnapshotGet got = get_eventually(b, key);
  ASSERT_TRUE(got.hit) << second->log();
  EXPECT_EQ(got.tier, "remote");
  EXPECT_EQ(b.page(), published);  // the compressed page, byte for byte
  // The second lookup on that daemon is served by its host tier.
  std::memset(b.arena.page(b.slot[0]).data(), 0, b.info.page_bytes);
  const client::SnapshotGet again = b.conn.get_snapshot(key, b.slot[0]);
  EXPECT_EQ(again.tier, "host");
  EXPECT_EQ(b.page(), published);
  // The publishing daemon itself serves it from its pool.
  EXPECT_EQ(a.conn.get_snapshot(key, a.slot[0]).tier, "pool");

  const auto b_stats = b.conn.stats().tenants.at(0);
  EXPECT_EQ(b_stats.snapshot_hits, 2u);
  EXPECT_EQ(b_stats.snapshot_hits_remote, 1u);
  EXPECT_EQ(b_stats.snapshot_hits_host, 1u);
  EXPECT_GE(metric(*second, "statepool_remote_store_reads_total{result=\"hit\"}"), 1);
  // The second daemon read the value, so Redis holds it; the first counts the write when
  // Redis's reply reaches it, which may come a moment later.
  EXPECT_TRUE(eventually([&] {
    return metric(*first, "statepool_remote_store_writes_total{result=\"ok\"}") >= 1;
  })) << first->log();
  // The value in Redis is the compressed page plus its header: about the page's size.
  const auto keys = redis.query({"KEYS", "statepool:snap:2:*"});
  ASSERT_EQ(keys.elements.size(), 1u);
  const auto value = redis.query({"STRLEN", keys.elements[0].text});
  EXPECT_GE(value.integer, static_cast<long long>(a.info.page_bytes));
  EXPECT_LT(value.integer, static_cast<long long>(a.info.page_bytes + 512));

  // Deleted on the first daemon: gone from Redis too, so the second misses once its
  // host tier forgets it (it is not told: its own delete clears it).
  EXPECT_EQ(a.conn.delete_snapshot(key), 1u);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (redis.query({"DBSIZE"}).integer != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(redis.query({"DBSIZE"}).integer, 0);
  EXPECT_EQ(first->stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second->stop(SIGTERM, 10s), 0);
}

TEST_F(SnapshotTiers, AThreeNodeClusterSpreadsSnapshotsAndServesThemAcrossDaemons) {
  RedisCluster cluster(3);
  auto first = daemon_with(cluster.url(), "");
  auto second = daemon_with(cluster.url(), "");
  Engine a(first->socket_path());
  Engine b(second->socket_path());
  std::vector<std::vector<std::byte>> pages;
  for (std::uint32_t i = 0; i < 12; ++i) {
    pages.push_back(a.park(100 + i));
    ASSERT_TRUE(a.conn.put_snapshot(a.slot[0], {"prompt-" + std::to_string(i), i}).created);
  }
  for (std::uint32_t i = 0; i < 12; ++i) {
    const client::SnapshotGet got = get_eventually(b, {"prompt-" + std::to_string(i), i});
    ASSERT_TRUE(got.hit) << i << "\n" << second->log();
    EXPECT_EQ(got.tier, "remote");
    EXPECT_EQ(b.page(), pages[i]) << i;
  }
  for (std::size_t n = 0; n < cluster.size(); ++n) {
    EXPECT_GT(cluster.node(n).query({"DBSIZE"}).integer, 0) << "node " << n;
  }
  EXPECT_EQ(first->stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second->stop(SIGTERM, 10s), 0);
}

TEST_F(SnapshotTiers, ACorruptedRemoteValueIsAMiss) {
  RedisServer redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  auto first = daemon_with(url, "");
  auto second = daemon_with(url, "");
  Engine a(first->socket_path());
  Engine b(second->socket_path());
  a.park(5);
  const client::SnapshotKey key{"k", 1};
  a.conn.put_snapshot(a.slot[0], key);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (redis.query({"DBSIZE"}).integer == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const auto keys = redis.query({"KEYS", "statepool:snap:2:*"});
  ASSERT_EQ(keys.elements.size(), 1u);
  ASSERT_TRUE(redis.query({"SETRANGE", keys.elements[0].text, "100", "garbage"}).ok());
  const std::vector<std::byte> before = b.park(6);
  const client::SnapshotGet got = b.conn.get_snapshot(key, b.slot[0]);
  EXPECT_FALSE(got.hit);
  EXPECT_EQ(b.page(), before);  // unchanged
  EXPECT_EQ(metric(*second, "statepool_remote_store_reads_total{result=\"rejected\"}"), 1);
  // One lookup that missed the pool and every tier below: one miss, counted once.
  const auto stats = b.conn.stats().tenants.at(0);
  EXPECT_EQ(stats.snapshot_misses, 1u);
  EXPECT_EQ(stats.snapshot_hits, 0u);
  EXPECT_NE(second->log().find("checksum mismatch"), std::string::npos) << second->log();
  EXPECT_EQ(first->stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second->stop(SIGTERM, 10s), 0);
}

TEST_F(SnapshotTiers, RedisKilledMidRunDegradesToMissesAndComesBack) {
  RedisServer redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  auto daemon = daemon_with(url, "");
  Engine e(daemon->socket_path());
  e.park(1);
  ASSERT_TRUE(e.conn.put_snapshot(e.slot[0], {"before", 1}).created);

  redis.kill();
  // Publishing and looking up keep working: the writes fail in the background, the
  // lookups below the pool are misses.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(e.conn.put_snapshot(e.slot[0], {"during", static_cast<std::uint64_t>(i)}).created);
    EXPECT_FALSE(e.conn.get_snapshot({"absent", static_cast<std::uint64_t>(i)}, e.slot[0]).hit);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // a hang bound, not a timing
  EXPECT_TRUE(e.conn.healthy());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (metric(*daemon, "statepool_remote_store_writes_total{result=\"failed\"}") < 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE(metric(*daemon, "statepool_remote_store_writes_total{result=\"failed\"}"), 1);
  EXPECT_GE(metric(*daemon, "statepool_remote_store_reads_total{result=\"failed\"}"), 1);
  EXPECT_NE(daemon->log().find("WARN"), std::string::npos) << daemon->log();

  // Back on the same port: new publications reach it again.
  redis.restart();
  const auto back = std::chrono::steady_clock::now() + 10s;
  std::uint64_t n = 100;
  while (redis.query({"DBSIZE"}).integer == 0 && std::chrono::steady_clock::now() < back) {
    e.conn.put_snapshot(e.slot[0], {"after", n++});
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GT(redis.query({"DBSIZE"}).integer, 0) << daemon->log();
  EXPECT_EQ(daemon->stop(SIGTERM, 10s), 0);
}

// Publishing is idempotent across daemons: the remote write is SET NX, so a second daemon
// that publishes the same key (with other contents: another engine's state at the same
// position) leaves the first value in Redis, and a third daemon gets the first one.
TEST_F(SnapshotTiers, TheFirstPublicationOfAKeyStandsInRedis) {
  RedisServer redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  auto first = daemon_with(url, "16MiB");
  auto second = daemon_with(url, "16MiB");
  auto third = daemon_with(url, "");
  Engine a(first->socket_path());
  Engine b(second->socket_path());
  Engine c(third->socket_path());
  const client::SnapshotKey key{"sha256:same-prefix", 512};

  const std::vector<std::byte> first_page = a.park(31);
  ASSERT_TRUE(a.conn.put_snapshot(a.slot[0], key).created);
  ASSERT_TRUE(eventually([&] { return redis.query({"DBSIZE"}).integer == 1; })) << first->log();
  const auto keys = redis.query({"KEYS", "statepool:snap:2:*"});
  ASSERT_EQ(keys.elements.size(), 1u);
  const std::string stored = redis.query({"GET", keys.elements[0].text}).text;

  const std::vector<std::byte> second_page = b.park(32);
  ASSERT_NE(second_page, first_page);
  ASSERT_TRUE(b.conn.put_snapshot(b.slot[0], key).created);  // b's pool had no entry
  const auto tried = [&] {
    const auto count = [&](const char* result) {
      return std::max(0.0, metric(*second, std::string("statepool_remote_store_writes_total{"
                                                       "result=\"") +
                                               result + "\"}"));
    };
    return count("ok") + count("existing") + count("failed") >= 1;
  };
  ASSERT_TRUE(eventually(tried)) << second->log();
  EXPECT_EQ(metric(*second, "statepool_remote_store_writes_total{result=\"existing\"}"), 1);
  EXPECT_EQ(metric(*second, "statepool_remote_store_writes_total{result=\"ok\"}"), 0);
  // Not overwritten (compared whole: a failure does not print the bytes).
  EXPECT_TRUE(redis.query({"GET", keys.elements[0].text}).text == stored);

  const client::SnapshotGet got = c.conn.get_snapshot(key, c.slot[0]);
  ASSERT_TRUE(got.hit) << third->log();
  EXPECT_EQ(got.tier, "remote");
  EXPECT_TRUE(c.page() == first_page);
  EXPECT_FALSE(c.page() == second_page);
  EXPECT_EQ(first->stop(SIGTERM, 10s), 0);
  EXPECT_EQ(second->stop(SIGTERM, 10s), 0);
  EXPECT_EQ(third->stop(SIGTERM, 10s), 0);
}

// The writer thread has connections of its own: a GetSnapshot that falls through to Redis
// is answered while a write to the same node is in flight (held at a proxy for as long as
// the test likes; the remote timeout is long so that the write cannot time out meanwhile).
TEST_F(SnapshotTiers, ALookupIsAnsweredWhileAWriteToTheSameNodeIsInFlight) {
  RedisServer redis;
  RedisProxy proxy(redis.port());
  auto daemon =
      std::make_unique<DaemonProcess>(std::vector<std::string>{"--snapshot-remote", proxy.url(),
                                                               "--snapshot-remote-timeout", "30s"},
                                      true);
  Engine e(daemon->socket_path());
  // A first lookup below the pool: the lookup side is connected.
  EXPECT_FALSE(e.conn.get_snapshot({"absent", 1}, e.slot[0]).hit);

  proxy.hold("SET");
  e.park(41);
  ASSERT_TRUE(e.conn.put_snapshot(e.slot[0], {"large", 4096}).created);
  ASSERT_TRUE(proxy.wait_held(10s)) << daemon->log();

  // Another key: a pool miss that asks Redis. It is answered (a miss) while the SET is
  // still held, and Redis was really asked (not a failure).
  client::SnapshotGet got;
  EXPECT_NO_THROW(got = e.conn.get_snapshot({"elsewhere", 2}, e.slot[0]));
  EXPECT_FALSE(got.hit);
  EXPECT_EQ(proxy.held(), 1);  // the write is still in flight
  EXPECT_EQ(metric(*daemon, "statepool_remote_store_reads_total{result=\"missing\"}"), 2);
  EXPECT_EQ(metric(*daemon, "statepool_remote_store_reads_total{result=\"failed\"}"), 0);
  EXPECT_EQ(metric(*daemon, "statepool_remote_store_pending_writes"), 1);

  proxy.release();
  EXPECT_TRUE(eventually([&] {
    return metric(*daemon, "statepool_remote_store_writes_total{result=\"ok\"}") == 1;
  })) << daemon->log();
  EXPECT_EQ(redis.query({"DBSIZE"}).integer, 1);
  EXPECT_EQ(metric(*daemon, "statepool_remote_store_writes_total{result=\"failed\"}"), 0);
  EXPECT_EQ(daemon->stop(SIGTERM, 10s), 0);
}

// A snapshot evicted from the pool is a demotion only while a tier below holds it: here
// the host tier (no Redis), which holds one value at a time, so that most snapshots have
// left it before the pool evicts them.
TEST(SnapshotDemotions, CountOnlySnapshotsTheHostTierStillHolds) {
  const std::size_t page = kernels::PageCodec(layout()).page_bytes();
  // The value of a snapshot of tenant "default" (its namespace) under a 3-byte prefix:
  // the value format's 80-byte header, the namespace, the prefix, the page.
  const std::size_t value = 80 + std::string("default").size() + 3 + page;
  DaemonProcess daemon({"--snapshot-host-capacity", std::to_string(value + value / 2)}, true);
  Engine e(daemon.socket_path(), 4);  // one live slot and three snapshot pages
  const auto series = [&](const std::string& name, const std::string& tier) {
    return metric(daemon, name + "{tenant=\"default\",tier=\"" + tier + "\"}");
  };
  const auto host_evictions = [&] { return series("statepool_snapshot_evictions_total", "host"); };
  const auto put = [&](const char* prefix, std::uint32_t seed) {
    e.park(seed);
    return e.conn.put_snapshot(e.slot[0], {prefix, 7});
  };

  ASSERT_TRUE(put("p-a", 1).created);
  ASSERT_TRUE(eventually([&] { return series("statepool_snapshots", "host") == 1; }))
      << daemon.log();
  ASSERT_TRUE(put("p-b", 2).created);  // the host tier lets p-a go for p-b
  ASSERT_TRUE(eventually([&] { return host_evictions() == 1; })) << daemon.log();
  ASSERT_TRUE(put("p-c", 3).created);  // and p-b for p-c
  ASSERT_TRUE(eventually([&] { return host_evictions() == 2; })) << daemon.log();
  // Pool hits make p-a and p-b the pool's most recently used: p-c is its oldest.
  EXPECT_EQ(e.conn.get_snapshot({"p-a", 7}, e.slot[0]).tier, "pool");
  EXPECT_EQ(e.conn.get_snapshot({"p-b", 7}, e.slot[0]).tier, "pool");

  // The pool evicts p-c, which the host tier holds: a demotion.
  EXPECT_EQ(put("p-d", 4).evicted, 1u);
  ASSERT_TRUE(eventually([&] { return host_evictions() == 3; })) << daemon.log();
  // The pool evicts p-a, which the host tier let go long ago: an eviction.
  EXPECT_EQ(put("p-e", 5).evicted, 1u);
  ASSERT_TRUE(eventually([&] { return host_evictions() == 4; })) << daemon.log();

  const client::TenantStats stats = e.conn.stats().tenants.at(0);
  EXPECT_EQ(stats.snapshot_demotions, 1u);
  EXPECT_EQ(stats.snapshot_evictions, 1u);
  EXPECT_EQ(stats.snapshots, 3u);
  EXPECT_EQ(metric(daemon, "statepool_snapshot_demotions_total{tenant=\"default\"}"), 1);
  EXPECT_EQ(series("statepool_snapshot_evictions_total", "pool"), 1);
  EXPECT_EQ(host_evictions(), 4);
  EXPECT_EQ(series("statepool_snapshots", "host"), 1);
  EXPECT_EQ(series("statepool_snapshot_bytes", "host"), static_cast<double>(value));
  // What the tiers say matches: p-c is nowhere now, p-e is in the pool.
  EXPECT_FALSE(e.conn.get_snapshot({"p-c", 7}, e.slot[0]).hit);
  EXPECT_EQ(e.conn.get_snapshot({"p-e", 7}, e.slot[0]).tier, "pool");
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}
