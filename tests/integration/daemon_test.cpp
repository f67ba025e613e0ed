// Integration tests: statepoold in its own process, clients in this process and in
// forked child processes, talking over the real Unix socket.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/json.hpp>

#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"
#include "statepoolctl_run.hpp"

namespace sp = statepool;
namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using statepool::testing::statepoolctl;
using namespace std::chrono_literals;

namespace {

kernels::StateLayout small_layout(kernels::CodecId codec = kernels::CodecId::int8) {
  kernels::StateLayout l;
  l.name = "it-small";
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

// Fills a staged FP32 state (recurrent then conv) with seeded values of state-like size.
void fill_state(std::span<std::byte> staged, std::uint64_t seed) {
  const std::size_t n = staged.size() / sizeof(float);
  const std::vector<float> values = statepool::synthetic::gaussian_values(n, seed, 0.05f);
  std::memcpy(staged.data(), values.data(), n * sizeof(float));
}

std::vector<float> floats(std::span<const std::byte> bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

std::uint32_t used_pages(client::Connection& c, std::uint32_t arena) {
  for (const auto& a : c.stats().arenas)
    if (a.arena_id == arena) return a.pages_used;
  return 0;
}

std::size_t open_descriptors(pid_t pid) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
    ++n;
  return n;
}

/// The status and message of a call that must fail with a daemon error.
template <class F>
std::pair<statepool::Status, std::string> refusal(F&& f) {
  try {
    f();
  } catch (const client::Error& e) {
    return {e.status(), e.what()};
  }
  ADD_FAILURE() << "the call succeeded";
  return {statepool::Status::ok, ""};
}

}  // namespace

TEST(Daemon, ParksAndResumesStatesThroughTheWholeLifecycle) {
  DaemonProcess daemon({"--grace-period", "5s"});
  auto conn = client::Connection::connect(client_options(daemon));
  EXPECT_FALSE(conn.lease_token().empty());
  const auto layout = conn.register_layout(small_layout(kernels::CodecId::int8));
  EXPECT_GT(layout.compression_ratio(), 3.0);
  auto arena = conn.open_arena(layout, 8);
  EXPECT_TRUE(arena.created());
  EXPECT_EQ(arena.page_count(), 8u);
  EXPECT_EQ(arena.page_bytes(), layout.page_bytes);

  const std::size_t state = layout.state_bytes_f32;
  auto staging = conn.open_staging(3 * state);
  auto slots = conn.allocate(arena, 2);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_NE(slots[0].id(), slots[1].id());

  auto original = staging.bytes().subspan(0, state);
  fill_state(original, 1);
  conn.compress(slots[0], staging, 0);
  // The page is visible through the client's own mapping and equals a local encode.
  std::vector<std::byte> local(layout.page_bytes);
  arena.codec().encode(original, kernels::DType::f32, local);
  const auto page = arena.page(slots[0]);
  EXPECT_EQ(std::memcmp(page.data(), local.data(), local.size()), 0);

  conn.decompress(slots[0], staging, state);
  const auto before = floats(original);
  const auto after = floats(staging.bytes().subspan(state, state));
  EXPECT_LT(relative_error(before, after), 0.01);

  // Copy (prefix checkpoint) gives an identical page.
  conn.copy(slots[0], slots[1]);
  EXPECT_EQ(std::memcmp(arena.page(slots[1]).data(), page.data(), page.size()), 0);

  auto stats = conn.stats();
  ASSERT_EQ(stats.arenas.size(), 1u);
  EXPECT_EQ(stats.arenas[0].pages_used, 2u);
  EXPECT_EQ(stats.arenas[0].fp32_bytes_used, 2 * layout.fp32_bytes);
  EXPECT_NEAR(stats.arenas[0].compression_ratio(), layout.compression_ratio(), 1e-9);

  EXPECT_EQ(conn.free(slots), 2u);
  EXPECT_EQ(used_pages(conn, arena.id()), 0u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(Daemon, AsynchronousRequestsOnTheHostBackendAreAnsweredWhenDoneWithoutAnEvent) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  const auto layout = conn.register_layout(small_layout(kernels::CodecId::int6));
  auto arena = conn.open_arena(layout, 4);
  const std::size_t state = layout.state_bytes_f32;
  auto staging = conn.open_staging(2 * state);
  auto slots = conn.allocate(arena, 2);
  auto original = staging.bytes().subspan(0, state);
  fill_state(original, 3);

  // The host executor exports no events: the reply comes when the page is written.
  const client::Pending parked = conn.compress_async(arena.id(), slots[0].id(), staging.id(), 0);
  EXPECT_FALSE(parked.event.has_value());
  EXPECT_EQ(parked.bytes, layout.page_bytes);
  std::vector<std::byte> local(layout.page_bytes);
  arena.codec().encode(original, kernels::DType::f32, local);
  EXPECT_EQ(std::memcmp(arena.page(slots[0]).data(), local.data(), local.size()), 0);

  const client::Pending copied = conn.copy_async(arena.id(), slots[0].id(), slots[1].id());
  EXPECT_FALSE(copied.event.has_value());
  EXPECT_EQ(std::memcmp(arena.page(slots[1]).data(), local.data(), local.size()), 0);

  const client::Pending resumed =
      conn.decompress_async(arena.id(), slots[1].id(), staging.id(), state);
  EXPECT_FALSE(resumed.event.has_value());
  EXPECT_EQ(resumed.bytes, state);
  std::vector<std::byte> expected(state);
  arena.codec().decode(local, kernels::DType::f32, expected);
  EXPECT_EQ(std::memcmp(staging.bytes().data() + state, expected.data(), state), 0);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

/// In a child running as uid 65534: connects to `socket` and says Hello; exit 0 when the
/// daemon answered it (1 when it refused or could not be reached).
int hello_as_another_user(const std::string& socket) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    try {
      client::Options o;
      o.socket_path = socket;
      o.timeout = 5s;
      auto conn = client::Connection::connect(o);
      (void)conn.ping();
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Daemon, SilentConnectionsCannotLockOthersOutAndAreClosedAfterTheHelloTimeout) {
  DaemonProcess daemon({"--max-connections", "6", "--max-unattached-connections", "2",
                        "--hello-timeout", "800ms", "--socket-mode", "0666"},
                       /*with_metrics=*/true);
  const auto metrics = [&] {
    return statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  };
  auto attached = client::Connection::connect(client_options(daemon));  // before the flood
  // The fixture's readiness probe (a connection that never says Hello) has ended: it holds
  // no place in the budget below any more.
  ASSERT_TRUE(eventually(
      [&] { return metrics().find("statepool_clients_connected 1") != std::string::npos; }, 5s));
  // Two connections that never say Hello hold this uid's whole budget of them...
  statepool::testing::RawPeer silent1(daemon.socket_path());
  statepool::testing::RawPeer silent2(daemon.socket_path());
  ASSERT_TRUE(eventually(
      [&] { return metrics().find("statepool_clients_connected 3") != std::string::npos; }, 5s));
  // ...so a third from the same uid is turned away at once, saying why...
  statepool::testing::RawPeer third(daemon.socket_path());
  const auto reply = third.read_reply(5s);
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), statepool::wire::Status::too_many_connections);
  EXPECT_NE(std::string(r->message()->c_str()).find("--max-unattached-connections"),
            std::string::npos);
  // ...while other users still get in, and attached clients carry on.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chmod(daemon.dir().c_str(), 0755), 0);  // let the other user reach the socket
    EXPECT_EQ(hello_as_another_user(daemon.socket_path()), 0);
  }
  (void)attached.ping();
  // The silent ones are closed once --hello-timeout passes, and this uid gets in again.
  EXPECT_TRUE(silent1.closed_by_peer(5s));
  EXPECT_TRUE(silent2.closed_by_peer(5s));
  auto later = client::Connection::connect(client_options(daemon));
  (void)later.ping();
  const std::string text = metrics();
  EXPECT_NE(text.find("statepool_connections_refused_total{reason=\"unattached_limit\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("statepool_connections_refused_total{reason=\"hello_timeout\"} 2"),
            std::string::npos)
      << text;
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

/// The value of an unlabelled sample in a /metrics text, or -1.
double metric_value(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

TEST(Daemon, RequestBuffersGrowWithWhatArrivedAndAreLetGoAfterTheRequest) {
  DaemonProcess daemon(
      {"--max-unattached-connections", "32", "--hello-timeout", "60s", "--io-timeout", "30s"},
      /*with_metrics=*/true);
  const auto buffers = [&] {
    return metric_value(statepool::testing::http_get(daemon.metrics_port(), "/metrics"),
                        "statepool_request_buffer_bytes");
  };
  const auto frame_of = [](flatbuffers::FlatBufferBuilder& b) {
    return protocol::make_frame(protocol::FrameType::request, protocol::kFlagNone,
                                {b.GetBufferPointer(), b.GetSize()});
  };
  // 24 frames of 4 MiB announced, 1000 bytes of each sent: the daemon holds what arrived
  // (one receive piece each), not 24 x 4 MiB.
  {
    std::vector<std::unique_ptr<statepool::testing::RawPeer>> peers;
    for (int i = 0; i < 24; ++i) {
      peers.push_back(std::make_unique<statepool::testing::RawPeer>(daemon.socket_path()));
      protocol::FrameHeader h;
      h.type = protocol::FrameType::request;
      h.length = 4u << 20;
      const auto head = protocol::encode_header(h);
      const std::vector<char> part(1000, 'x');
      ASSERT_TRUE(peers.back()->send_bytes(head.data(), head.size()));
      ASSERT_TRUE(peers.back()->send_bytes(part.data(), part.size()));
    }
    ASSERT_TRUE(eventually([&] { return buffers() >= 24.0 * (256 << 10); }, 10s)) << buffers();
    EXPECT_LE(buffers(), 24.0 * (512 << 10));
  }
  EXPECT_TRUE(eventually([&] { return buffers() == 0; }, 10s)) << buffers();

  // A frame of 2.5 MiB, all but its last byte sent: its buffer has grown to the frame's
  // length, and not past it (doubling 256 KiB pieces would reach 4 MiB).
  {
    statepool::testing::RawPeer partial(daemon.socket_path());
    protocol::FrameHeader h;
    h.type = protocol::FrameType::request;
    h.length = 5u << 19;
    const auto head = protocol::encode_header(h);
    const std::vector<char> body(h.length - 1, 'x');
    ASSERT_TRUE(partial.send_bytes(head.data(), head.size()));
    ASSERT_TRUE(partial.send_bytes(body.data(), body.size()));
    ASSERT_TRUE(eventually([&] { return buffers() >= h.length; }, 10s)) << buffers();
    EXPECT_EQ(buffers(), h.length);
  }
  EXPECT_TRUE(eventually([&] { return buffers() == 0; }, 10s)) << buffers();

  // A 3 MiB request, handled (refused as a bad plan; the connection stays): afterwards the
  // idle connection holds no large buffer.
  statepool::testing::RawPeer peer(daemon.socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(
      b, 1, wire::RequestBody::Hello,
      wire::CreateHello(b, protocol::kMinProtocolVersion, protocol::kMaxProtocolVersion).Union()));
  const std::string hello = frame_of(b);
  ASSERT_TRUE(peer.send_bytes(hello.data(), hello.size()));
  ASSERT_TRUE(peer.read_reply(10s).has_value());
  b.Clear();
  const std::vector<std::uint8_t> junk(3u << 20, 0x5a);
  b.Finish(wire::CreateRequest(b, 2, wire::RequestBody::InstallPlan,
                               wire::CreateInstallPlan(b, b.CreateVector(junk)).Union()));
  const std::string big = frame_of(b);
  ASSERT_TRUE(peer.send_bytes(big.data(), big.size()));
  const auto reply = peer.read_reply(10s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(statepool::testing::as_reply(*reply)->status(), wire::Status::invalid_argument);
  EXPECT_TRUE(eventually([&] { return buffers() <= 64 << 10; }, 10s)) << buffers();
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(Daemon, RefusesNonFiniteStatesAndLeavesThePageUnchanged) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  const auto layout = conn.register_layout(small_layout(kernels::CodecId::int6));
  auto arena = conn.open_arena(layout, 2);
  auto staging = conn.open_staging(layout.state_bytes_f32);
  auto slots = conn.allocate(arena, 1);
  fill_state(staging.bytes(), 2);
  conn.compress(slots[0], staging, 0);
  const std::vector<std::byte> page_before(arena.page(slots[0]).begin(),
                                           arena.page(slots[0]).end());
  const float nan = std::nanf("");
  std::memcpy(staging.bytes().data() + 4 * 777, &nan, sizeof nan);
  try {
    conn.compress(slots[0], staging, 0);
    FAIL() << "NaN was accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::not_finite);
    EXPECT_NE(std::string(e.what()).find("layer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(arena.page(slots[0]).data(), page_before.data(), page_before.size()), 0);
  EXPECT_TRUE(conn.healthy());
  EXPECT_GT(conn.ping().count(), 0);
}

TEST(Daemon, PoolExhaustionQuotaAndOwnershipAreClearErrors) {
  DaemonProcess daemon({"--tenant", "small:64KiB", "--tenant", "big"});
  auto small = client::Connection::connect(client_options(daemon, "small"));
  const auto layout = small.register_layout(small_layout(kernels::CodecId::fp32));
  const auto before = small.stats();
  try {
    (void)small.open_arena(layout, 64);  // 64 pages of ~33 KiB > 64 KiB quota
    FAIL() << "quota not enforced";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::quota_exceeded);
    EXPECT_NE(std::string(e.what()).find("quota"), std::string::npos) << e.what();
  }
  const auto after = small.stats();
  EXPECT_EQ(after.arenas.size(), before.arenas.size());
  EXPECT_EQ(after.pool_reserved_bytes, before.pool_reserved_bytes);

  auto big = client::Connection::connect(client_options(daemon, "big"));
  auto arena = big.open_arena(big.register_layout(small_layout()), 3);
  auto slots = big.allocate(arena, 3);
  try {
    (void)big.allocate(arena, 1);
    FAIL() << "arena over-allocated";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::pool_exhausted);
  }
  // Another lease of the same tenant may not free these slots.
  auto other = client::Connection::connect(client_options(daemon, "big"));
  const std::vector<client::SlotId> ids = {slots[0].id()};
  try {
    other.free(arena.id(), ids);
    FAIL() << "freed another lease's slot";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::not_owner);
  }
  // An unknown tenant is refused at hello.
  EXPECT_THROW((void)client::Connection::connect(client_options(daemon, "nobody")), client::Error);
}

// What one tenant's client may not do to another tenant's arena is refused, and the
// operator sees who tried what on whose arena in an audit line, rate-limited: a client that
// retries in a loop writes a few lines, and the next line says how many were not written.
TEST(Daemon, CrossTenantRefusalsAreAuditedWithoutFloodingTheLog) {
  DaemonProcess daemon({"--tenant", "alpha", "--tenant", "beta"});
  auto alpha = client::Connection::connect(client_options(daemon, "alpha"));
  auto arena = alpha.open_arena(alpha.register_layout(small_layout()), 2);
  auto beta = client::Connection::connect(client_options(daemon, "beta"));
  constexpr int kTries = 40;
  for (int i = 0; i < kTries; ++i) {
    try {
      (void)beta.allocate(arena.id(), 1);
      FAIL() << "another tenant's arena was given out";
    } catch (const client::Error& e) {
      ASSERT_EQ(e.status(), sp::Status::permission_denied);
      // The peer learns nothing of the owner.
      ASSERT_EQ(std::string(e.what()).find("alpha"), std::string::npos) << e.what();
    }
  }
  const auto audit_lines = [&] {
    std::vector<std::string> lines;
    std::istringstream log(daemon.log());
    for (std::string line; std::getline(log, line);) {
      if (line.find(" WARN  audit: ") != std::string::npos) lines.push_back(line);
    }
    return lines;
  };
  std::vector<std::string> lines = audit_lines();
  ASSERT_FALSE(lines.empty()) << daemon.log();
  EXPECT_LE(lines.size(), 12u) << "one line per refusal: the log is flooded";
  const std::string& first = lines.front();
  for (const char* part : {"refused allocate", "tenant 'beta'", "permission_denied", "arena ",
                           "(it belongs to tenant 'alpha')", "uid "}) {
    EXPECT_NE(first.find(part), std::string::npos) << part << " missing in: " << first;
  }
  // A second later there is room for a line again, and it counts the ones dropped.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_THROW((void)beta.allocate(arena.id(), 1), client::Error);
  lines = audit_lines();
  EXPECT_NE(lines.back().find("more refusals not shown"), std::string::npos) << lines.back();
  // A peer that names a tenant the daemon does not have is audited too.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_THROW((void)client::Connection::connect(client_options(daemon, "nobody")), client::Error);
  EXPECT_TRUE(statepool::testing::eventually(
      [&] {
        const auto all = audit_lines();
        return !all.empty() && all.back().find("unknown_tenant") != std::string::npos;
      },
      std::chrono::seconds(2)))
      << daemon.log();
}

TEST(Daemon, KilledClientsSlotsAreReclaimedWhileTheOtherClientKeepsItsData) {
  DaemonProcess daemon({"--grace-period", "300ms"});
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: take 3 slots in the shared arena, write them, report, then wait to be killed.
    ::close(ready[0]);
    try {
      auto conn = client::Connection::connect(client_options(daemon));
      auto arena = conn.open_arena(conn.register_layout(small_layout()), 16);
      auto staging = conn.open_staging(arena.codec().staged_bytes(kernels::DType::f32));
      auto slots = conn.allocate(arena, 3);
      fill_state(staging.bytes(), 99);
      for (auto& s : slots) conn.compress(s, staging, 0);
      const std::uint32_t arena_id = arena.id();
      if (::write(ready[1], &arena_id, sizeof arena_id) != sizeof arena_id) ::_exit(3);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(2);
    }
  }
  ::close(ready[1]);
  std::uint32_t child_arena = 0;
  ASSERT_EQ(::read(ready[0], &child_arena, sizeof child_arena),
            static_cast<ssize_t>(sizeof child_arena));
  ::close(ready[0]);

  auto conn = client::Connection::connect(client_options(daemon));
  const auto layout = conn.register_layout(small_layout());
  auto arena = conn.open_arena(layout);
  EXPECT_FALSE(arena.created());
  ASSERT_EQ(arena.id(), child_arena);  // one arena per (tenant, layout), shared
  auto staging = conn.open_staging(2 * layout.state_bytes_f32);
  auto mine = conn.allocate(arena, 2);
  fill_state(staging.bytes().subspan(0, layout.state_bytes_f32), 7);
  conn.compress(mine[0], staging, 0);
  conn.compress(mine[1], staging, 0);
  const std::vector<std::byte> my_page(arena.page(mine[0]).begin(), arena.page(mine[0]).end());
  EXPECT_EQ(used_pages(conn, arena.id()), 5u);

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  // The child's lease is orphaned, then reclaimed after the 300 ms grace period.
  EXPECT_TRUE(eventually([&] { return used_pages(conn, arena.id()) == 2u; }, 10s))
      << "pages used: " << used_pages(conn, arena.id());
  const auto stats = conn.stats();
  EXPECT_EQ(stats.pages_reclaimed_total, 3u);
  EXPECT_EQ(stats.leases_orphaned, 0u);

  // This client kept working, and its data is intact.
  EXPECT_EQ(std::memcmp(arena.page(mine[0]).data(), my_page.data(), my_page.size()), 0);
  conn.decompress(mine[1], staging, layout.state_bytes_f32);
  const auto original = floats(staging.bytes().subspan(0, layout.state_bytes_f32));
  const auto restored =
      floats(staging.bytes().subspan(layout.state_bytes_f32, layout.state_bytes_f32));
  EXPECT_LT(relative_error(original, restored), 0.01);
  auto more = conn.allocate(arena, 14);  // the reclaimed pages are allocatable again
  EXPECT_EQ(more.size(), 14u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << "exit 0 also means the pool check passed";
}

TEST(Daemon, ReconnectingWithTheLeaseTokenWithinTheGracePeriodGetsTheSlotsBack) {
  DaemonProcess daemon({"--grace-period", "30s"});
  std::string token;
  std::vector<client::SlotId> ids;
  client::ArenaId arena_id = 0;
  std::vector<std::byte> page_copy;
  {
    auto conn = client::Connection::connect(client_options(daemon));
    auto arena = conn.open_arena(conn.register_layout(small_layout()), 4);
    auto staging = conn.open_staging(arena.codec().staged_bytes(kernels::DType::f32));
    auto slots = conn.allocate(arena, 2);
    fill_state(staging.bytes(), 5);
    conn.compress(slots[1], staging, 0);
    page_copy.assign(arena.page(slots[1]).begin(), arena.page(slots[1]).end());
    for (auto& s : slots) ids.push_back(s.release());
    arena_id = arena.id();
    token = conn.lease_token();
  }  // the connection drops here with two slots held
  auto options = client_options(daemon);
  options.lease_token = token;
  auto conn = client::Connection::connect(options);
  EXPECT_TRUE(conn.lease_resumed());
  EXPECT_EQ(conn.resumed_slots(), 2u);
  EXPECT_EQ(conn.lease_token(), token);
  auto arena = conn.open_arena(conn.register_layout(small_layout()));
  EXPECT_EQ(arena.id(), arena_id);
  auto slot = conn.adopt(arena_id, ids[1]);
  EXPECT_EQ(std::memcmp(arena.page(slot).data(), page_copy.data(), page_copy.size()), 0);
  EXPECT_EQ(conn.free(arena_id, ids), 2u);
  (void)slot.release();

  // A second connection presenting the same token while the lease is attached is refused.
  try {
    (void)client::Connection::connect(options);
    FAIL() << "lease attached twice";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::lease_busy);
  }
}

TEST(Daemon, SigtermFinishesTheRequestInFlightClosesIdleClientsAndExitsZero) {
  DaemonProcess daemon({"--drain-timeout", "10s"});
  auto idle = client::Connection::connect(client_options(daemon));
  statepool::testing::RawPeer raw(daemon.socket_path());
  ASSERT_TRUE(raw.connected());
  flatbuffers::FlatBufferBuilder b;
  const auto hello = statepool::wire::CreateHello(b, 1, 1);
  b.Finish(
      statepool::wire::CreateRequest(b, 1, statepool::wire::RequestBody::Hello, hello.Union()));
  ASSERT_TRUE(raw.send_frame(b));
  ASSERT_TRUE(raw.read_reply().has_value());

  // Send a ping frame's header and half of its payload: the request is now in flight.
  b.Clear();
  b.Finish(statepool::wire::CreateRequest(b, 2, statepool::wire::RequestBody::Ping,
                                          statepool::wire::CreatePing(b).Union()));
  const auto frame = statepool::protocol::make_frame(statepool::protocol::FrameType::request, 0,
                                                     {b.GetBufferPointer(), b.GetSize()});
  const std::size_t first = statepool::protocol::kHeaderBytes + 4;
  ASSERT_TRUE(raw.send_bytes(frame.data(), first));
  ASSERT_TRUE(raw.wait_until_read());  // the daemon has those bytes: the request is in flight

  ASSERT_EQ(::kill(daemon.pid(), SIGTERM), 0);
  // The idle client is disconnected by the drain...
  EXPECT_TRUE(eventually(
      [&] {
        try {
          (void)idle.ping();
          return false;
        } catch (const client::ConnectionError&) {
          return true;
        }
      },
      10s));
  // ...while the request in flight still gets its reply once its bytes arrive.
  ASSERT_TRUE(raw.send_bytes(frame.data() + first, frame.size() - first));
  const auto reply = raw.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->id(), 2u);
  EXPECT_EQ(r->status(), statepool::wire::Status::ok);
  EXPECT_EQ(r->body_type(), statepool::wire::ReplyBody::PingReply);
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
  EXPECT_FALSE(std::filesystem::exists(daemon.socket_path()));
}

namespace {

std::string request_frame(std::uint64_t id, wire::RequestBody type, flatbuffers::Offset<void> body,
                          flatbuffers::FlatBufferBuilder& b) {
  b.Finish(wire::CreateRequest(b, id, type, body));
  std::string frame =
      protocol::make_frame(protocol::FrameType::request, 0, {b.GetBufferPointer(), b.GetSize()});
  b.Clear();
  return frame;
}

std::string hello_frame(std::uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  return request_frame(id, wire::RequestBody::Hello, wire::CreateHello(b, 1, 1).Union(), b);
}

std::string ping_frame(std::uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  return request_frame(id, wire::RequestBody::Ping, wire::CreatePing(b).Union(), b);
}

// The reply's id when it is an ok reply of `type`, else 0.
std::uint64_t ok_reply_id(statepool::testing::RawPeer& peer, wire::ReplyBody type) {
  const auto reply = peer.read_reply();
  if (!reply) return 0;
  const auto* r = statepool::testing::as_reply(*reply);
  return r != nullptr && r->status() == wire::Status::ok && r->body_type() == type ? r->id() : 0;
}

// State letter of /proc/PID/stat ('T' when stopped).
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = all.rfind(')');
  return paren == std::string::npos || paren + 2 >= all.size() ? '?' : all[paren + 2];
}

}  // namespace

// The drain race, made deterministic: the daemon is stopped (SIGSTOP) while requests
// arrive, so when it resumes they are all in its sockets, unread, and SIGTERM is pending.
// Whichever of its threads runs first, every request that arrived must be answered:
// those of attached connections, and Hello + Ping of connections still waiting in the
// listen backlog (for their clients they are open).
TEST(Daemon, DrainAnswersEveryRequestThatArrivedBeforeTheSignal) {
  DaemonProcess daemon({"--drain-timeout", "10s"});
  constexpr int kAttached = 16;
  constexpr int kBacklog = 8;
  std::vector<std::unique_ptr<statepool::testing::RawPeer>> attached;
  for (int i = 0; i < kAttached; ++i) {
    attached.push_back(std::make_unique<statepool::testing::RawPeer>(daemon.socket_path()));
    ASSERT_TRUE(attached.back()->connected());
    const std::string hello = hello_frame(1);
    ASSERT_TRUE(attached.back()->send_bytes(hello.data(), hello.size()));
    ASSERT_EQ(ok_reply_id(*attached.back(), wire::ReplyBody::HelloReply), 1u);
  }

  ASSERT_EQ(::kill(daemon.pid(), SIGSTOP), 0);
  ASSERT_TRUE(eventually([&] { return process_state(daemon.pid()) == 'T'; }, 10s));
  for (auto& peer : attached) {
    const std::string ping = ping_frame(7);
    ASSERT_TRUE(peer->send_bytes(ping.data(), ping.size()));
  }
  std::vector<std::unique_ptr<statepool::testing::RawPeer>> waiting;
  for (int i = 0; i < kBacklog; ++i) {
    waiting.push_back(std::make_unique<statepool::testing::RawPeer>(daemon.socket_path()));
    ASSERT_TRUE(waiting.back()->connected()) << "the kernel completes connections to a "
                                                "stopped listener into its backlog";
    const std::string frames = hello_frame(1) + ping_frame(7);
    ASSERT_TRUE(waiting.back()->send_bytes(frames.data(), frames.size()));
  }
  ASSERT_EQ(::kill(daemon.pid(), SIGTERM), 0);
  ASSERT_EQ(::kill(daemon.pid(), SIGCONT), 0);

  int answered = 0;
  for (auto& peer : attached) {
    answered += ok_reply_id(*peer, wire::ReplyBody::PingReply) == 7u;
    EXPECT_TRUE(peer->closed_by_peer());
  }
  for (auto& peer : waiting) {
    answered += ok_reply_id(*peer, wire::ReplyBody::HelloReply) == 1u &&
                ok_reply_id(*peer, wire::ReplyBody::PingReply) == 7u;
    EXPECT_TRUE(peer->closed_by_peer());
  }
  EXPECT_EQ(answered, kAttached + kBacklog) << daemon.log();
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

// A connection busy receiving a request when the drain starts is served until nothing
// of it is left unread: the request that follows in the same burst is answered too,
// not cut off after the first reply.
TEST(Daemon, DrainServesAConnectionUntilNothingItSentIsLeftUnread) {
  DaemonProcess daemon({"--drain-timeout", "10s"});
  statepool::testing::RawPeer raw(daemon.socket_path());
  ASSERT_TRUE(raw.connected());
  const std::string hello = hello_frame(1);
  ASSERT_TRUE(raw.send_bytes(hello.data(), hello.size()));
  ASSERT_EQ(ok_reply_id(raw, wire::ReplyBody::HelloReply), 1u);

  const std::string burst = ping_frame(2) + ping_frame(3);
  const std::size_t first = protocol::kHeaderBytes + 4;
  ASSERT_TRUE(raw.send_bytes(burst.data(), first));
  ASSERT_TRUE(raw.wait_until_read());
  ASSERT_EQ(::kill(daemon.pid(), SIGTERM), 0);
  // The drain has begun once the socket refuses new connections.
  ASSERT_TRUE(eventually(
      [&] { return !statepool::testing::RawPeer(daemon.socket_path()).connected(); }, 10s));
  ASSERT_TRUE(raw.send_bytes(burst.data() + first, burst.size() - first));
  EXPECT_EQ(ok_reply_id(raw, wire::ReplyBody::PingReply), 2u);
  EXPECT_EQ(ok_reply_id(raw, wire::ReplyBody::PingReply), 3u);
  EXPECT_TRUE(raw.closed_by_peer());
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

template <class Fn>
sp::Status status_of(Fn&& fn) {
  try {
    fn();
  } catch (const client::Error& e) {
    return e.status();
  }
  return sp::Status::ok;
}

// The reviewed failure: a tenant using none of its byte quota filled the daemon's layout
// table, and every other tenant got pool_exhausted on RegisterLayout until restart. Each
// shared table and budget is bounded per tenant now, and the staging of all connections
// together by --staging-capacity.
TEST(Daemon, NoTenantCanFillTheTablesOrTheStagingBudgetOfAnother) {
  DaemonProcess daemon({"--tenant", "greedy", "--tenant", "polite", "--tenant-max-layouts", "4",
                        "--tenant-max-staging-bytes", "1MiB", "--staging-capacity", "1536KiB",
                        "--tenant-max-connections", "3"});
  auto greedy = client::Connection::connect(client_options(daemon, "greedy"));
  auto polite = client::Connection::connect(client_options(daemon, "polite"));
  const auto layout = [](std::uint32_t layers) {
    auto l = small_layout();
    l.num_layers = layers;
    return l;
  };
  for (std::uint32_t layers = 1; layers <= 4; ++layers)
    (void)greedy.register_layout(layout(layers));
  try {
    (void)greedy.register_layout(layout(5));
    ADD_FAILURE() << "a fifth layout was accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::quota_exceeded);
    EXPECT_NE(std::string(e.what()).find("--tenant-max-layouts"), std::string::npos) << e.what();
  }
  // The other tenant has its own four, new to the daemon as well.
  for (std::uint32_t layers = 5; layers <= 8; ++layers)
    EXPECT_NO_THROW((void)polite.register_layout(layout(layers)));

  // Staging: the tenant's budget (1 MiB) over the daemon's (1.5 MiB).
  auto greedy2 = client::Connection::connect(client_options(daemon, "greedy"));
  auto held = greedy.open_staging(1u << 20);
  EXPECT_EQ(status_of([&] { (void)greedy2.open_staging(4096); }), sp::Status::quota_exceeded);
  auto polite_half = polite.open_staging(512u << 10);
  auto polite2 = client::Connection::connect(client_options(daemon, "polite"));
  EXPECT_EQ(status_of([&] { (void)polite2.open_staging(4096); }), sp::Status::pool_exhausted)
      << "the daemon's staging capacity is held in full";

  // Connections attached to one tenant: at most 3 (greedy has 2).
  auto greedy3 = client::Connection::connect(client_options(daemon, "greedy"));
  EXPECT_EQ(status_of([&] { (void)client::Connection::connect(client_options(daemon, "greedy")); }),
            sp::Status::too_many_connections);
  EXPECT_NO_THROW((void)client::Connection::connect(client_options(daemon, "polite")));
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(Daemon, AConnectionHoldsABoundedNumberOfStagingBuffers) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  std::vector<client::Staging> buffers;
  for (int i = 0; i < 64; ++i) buffers.push_back(conn.open_staging(4096));
  try {
    (void)conn.open_staging(4096);
    ADD_FAILURE() << "a 65th staging buffer was opened";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), sp::Status::quota_exceeded);
    EXPECT_NE(std::string(e.what()).find("64 staging buffers"), std::string::npos) << e.what();
  }
  buffers.pop_back();  // closing one makes room again
  EXPECT_NO_THROW(buffers.push_back(conn.open_staging(4096)));
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

// statepool-demo run again by the same tenant with more slots: arenas are fixed in size,
// so the daemon opens a second, larger one beside the first.
TEST(Daemon, ATenantThatNeedsMorePagesGetsALargerArenaBesideTheFirst) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  const auto layout = conn.register_layout(small_layout());
  auto small = conn.open_arena(layout, 4);
  auto first = conn.allocate(small, 4);
  auto large = conn.open_arena(layout, 16);
  EXPECT_NE(large.id(), small.id());
  EXPECT_EQ(large.page_count(), 16u);
  auto more = conn.allocate(large, 16);
  EXPECT_EQ(more.size(), 16u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

// Out of descriptors: staging buffers (one memfd each) use up what the limit leaves. A
// memfd that cannot be made is pool_exhausted, logged; a client that connects then is
// told too_many_connections at once instead of hanging in the listen backlog while the
// log fills with "accept failed"; and everything works again once descriptors are free.
TEST(Daemon, RunningOutOfDescriptorsIsACleanRefusalAndLogged) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers' runtime in the daemon needs descriptors itself (UBSan checks memory
  // through a pipe and aborts when it cannot make one); the normal build runs the test.
  GTEST_SKIP() << "needs free descriptors under the sanitizers";
#endif
  statepool::testing::DaemonOptions limited;
  limited.descriptor_limit = 100;  // --max-connections 16 needs 16 + 64
  DaemonProcess daemon({"--max-connections", "16"}, limited);
  std::vector<client::Connection> connections;
  std::vector<client::Staging> buffers;
  std::string refusal;
  for (int c = 0; c < 3 && refusal.empty(); ++c) {
    connections.push_back(client::Connection::connect(client_options(daemon)));
    for (int i = 0; i < 64 && refusal.empty(); ++i) {
      try {
        buffers.push_back(connections.back().open_staging(4096));
      } catch (const client::Error& e) {
        EXPECT_EQ(e.status(), sp::Status::pool_exhausted) << e.what();
        refusal = e.what();
      }
    }
  }
  ASSERT_FALSE(refusal.empty()) << "100 descriptors never ran out";
  EXPECT_NE(refusal.find("memfd_create"), std::string::npos) << refusal;
  EXPECT_TRUE(eventually(
      [&] { return daemon.log().find("host memory allocation failed") != std::string::npos; },
      10s));

  // Use up the last descriptors with bare connections, then try to attach.
  std::vector<std::unique_ptr<statepool::testing::RawPeer>> bare;
  for (int i = 0; i < 8; ++i)
    bare.push_back(std::make_unique<statepool::testing::RawPeer>(daemon.socket_path()));
  sp::Status status = sp::Status::ok;
  std::string message;
  try {
    (void)client::Connection::connect(client_options(daemon));
  } catch (const client::Error& e) {
    status = e.status();
    message = e.what();
  }
  EXPECT_EQ(status, sp::Status::too_many_connections);
  EXPECT_NE(message.find("out of file descriptors"), std::string::npos) << message;
  const std::string log = daemon.log();
  EXPECT_NE(log.find("out of file descriptors (limit 100)"), std::string::npos) << log;
  EXPECT_EQ(log.find("accept failed"), std::string::npos) << log;

  bare.clear();
  buffers.clear();
  EXPECT_TRUE(eventually(
      [&] {
        try {
          (void)client::Connection::connect(client_options(daemon)).ping();
          return true;
        } catch (const client::Error&) {
          return false;
        }
      },
      10s));
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST(Daemon, ClientsOfAKilledDaemonGetAClearErrorNotAHang) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  ASSERT_EQ(daemon.stop(SIGKILL, 10s), 128 + SIGKILL);
  EXPECT_THROW((void)conn.ping(), client::ConnectionError);
  EXPECT_FALSE(conn.healthy());
}

TEST(Daemon, ConnectionsAndStagingBuffersLeakNoDescriptorsOrPages) {
  DaemonProcess daemon({"--grace-period", "0s"});
  const std::string fd_dir = "/proc/" + std::to_string(daemon.pid()) + "/fd";
  auto count_fds = [&] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(fd_dir)) ++n;
    return n;
  };
  auto cycle = [&] {
    auto conn = client::Connection::connect(client_options(daemon));
    auto arena = conn.open_arena(conn.register_layout(small_layout()), 4);
    auto staging = conn.open_staging(arena.codec().staged_bytes(kernels::DType::f32));
    auto extra = conn.open_staging(4096);
    auto slots = conn.allocate(arena, 2);
    conn.compress(slots[0], staging, 0);
    for (auto& s : slots) (void)s.release();  // left to the lease: reclaimed at once (grace 0)
  };
  cycle();  // creates the arena (its memfd stays with the daemon)
  auto observer = client::Connection::connect(client_options(daemon));
  ASSERT_TRUE(eventually([&] { return observer.stats().leases_active == 1; }, 10s));
  // The daemon releases a closed connection's staging memory on a worker, a moment after
  // the connection is gone: take the baseline once the count has settled.
  std::size_t baseline = count_fds();
  for (int still = 0; still < 5;) {
    std::this_thread::sleep_for(50ms);
    const std::size_t now = count_fds();
    still = now == baseline ? still + 1 : 0;
    baseline = now;
  }
  for (int i = 0; i < 20; ++i) cycle();
  EXPECT_TRUE(eventually([&] { return count_fds() == baseline; }, 10s))
      << count_fds() << " descriptors open, " << baseline << " before";
  EXPECT_TRUE(eventually([&] { return observer.stats().arenas.at(0).pages_used == 0; }, 10s));
  const auto stats = observer.stats();
  EXPECT_EQ(stats.pages_reclaimed_total, 21u * 2u);
  EXPECT_EQ(stats.leases_orphaned, 0u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << "exit 0 also means the pool check passed";
}

TEST(Daemon, RepeatedSignalsDuringTheDrainStillExitZero) {
  DaemonProcess daemon({});
  auto conn = client::Connection::connect(client_options(daemon));
  // Operators (and Kubernetes) send SIGTERM again, or SIGINT after it: it must neither
  // kill the daemon half-way through the drain nor change its exit status.
  for (int i = 0; i < 20; ++i) ::kill(daemon.pid(), i % 2 == 0 ? SIGTERM : SIGINT);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
  EXPECT_THROW((void)conn.ping(), client::ConnectionError);
}

// CloseArena: an engine gives an arena back once it has freed its pages, the daemon frees
// the memory (its memfd goes, the pool's reserved bytes fall), and the id is dead after.
TEST(Daemon, AnEngineGivesItsArenaBackAndTheDaemonFreesTheMemory) {
  DaemonProcess daemon({"--grace-period", "0s"});
  auto engine = client::Connection::connect(client_options(daemon));
  auto observer = client::Connection::connect(client_options(daemon));
  const auto info = engine.register_layout(small_layout());
  const std::size_t descriptors = open_descriptors(daemon.pid());

  auto arena = engine.open_arena(info, 8);
  ASSERT_TRUE(arena.created());
  const client::ArenaId id = arena.id();
  const std::uint64_t bytes = arena.bytes();
  auto staging = engine.open_staging(info.state_bytes_f32);
  auto slots = engine.allocate(arena, 2);
  engine.compress(slots[0], staging, 0);
  EXPECT_EQ(observer.stats().pool_reserved_bytes, bytes);

  // Another connection cannot close it while the engine (which opened it) is connected.
  auto [status, message] = refusal([&] { observer.close_arena(id); });
  EXPECT_EQ(status, statepool::Status::in_use);
  EXPECT_NE(message.find("is open on 1 other connection"), std::string::npos) << message;
  // The engine cannot either while it holds pages; its mapping is gone all the same.
  std::tie(status, message) = refusal([&] { engine.close_arena(std::move(arena)); });
  EXPECT_EQ(status, statepool::Status::in_use);
  EXPECT_NE(message.find("has 2 pages held by leases"), std::string::npos) << message;
  EXPECT_EQ(engine.free(slots), 2u);

  const client::ArenaClose closed = engine.close_arena(id);
  EXPECT_EQ(closed.bytes, bytes);
  EXPECT_EQ(closed.snapshots_dropped, 0u);
  const client::Stats stats = observer.stats();
  EXPECT_TRUE(stats.arenas.empty());
  EXPECT_EQ(stats.pool_reserved_bytes, 0u);
  // The arena's memfd is closed in the daemon (the staging buffer's is not).
  EXPECT_TRUE(eventually([&] { return open_descriptors(daemon.pid()) == descriptors + 1; }, 10s))
      << open_descriptors(daemon.pid()) << " descriptors, " << descriptors << " before";

  std::tie(status, message) = refusal([&] { (void)engine.allocate(id, 1); });
  EXPECT_EQ(status, statepool::Status::not_found);
  EXPECT_EQ(message, "arena " + std::to_string(id) + " was closed");
  auto again = engine.open_arena(info, 8);
  EXPECT_TRUE(again.created());
  EXPECT_NE(again.id(), id);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << "exit 0 also means the pool check passed";
}

// statepoolctl close-arena refuses while an engine that opened the arena is connected, and
// closes it once the engine is gone.
TEST(Daemon, StatepoolctlClosesAnArenaOnceItsEnginesHaveGone) {
  DaemonProcess daemon({"--grace-period", "0s"});
  const std::string ctl = "--socket " + daemon.socket_path() + " ";
  client::ArenaId id = 0;
  std::uint64_t bytes = 0;
  {
    auto engine = client::Connection::connect(client_options(daemon));
    auto arena = engine.open_arena(engine.register_layout(small_layout()), 4);
    id = arena.id();
    bytes = arena.bytes();
    const auto busy = statepoolctl(ctl + "close-arena " + std::to_string(id));
    EXPECT_EQ(busy.code, 1) << busy.output;
    EXPECT_NE(busy.output.find("close-arena failed (in_use): arena " + std::to_string(id)),
              std::string::npos)
        << busy.output;
  }
  auto observer = client::Connection::connect(client_options(daemon));
  ASSERT_TRUE(eventually([&] { return observer.stats().leases_active == 1; }, 10s));
  const auto done = statepoolctl(ctl + "close-arena --json " + std::to_string(id));
  ASSERT_EQ(done.code, 0) << done.output;
  const boost::json::object v = boost::json::parse(done.output).as_object();
  EXPECT_EQ(v.at("arena_id").to_number<std::uint32_t>(), id);
  EXPECT_EQ(v.at("bytes").to_number<std::uint64_t>(), bytes);
  EXPECT_EQ(v.at("snapshots_dropped").to_number<std::uint32_t>(), 0u);
  EXPECT_TRUE(observer.stats().arenas.empty());

  const auto gone = statepoolctl(ctl + "close-arena " + std::to_string(id));
  EXPECT_EQ(gone.code, 1) << gone.output;
  EXPECT_NE(gone.output.find("(not_found): arena " + std::to_string(id) + " was closed"),
            std::string::npos)
      << gone.output;
  for (const std::string bad : {"close-arena", "close-arena 0", "close-arena x1", "close-arena -3",
                                "close-arena 4294967296", "close-arena 1 2"}) {
    const auto run = statepoolctl(ctl + bad);
    EXPECT_EQ(run.code, 2) << bad << ": " << run.output;
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}
