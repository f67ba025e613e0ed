// The remote tier's Redis client (store/redis_store.hpp) against real redis-server
// processes: URL parsing, the cluster hash slot (against the spec and CLUSTER KEYSLOT),
// a standalone server (round trips, SET NX keeping a key's first value, binary and 64 MiB
// values, ttl, AUTH, error replies, a server that is down, killed, hung or restarted, a
// lookup answered while a write to the same server is held in flight at a proxy, 8
// threads at once) and a 3-node
// Redis Cluster (keys spread over every node, hash tags, one seed, MOVED and ASK after
// real slot moves, a killed node failing only its own keys, 8 threads at once).
//
// Each test starts its own servers (ctest runs every test in a process of its own) and
// kills them when it ends, failed or not. Timing bounds (a call on a dead server returns
// within a few timeouts) guard against hangs; they are not benchmarks.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "statepool/testing/redis_proxy.hpp"
#include "statepool/testing/redis_server.hpp"
#include "store/redis_store.hpp"

namespace {

using namespace std::chrono_literals;
using statepool::service::kRedisClusterSlots;
using statepool::service::make_redis_store;
using statepool::service::parse_redis_url;
using statepool::service::redis_available;
using statepool::service::redis_crc16;
using statepool::service::redis_key_slot;
using statepool::service::RedisEndpoint;
using statepool::service::RedisOptions;
using statepool::service::RemoteError;
using statepool::service::RemoteStore;
using statepool::testing::redis_query;
using statepool::testing::RedisCluster;
using statepool::testing::RedisProxy;
using statepool::testing::RedisServer;
using statepool::testing::RedisServerOptions;
using Clock = std::chrono::steady_clock;

template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return condition();
}

// How long `call` took; it must throw RemoteError, whose message is returned in `what`.
template <class Call>
std::chrono::milliseconds time_failure(Call call, std::string& what) {
  const auto start = Clock::now();
  try {
    call();
    what = "(no exception)";
  } catch (const RemoteError& error) {
    what = error.what();
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// A string literal with its NUL bytes, without its terminator.
template <std::size_t N>
std::string literal(const char (&text)[N]) {
  return std::string(text, N - 1);
}

std::string random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xFFU);
  return out;
}

RedisOptions options_for(const std::string& url, std::chrono::milliseconds timeout = 250ms) {
  RedisOptions options = parse_redis_url(url);
  options.timeout = timeout;
  return options;
}

// ---- parse_redis_url --------------------------------------------------------------------

TEST(RedisUrl, ParsesOneHostWithAndWithoutPort) {
  RedisOptions options = parse_redis_url("redis://127.0.0.1:6380");
  ASSERT_EQ(options.seeds.size(), 1U);
  EXPECT_EQ(options.seeds[0], (RedisEndpoint{"127.0.0.1", 6380}));
  EXPECT_TRUE(options.password.empty());
  EXPECT_EQ(options.timeout, 250ms);
  EXPECT_EQ(options.ttl.count(), 0);

  options = parse_redis_url("redis://cache.internal");
  ASSERT_EQ(options.seeds.size(), 1U);
  EXPECT_EQ(options.seeds[0], (RedisEndpoint{"cache.internal", 6379}));

  options = parse_redis_url("REDIS://redis-0.redis_svc:7000/");
  EXPECT_EQ(options.seeds.at(0), (RedisEndpoint{"redis-0.redis_svc", 7000}));
  options = parse_redis_url("redis://h/0");
  EXPECT_EQ(options.seeds.at(0), (RedisEndpoint{"h", 6379}));
}

