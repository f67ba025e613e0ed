// The hand-over (docs/operations.md, "Upgrade without losing state") between two real
// statepoold processes: a successor started with --take-over gets the pool, the memory and
// the listening sockets of the running daemon; its clients reconnect with their lease
// tokens and find their slots, pages and decoded states unchanged, and their snapshots
// hit. A successor that refuses leaves the old daemon serving, with nothing lost.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::client_options;
using statepool::testing::DaemonOptions;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout layout_of(kernels::CodecId codec) {
  kernels::StateLayout l;
  l.name = std::string("handover-") + kernels::to_string(codec);
  l.arch = kernels::Arch::gdn;
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.conv_channels = 64;
  l.conv_width = 3;
  l.conv_dtype = kernels::DType::f32;
  l.codec.id = codec;
  return l;
}

constexpr kernels::CodecId kCodecs[] = {kernels::CodecId::int8, kernels::CodecId::fp32,
                                        kernels::CodecId::bf16, kernels::CodecId::int6};

/// What one client parked before the hand-over, to find again after it.
struct Parked {
  std::string token;
  kernels::CodecId codec = kernels::CodecId::int8;
  client::ArenaId arena = 0;
  std::vector<client::SlotId> slots;
  std::vector<std::byte> page;     // slot 0's page
  std::vector<std::byte> decoded;  // slot 0 decompressed
  std::string snapshot;            // its published key
  bool pinned = false;
};

Parked park(const DaemonProcess& daemon, int i) {
  Parked p;
  p.codec = kCodecs[i % 4];
  auto conn = client::Connection::connect(client_options(daemon));
  auto arena = conn.open_arena(conn.register_layout(layout_of(p.codec)), 16);
  const std::size_t state = arena.codec().staged_bytes(kernels::DType::f32);
  auto staging = conn.open_staging(2 * state);
  const std::vector<float> values =
      statepool::synthetic::gaussian_values(state / sizeof(float), 100 + i, 0.05f);
  std::memcpy(staging.bytes().data(), values.data(), state);
  auto slots = conn.allocate(arena, 2);
  conn.compress(slots[0], staging, 0);
  conn.decompress(slots[0], staging, state);
  p.decoded.assign(staging.bytes().begin() + state, staging.bytes().begin() + 2 * state);
  p.page.assign(arena.page(slots[0]).begin(), arena.page(slots[0]).end());
  p.snapshot = "prefix-" + std::to_string(i);
  EXPECT_TRUE(conn.put_snapshot(slots[0], {p.snapshot, 64}).created);
  if (i % 3 == 0) {
    EXPECT_EQ(conn.pin_snapshot({p.snapshot, 64}), 1u);
    p.pinned = true;
  }
  p.arena = arena.id();
  for (auto& s : slots) p.slots.push_back(s.release());
  p.token = conn.lease_token();
  return p;  // the connection drops with its slots parked
}

/// Reconnects with the lease token and checks everything the client parked.
void resume(const DaemonProcess& daemon, const Parked& p, int i) {
  SCOPED_TRACE("client " + std::to_string(i));
  auto options = client_options(daemon);
  options.lease_token = p.token;
  auto conn = client::Connection::connect(options);
  EXPECT_TRUE(conn.lease_resumed());
  EXPECT_EQ(conn.resumed_slots(), 2u);
  auto arena = conn.open_arena(conn.register_layout(layout_of(p.codec)));
  ASSERT_EQ(arena.id(), p.arena);
  auto slot = conn.adopt(p.arena, p.slots[0]);
  auto other = conn.adopt(p.arena, p.slots[1]);
  const auto page = arena.page(slot);
  ASSERT_EQ(page.size(), p.page.size());
  EXPECT_EQ(std::memcmp(page.data(), p.page.data(), page.size()), 0) << "the page changed";
  auto staging = conn.open_staging(p.decoded.size());
  conn.decompress(slot, staging, 0);
  EXPECT_EQ(std::memcmp(staging.bytes().data(), p.decoded.data(), p.decoded.size()), 0)
      << "the decoded state changed";
  // Its snapshot hits (into the other slot) with the same page.
  const client::SnapshotGet hit = conn.get_snapshot({p.snapshot, 64}, other);
  EXPECT_TRUE(hit.hit);
  EXPECT_EQ(std::memcmp(arena.page(other).data(), p.page.data(), p.page.size()), 0);
  EXPECT_EQ(conn.free(p.arena, p.slots), 2u);
  (void)slot.release();
  (void)other.release();
}

}  // namespace

