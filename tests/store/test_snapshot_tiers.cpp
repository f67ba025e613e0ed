// The prefix-state store below the pool, without a daemon: the snapshot value format
// (every way a value is refused), the host tier's byte-bounded LRU that keeps the first
// value of a name, and SnapshotTiers over an in-memory remote store (SET NX, as Redis)
// that can fail, block or hold corrupted values, with the SnapshotTierHold that tells the
// pool whether an evicted snapshot is still held below it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "statepool/kernels/kv.hpp"

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

/// Small KV blocks of a hybrid model: 2 layers, 200 tokens (past KIVI's residual window).
kernels::KvBlocks kv_blocks(kernels::KvCodecId codec = kernels::KvCodecId::kivi2) {
  return kernels::KvBlocks{codec, 2, 64, 32, 200};
}

/// kv_encode_blocks bytes of `blocks` over some finite values.
std::vector<std::byte> kv_bytes_of(const kernels::KvBlocks& blocks) {
  std::vector<float> plain(kernels::kv_blocks_plain_bytes(blocks, kernels::DType::f32) /
                           sizeof(float));
  for (std::size_t i = 0; i < plain.size(); ++i)
    plain[i] = static_cast<float>((i * 37) % 101) / 25.0F - 2.0F;
  std::vector<std::byte> out(kernels::kv_blocks_encoded_bytes(blocks));
  kernels::kv_encode_blocks(blocks, kernels::DType::f32, std::as_bytes(std::span(plain)), out);
  return out;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

/// `value` with the little-endian `field` of `bytes` bytes at `at` set to `to`, resealed:
/// a value whose checksum is right and whose header says something else.
std::string with_field(std::string value, std::size_t at, std::uint64_t to, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    value[at + i] = static_cast<char>((to >> (8 * i)) & 0xFFu);
  seal_snapshot_value(value);
  return value;
}

std::string refused(std::string_view v, const SnapshotName& expected, std::size_t bytes) {
  std::string reason;
  EXPECT_FALSE(decode_snapshot_value(v, expected, bytes, reason).has_value());
  return reason;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(SnapshotValue, RoundTripsAndRefusesEveryMismatch) {
  const SnapshotName n = name(std::string("\x00k\xff", 3));
  const std::vector<std::byte> p = page(1000, 3);
  const std::string value = encode_snapshot_value(n, p);
  EXPECT_EQ(value.size(), 80 + 4 + 3 + p.size());
  std::string why;
  const auto got = decode_snapshot_value(value, n, p.size(), why);
  ASSERT_TRUE(got.has_value()) << why;
  EXPECT_TRUE(same(got->page, p));
  EXPECT_FALSE(got->kv.has_value());
  EXPECT_TRUE(got->kv_bytes.empty());

  // The two-step form writes the same bytes.
  std::string framed = snapshot_value_frame(n, p.size());
  EXPECT_EQ(snapshot_value_page(framed).size(), p.size());
  EXPECT_TRUE(snapshot_value_kv(framed).empty());
  std::copy(p.begin(), p.end(), snapshot_value_page(framed).begin());
  seal_snapshot_value(framed);
  EXPECT_EQ(framed, value);

  std::string flipped = value;
  flipped[value.size() - 10] = static_cast<char>(flipped[value.size() - 10] ^ 0x01);
  EXPECT_EQ(refused(flipped, n, p.size()), "checksum mismatch");
  EXPECT_TRUE(contains(refused(value.substr(0, value.size() - 1), n, p.size()), "truncated"));
  EXPECT_TRUE(contains(refused(value + "x", n, p.size()), "trailing bytes"));
  EXPECT_TRUE(contains(refused(value.substr(0, 60), n, p.size()), "truncated"));
  EXPECT_TRUE(contains(refused("GET me a value", n, p.size()), "not a snapshot value"));
  EXPECT_TRUE(contains(refused("SPSNAP", n, p.size()), "not a snapshot value"));
  EXPECT_EQ(refused(value, name("other"), p.size()), "the value is another snapshot's");
  EXPECT_EQ(refused(value, name(n.prefix, 65), p.size()), "the value is another snapshot's");
  EXPECT_EQ(refused(value, name(n.prefix, 64, "fedcba9876543210"), p.size()),
            "layout digest 0123456789abcdef, expected fedcba9876543210");
  EXPECT_EQ(refused(value, n, 999), "a page of 1000 bytes, expected 999");
  std::string future = value;
  future[8] = 3;
  EXPECT_EQ(refused(future, n, p.size()), "snapshot value format version 3, this daemon reads 2");
  // Lengths in the header that do not match the value (the header is outside the CRC).
  EXPECT_TRUE(contains(refused(with_field(value, 10, 5, 2), n, p.size()), "truncated"));
  EXPECT_TRUE(contains(refused(with_field(value, 12, 0, 2), n, p.size()), "trailing bytes"));
  EXPECT_TRUE(contains(refused(with_field(value, 28, 1001, 8), n, p.size()), "truncated"));
  EXPECT_TRUE(contains(refused(with_field(value, 28, ~0ull, 8), n, p.size()), "truncated"));
  // The page format: a value of a build before format 2 (0 there), or of a later format.
  EXPECT_EQ(static_cast<int>(value[15]), 2);
  EXPECT_EQ(refused(with_field(value, 15, 0, 1), n, p.size()),
            "the page is in STEPQuant page format 0 (written before 2026-12-05 as format 1), "
            "this daemon reads format 2 (a miss: the next put of this prefix stores it again)");
  EXPECT_TRUE(contains(refused(with_field(value, 15, 3, 1), n, p.size()),
                       "the page is in STEPQuant page format 3, this daemon reads format 2"));
  std::string peek_why;
  EXPECT_FALSE(peek_snapshot_value(with_field(value, 15, 0, 1), peek_why).has_value());
  EXPECT_TRUE(contains(peek_why, "STEPQuant page format 0")) << peek_why;
}

TEST(SnapshotValue, AVersionOneValueIsRefused) {
  // A value as version 1 wrote it: a 52-byte header, no KV fields.
  const SnapshotName n = name("k");
  std::string v1(52 + n.space.size() + n.prefix.size() + 100, '\0');
  std::memcpy(v1.data(), "SPSNAP\r\n", 8);
  v1[8] = 1;
  v1[10] = static_cast<char>(n.space.size());
  v1[12] = static_cast<char>(n.prefix.size());
  v1[20] = 64;
  v1[28] = 100;
  std::memcpy(v1.data() + 36, n.layout_digest.data(), 16);
  std::memcpy(v1.data() + 52, n.space.data(), n.space.size());
  std::memcpy(v1.data() + 52 + n.space.size(), n.prefix.data(), n.prefix.size());
  EXPECT_EQ(refused(v1, n, 100), "snapshot value format version 1, this daemon reads 2");
}

// A value's own header names it, for a reader that does not know it (an imported file).
TEST(SnapshotValue, PeekReadsTheNameAndPageSizeFromTheHeader) {
  const SnapshotName n = name(std::string("\x00\xff chat", 7), 4096, "fedcba9876543210");
  const std::vector<std::byte> p = page(300, 5);
  const kernels::KvBlocks kv = kv_blocks();
  const std::string value = encode_snapshot_value(n, p, kv, kv_bytes_of(kv));
  std::string why;
  const auto header = peek_snapshot_value(value, why);
  ASSERT_TRUE(header) << why;
  EXPECT_EQ(header->name.space, n.space);
  EXPECT_EQ(header->name.prefix, n.prefix);
  EXPECT_EQ(header->name.position, 4096u);
  EXPECT_EQ(header->name.layout_digest, n.layout_digest);
  EXPECT_EQ(header->page_bytes, 300u);
  EXPECT_TRUE(decode_snapshot_value(value, header->name, header->page_bytes, why)) << why;

  EXPECT_FALSE(peek_snapshot_value("hello", why));
  EXPECT_NE(why.find("not a snapshot value"), std::string::npos) << why;
  EXPECT_FALSE(peek_snapshot_value(value.substr(0, 60), why));
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  std::string v1 = value;
  v1[8] = 1;
  EXPECT_FALSE(peek_snapshot_value(v1, why));
  EXPECT_NE(why.find("format version 1"), std::string::npos) << why;
}

TEST(SnapshotValue, CarriesKvBlocksBesideThePage) {
  const SnapshotName n = name("hybrid");
  const std::vector<std::byte> p = page(700, 9);
  for (const auto codec :
       {kernels::KvCodecId::bf16, kernels::KvCodecId::fp8, kernels::KvCodecId::kivi2,
        kernels::KvCodecId::kivi4, kernels::KvCodecId::flexgen4}) {
    SCOPED_TRACE(kernels::to_string(codec));
    const kernels::KvBlocks blocks = kv_blocks(codec);
    const std::vector<std::byte> kv = kv_bytes_of(blocks);
    const std::string value = encode_snapshot_value(n, p, blocks, kv);
    EXPECT_EQ(value.size(), 80 + n.space.size() + n.prefix.size() + p.size() + kv.size());
    EXPECT_EQ(static_cast<unsigned char>(value[14]), static_cast<unsigned>(codec) + 1);
    std::string why;
    const auto got = decode_snapshot_value(value, n, p.size(), why);
    ASSERT_TRUE(got.has_value()) << why;
    EXPECT_TRUE(same(got->page, p));
    ASSERT_TRUE(got->kv.has_value());
    EXPECT_EQ(*got->kv, blocks);
    EXPECT_TRUE(same(got->kv_bytes, kv));

    // Frame, fill both areas, seal: the same bytes.
    std::string framed = snapshot_value_frame(n, p.size(), blocks);
    ASSERT_EQ(snapshot_value_page(framed).size(), p.size());
    ASSERT_EQ(snapshot_value_kv(framed).size(), kv.size());
    EXPECT_TRUE(std::all_of(snapshot_value_kv(framed).begin(), snapshot_value_kv(framed).end(),
                            [](std::byte b) { return b == std::byte{0}; }));
    std::copy(p.begin(), p.end(), snapshot_value_page(framed).begin());
    std::copy(kv.begin(), kv.end(), snapshot_value_kv(framed).begin());
    seal_snapshot_value(framed);
    EXPECT_EQ(framed, value);
  }
}

TEST(SnapshotValue, RefusesEveryInconsistentKvHeader) {
  const SnapshotName n = name("hybrid");
  const std::vector<std::byte> p = page(300, 5);
  const kernels::KvBlocks blocks = kv_blocks();
  const std::vector<std::byte> kv = kv_bytes_of(blocks);
  const std::string value = encode_snapshot_value(n, p, blocks, kv);
  const std::uint64_t k = kv.size();

  // The KV area: one byte short, one byte flipped.
  EXPECT_TRUE(contains(refused(value.substr(0, value.size() - 1), n, p.size()), "truncated"));
  std::string flipped = value;
  flipped[value.size() - kv.size() / 2] ^= 0x10;
  EXPECT_EQ(refused(flipped, n, p.size()), "checksum mismatch");
  std::string why;
  EXPECT_TRUE(decode_snapshot_value(flipped, n, p.size(), why, false).has_value()) << why;

  // Codec byte: unknown; 0 with KV fields left set.
  EXPECT_EQ(refused(with_field(value, 14, 6, 1), n, p.size()), "unknown KV codec byte 6");
  EXPECT_EQ(refused(with_field(value, 14, 255, 1), n, p.size()), "unknown KV codec byte 255");
  EXPECT_EQ(refused(with_field(value, 14, 0, 1), n, p.size()), "KV fields set without a KV codec");
  const std::string plain = encode_snapshot_value(n, p);
  for (const std::size_t at : {52, 56, 60, 64, 72}) {
    EXPECT_EQ(refused(with_field(plain, at, 1, 1), n, p.size()), "KV fields set without a KV codec")
        << at;
  }

  // Ill-formed fields (kv_blocks_problem).
  EXPECT_EQ(refused(with_field(value, 52, 0, 4), n, p.size()),
            "ill-formed KV fields: KV blocks need at least 1 layer");
  EXPECT_EQ(refused(with_field(value, 52, 1025, 4), n, p.size()),
            "ill-formed KV fields: KV blocks have at most 1024 layers");
  EXPECT_EQ(refused(with_field(value, 56, 0, 4), n, p.size()),
            "ill-formed KV fields: KV blocks need at least 1 key channel");
  EXPECT_EQ(refused(with_field(value, 64, 0, 8), n, p.size()),
            "ill-formed KV fields: KV blocks need at least 1 token");
  EXPECT_TRUE(contains(refused(with_field(value, 64, (1ull << 32) + 1, 8), n, p.size()),
                       "ill-formed KV fields"));

  // k inconsistent with the fields, both ways; fields changed under the same k.
  EXPECT_TRUE(contains(refused(with_field(value, 72, k + 1, 8), n, p.size()),
                       std::to_string(k + 1) + " KV bytes, "));
  EXPECT_TRUE(contains(refused(with_field(value, 72, k - 1, 8), n, p.size()), " KV bytes, "));
  EXPECT_TRUE(contains(refused(with_field(value, 64, 201, 8), n, p.size()), " KV bytes, "));
  EXPECT_TRUE(contains(refused(with_field(value, 72, ~0ull, 8), n, p.size()), " KV bytes, "));

  // Huge sizes whose sums wrap around: 16 KV bytes (8 bf16 keys) beside a page of
  // 2^64 - 16 bytes add up to 0 modulo 2^64.
  std::string huge = encode_snapshot_value(n, {});
  huge = with_field(huge, 14, static_cast<unsigned>(kernels::KvCodecId::bf16) + 1, 1);
  huge = with_field(huge, 52, 1, 4);
  huge = with_field(huge, 56, 1, 4);
  huge = with_field(huge, 64, 8, 8);
  huge = with_field(huge, 72, 16, 8);
  huge = with_field(huge, 28, ~0ull - 15, 8);
  EXPECT_TRUE(contains(refused(huge, n, 0), "truncated")) << refused(huge, n, 0);
  EXPECT_TRUE(contains(refused(huge, n, ~std::size_t{0} - 15), "truncated"));
  // ... and fields whose KV size would pass 2^64 (1024 layers of 2^32 tokens of 2^20 key
  // and 2^20 value channels): refused by the KV-block limits before any size is computed.
  huge = with_field(huge, 28, 0, 8);
  huge = with_field(huge, 52, 1024, 4);
  huge = with_field(huge, 56, 1u << 20, 4);
  huge = with_field(huge, 60, 1u << 20, 4);
  huge = with_field(huge, 64, 1ull << 32, 8);
  huge = with_field(huge, 72, 0, 8);
  EXPECT_TRUE(contains(refused(huge, n, 0), "at most 2^48 bytes")) << refused(huge, n, 0);
}

TEST(SnapshotValue, RefusesIllFormedKvBlocksWhenWriting) {
  const SnapshotName n = name("hybrid");
  const std::vector<std::byte> p = page(10, 1);
  kernels::KvBlocks bad = kv_blocks();
  bad.tokens = 0;
  EXPECT_THROW((void)snapshot_value_frame(n, p.size(), bad), std::invalid_argument);
  EXPECT_THROW((void)encode_snapshot_value(n, p, bad), std::invalid_argument);
  bad = kv_blocks();
  bad.codec = static_cast<kernels::KvCodecId>(9);
  EXPECT_THROW((void)snapshot_value_frame(n, p.size(), bad), std::invalid_argument);
  // KV bytes of the wrong size, or without blocks.
  const kernels::KvBlocks blocks = kv_blocks();
  std::vector<std::byte> kv = kv_bytes_of(blocks);
  kv.pop_back();
  EXPECT_THROW((void)encode_snapshot_value(n, p, blocks, kv), std::invalid_argument);
  EXPECT_THROW((void)encode_snapshot_value(n, p, blocks), std::invalid_argument);
  EXPECT_THROW((void)encode_snapshot_value(n, p, std::nullopt, kv), std::invalid_argument);
}

TEST(SnapshotValue, RemoteKeysSpreadAndNameEveryPart) {
  EXPECT_EQ(remote_key(name(std::string("\x9f\x86", 2), 512)),
            "statepool:snap:2:team:0123456789abcdef:512:9f86");
  EXPECT_TRUE(contains(remote_key(name("a")), ":snap:2:"));
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
  // The same name again keeps the entry.
  EXPECT_TRUE(tier.put(name("a"), "alice", value_of(name("a"), 1000)));
  EXPECT_EQ(tier.used(), 3 * one);
}

// Snapshots are immutable below the pool too: a second value for a name (another daemon's,
// read from the remote store; a publication after the pool let the snapshot go) leaves the
// first value, its size and its publisher as they were.
TEST(HostTier, KeepsTheFirstValueOfAName) {
  HostTier tier(1 << 20);
  const SnapshotName n = name("k");
  const auto first = std::make_shared<const std::string>(encode_snapshot_value(n, page(100, 1)));
  const auto second = std::make_shared<const std::string>(encode_snapshot_value(n, page(300, 2)));
  EXPECT_TRUE(tier.put(n, "alice", first));
  EXPECT_TRUE(tier.put(n, "bob", second));  // the tier holds a value for the name
  EXPECT_EQ(tier.get(n), first);
  EXPECT_EQ(tier.used(), first->size());
  EXPECT_EQ(tier.usage().at("alice").snapshots, 1u);
  EXPECT_EQ(tier.usage().count("bob"), 0u);
  // Even one too large for the tier: the entry stays.
  EXPECT_TRUE(tier.put(n, "bob", value_of(n, 2 << 20)));
  EXPECT_EQ(tier.get(n), first);
}

// The hold of the publication that put (or put again) an entry says whether it is here.
TEST(HostTier, AHoldSaysWhetherTheEntryIsStillThere) {
  const std::size_t one = value_of(name("a"), 1000)->size();
  HostTier tier(2 * one);
  auto a = std::make_shared<SnapshotTierHold>();
  auto b = std::make_shared<SnapshotTierHold>();
  auto c = std::make_shared<SnapshotTierHold>();
  EXPECT_TRUE(tier.put(name("a"), "alice", value_of(name("a"), 1000), a));
  EXPECT_TRUE(tier.put(name("b"), "alice", value_of(name("b"), 1000), b));
  EXPECT_TRUE(a->host);
  EXPECT_TRUE(b->host);
  EXPECT_TRUE(tier.put(name("c"), "alice", value_of(name("c"), 1000), c));  // a goes
  EXPECT_FALSE(a->host);
  EXPECT_TRUE(b->host);
  EXPECT_TRUE(c->host);
  // b published again (its first snapshot left the pool): the entry answers for the new
  // hold, which the tier keeps up to date from now on.
  auto b2 = std::make_shared<SnapshotTierHold>();
  EXPECT_TRUE(tier.put(name("b"), "alice", value_of(name("b"), 1000), b2));
  EXPECT_TRUE(b2->host);
  EXPECT_EQ(tier.remove_key("team", "b", 64).size(), 1u);
  EXPECT_FALSE(b2->host);
  // Too large: not held.
  auto huge = std::make_shared<SnapshotTierHold>();
  EXPECT_FALSE(tier.put(name("huge"), "alice", value_of(name("huge"), 3000), huge));
  EXPECT_FALSE(huge->host);
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

/// An in-memory remote store that can be made to fail or to block its writes. put is SET
/// NX, as RedisStore's: a key keeps its first value.
class FakeRemote final : public RemoteStore {
 public:
  bool put(std::string_view key, std::string_view value) override {
    std::unique_lock lock(mutex_);
    ++entered_;
    released_.wait(lock, [&] { return !blocked_; });
    if (down_) throw RemoteError("fake redis unreachable: Connection refused");
    return data_.emplace(std::string(key), std::string(value)).second;
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
  bool exists(std::string_view key) override {
    const std::lock_guard lock(mutex_);
    if (down_) throw RemoteError("fake redis unreachable: Connection refused");
    return data_.contains(std::string(key));
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

TEST(SnapshotTiers, FindReturnsTheKvBlocksBesideThePageFromEitherTier) {
  const SnapshotName n = name("hybrid");
  const std::vector<std::byte> p = page(400, 2);
  const kernels::KvBlocks blocks = kv_blocks(kernels::KvCodecId::kivi4);
  const std::vector<std::byte> kv = kv_bytes_of(blocks);
  const auto value = std::make_shared<const std::string>(encode_snapshot_value(n, p, blocks, kv));

  // The host tier alone (no remote).
  SnapshotTiers host_only(TiersConfig{1 << 20, 16}, nullptr);
  host_only.publish(n, "alice", value);
  const auto local = host_only.find(n, p.size(), "alice");
  ASSERT_TRUE(local.has_value());
  EXPECT_STREQ(local->tier, "host");
  EXPECT_TRUE(same(local->page, p));
  ASSERT_TRUE(local->kv.has_value());
  EXPECT_EQ(*local->kv, blocks);
  EXPECT_TRUE(same(local->kv_bytes, kv));
  // A snapshot without KV blocks finds none.
  const SnapshotName plain = name("plain");
  host_only.publish(plain, "alice", value_of(plain, 400));
  const auto none = host_only.find(plain, 400, "alice");
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->kv.has_value());
  EXPECT_TRUE(none->kv_bytes.empty());

  // The remote tier, then the host tier that kept the remote hit.
  auto remote = std::make_unique<FakeRemote>();
  remote->put(remote_key(n), *value);
  SnapshotTiers reader(TiersConfig{1 << 20, 16}, std::move(remote));
  for (const char* tier : {"remote", "host"}) {
    const auto got = reader.find(n, p.size(), "bob");
    ASSERT_TRUE(got.has_value()) << tier;
    EXPECT_STREQ(got->tier, tier);
    EXPECT_TRUE(same(got->page, p)) << tier;
    ASSERT_TRUE(got->kv.has_value()) << tier;
    EXPECT_EQ(*got->kv, blocks) << tier;
    EXPECT_TRUE(same(got->kv_bytes, kv)) << tier;
  }
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

// locate() answers where a value is without reading it: the host tier, else the remote
// store's EXISTS; a dead remote is "nowhere", counted, never an error.
TEST(SnapshotTiers, LocateAnswersFromTheIndexesWithoutReadingValues) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  SnapshotTiers writer(TiersConfig{1 << 20, 16}, std::move(remote));
  const SnapshotName n = name("prompt");
  writer.publish(n, "alice", value_of(n, 500));
  ASSERT_TRUE(writer.flush(5s));
  EXPECT_STREQ(writer.locate(n), "host");
  EXPECT_EQ(writer.locate(name("absent")), nullptr);

  auto other_remote = std::make_unique<FakeRemote>();
  for (const auto& [k, v] : fake.data()) other_remote->put(k, v);
  FakeRemote& other = *other_remote;
  SnapshotTiers reader(TiersConfig{1 << 20, 16}, std::move(other_remote));
  EXPECT_STREQ(reader.locate(n), "remote");
  EXPECT_EQ(reader.locate(name("prompt", 64, "ffffffffffffffff")), nullptr);  // other layout
  EXPECT_EQ(reader.remote_counters().lookups_present, 1u);
  EXPECT_EQ(reader.remote_counters().lookups_missing, 1u);
  EXPECT_EQ(reader.remote_counters().reads_hit, 0u);  // nothing was read
  EXPECT_TRUE(reader.host_usage().empty());           // nor kept in the host tier
  other.set_down(true);
  EXPECT_EQ(reader.locate(n), nullptr);
  EXPECT_EQ(reader.remote_counters().lookups_failed, 1u);
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

namespace statepool::service {
namespace {

// A second publication of a name (another daemon's, or this one's after its pool let the
// snapshot go) leaves the first value in the remote store and is counted as "existing";
// the bytes of both writes count as sent.
TEST(SnapshotTiers, TheRemoteKeepsTheFirstValueOfAName) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  SnapshotTiers tiers(TiersConfig{0, 16}, std::move(remote));  // remote only
  const SnapshotName n = name("p");
  const auto first = std::make_shared<const std::string>(encode_snapshot_value(n, page(100, 1)));
  const auto second = std::make_shared<const std::string>(encode_snapshot_value(n, page(100, 2)));
  tiers.publish(n, "alice", first);
  ASSERT_TRUE(tiers.flush(5s));
  tiers.publish(n, "bob", second);
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(fake.data().at(remote_key(n)) == *first);
  const RemoteCounters c = tiers.remote_counters();
  EXPECT_EQ(c.writes_ok, 1u);
  EXPECT_EQ(c.writes_existing, 1u);
  EXPECT_EQ(c.write_bytes, first->size() + second->size());
  const auto found = tiers.find(n, 100, "carol");
  ASSERT_TRUE(found.has_value());
  EXPECT_TRUE(same(found->page, page(100, 1)));
}

// What a publication's hold says as its value goes down: on its way until publish()
// returns; then held by the host tier until it lets the value go, and by the remote store
// while its write is queued, in flight or done; never by a remote write that was dropped
// or failed.
TEST(SnapshotTiers, AHoldFollowsTheValueIntoEachTier) {
  auto remote = std::make_unique<FakeRemote>();
  FakeRemote& fake = *remote;
  const std::size_t one = value_of(name("a"), 100)->size();
  SnapshotTiers tiers(TiersConfig{one, 1}, std::move(remote));  // one value, one write queued

  auto a = std::make_shared<SnapshotTierHold>();
  EXPECT_TRUE(a->held());  // on its way
  tiers.publish(name("a"), "alice", value_of(name("a"), 100), a);
  EXPECT_FALSE(a->publishing);
  EXPECT_TRUE(a->host);
  EXPECT_TRUE(a->remote);  // queued or written
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(a->remote);  // written

  // The host tier lets a go for b: a is held by the remote store alone.
  auto b = std::make_shared<SnapshotTierHold>();
  tiers.publish(name("b"), "alice", value_of(name("b"), 100), b);
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_FALSE(a->host);
  EXPECT_TRUE(a->held());
  EXPECT_TRUE(b->host && b->remote);

  // A failed write: c is held by the host tier only, until d pushes it out.
  fake.set_down(true);
  auto c = std::make_shared<SnapshotTierHold>();
  tiers.publish(name("c"), "alice", value_of(name("c"), 100), c);
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(c->host);
  EXPECT_FALSE(c->remote);
  fake.set_down(false);
  fake.set_blocked(true);
  auto d = std::make_shared<SnapshotTierHold>();
  tiers.publish(name("d"), "alice", value_of(name("d"), 100), d);
  while (fake.entered() < 4) std::this_thread::sleep_for(1ms);  // the writer holds d
  EXPECT_FALSE(c->held());
  EXPECT_TRUE(d->remote);  // in flight

  // A dropped write (one is queued already, d is in flight): e is held by the host tier
  // only, and by nothing once the tier lets it go.
  auto queued = std::make_shared<SnapshotTierHold>();
  tiers.publish(name("q"), "alice", value_of(name("q"), 100), queued);
  auto e = std::make_shared<SnapshotTierHold>();
  tiers.publish(name("e"), "alice", value_of(name("e"), 100), e);
  EXPECT_EQ(tiers.remote_counters().writes_dropped, 1u);
  EXPECT_TRUE(e->host);
  EXPECT_FALSE(e->remote);
  tiers.publish(name("f"), "alice", value_of(name("f"), 100));  // no hold: a remote hit, say
  EXPECT_FALSE(e->held());
  fake.set_blocked(false);
  ASSERT_TRUE(tiers.flush(5s));
  EXPECT_TRUE(d->remote && queued->remote);
}

}  // namespace
}  // namespace statepool::service
