// Chaos: client processes that connect, allocate, compress, decompress, copy and free are
// killed with SIGKILL at random points of their requests, hundreds of times, while others
// keep working; afterwards, once the lease grace period has passed, every page must be
// free again (Stats and /metrics agree) and the daemon must stop cleanly (its pool
// self-check at exit finds nothing).
//
// The run is driven by one seeded RNG, printed at the start (STATEPOOL_CHAOS_SEED repeats
// a run's choices; the interleaving with the daemon still varies with timing). Each child
// reports every request it is about to send on a pipe; the parent picks, per child, how
// many requests to let it start and how many microseconds to wait after that, then kills
// it: kills land before, inside and after requests, in the client's send, while the daemon
// works, and while the reply is on its way. A child also sometimes hands its slots to the
// next connection through its lease token, or resumes its lease on a raw socket and
// starts a frame it never finishes.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using namespace std::chrono_literals;

namespace {

constexpr int kKills = 600;        // children killed in all
constexpr int kParallel = 6;       // children alive at once
constexpr int kMaxRequests = 48;   // a child is killed after starting 1..kMaxRequests requests
constexpr int kMaxDelayUs = 3000;  // ... and 0..kMaxDelayUs microseconds more (half of
                                   // them within 200 us: inside the next request)
constexpr auto kGrace = 300ms;     // --grace-period
constexpr std::uint32_t kArenaPages = 96;
const char* const kTenants[] = {"default", "b"};

std::uint64_t chaos_seed() {
  if (const char* text = std::getenv("STATEPOOL_CHAOS_SEED"); text != nullptr && *text != '\0')
    return std::strtoull(text, nullptr, 0);
  return 20261201;
}

kernels::StateLayout chaos_layout(int which) {
  kernels::StateLayout l;
  l.name = which == 0 ? "chaos-int8" : "chaos-int6";
  l.arch = which == 0 ? kernels::Arch::gdn : kernels::Arch::kda;
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.conv_channels = which == 0 ? 64 : 0;
  l.conv_width = which == 0 ? 3 : 0;
  l.conv_dtype = kernels::DType::f32;
  l.codec.id = which == 0 ? kernels::CodecId::int8 : kernels::CodecId::int6;
  return l;
}

// --- the child -------------------------------------------------------------------------

/// Tells the parent, one byte per request about to be sent; a message starting with '!'
/// reports a failure (the child then exits by itself, which the parent reports).
class Progress {
 public:
  explicit Progress(int fd) : fd_(fd) {}
  void step() const {
    const char c = 'r';
    [[maybe_unused]] const ssize_t n = ::write(fd_, &c, 1);
  }
  /// Nothing more to do: "kill me now" (the parent kills it without waiting for more steps).
  [[noreturn]] void park() const {
    const char c = 'p';
    [[maybe_unused]] const ssize_t n = ::write(fd_, &c, 1);
    for (;;) ::pause();
  }
  [[noreturn]] void fail(const std::string& what) const {
    const std::string text = "!" + what + "\n";
    [[maybe_unused]] const ssize_t n = ::write(fd_, text.data(), text.size());
    ::_exit(3);
  }

 private:
  int fd_;
};

/// What one connection leaves to the next through its lease token.
struct Handover {
  std::string token;
  int tenant = 0;
  int layout = 0;
  client::ArenaId arena = 0;
  std::vector<client::SlotId> slots;
};

/// Resumes the lease on a raw socket, sends half of a Free frame for its slots and waits
/// to be killed: the daemon sees the connection die inside a frame. Returns when the lease
/// could not be resumed.
void half_frame(const std::string& socket, const Handover& h, const Progress& p) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    statepool::testing::RawPeer peer(socket);
    if (!peer.connected()) p.fail("raw peer: cannot connect");
    flatbuffers::FlatBufferBuilder b;
    const auto hello =
        wire::CreateHelloDirect(b, protocol::kMinProtocolVersion, protocol::kMaxProtocolVersion,
                                kTenants[h.tenant], h.token.c_str(), "chaos-raw");
    b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, hello.Union()));
    p.step();
    if (!peer.send_frame(b)) p.fail("raw peer: cannot send hello");
    const auto reply = peer.read_reply(20s);
    if (!reply) p.fail("raw peer: no reply to hello");
    const auto* r = flatbuffers::GetRoot<wire::Reply>(reply->data());
    if (r->status() == wire::Status::lease_busy) {
      // The daemon has not yet seen the previous connection close.
      std::this_thread::sleep_for(5ms);
      continue;
    }
    if (r->status() != wire::Status::ok) return;
    b.Clear();
    const auto free = wire::CreateFreeDirect(b, h.arena, &h.slots);
    b.Finish(wire::CreateRequest(b, 2, wire::RequestBody::Free, free.Union()));
    const std::string frame =
        protocol::make_frame(protocol::FrameType::request, 0, {b.GetBufferPointer(), b.GetSize()});
    p.step();
    if (!peer.send_bytes(frame.data(), frame.size() / 2)) p.fail("raw peer: cannot send");
    p.park();
  }
}