TEST(HandOver, ASuccessorServesEveryParkedStateSnapshotAndListener) {
  const std::vector<std::string> args = {"--grace-period", "60s", "--workers", "2"};
  DaemonProcess old(args, DaemonOptions{true, true});
  std::vector<Parked> parked;
  for (int i = 0; i < 16; ++i) parked.push_back(park(old, i));

  // A client that keeps asking while the hand-over happens: every request it sent is
  // answered (the daemon finishes it before closing), then it sees the connection end.
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread busy([&] {
    try {
      auto conn = client::Connection::connect(client_options(old));
      while (!stop.load()) {
        (void)conn.ping();
        answered.fetch_add(1);
      }
    } catch (const std::exception&) {
      // The predecessor closed the connection after a reply: the client reconnects.
    }
  });
  ASSERT_TRUE(eventually([&] { return answered.load() > 10; }, 10s));

  DaemonProcess next(args, DaemonOptions{true, true, 0, &old});
  EXPECT_TRUE(eventually([&] { return !old.running(); }, 30s)) << old.log();
  EXPECT_EQ(old.stop(SIGKILL, 1s), 0) << "the predecessor exits cleanly\n" << old.log();
  stop.store(true);
  busy.join();
  EXPECT_NE(old.log().find("handed over to the successor: 4 arenas, 48 pages, 16 leases"),
            std::string::npos)
      << old.log();
  EXPECT_NE(next.log().find("took over generation 0's pool: 4 arenas"), std::string::npos)
      << next.log();

  for (int i = 0; i < 16; ++i) resume(next, parked[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(client::Connection::connect(client_options(next)).stats().generation, 1u);
  // The listeners came along: the HTTP API and the metrics answer on the same ports.
  EXPECT_EQ(statepool::testing::http_get(next.api_port(), "/readyz"), "ready\n");
  const std::string metrics = statepool::testing::http_get(next.metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("\nstatepool_generation 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nstatepool_taken_over{what=\"leases\"} 16\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\nstatepool_taken_over{what=\"snapshots\"} 16\n"), std::string::npos)
      << metrics;
  EXPECT_EQ(next.stop(SIGTERM, 20s), 0) << next.log();
}

TEST(HandOver, ARefusedHandOverLeavesTheOldDaemonServingEverything) {
  DaemonProcess old({"--grace-period", "60s", "--tenant", "a"}, DaemonOptions{});
  auto options = client_options(old);
  options.tenant = "a";
  std::string token;
  client::ArenaId arena_id = 0;
  std::vector<client::SlotId> ids;
  std::vector<std::byte> page;
  {
    auto conn = client::Connection::connect(options);
    auto arena = conn.open_arena(conn.register_layout(layout_of(kernels::CodecId::int8)), 4);
    auto staging = conn.open_staging(arena.codec().staged_bytes(kernels::DType::f32));
    const std::vector<float> values =
        statepool::synthetic::gaussian_values(staging.bytes().size() / sizeof(float), 7, 0.05f);
    std::memcpy(staging.bytes().data(), values.data(), values.size() * sizeof(float));
    auto slots = conn.allocate(arena, 1);
    conn.compress(slots[0], staging, 0);
    page.assign(arena.page(slots[0]).begin(), arena.page(slots[0]).end());
    ids.push_back(slots[0].release());
    arena_id = arena.id();
    token = conn.lease_token();
  }
  // The successor does not configure tenant 'a': it must refuse, and exit.
  try {
    DaemonProcess next({"--grace-period", "60s", "--tenant", "b"},
                       DaemonOptions{false, false, 0, &old});
    ADD_FAILURE() << "the successor served:\n" << next.log();
  } catch (const statepool::testing::DaemonError& e) {
    EXPECT_NE(e.log().find("tenant 'a'"), std::string::npos) << e.log();
    EXPECT_NE(e.log().find("the running statepoold serves on"), std::string::npos) << e.log();
  }
  ASSERT_TRUE(old.running()) << old.log();
  EXPECT_TRUE(eventually(
      [&] { return old.log().find("serving on after the failed hand-over") != std::string::npos; },
      10s))
      << old.log();
  options.lease_token = token;
  auto conn = client::Connection::connect(options);
  EXPECT_TRUE(conn.lease_resumed());
  auto arena = conn.open_arena(conn.register_layout(layout_of(kernels::CodecId::int8)));
  auto slot = conn.adopt(arena_id, ids[0]);
  EXPECT_EQ(std::memcmp(arena.page(slot).data(), page.data(), page.size()), 0);
  // It still takes new work.
  EXPECT_EQ(conn.allocate(arena, 1).size(), 1u);
  EXPECT_EQ(old.stop(SIGTERM, 20s), 0) << old.log();
}

// SIGUSR2 (systemd's ExecReload=): the daemon starts the binary installed where it was
// started from, with its own arguments and --take-over, and hands the pool to it.
TEST(HandOver, Sigusr2StartsTheInstalledBinaryAsTheSuccessor) {
  // The successor is the old daemon's child: once that exits, it becomes ours to reap.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  DaemonProcess old({"--grace-period", "60s"}, DaemonOptions{});
  const Parked parked = park(old, 1);
  ASSERT_EQ(::kill(old.pid(), SIGUSR2), 0);
  ASSERT_TRUE(eventually([&] { return !old.running(); }, 30s)) << old.log();
  const std::string log = old.log();
  const auto at = log.find("SIGUSR2: started the successor ");
  ASSERT_NE(at, std::string::npos) << log;
  const auto pid_at = log.find("(pid ", at);
  ASSERT_NE(pid_at, std::string::npos) << log;
  const pid_t successor = std::stoi(log.substr(pid_at + 5));
  EXPECT_NE(log.find("handed over to the successor: 1 arenas"), std::string::npos) << log;
  // The successor writes to the same log: it serves once it says so a second time.
  ASSERT_TRUE(eventually([&] { return old.log().rfind("ready on") > at; }, 30s)) << old.log();
  resume(old, parked, 1);  // the same socket path, now served by the successor
  ASSERT_EQ(::kill(successor, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(successor, &status, 0), successor);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << old.log();
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}