TEST(RedisUrl, ParsesClusterSeedsPasswordAndIpv6) {
  RedisOptions options = parse_redis_url("redis://:s3cret@10.0.0.1:7000,10.0.0.2:7001,node3");
  EXPECT_EQ(options.password, "s3cret");
  ASSERT_EQ(options.seeds.size(), 3U);
  EXPECT_EQ(options.seeds[0], (RedisEndpoint{"10.0.0.1", 7000}));
  EXPECT_EQ(options.seeds[1], (RedisEndpoint{"10.0.0.2", 7001}));
  EXPECT_EQ(options.seeds[2], (RedisEndpoint{"node3", 6379}));

  options = parse_redis_url("redis://[::1]:6380,[fe80::1],[2001:db8::7]");
  ASSERT_EQ(options.seeds.size(), 3U);
  EXPECT_EQ(options.seeds[0], (RedisEndpoint{"::1", 6380}));
  EXPECT_EQ(statepool::service::to_string(options.seeds[0]), "[::1]:6380");
  EXPECT_EQ(options.seeds[2], (RedisEndpoint{"2001:db8::7", 6379}));

  // "default" is the user a plain password authenticates as; reserved characters of a
  // password are percent-encoded.
  options = parse_redis_url("redis://default:p%40ss%3Aw%2Fd@h:1");
  EXPECT_EQ(options.password, "p@ss:w/d");
  EXPECT_EQ(options.seeds.at(0), (RedisEndpoint{"h", 1}));
}

TEST(RedisUrl, RefusesBadUrlsNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected redis://"},
      {"127.0.0.1:6379", "expected redis://"},
      {"http://h:1", "scheme \"http\""},
      {"rediss://h:6380", "TLS"},
      {"redis://", "no host"},
      {"redis://h:0", "bad port \"0\""},
      {"redis://h:65536", "bad port \"65536\""},
      {"redis://h:12ab", "bad port \"12ab\""},
      {"redis://h:", "bad port \"\""},
      {"redis://a:1,,b:2", "empty host"},
      {"redis://a:1,", "empty host"},
      {"redis://:7000", "no host"},
      {"redis://::1:6379", "needs brackets"},
      {"redis://[::1:6379", "without ']'"},
      {"redis://[not-v6]:1", "not an IPv6 address"},
      {"redis://[::1]6379", "expected ':'"},
      {"redis://alice:pw@h", "ACL users are not supported"},
      {"redis://alice@h", "user name without a password"},
      {"redis://:@h", "empty password"},
      {"redis://:p%4@h", "percent-encoding in the password"},
      {"redis://h/3", "only database 0"},
      {"redis://h?timeout=1", "query parameters"},
      {"redis://h/0?x", "query parameters"},
      {"redis://h#frag", "fragments"},
      {"redis://h w", "spaces"},
      {"redis://ho$t:1", "bad character '$'"},
  };
  for (const auto& [url, expected] : cases) {
    try {
      (void)parse_redis_url(url);
      ADD_FAILURE() << "accepted \"" << url << "\"";
    } catch (const std::invalid_argument& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find(expected), std::string::npos)
          << "\"" << url << "\": " << what << " (expected \"" << expected << "\")";
      EXPECT_EQ(what.rfind("redis URL \"", 0), 0U) << what;
    }
  }
}

TEST(RedisUrl, NeverShowsThePasswordInAMessage) {
  try {
    (void)parse_redis_url("redis://:hunter2@h:0");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& error) {
    const std::string what = error.what();
    EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
    EXPECT_NE(what.find(":***@h:0"), std::string::npos) << what;
  }
}

// ---- hash slots ---------------------------------------------------------------------------

TEST(RedisSlot, Crc16IsXmodemAsTheClusterSpecSays) {
  EXPECT_EQ(redis_crc16("123456789"), 0x31C3);  // the spec's check value
  EXPECT_EQ(redis_crc16(""), 0);
  EXPECT_EQ(redis_key_slot("foo"), 12182);  // CLUSTER KEYSLOT foo
  EXPECT_EQ(redis_key_slot("bar"), 5061);
  EXPECT_EQ(redis_key_slot(""), 0);
}

TEST(RedisSlot, HashTagsFollowTheSpec) {
  // The spec's examples.
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("user1000"));
  EXPECT_EQ(redis_key_slot("{user1000}.followers"), redis_key_slot("user1000"));
  EXPECT_EQ(redis_key_slot("foo{}{bar}"), redis_crc16("foo{}{bar}") % kRedisClusterSlots);
  EXPECT_EQ(redis_key_slot("foo{{bar}}zap"), redis_key_slot("{bar"));
  EXPECT_EQ(redis_key_slot("foo{bar}{zap}"), redis_key_slot("bar"));
  EXPECT_EQ(redis_key_slot("no-close{tag"), redis_crc16("no-close{tag") % kRedisClusterSlots);
  EXPECT_EQ(redis_key_slot(literal("{\0x}")), redis_key_slot(literal("\0x")));
}

