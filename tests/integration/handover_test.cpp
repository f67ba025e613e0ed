// The hand-over (docs/operations.md, "Upgrade without losing state") between two real
// statepoold processes: a successor started with --take-over gets the pool, the memory and
// the listening sockets of the running daemon; its clients reconnect with their lease
// tokens and find their slots, pages and decoded states unchanged, and their snapshots
// hit. A successor that refuses leaves the old daemon serving, with nothing lost.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "handover/image.hpp"
#include "handover/transfer.hpp"
#include "memory/host_memfd.hpp"
#include "parked_clients.hpp"
#include "pool/pool.hpp"
#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::client_options;
using statepool::testing::DaemonOptions;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using namespace std::chrono_literals;

using statepool::testing::kCodecs;
using statepool::testing::layout_of;
using statepool::testing::park;
using statepool::testing::Parked;
using statepool::testing::resume;

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

// Kubernetes (docs/operations.md §12.3): the new pod's daemon takes the pool over when the
// old pod's runs (--take-over=if-running), and starts fresh when none does; the old one
// keeps its probes (its HTTP listeners are in its own pod's network) until the DaemonSet
// deletes its pod (--after-handover=wait), and removes nothing on its way out.
TEST(HandOver, IfRunningStartsFreshWhenNoDaemonRuns) {
  DaemonProcess fresh({"--take-over=if-running"}, DaemonOptions{});
  EXPECT_NE(fresh.log().find("(--take-over=if-running): starting with an empty pool"),
            std::string::npos)
      << fresh.log();
  auto conn = client::Connection::connect(client_options(fresh));
  EXPECT_FALSE(conn.lease_resumed());
  EXPECT_EQ(fresh.stop(SIGTERM, 20s), 0) << fresh.log();
}