/// One connection's life: connect (maybe resuming a lease), a layout, its arena, a
/// staging buffer, a random run of requests, and one of four endings.
void cycle(const std::string& socket, std::mt19937_64& rng, const Progress& p, Handover& h) {
  const bool resume = !h.token.empty();
  if (!resume) {
    h.tenant = static_cast<int>(rng() % 2);
    h.layout = static_cast<int>(rng() % 2);
  }
  client::Options o;
  o.socket_path = socket;
  o.tenant = kTenants[h.tenant];
  o.lease_token = h.token;
  o.client_name = "chaos";
  o.timeout = 30s;
  p.step();
  client::Connection conn = client::Connection::connect(o);
  p.step();
  const client::LayoutInfo layout = conn.register_layout(chaos_layout(h.layout));
  p.step();
  client::Arena arena = conn.open_arena(layout, kArenaPages);
  std::vector<client::Slot> slots;
  if (resume && conn.lease_resumed() && arena.id() == h.arena) {
    for (const client::SlotId id : h.slots) slots.push_back(conn.adopt(h.arena, id));
  }
  const int tenant = h.tenant;
  const int layout_index = h.layout;
  h = Handover{};
  const std::uint64_t state = layout.state_bytes_f32;
  p.step();
  client::Staging staging = conn.open_staging(2 * state);
  {
    std::vector<float> values(state / sizeof(float));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
    std::memcpy(staging.bytes().data(), values.data(), values.size() * sizeof(float));
  }
  const auto any = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const int requests = 1 + static_cast<int>(rng() % 24);
  for (int i = 0; i < requests; ++i) {
    switch (rng() % 8) {
      case 0:
      case 1:
        if (slots.size() < 8) {
          p.step();
          try {
            for (client::Slot& s : conn.allocate(arena, 1 + static_cast<std::uint32_t>(any(3))))
              slots.push_back(std::move(s));
          } catch (const client::Error& e) {
            // The arena is full of slots waiting for their grace period: normal here.
            if (e.status() != statepool::Status::pool_exhausted) throw;
          }
        }
        break;
      case 2:
        if (!slots.empty()) {
          p.step();
          conn.compress(slots[any(slots.size())], staging, 0);
        }
        break;
      case 3:
        if (!slots.empty()) {
          p.step();
          conn.decompress(slots[any(slots.size())], staging, state);
        }
        break;
      case 4:
        if (slots.size() >= 2) {
          p.step();
          conn.copy(slots[any(slots.size())], slots[any(slots.size())]);
        }
        break;
      case 5:
        if (!slots.empty()) {
          const std::size_t keep = any(slots.size());
          p.step();
          conn.free(std::span<client::Slot>(slots).subspan(keep));
          slots.resize(keep);
        }
        break;
      case 6:
        p.step();
        (void)conn.stats();
        break;
      default:
        p.step();
        (void)conn.ping();
        break;
    }
  }
  switch (rng() % 4) {
    case 0:  // free everything explicitly
      if (!slots.empty()) {
        p.step();
        conn.free(slots);
      }
      break;
    case 1:  // let the destructors free the slots (one Free each) and close the staging
      p.step();
      break;
    default:  // hand the slots to the next connection through the lease token
      h.token = conn.lease_token();
      h.tenant = tenant;
      h.layout = layout_index;
      h.arena = arena.id();
      for (client::Slot& s : slots) h.slots.push_back(s.release());
      break;
  }
}