TEST(RedisSlot, AgreesWithClusterKeyslotOfARealServer) {
  if (!statepool::testing::redis_tools_available()) {
    GTEST_SKIP() << statepool::testing::redis_tools_missing();
  }
  RedisServerOptions options;
  options.cluster = true;  // CLUSTER KEYSLOT needs cluster support, not a formed cluster
  RedisServer server(options);
  std::mt19937 rng(7);
  std::vector<std::string> keys = {"foo", "{user1000}.following", "foo{}{bar}", "a{b}c{d}"};
  for (int i = 0; i < 500; ++i) {
    keys.push_back(random_bytes(1 + rng() % 40, static_cast<std::uint32_t>(i)));
  }
  keys.push_back(literal("{\0tag}rest"));
  for (const std::string& key : keys) {
    const auto reply = server.query({"CLUSTER", "KEYSLOT", key});
    ASSERT_EQ(reply.type, ':') << reply.text;
    EXPECT_EQ(reply.integer, redis_key_slot(key));
  }
}

// ---- without hiredis ------------------------------------------------------------------------

TEST(RedisStore, WithoutHiredisTheFactoryThrowsRemoteError) {
  if (redis_available()) GTEST_SKIP() << "this build has hiredis";
  RedisOptions options;
  options.seeds.push_back({"127.0.0.1", 6379});
  try {
    (void)make_redis_store(options);
    FAIL() << "no exception";
  } catch (const RemoteError& error) {
    EXPECT_NE(std::string(error.what()).find("libhiredis-dev"), std::string::npos);
  }
}

TEST(RedisStore, RefusesBadOptions) {
  if (!redis_available()) GTEST_SKIP() << "built without hiredis";
  EXPECT_THROW((void)make_redis_store(RedisOptions{}), std::invalid_argument);
  RedisOptions options = parse_redis_url("redis://127.0.0.1:1");
  options.timeout = 0ms;
  EXPECT_THROW((void)make_redis_store(options), std::invalid_argument);
  options.timeout = 250ms;
  options.ttl = std::chrono::seconds(-1);
  EXPECT_THROW((void)make_redis_store(options), std::invalid_argument);
}

// ---- standalone ----------------------------------------------------------------------------

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!redis_available()) GTEST_SKIP() << "built without hiredis";
    if (!statepool::testing::redis_tools_available()) {
      GTEST_SKIP() << statepool::testing::redis_tools_missing();
    }
  }
};

class StandaloneTest : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    if (IsSkipped()) return;
    server_ = std::make_unique<RedisServer>();
  }
  void TearDown() override {
    if (HasFailure() && server_) std::cerr << "---- redis-server log ----\n" << server_->log();
  }
  std::unique_ptr<RemoteStore> store(std::chrono::milliseconds timeout = 250ms) {
    return make_redis_store(options_for(server_->url(), timeout));
  }
  std::unique_ptr<RedisServer> server_;
};

TEST_F(StandaloneTest, PutGetRemove) {
  const auto remote = store();
  EXPECT_EQ(remote->describe(), "redis " + server_->address());
  EXPECT_EQ(remote->get("absent"), std::nullopt);
  EXPECT_FALSE(remote->exists("k"));
  EXPECT_TRUE(remote->put("k", "v1"));
  EXPECT_TRUE(remote->exists("k"));
  EXPECT_EQ(remote->get("k"), "v1");
  EXPECT_FALSE(remote->put("k", "v2"));  // SET NX: the first value stays
  EXPECT_EQ(remote->get("k"), "v1");
  EXPECT_EQ(server_->query({"GET", "k"}).text, "v1");
  EXPECT_EQ(server_->query({"TTL", "k"}).integer, -1);  // no ttl: never expires
  remote->remove("k");
  EXPECT_EQ(remote->get("k"), std::nullopt);
  EXPECT_TRUE(remote->put("k", "v3"));  // deleted: a new first value
  EXPECT_EQ(remote->get("k"), "v3");
  remote->remove("k");
  EXPECT_NO_THROW(remote->remove("k"));  // absent keys are fine
  EXPECT_NO_THROW(remote->remove("never-there"));
}