TEST(HandOver, AWaitingPredecessorAnswersItsProbesUntilSigterm) {
  const std::vector<std::string> args = {"--grace-period", "60s", "--take-over=if-running",
                                         "--after-handover=wait"};
  DaemonProcess old(args, DaemonOptions{true, false});
  const Parked parked = park(old, 0);
  DaemonOptions options{true, false};
  options.take_over_from = &old;
  options.own_ports = true;
  DaemonProcess next(args, options);
  ASSERT_NE(next.metrics_port(), old.metrics_port());
  EXPECT_TRUE(
      eventually([&] { return old.log().find("waiting for SIGTERM") != std::string::npos; }, 10s))
      << old.log();
  // The old daemon lives on for its probes: alive, not ready.
  ASSERT_TRUE(old.running()) << old.log();
  EXPECT_EQ(statepool::testing::http_get(old.metrics_port(), "/healthz"), "ok\n");
  EXPECT_EQ(statepool::testing::http_request(old.metrics_port(), "GET", "/readyz").status, 503);
  EXPECT_EQ(statepool::testing::http_get(next.metrics_port(), "/readyz"), "ready\n");
  resume(next, parked, 0);
  // Deleting the old pod: SIGTERM ends it at once, leaving the socket files to the successor.
  EXPECT_EQ(old.stop(SIGTERM, 20s), 0) << old.log();
  EXPECT_NE(old.log().find("SIGTERM after the hand-over: exiting"), std::string::npos) << old.log();
  EXPECT_TRUE(std::filesystem::exists(next.socket_path()));
  auto conn = client::Connection::connect(client_options(next));
  EXPECT_EQ(conn.pin_snapshot({parked.snapshot, 64}), parked.pinned ? 0u : 1u);
  EXPECT_EQ(next.stop(SIGTERM, 20s), 0) << next.log();
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

// --- what arrives is input, on both sides ------------------------------------------------

namespace {

namespace handover = statepool::service::handover;
namespace service = statepool::service;
using std::chrono::steady_clock;

/// A Unix listening socket at `path`.
statepool::support::UniqueFd listen_at(const std::string& path) {
  statepool::support::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(fd.get(), 4), 0);
  return fd;
}

/// A real pool's state, as a predecessor would send it: its image and its arena's memory.
struct SentState {
  std::shared_ptr<service::Pool> pool;
  std::vector<std::byte> image;
  std::vector<int> arena_fds;
};

SentState a_real_state() {
  SentState out;
  service::PoolConfig config;
  config.capacity_bytes = 64ull << 20;
  out.pool =
      std::make_shared<service::Pool>(config, std::make_shared<service::HostMemfdResource>());
  const auto layout = out.pool->register_layout(layout_of(kernels::CodecId::int8));
  const auto arena = out.pool->open_arena("", layout, 8);
  const auto lease = out.pool->attach_lease("", "");
  (void)out.pool->allocate(lease.id, arena.id, 2);
  const service::PoolState state = out.pool->save_state();
  out.image = handover::encode_image(state, {0, "test", "host", -1});
  for (const auto& a : state.arenas) out.arena_fds.push_back(a.fd);
  return out;
}

/// Plays the running daemon for a real `statepoold --take-over`: sends what `send` sends
/// on the hand-over connection, returns the successor's verdict and its exit.
struct Played {
  std::string verdict;
  statepool::testing::Exit exit;
  bool socket_files_left = false;  ///< both socket files still there after the successor
};

Played play_predecessor(const std::function<void(int peer, int listener)>& send) {
  statepool::testing::TempDir dir;
  const std::string socket = dir.file("statepool.sock");
  const auto listener = listen_at(socket);
  const auto handover_listener = listen_at(socket + ".handover");
  Played out;
  std::thread successor([&] {
    out.exit =
        statepool::testing::run_daemon({"--socket", socket, "--take-over", "--metrics-address",
                                        "off", "--api-address", "off", "--workers", "1"},
                                       dir.path());
  });
  pollfd ready{handover_listener.get(), POLLIN, 0};
  if (::poll(&ready, 1, 30000) == 1) {
    statepool::support::UniqueFd peer(
        ::accept4(handover_listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    try {
      const auto request = handover::receive_message(peer.get(), 64, steady_clock::now() + 10s);
      EXPECT_EQ(request.kind, handover::MessageKind::request);
      send(peer.get(), listener.get());
      const auto verdict = handover::receive_message(peer.get(), 4096, steady_clock::now() + 30s);
      out.verdict.assign(reinterpret_cast<const char*>(verdict.body.data()), verdict.body.size());
    } catch (const handover::HandoverError& e) {
      out.verdict = std::string("(no verdict: ") + e.what() + ")";
    }
  }
  successor.join();
  out.socket_files_left =
      std::filesystem::exists(socket) && std::filesystem::exists(socket + ".handover");
  return out;
}

}  // namespace

// A successor checks everything it is sent, and refuses (exit 1, the reason sent back and
// logged) whatever does not hold: the image's checksums and version, each descriptor.
TEST(HandOver, ASuccessorRefusesACorruptImageOrDescriptorSetAndSaysWhy) {
  const SentState state = a_real_state();
  const auto send = [&](int peer, std::vector<handover::NamedFd> fds,
                        std::vector<std::byte> image) {
    handover::send_state(peer, fds, image, steady_clock::now() + 10s);
  };
  const auto good_fds = [&](int listener) {
    return std::vector<handover::NamedFd>{{"listener", listener},
                                          {"arena 1", state.arena_fds.at(0)}};
  };
  statepool::support::UniqueFd small(::memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(small.get(), 4096), 0);
  ASSERT_EQ(::fcntl(small.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  int pipe_ends[2];
  ASSERT_EQ(::pipe2(pipe_ends, O_CLOEXEC), 0);
  statepool::support::UniqueFd pipe_read(pipe_ends[0]);
  statepool::support::UniqueFd pipe_write(pipe_ends[1]);

  struct Case {
    const char* name;
    std::function<void(int, int)> play;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"a flipped payload byte",
       [&](int peer, int listener) {
         auto image = state.image;
         image[image.size() / 2] ^= std::byte{0x10};
         send(peer, good_fds(listener), image);
       },
       "payload checksum mismatch"},
      {"a newer image version",
       [&](int peer, int listener) {
         const std::vector<std::byte> payload(state.image.begin() + 32, state.image.end());
         send(peer, good_fds(listener), handover::wrap_payload(payload, 2));
       },
       "version 2, this statepoold reads version 1 only"},
      {"no memory for an arena",
       [&](int peer, int listener) {
         send(peer, {{"listener", listener}}, state.image);
       },
       "no memory for arena 1"},
      {"a pipe for an arena's memory",
       [&](int peer, int listener) {
         send(peer, {{"listener", listener}, {"arena 1", pipe_read.get()}}, state.image);
       },
       "not a memfd"},
      {"another memfd for an arena's memory",
       [&](int peer, int listener) {
         send(peer, {{"listener", listener}, {"arena 1", small.get()}}, state.image);
       },
       "4096 bytes"},
      {"no listening socket",
       [&](int peer, int) {
         send(peer, {{"arena 1", state.arena_fds.at(0)}}, state.image);
       },
       "no listening socket"},
      {"a descriptor nobody asked for",
       [&](int peer, int listener) {
         auto fds = good_fds(listener);
         fds.push_back({"surprise", pipe_read.get()});
         send(peer, fds, state.image);
       },
       "unknown descriptor 'surprise'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Played played = play_predecessor(c.play);
    EXPECT_NE(played.verdict.find(c.says), std::string::npos) << played.verdict;
    EXPECT_EQ(played.exit.code, 1) << played.exit.stderr_text;
    EXPECT_NE(played.exit.stderr_text.find("the running statepoold serves on"), std::string::npos)
        << played.exit.stderr_text;
    EXPECT_TRUE(played.socket_files_left);
  }
  // A predecessor that goes away after the successor's "ok", without its last word (it
  // gave up waiting and serves on): the successor must not serve, nor take the socket
  // files with it.
  const Played unanswered = play_predecessor(
      [&](int peer, int listener) { send(peer, good_fds(listener), state.image); });
  EXPECT_EQ(unanswered.verdict, "ok");
  EXPECT_EQ(unanswered.exit.code, 1) << unanswered.exit.stderr_text;
  EXPECT_EQ(unanswered.exit.stderr_text.find("ready on"), std::string::npos)
      << unanswered.exit.stderr_text;
  EXPECT_TRUE(unanswered.socket_files_left);
}

// The running daemon treats a successor's messages as input: garbage, a version it does not
// write, a successor that vanishes or refuses; each time it serves on with every parked
// state, and says why in its log.
TEST(HandOver, ThePredecessorServesOnWhateverASuccessorSends) {
  DaemonProcess old({"--grace-period", "60s"}, DaemonOptions{});
  const Parked parked = park(old, 2);
  const std::string path = old.socket_path() + ".handover";
  const auto request = [](std::uint32_t version) {
    std::vector<std::byte> body(4);
    for (std::size_t i = 0; i < 4; ++i) body[i] = static_cast<std::byte>(version >> (8 * i));
    return body;
  };
  {
    SCOPED_TRACE("garbage");
    auto peer = handover::connect(path);
    const std::string junk = "hello there, give me your memory";
    ASSERT_EQ(::write(peer.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    peer.reset();
    ASSERT_TRUE(
        eventually([&] { return old.log().find("does not speak") != std::string::npos; }, 10s))
        << old.log();
  }
  {
    SCOPED_TRACE("a version it does not write");
    auto peer = handover::connect(path);
    handover::send_message(peer.get(), handover::MessageKind::request, request(2), {},
                           steady_clock::now() + 5s);
    const auto refusal = handover::receive_message(peer.get(), 4096, steady_clock::now() + 10s);
    EXPECT_EQ(refusal.kind, handover::MessageKind::refusal);
    ASSERT_TRUE(eventually(
        [&] { return old.log().find("reads hand-over images of version 2") != std::string::npos; },
        10s))
        << old.log();
  }
  for (const char* ending : {"vanishes", "refuses"}) {
    SCOPED_TRACE(ending);
    auto peer = handover::connect(path);
    handover::send_message(peer.get(), handover::MessageKind::request,
                           request(handover::kImageVersion), {}, steady_clock::now() + 5s);
    const auto received =
        handover::receive_state(peer.get(), 64, 1 << 20, steady_clock::now() + 30s);
    EXPECT_FALSE(received.image.empty());
    if (std::string(ending) == "refuses") {
      handover::send_text(peer.get(), handover::MessageKind::verdict, "not today",
                          steady_clock::now() + 5s);
    }
    peer.reset();
    ASSERT_TRUE(eventually(
        [&] {
          const std::string log = old.log();
          std::size_t count = 0;
          for (auto at = log.find("serving on after the failed hand-over"); at != std::string::npos;
               at = log.find("serving on after the failed hand-over", at + 1)) {
            ++count;
          }
          return count == (std::string(ending) == "refuses" ? 2u : 1u);
        },
        10s))
        << old.log();
  }
  EXPECT_NE(old.log().find("the successor refused: not today"), std::string::npos) << old.log();
  ASSERT_TRUE(old.running());
  resume(old, parked, 2);
  EXPECT_EQ(old.stop(SIGTERM, 20s), 0) << old.log();
}
