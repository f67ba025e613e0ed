// The prefix-state store below the pool, without a daemon: the snapshot value format
// (every way a value is refused), the host tier's byte-bounded LRU, and SnapshotTiers over
// an in-memory remote store that can fail, block or hold corrupted values.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/host_tier.hpp"
#include "store/snapshot_value.hpp"
#include "store/tiers.hpp"

namespace statepool::service {
namespace {

using namespace std::chrono_literals;

SnapshotName name(std::string prefix, std::uint64_t position = 64,
                  std::string digest = "0123456789abcdef") {
  return SnapshotName{"team", std::move(prefix), position, std::move(digest)};
}

std::vector<std::byte> page(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    out[i] = std::byte(static_cast<std::uint8_t>(seed + i * 7));
  return out;
}

// --- the value format ------------------------------------------------------------------

TEST(SnapshotValue, RoundTripsAndRefusesEveryMismatch) {
  const SnapshotName n = name(std::string("\x00k\xff", 3));
  const std::vector<std::byte> p = page(1000, 3);
  const std::string value = encode_snapshot_value(n, p);
  std::string why;
  const auto got = decode_snapshot_value(value, n, p.size(), why);
  ASSERT_TRUE(got.has_value()) << why;
  EXPECT_TRUE(std::equal(got->begin(), got->end(), p.begin(), p.end()));

  // The two-step form writes the same bytes.
  std::string framed = snapshot_value_frame(n, p.size());
  std::copy(p.begin(), p.end(), snapshot_value_page(framed).begin());
  seal_snapshot_value(framed);
  EXPECT_EQ(framed, value);

  const auto refused = [&](const std::string& v, const SnapshotName& expected, std::size_t bytes) {
    std::string reason;
    EXPECT_FALSE(decode_snapshot_value(v, expected, bytes, reason).has_value());
    return reason;
  };
  std::string flipped = value;
  flipped[value.size() - 10] = static_cast<char>(flipped[value.size() - 10] ^ 0x01);
  EXPECT_EQ(refused(flipped, n, p.size()), "checksum mismatch");
  EXPECT_NE(refused(value.substr(0, value.size() - 1), n, p.size()).find("truncated"),
            std::string::npos);
  EXPECT_NE(refused("GET me a value", n, p.size()).find("not a snapshot value"), std::string::npos);
  EXPECT_EQ(refused(value, name("other"), p.size()), "the value is another snapshot's");
  EXPECT_EQ(refused(value, name(n.prefix, 65), p.size()), "the value is another snapshot's");
  EXPECT_EQ(refused(value, name(n.prefix, 64, "fedcba9876543210"), p.size()),
            "layout digest 0123456789abcdef, expected fedcba9876543210");
  EXPECT_EQ(refused(value, n, 999), "a page of 1000 bytes, expected 999");
  std::string future = value;
  future[8] = 2;
  EXPECT_EQ(refused(future, n, p.size()), "snapshot value format 2, this daemon reads 1");
}

TEST(SnapshotValue, RemoteKeysSpreadAndNameEveryPart) {
  EXPECT_EQ(remote_key(name(std::string("\x9f\x86", 2), 512)),
            "statepool:snap:1:team:0123456789abcdef:512:9f86");
  EXPECT_NE(remote_key(name("a")), remote_key(name("a", 65)));
  EXPECT_EQ(remote_key(name("a")).find('{'), std::string::npos);  // no cluster hash tag
}

// --- the host tier -----------------------------------------------------------------------

std::shared_ptr<const std::string> value_of(const SnapshotName& n, std::size_t page_bytes) {
  return std::make_shared<const std::string>(encode_snapshot_value(n, page(page_bytes, 1)));
}

TEST(HostTier, KeepsAtMostItsCapacityLeastRecentlyUsedOutFirst) {
  const std::size_t one = value_of(name("a"), 1000)->size();
  HostTier tier(3 * one);
  EXPECT_TRUE(tier.put(name("a"), "alice", value_of(name("a"), 1000)));
  EXPECT_TRUE(tier.put(name("b"), "alice", value_of(name("b"), 1000)));
  EXPECT_TRUE(tier.put(name("c"), "bob", value_of(name("c"), 1000)));
  EXPECT_EQ(tier.used(), 3 * one);
  ASSERT_NE(tier.get(name("a")), nullptr);  // a is now the most recent: b goes first
  EXPECT_TRUE(tier.put(name("d"), "bob", value_of(name("d"), 1000)));
  EXPECT_FALSE(tier.contains(name("b")));
  EXPECT_TRUE(tier.contains(name("a")));
  EXPECT_EQ(tier.used(), 3 * one);
  const auto usage = tier.usage();
  EXPECT_EQ(usage.at("alice").snapshots, 1u);
  EXPECT_EQ(usage.at("alice").evictions, 1u);
  EXPECT_EQ(usage.at("bob").snapshots, 2u);
  EXPECT_EQ(usage.at("bob").bytes, 2 * one);

  // Too large for the tier: kept nowhere, nothing evicted.
  EXPECT_FALSE(tier.put(name("huge"), "alice", value_of(name("huge"), 4 * 1000)));
  EXPECT_EQ(tier.used(), 3 * one);
  // The same name again replaces the entry.
  EXPECT_TRUE(tier.put(name("a"), "alice", value_of(name("a"), 1000)));
  EXPECT_EQ(tier.used(), 3 * one);
}

TEST(HostTier, RemovingAKeyRemovesItUnderEveryLayout) {
  HostTier tier(1 << 20);
  tier.put(name("k", 1, "aaaaaaaaaaaaaaaa"), "alice",
           value_of(name("k", 1, "aaaaaaaaaaaaaaaa"), 10));
  tier.put(name("k", 1, "bbbbbbbbbbbbbbbb"), "alice",
           value_of(name("k", 1, "bbbbbbbbbbbbbbbb"), 10));
  tier.put(name("k", 2), "alice", value_of(name("k", 2), 10));
  EXPECT_EQ(tier.remove_key("team", "k", 1).size(), 2u);
  EXPECT_TRUE(tier.contains(name("k", 2)));
  EXPECT_EQ(tier.usage().at("alice").snapshots, 1u);
}

// --- the tiers over a fake remote ----------------------------------------------------------

/// An in-memory remote store that can be made to fail or to block its writes.
class FakeRemote final : public RemoteStore {
 public:
  void put(std::string_view key, std::string_view value) override {
    std::unique_lock lock(mutex_);
    ++entered_;
    released_.wait(lock, [&] { return !blocked_; });
    if (down_) throw RemoteError("fake redis unreachable: Connection refused");
    data_[std::string(key)] = std::string(value);
  }
  std::optional<std::string> get(std::string_view key) override {
    const std::lock_guard lock(mutex_);
    if (down_) throw RemoteError("fake redis unreachable: Connection refused");
    const auto it = data_.find(std::string(key));
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }
  void remove(std::string_view key) override {
    const std::lock_guard lock(mutex_);
    if (down_) throw RemoteError("fake redis unreachable: Connection refused");
    data_.erase(std::string(key));
  }
  [[nodiscard]] std::string describe() const override { return "fake redis"; }