TEST_F(StandaloneTest, BinaryKeysAndValuesWithNulBytes) {
  const auto remote = store();
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  const std::string key = literal("\0key\0\xff\r\n%s%b");  // format characters too
  const std::string value = all_bytes + literal("\0\0\r\n") + all_bytes;
  remote->put(key, value);
  EXPECT_EQ(remote->get(key), value);
  EXPECT_EQ(server_->query({"STRLEN", key}).integer, static_cast<long long>(value.size()));
  EXPECT_EQ(remote->get(literal("\0key")), std::nullopt);  // no C-string truncation

  remote->put("empty-value", "");
  EXPECT_EQ(remote->get("empty-value"), std::string());  // present and empty, not nullopt
  remote->put("", "empty key");
  EXPECT_EQ(remote->get(""), "empty key");
  remote->remove("");
  EXPECT_EQ(remote->get(""), std::nullopt);
}

TEST_F(StandaloneTest, A64MiBValueRoundTrips) {
  // Larger than any buffer of hiredis's; the timeout bounds each socket read or write,
  // not the whole transfer.
  const auto remote = store(1000ms);
  const std::string value = random_bytes(std::size_t{64} << 20, 42);
  remote->put("big", value);
  EXPECT_EQ(server_->query({"STRLEN", "big"}).integer, static_cast<long long>(value.size()));
  const std::optional<std::string> back = remote->get("big");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->size(), value.size());
  EXPECT_TRUE(*back == value);
  // The connection is still good for small calls afterwards.
  remote->put("small", "x");
  EXPECT_EQ(remote->get("small"), "x");
}

TEST_F(StandaloneTest, TtlExpiresKeys) {
  RedisOptions options = options_for(server_->url());
  options.ttl = std::chrono::seconds(1);
  const auto remote = make_redis_store(options);
  EXPECT_TRUE(remote->put("short-lived", "v"));
  const long long pttl = server_->query({"PTTL", "short-lived"}).integer;
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 1000);
  // NX with PX: a second put neither replaces the value nor renews its ttl.
  ASSERT_EQ(server_->query({"SET", "kept", "first", "PX", "100000"}).text, "OK");
  EXPECT_FALSE(remote->put("kept", "second"));
  EXPECT_EQ(server_->query({"GET", "kept"}).text, "first");
  EXPECT_GT(server_->query({"PTTL", "kept"}).integer, 1000);
  EXPECT_TRUE(eventually([&] { return !remote->get("short-lived").has_value(); }, 5s));
}

TEST_F(StandaloneTest, ErrorRepliesAreRemoteErrorsAndKeepTheConnection) {
  const auto remote = store();
  ASSERT_EQ(server_->query({"RPUSH", "a-list", "x"}).integer, 1);
  std::string what;
  (void)time_failure([&] { (void)remote->get("a-list"); }, what);
  EXPECT_NE(what.find("redis " + server_->address() + ": GET failed: WRONGTYPE"), std::string::npos)
      << what;
  remote->put("after", "fine");
  EXPECT_EQ(remote->get("after"), "fine");
}