[[noreturn]] void run_child(const std::string& socket, int progress_fd, std::uint64_t seed) {
  const Progress p(progress_fd);
  std::mt19937_64 rng(seed);
  Handover h;
  for (;;) {
    try {
      cycle(socket, rng, p, h);
      if (!h.token.empty() && rng() % 3 == 0) {
        half_frame(socket, h, p);  // returns only when the lease could not be resumed
        h = Handover{};
      }
    } catch (const client::ConnectionError& e) {
      p.fail(std::string("connection error: ") + e.what());
    } catch (const client::Error& e) {
      // Refusals are part of the game (an expired token's slots, a busy lease, a full
      // pool); a daemon bug is not.
      if (e.status() == statepool::Status::internal ||
          e.status() == statepool::Status::protocol_error)
        p.fail(std::string(statepool::status_name(e.status())) + ": " + e.what());
      h = Handover{};
    } catch (const std::exception& e) {
      p.fail(std::string("unexpected exception: ") + e.what());
    }
  }
}

// --- the parent ------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;
  int target = 0;  ///< requests to let it start
  int delay_us = 0;
  int started = 0;
  bool armed = false;
  std::chrono::steady_clock::time_point kill_at;
  std::chrono::steady_clock::time_point deadline;  ///< to reach its target
  std::string message;
};

/// Sums the samples of `metric` whose labels contain `label` ("" = all).
double metric_sum(const std::string& text, const std::string& metric, const std::string& label) {
  double sum = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(metric + "{", 0) != 0 && line.rfind(metric + " ", 0) != 0) continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

/// Kills the children still alive when the test ends early (a failed assertion).
struct Reaper {
  std::vector<Child>& children;
  ~Reaper() {
    for (Child& c : children) {
      if (c.pid <= 0) continue;
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      ::close(c.fd);
      c.pid = -1;
    }
  }
};

}  // namespace