  void set_down(bool down) {
    const std::lock_guard lock(mutex_);
    down_ = down;
  }
  void set_blocked(bool blocked) {
    {
      const std::lock_guard lock(mutex_);
      blocked_ = blocked;
    }
    released_.notify_all();
  }
  /// put() calls begun so far (blocked ones included).
  int entered() {
    const std::lock_guard lock(mutex_);
    return entered_;
  }
  std::map<std::string, std::string> data() {
    const std::lock_guard lock(mutex_);
    return data_;
  }
  void corrupt(const std::string& key) {
    const std::lock_guard lock(mutex_);
    data_.at(key).back() ^= 0x40;
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  std::map<std::string, std::string> data_;
  bool down_ = false;
  bool blocked_ = false;
  int entered_ = 0;
};

TEST(SnapshotTiers, PublicationsReachTheRemoteAndAnotherDaemonFindsThem) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  SnapshotTiers writer(TiersConfig{1 << 20, 16}, std::move(remote));
  const SnapshotName n = name("prompt");
  writer.publish(n, "alice", value_of(n, 500));
  ASSERT_TRUE(writer.flush(5s));
  EXPECT_EQ(fake.data().count(remote_key(n)), 1u);
  EXPECT_EQ(writer.remote_counters().writes_ok, 1u);

  // A host-tier hit needs no remote.
  const auto local = writer.find(n, 500, "alice");
  ASSERT_TRUE(local.has_value());
  EXPECT_STREQ(local->tier, "host");