TEST_F(StandaloneTest, DeadServerFailsFastAndARestartedOneWorksAgain) {
  const auto remote = store();
  remote->put("k", "v");
  server_->kill();

  const std::chrono::milliseconds timeout = 250ms;
  std::string what;
  const auto first = time_failure([&] { (void)remote->get("k"); }, what);
  EXPECT_LT(first, 5 * timeout) << what;
  EXPECT_NE(what.find("redis " + server_->address()), std::string::npos) << what;
  for (int i = 0; i < 20; ++i) {  // within the retry interval: at once, no connect attempt
    const auto again = time_failure([&] { remote->put("k", "v"); }, what);
    EXPECT_LT(again, 5 * timeout) << what;
    EXPECT_NE(what.find("redis " + server_->address() + " unreachable: "), std::string::npos)
        << what;
  }
  std::this_thread::sleep_for(2 * timeout);  // a real reconnect attempt, refused
  EXPECT_LT(time_failure([&] { remote->remove("k"); }, what), 5 * timeout) << what;

  server_->restart();  // same port, empty (no persistence)
  EXPECT_TRUE(eventually(
      [&] {
        try {
          remote->put("k", "v3");
          return true;
        } catch (const RemoteError&) {
          return false;
        }
      },
      5s));
  EXPECT_EQ(remote->get("k"), "v3");
}

TEST_F(StandaloneTest, ARestartBetweenCallsCostsNoFailedCall) {
  // The idle connection the old server left is found closed and made again in the same
  // call (the reconnect interval has passed).
  const auto remote = store();
  remote->put("k", "v");
  server_->restart();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(remote->get("k"), std::nullopt);
  remote->put("k", "v2");
  EXPECT_EQ(remote->get("k"), "v2");
}

TEST_F(StandaloneTest, HungServerTimesOut) {
  const auto remote = store();
  remote->put("k", "v");
  server_->pause();  // accepts, never answers
  const std::chrono::milliseconds timeout = 250ms;
  std::string what;
  const auto took = time_failure([&] { (void)remote->get("k"); }, what);
  server_->resume();
  EXPECT_LT(took, 5 * timeout) << what;
  EXPECT_GE(took, timeout / 2) << what;
  EXPECT_NE(what.find("timed out after 250 ms"), std::string::npos) << what;
  EXPECT_TRUE(eventually(
      [&] {
        try {
          return remote->get("k") == std::optional<std::string>("v");
        } catch (const RemoteError&) {
          return false;
        }
      },
      5s));
}

TEST_F(StandaloneTest, DownAtConstructionThenUp) {
  const int port = statepool::testing::free_tcp_port();
  const auto remote = make_redis_store(options_for("redis://127.0.0.1:" + std::to_string(port)));
  EXPECT_EQ(remote->describe(), "redis 127.0.0.1:" + std::to_string(port) + " (not reached yet)");
  std::string what;
  EXPECT_LT(time_failure([&] { (void)remote->get("k"); }, what), 1250ms) << what;
  EXPECT_NE(what.find("redis 127.0.0.1:" + std::to_string(port) + " unreachable: "),
            std::string::npos)
      << what;

  RedisServerOptions options;
  options.port = port;
  RedisServer late(options);
  EXPECT_TRUE(eventually(
      [&] {
        try {
          remote->put("k", "v");
          return true;
        } catch (const RemoteError&) {
          return false;
        }
      },
      5s));
  EXPECT_EQ(remote->get("k"), "v");
  EXPECT_EQ(remote->describe(), "redis 127.0.0.1:" + std::to_string(port));
}

TEST_F(StandaloneTest, Password) {
  RedisServerOptions options;
  options.extra_args = {"--requirepass", "pa ss@word"};
  RedisServer guarded(options);

  RedisOptions good = options_for(guarded.url());
  good.password = "pa ss@word";
  const auto remote = make_redis_store(good);
  remote->put("k", "v");
  EXPECT_EQ(remote->get("k"), "v");

  RedisOptions wrong = good;
  wrong.password = "nope";
  std::string what;
  (void)time_failure([&] { (void)make_redis_store(wrong)->get("k"); }, what);
  EXPECT_NE(what.find("AUTH failed"), std::string::npos) << what;

  RedisOptions none = good;
  none.password.clear();
  (void)time_failure([&] { (void)make_redis_store(none)->get("k"); }, what);
  EXPECT_NE(what.find("NOAUTH"), std::string::npos) << what;
}