TEST(Chaos, ClientsKilledAtRandomPointsOfTheirRequestsGiveEveryPageBack) {
  const std::uint64_t seed = chaos_seed();
  std::printf("[ chaos    ] seed %llu (STATEPOOL_CHAOS_SEED=%llu repeats its choices)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  RecordProperty("chaos_seed", std::to_string(seed));
  std::mt19937_64 rng(seed);

  DaemonProcess daemon(
      {"--grace-period", "300ms", "--tenant", "default", "--tenant", "b:256MiB",
       "--max-unattached-connections", "64", "--workers", "2", "--log-level", "warn"},
      /*with_metrics=*/true);
  client::Options o = statepool::testing::client_options(daemon);
  o.timeout = 30s;
  std::optional<client::Connection> watcher = client::Connection::connect(o);  // no slots

  std::vector<Child> children(kParallel);
  const Reaper reaper{children};
  int kills = 0;
  int spawned = 0;
  long long requests = 0;  // requests the killed children started
  const auto start = std::chrono::steady_clock::now();
  const auto spawn = [&](Child& c) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    const std::uint64_t child_seed = rng();
    c = Child{};
    c.target = 1 + static_cast<int>(rng() % kMaxRequests);
    c.delay_us = static_cast<int>(rng() % 2 == 0 ? rng() % 200 : rng() % (kMaxDelayUs + 1));
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      run_child(daemon.socket_path(), fds[1], child_seed);
    }
    ::close(fds[1]);
    c.pid = pid;
    c.fd = fds[0];
    c.deadline = std::chrono::steady_clock::now() + 30s;
    ++spawned;
  };
  for (Child& c : children) {
    spawn(c);
    if (HasFatalFailure()) return;
  }

  while (kills < kKills) {
    std::vector<pollfd> polls;
    for (const Child& c : children) polls.push_back({c.pid > 0 ? c.fd : -1, POLLIN, 0});
    ASSERT_GE(::poll(polls.data(), polls.size(), 1), 0);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.pid <= 0) continue;
      bool eof = false;
      if ((polls[i].revents & (POLLIN | POLLHUP)) != 0) {
        char buf[512];
        const ssize_t n = ::read(c.fd, buf, sizeof buf);
        if (n <= 0) eof = true;
        for (ssize_t j = 0; j < n; ++j) {
          if (!c.message.empty() || buf[j] == '!') {
            c.message += buf[j];
          } else if (buf[j] == 'p') {
            c.started = c.target;  // parked: nothing more will come
          } else {
            ++c.started;
          }
        }
      }
      if (eof || !c.message.empty()) {
        // The child ended by itself: it found something wrong (or crashed).
        std::this_thread::sleep_for(50ms);  // the rest of its message
        char buf[512];
        for (ssize_t n; (n = ::read(c.fd, buf, sizeof buf)) > 0;) c.message.append(buf, n);
        FAIL() << "child " << c.pid << " ended by itself: " << c.message << " (seed " << seed
               << ")";
      }
      if (!c.armed && c.started >= c.target) {
        c.armed = true;
        c.kill_at = now + std::chrono::microseconds(c.delay_us);
      }
      ASSERT_TRUE(c.armed || now < c.deadline)
          << "child " << c.pid << " started only " << c.started << " of " << c.target
          << " requests in 30 s: does the daemon still answer? (seed " << seed << ")";
      if (c.armed && now >= c.kill_at) {
        ASSERT_EQ(::kill(c.pid, SIGKILL), 0);
        int status = 0;
        ASSERT_EQ(::waitpid(c.pid, &status, 0), c.pid);
        ::close(c.fd);
        c.pid = -1;
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            << "a child was not killed by SIGKILL (status " << status << "; seed " << seed << ")";
        ++kills;
        requests += c.started;
        if (spawned < kKills) spawn(c);
        if (HasFatalFailure()) return;
      }
    }
  }
  const double chaos_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(daemon.running()) << "the daemon died (seed " << seed << ")";

  // After the grace period every orphaned lease is reclaimed: every page is free.
  client::Stats stats;
  const bool reclaimed = eventually(
      [&] {
        stats = watcher->stats();
        if (stats.leases_orphaned != 0 || stats.leases_active != 1) return false;
        for (const auto& a : stats.arenas)
          if (a.pages_used != 0) return false;
        return true;
      },
      kGrace * 20);
  std::ostringstream why;
  for (const auto& a : stats.arenas)
    why << " arena " << a.arena_id << " (" << a.tenant << ", " << a.layout_name
        << "): " << a.pages_used << " of " << a.pages_total << " pages used;";
  ASSERT_TRUE(reclaimed) << "leases active " << stats.leases_active << ", orphaned "
                         << stats.leases_orphaned << ";" << why.str() << " seed " << seed;
  ASSERT_FALSE(stats.arenas.empty());
  EXPECT_GT(stats.pages_reclaimed_total, 0u) << "no kill left slots to reclaim";
  std::uint64_t pages_total = 0;
  for (const auto& a : stats.arenas) pages_total += a.pages_total;
  std::printf(
      "[ chaos    ] %d children killed in %.1f s after %lld requests; %llu pages "
      "reclaimed after their grace period\n",
      kills, chaos_s, requests, static_cast<unsigned long long>(stats.pages_reclaimed_total));

  // The metrics say the same: free pages == total pages, no staging buffer left.
  const std::string metrics = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  EXPECT_EQ(metric_sum(metrics, "statepool_arena_pages", "state=\"free\""),
            static_cast<double>(pages_total));
  EXPECT_EQ(metric_sum(metrics, "statepool_arena_pages", "state=\"used\""), 0.0);
  EXPECT_EQ(metric_sum(metrics, "statepool_leases", "state=\"orphaned\""), 0.0);
  EXPECT_EQ(metric_sum(metrics, "statepool_memory_allocations", "use=\"staging\""), 0.0);

  // The pool's self-check at exit finds nothing (exit status 0).
  watcher.reset();
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << "seed " << seed;
  // For the record (not a check: log text is no interface): kills inside a frame.
  const std::string log = daemon.log();
  std::size_t cut = 0;
  for (std::size_t at = 0; (at = log.find("inside a frame", at)) != std::string::npos; ++at) ++cut;
  std::printf("[ chaos    ] %zu connections died inside a frame\n", cut);
}