  // "Another daemon": no host entry, the same remote (the fake is shared by copying its
  // data into a second fake).
  auto other_remote = std::make_unique<FakeRemote>();
  for (const auto& [k, v] : fake.data()) other_remote->put(k, v);
  SnapshotTiers reader(TiersConfig{1 << 20, 16}, std::move(other_remote));
  const auto far = reader.find(n, 500, "bob");
  ASSERT_TRUE(far.has_value());
  EXPECT_STREQ(far->tier, "remote");
  EXPECT_EQ(far->page.size(), 500u);
  EXPECT_EQ(reader.host_usage().at("bob").snapshots, 1u);  // kept for the next lookup
  EXPECT_STREQ(reader.find(n, 500, "bob")->tier, "host");
  EXPECT_FALSE(reader.find(name("prompt", 65), 500, "bob").has_value());
  EXPECT_EQ(reader.remote_counters().reads_hit, 1u);
  EXPECT_EQ(reader.remote_counters().reads_missing, 1u);
  // Another layout's lookup of the key is a miss, never the wrong page.
  EXPECT_FALSE(reader.find(name("prompt", 64, "ffffffffffffffff"), 500, "bob").has_value());
}

TEST(SnapshotTiers, ADeadOrCorruptRemoteIsAMissNeverAnError) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  SnapshotTiers tiers(TiersConfig{0, 16}, std::move(remote));  // remote only
  const SnapshotName n = name("p");
  tiers.publish(n, "alice", value_of(n, 100));
  ASSERT_TRUE(tiers.flush(5s));
  fake.corrupt(remote_key(n));
  EXPECT_FALSE(tiers.find(n, 100, "alice").has_value());
  EXPECT_EQ(tiers.remote_counters().reads_rejected, 1u);

  fake.set_down(true);
  EXPECT_FALSE(tiers.find(n, 100, "alice").has_value());
  EXPECT_EQ(tiers.remote_counters().reads_failed, 1u);
  tiers.publish(name("q"), "alice", value_of(name("q"), 100));
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_EQ(tiers.remote_counters().writes_failed, 1u);
  fake.set_down(false);
  tiers.publish(name("q"), "alice", value_of(name("q"), 100));
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(tiers.find(name("q"), 100, "alice").has_value());
}

TEST(SnapshotTiers, ASlowRemoteNeverBlocksAPublicationAndExcessWritesAreDropped) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  fake.set_blocked(true);
  SnapshotTiers tiers(TiersConfig{1 << 20, 2}, std::move(remote));
  const auto start = std::chrono::steady_clock::now();
  tiers.publish(name("k0"), "alice", value_of(name("k0"), 100));
  while (fake.entered() == 0) std::this_thread::sleep_for(1ms);  // the writer holds k0
  for (int i = 1; i < 6; ++i) {
    const SnapshotName n = name("k" + std::to_string(i));
    tiers.publish(n, "alice", value_of(n, 100));
  }
  // Every publication returned although the remote takes none (one being written, two
  // queued, three dropped); a generous bound that only a blocked call would pass.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(tiers.flush(50ms));
  EXPECT_EQ(tiers.remote_counters().writes_dropped, 3u);
  EXPECT_TRUE(tiers.find(name("k5"), 100, "alice").has_value());  // the host tier has all
  fake.set_blocked(false);
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_EQ(tiers.remote_counters().writes_ok, 3u);
  EXPECT_EQ(fake.data().size(), 3u);
}

TEST(SnapshotTiers, RemoveDeletesEveryLayoutFromBothTiers) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  SnapshotTiers tiers(TiersConfig{1 << 20, 16}, std::move(remote));
  const SnapshotName a = name("k", 1, "aaaaaaaaaaaaaaaa");
  const SnapshotName b = name("k", 1, "bbbbbbbbbbbbbbbb");
  tiers.publish(a, "alice", value_of(a, 10));
  tiers.publish(b, "alice", value_of(b, 10));
  ASSERT_TRUE(tiers.flush(5s));
  ASSERT_EQ(fake.data().size(), 2u);
  // The pool named no layout (it had neither): the host tier's entries are enough.
  tiers.remove("team", "k", 1, {});
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(fake.data().empty());
  EXPECT_FALSE(tiers.find(a, 10, "alice").has_value());
}

}  // namespace
}  // namespace statepool::service