void hammer(RemoteStore& remote, int threads, int rounds) {
  std::atomic<int> mismatches{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        try {
          const std::string key = "t" + std::to_string(t) + "-" + std::to_string(i % 25);
          const std::string value = random_bytes(1 + static_cast<std::size_t>((i * 37 + t) % 5000),
                                                 static_cast<std::uint32_t>(t * 100000 + i));
          remote.remove(key);  // SET NX: a key keeps its first value
          if (!remote.put(key, value)) ++mismatches;
          if (remote.get(key) != value) ++mismatches;
          (void)remote.get("shared");  // every thread on one key too
          if (i % 10 == 0) (void)remote.put("shared", key);
          if (i % 7 == 0) {
            remote.remove(key);
            if (remote.get(key).has_value()) ++mismatches;
          }
        } catch (const RemoteError&) {
          ++errors;
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
}

// Lookups and writes go over connections of their own: a GET is answered while a SET to
// the same server is in flight (held at a proxy for as long as the test likes; the timeout
// is long so that it cannot expire meanwhile), and the SET completes once let go.
TEST_F(StandaloneTest, ALookupIsAnsweredWhileAWriteIsInFlight) {
  RedisProxy proxy(server_->port());
  const auto remote = make_redis_store(options_for(proxy.url(), 30000ms));
  EXPECT_TRUE(remote->put("before", "x"));  // both kinds of connection made before the hold
  EXPECT_EQ(remote->get("before"), "x");

  proxy.hold("SET");
  const std::string big = random_bytes(std::size_t{8} << 20, 5);
  std::atomic<bool> stored{false};
  std::string failure;
  std::thread writer([&] {
    try {
      stored = remote->put("big", big);
    } catch (const RemoteError& error) {
      failure = error.what();
    }
  });
  ASSERT_TRUE(proxy.wait_held(10s));
  std::optional<std::string> got;
  EXPECT_NO_THROW(got = remote->get("before"));
  EXPECT_EQ(got, "x");
  EXPECT_EQ(remote->get("big"), std::nullopt);  // not there yet
  EXPECT_EQ(proxy.held(), 1);                   // the SET is still in flight
  proxy.release();
  writer.join();
  EXPECT_TRUE(stored) << failure;
  EXPECT_EQ(server_->query({"STRLEN", "big"}).integer, static_cast<long long>(big.size()));
}

TEST_F(StandaloneTest, EightThreadsAtOnce) {
  const auto remote = store(2000ms);
  hammer(*remote, 8, 300);
}

// ---- cluster -----------------------------------------------------------------------------

class ClusterTest : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    if (IsSkipped()) return;
    cluster_ = std::make_unique<RedisCluster>(3);
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      for (std::size_t i = 0; i < cluster_->size(); ++i) {
        std::cerr << "---- redis-server log (node " << i << ") ----\n" << cluster_->node(i).log();
      }
    }
  }
  [[nodiscard]] long long dbsize(std::size_t node) {
    return cluster_->node(node).query({"DBSIZE"}).integer;
  }
  // How many MOVED / ASK error replies the node has sent (INFO errorstats).
  [[nodiscard]] long long redirects_sent(std::size_t node, const std::string& kind) {
    const std::string info = cluster_->node(node).query({"INFO", "errorstats"}).text;
    const std::string field = "errorstat_" + kind + ":count=";
    const std::size_t at = info.find(field);
    return at == std::string::npos ? 0 : std::stoll(info.substr(at + field.size()));
  }
  [[nodiscard]] std::string node_id(std::size_t node) {
    return cluster_->node(node).query({"CLUSTER", "MYID"}).text;
  }
  std::unique_ptr<RedisCluster> cluster_;
};

TEST_F(ClusterTest, KeysSpreadOverEveryNode) {
  const auto remote = make_redis_store(options_for(cluster_->url()));
  const std::string description = remote->describe();
  EXPECT_EQ(description.rfind("redis cluster of 3 nodes (", 0), 0U) << description;
  for (std::size_t i = 0; i < cluster_->size(); ++i) {
    EXPECT_NE(description.find(cluster_->node(i).address()), std::string::npos) << description;
  }
  for (int i = 0; i < 200; ++i) {
    const std::string key = "key-" + std::to_string(i);
    remote->put(key, "value-" + std::to_string(i));
    EXPECT_EQ(cluster_->node(0).query({"CLUSTER", "KEYSLOT", key}).integer, redis_key_slot(key));
  }
  long long total = 0;
  for (std::size_t node = 0; node < cluster_->size(); ++node) {
    EXPECT_GT(dbsize(node), 0) << "node " << node;
    total += dbsize(node);
  }
  EXPECT_EQ(total, 200);
  for (int i = 0; i < 200; ++i) {
    const std::string key = "key-" + std::to_string(i);
    EXPECT_EQ(remote->get(key), "value-" + std::to_string(i));
    // It is where the cluster says its slot is.
    const std::size_t owner = cluster_->owner_of(redis_key_slot(key));
    EXPECT_EQ(cluster_->node(owner).query({"GET", key}).text, "value-" + std::to_string(i));
  }
  for (int i = 0; i < 200; i += 2) remote->remove("key-" + std::to_string(i));
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(remote->get("key-" + std::to_string(i)).has_value(), i % 2 == 1);
    EXPECT_EQ(remote->exists("key-" + std::to_string(i)), i % 2 == 1);  // on its slot's node
  }
}

TEST_F(ClusterTest, HashTagsLandOnOneSlot) {
  const auto remote = make_redis_store(options_for(cluster_->url()));
  for (int i = 0; i < 50; ++i) {
    remote->put("{session-7}/" + std::to_string(i), std::to_string(i));
  }
  const std::size_t owner = cluster_->owner_of(redis_key_slot("session-7"));
  EXPECT_EQ(cluster_->node(owner)
                .query({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(redis_key_slot("session-7"))})
                .integer,
            50);
  for (std::size_t node = 0; node < cluster_->size(); ++node) {
    EXPECT_EQ(dbsize(node), node == owner ? 50 : 0) << "node " << node;
  }
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(remote->get("{session-7}/" + std::to_string(i)), std::to_string(i));
  }
}

TEST_F(ClusterTest, OneSeedFindsTheWholeMap) {
  const auto remote = make_redis_store(options_for(cluster_->node(1).url()));
  EXPECT_EQ(remote->describe().rfind("redis cluster of 3 nodes", 0), 0U) << remote->describe();
  for (int i = 0; i < 200; ++i) remote->put("k" + std::to_string(i), std::to_string(i));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(remote->get("k" + std::to_string(i)), std::to_string(i));
  long long total = 0;
  for (std::size_t node = 0; node < cluster_->size(); ++node) total += dbsize(node);
  EXPECT_EQ(total, 200);
}

// Moves the (empty) slot of `key` from its owner to another node, on every node.
std::size_t move_slot(RedisCluster& cluster, const std::string& key,
                      const std::vector<std::string>& ids) {
  const int slot = redis_key_slot(key);
  const std::size_t from = cluster.owner_of(slot);
  const std::size_t to = (from + 1) % cluster.size();
  for (std::size_t node : {to, from, (from + 2) % cluster.size()}) {
    const auto reply =
        cluster.node(node).query({"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", ids[to]});
    EXPECT_EQ(reply.type, '+') << "node " << node << ": " << reply.text;
  }
  return to;
}

TEST_F(ClusterTest, MovedSlotIsFollowedAndTheMapRefreshed) {
  std::vector<std::string> ids;
  for (std::size_t node = 0; node < cluster_->size(); ++node) ids.push_back(node_id(node));
  const auto remote = make_redis_store(options_for(cluster_->url()));
  remote->put("warm-up", "x");  // the map is learnt before the slot moves

  const std::string key = "moving-key";
  const std::size_t from = cluster_->owner_of(redis_key_slot(key));
  const std::size_t to = move_slot(*cluster_, key, ids);
  ASSERT_EQ(cluster_->owner_of(redis_key_slot(key)), to);
  ASSERT_EQ(redirects_sent(from, "MOVED"), 0);

  remote->put(key, "after the move");  // MOVED from the old owner, then the new one
  EXPECT_EQ(redirects_sent(from, "MOVED"), 1);
  EXPECT_EQ(cluster_->node(to).query({"GET", key}).text, "after the move");
  EXPECT_EQ(remote->get(key), "after the move");
  remote->remove(key);
  remote->put(key, "again");
  EXPECT_EQ(redirects_sent(from, "MOVED"), 1);  // the map knows: no second MOVED

  // A second slot moved: the store follows again (its map was refreshed, not frozen).
  const std::string other = "another-moving-key";
  const std::size_t other_to = move_slot(*cluster_, other, ids);
  remote->put(other, "v");
  EXPECT_EQ(cluster_->node(other_to).query({"GET", other}).text, "v");
}

TEST_F(ClusterTest, AskRedirectDuringAMigration) {
  std::vector<std::string> ids;
  for (std::size_t node = 0; node < cluster_->size(); ++node) ids.push_back(node_id(node));
  const auto remote = make_redis_store(options_for(cluster_->url()));

  const std::string key = "migrating-key";
  const std::string slot = std::to_string(redis_key_slot(key));
  const std::size_t from = cluster_->owner_of(redis_key_slot(key));
  const std::size_t to = (from + 1) % cluster_->size();
  ASSERT_EQ(cluster_->node(to).query({"CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]}).type,
            '+');
  ASSERT_EQ(cluster_->node(from).query({"CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]}).type,
            '+');
  // The key is not on the migrating node, so it answers ASK: the key goes to the
  // importing node, asked with ASKING.
  const auto direct = cluster_->node(from).query({"SET", key, "x"});
  ASSERT_EQ(direct.type, '-');
  ASSERT_EQ(direct.text.rfind("ASK ", 0), 0U) << direct.text;

  const long long asks_before = redirects_sent(from, "ASK");
  remote->put(key, "imported");
  EXPECT_EQ(redirects_sent(from, "ASK"), asks_before + 1);
  EXPECT_EQ(cluster_->node(to).query({"CLUSTER", "COUNTKEYSINSLOT", slot}).integer, 1);
  EXPECT_EQ(cluster_->node(from).query({"CLUSTER", "COUNTKEYSINSLOT", slot}).integer, 0);
  EXPECT_EQ(remote->get(key), "imported");
  // The owner is still the migrating node: its map entry did not change.
  EXPECT_EQ(cluster_->owner_of(redis_key_slot(key)), from);
  remote->remove(key);
  EXPECT_EQ(cluster_->node(to).query({"CLUSTER", "COUNTKEYSINSLOT", slot}).integer, 0);
}

TEST_F(ClusterTest, AKilledNodeFailsOnlyItsOwnKeys) {
  const std::chrono::milliseconds timeout = 250ms;
  const auto remote = make_redis_store(options_for(cluster_->url(), timeout));
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("key-" + std::to_string(i));
    remote->put(keys.back(), "v");
  }
  std::vector<std::size_t> owners;
  for (const std::string& key : keys) owners.push_back(cluster_->owner_of(redis_key_slot(key)));

  const std::size_t dead = 2;
  cluster_->node(dead).kill();
  int failed = 0;
  int worked = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (owners[i] == dead) {
      std::string what;
      const auto took = time_failure([&] { (void)remote->get(keys[i]); }, what);
      EXPECT_LE(took, 2 * timeout) << what;
      EXPECT_NE(what.find(cluster_->node(dead).address()), std::string::npos) << what;
      ++failed;
    } else {
      EXPECT_EQ(remote->get(keys[i]), "v");
      remote->put(keys[i], "v2");
      ++worked;
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(worked, 0);

  // Back (it rejoins with its nodes.conf, empty): its slots work again.
  cluster_->node(dead).restart();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (owners[i] != dead) continue;
    EXPECT_TRUE(eventually(
        [&] {
          try {
            remote->put(keys[i], "v3");
            return true;
          } catch (const RemoteError&) {
            return false;
          }
        },
        10s))
        << keys[i];
    EXPECT_EQ(remote->get(keys[i]), "v3");
  }
}

TEST_F(ClusterTest, EightThreadsAtOnce) {
  const auto remote = make_redis_store(options_for(cluster_->url(), 2000ms));
  hammer(*remote, 8, 300);
}

}  // namespace
