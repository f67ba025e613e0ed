// Bad frames and bad configurations against a real statepoold process: each gets an error
// reply or a closed connection; the daemon and its other clients are unaffected.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "statepool/client.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace client = statepool::client;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using statepool::testing::DaemonProcess;
using statepool::testing::RawPeer;
using namespace std::chrono_literals;

namespace {

// Expects either a protocol_error reply followed by a close, or a plain close.
void expect_refused(RawPeer& peer, const char* what) {
  const auto reply = peer.read_reply(10s);
  if (reply) {
    const auto* r = statepool::testing::as_reply(*reply);
    ASSERT_NE(r, nullptr) << what;
    EXPECT_NE(r->status(), wire::Status::ok) << what;
    ASSERT_NE(r->message(), nullptr) << what;
    EXPECT_GT(r->message()->size(), 0u) << what;
  }
  EXPECT_TRUE(peer.closed_by_peer(10s)) << what << ": connection not closed";
}

std::string header_bytes(std::uint32_t magic, std::uint16_t version, std::uint32_t length,
                         std::uint16_t type = 1) {
  protocol::FrameHeader h;
  h.magic = magic;
  h.version = version;
  h.type = static_cast<protocol::FrameType>(type);
  h.length = length;
  const auto bytes = protocol::encode_header(h);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

class BadFrames : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--io-timeout", "2s"});
    client::Options o;
    o.socket_path = daemon_->socket_path();
    bystander_ = std::make_unique<client::Connection>(client::Connection::connect(o));
    auto layout = bystander_->register_layout([] {
      statepool::kernels::StateLayout l;
      l.num_layers = 1;
      l.num_heads = 1;
      l.key_dim = 16;
      l.value_dim = 16;
      l.codec.id = statepool::kernels::CodecId::int4;
      return l;
    }());
    arena_ = std::make_unique<client::Arena>(bystander_->open_arena(layout, 4));
    slots_ = bystander_->allocate(*arena_, 2);
  }
  void TearDown() override {
    // The daemon and the bystander are unaffected.
    ASSERT_TRUE(daemon_->running()) << daemon_->log();
    EXPECT_GT(bystander_->ping().count(), 0);
    EXPECT_EQ(bystander_->stats().arenas.at(0).pages_used, 2u);
    slots_.clear();
    EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0) << daemon_->log();
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<client::Connection> bystander_;
  std::unique_ptr<client::Arena> arena_;
  std::vector<client::Slot> slots_;
};

}  // namespace

TEST_F(BadFrames, WrongMagic) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(0x50545448, 1, 10);  // "HTTP"
  ASSERT_TRUE(peer.send_bytes(h.data(), h.size()));
  expect_refused(peer, "wrong magic");
}

TEST_F(BadFrames, UnknownFrameVersion) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(protocol::kMagic, 9, 10);
  ASSERT_TRUE(peer.send_bytes(h.data(), h.size()));
  expect_refused(peer, "unknown version");
}

TEST_F(BadFrames, HugeLengthIsRefusedWithoutReadingIt) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(protocol::kMagic, 1, 0xfffffff0u);
  ASSERT_TRUE(peer.send_bytes(h.data(), h.size()));
  expect_refused(peer, "huge length");
}

TEST_F(BadFrames, TruncatedFrameTimesOut) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(protocol::kMagic, 1, 100);
  ASSERT_TRUE(peer.send_bytes(h.data(), h.size()));
  ASSERT_TRUE(peer.send_bytes("abc", 3));
  // The daemon gives up after --io-timeout (2 s) and closes; it never waits forever.
  EXPECT_TRUE(peer.closed_by_peer(15s));
}

TEST_F(BadFrames, PartialHeaderTimesOut) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(protocol::kMagic, 1, 100);
  ASSERT_TRUE(peer.send_bytes(h.data(), 5));
  EXPECT_TRUE(peer.closed_by_peer(15s));
}

TEST_F(BadFrames, RequestTypeWithoutItsBody) {
  for (auto type : {wire::RequestBody::Hello, wire::RequestBody::Allocate}) {
    RawPeer peer(daemon_->socket_path());
    flatbuffers::FlatBufferBuilder b;
    wire::RequestBuilder request(b);
    request.add_id(9);
    request.add_body_type(type);  // a union type with no table: verifies, must not crash
    b.Finish(request.Finish());
    ASSERT_TRUE(peer.send_frame(b));
    const auto reply = peer.read_reply();
    ASSERT_TRUE(reply.has_value());
    const auto* r = statepool::testing::as_reply(*reply);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->status(), wire::Status::protocol_error);
    EXPECT_EQ(r->id(), 9u);
    EXPECT_TRUE(peer.closed_by_peer());
  }
}

TEST_F(BadFrames, GarbageFlatBuffer) {
  RawPeer peer(daemon_->socket_path());
  std::string frame = header_bytes(protocol::kMagic, 1, 64);
  for (int i = 0; i < 64; ++i) frame.push_back(static_cast<char>(0xA5 ^ i));
  ASSERT_TRUE(peer.send_bytes(frame.data(), frame.size()));
  expect_refused(peer, "garbage flatbuffer");
}

TEST_F(BadFrames, ReplyTypedFrame) {
  RawPeer peer(daemon_->socket_path());
  const auto h = header_bytes(protocol::kMagic, 1, 8, /*type=*/2);
  ASSERT_TRUE(peer.send_bytes(h.data(), h.size()));
  expect_refused(peer, "reply-typed frame");
}

TEST_F(BadFrames, RequestBeforeHello) {
  RawPeer peer(daemon_->socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 5, wire::RequestBody::Stats, wire::CreateStats(b).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  const auto reply = peer.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::not_hello);
  EXPECT_EQ(r->id(), 5u);
  EXPECT_TRUE(peer.closed_by_peer());
}

TEST_F(BadFrames, UnsupportedProtocolVersionInHello) {
  RawPeer peer(daemon_->socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 7, 9).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  const auto reply = peer.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::unsupported_version);
  EXPECT_NE(r->message()->str().find("7..9"), std::string::npos) << r->message()->str();
}

TEST_F(BadFrames, InvalidLayoutIsAnErrorAndTheConnectionStaysUsable) {
  RawPeer peer(daemon_->socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 1, 1).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  ASSERT_TRUE(peer.read_reply().has_value());
  b.Clear();
  const auto layout = wire::CreateLayout(b, 0, wire::Arch::gdn, 1, 1, /*key_dim=*/0, 16);
  b.Finish(wire::CreateRequest(b, 2, wire::RequestBody::RegisterLayout,
                               wire::CreateRegisterLayout(b, layout).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  auto reply = peer.read_reply();
  ASSERT_TRUE(reply.has_value());
  const auto* r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::invalid_argument);
  EXPECT_NE(r->message()->str().find("key_dim"), std::string::npos) << r->message()->str();
  // Out-of-range enum values are caught too (the FlatBuffer verifier does not check them).
  b.Clear();
  const auto bad_codec = wire::CreateLayout(b, 0, wire::Arch::gdn, 1, 1, 16, 16, 0, 0,
                                            wire::DType::bf16, static_cast<wire::CodecId>(200));
  b.Finish(wire::CreateRequest(b, 3, wire::RequestBody::RegisterLayout,
                               wire::CreateRegisterLayout(b, bad_codec).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  reply = peer.read_reply();
  ASSERT_TRUE(reply.has_value());
  r = statepool::testing::as_reply(*reply);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), wire::Status::invalid_argument);
  EXPECT_EQ(r->id(), 3u);
}

// `after` must be a whole IPC event handle: another length is refused before anything
// else is looked at, and the connection stays usable.
TEST_F(BadFrames, AnAfterEventOfTheWrongLengthIsInvalidArgument) {
  RawPeer peer(daemon_->socket_path());
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRequest(b, 1, wire::RequestBody::Hello, wire::CreateHello(b, 1, 1).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  ASSERT_TRUE(peer.read_reply().has_value());
  const std::vector<std::uint8_t> three = {1, 2, 3};
  std::uint64_t id = 2;
  for (const auto body :
       {wire::RequestBody::Compress, wire::RequestBody::Decompress, wire::RequestBody::Copy}) {
    b.Clear();
    const auto after = b.CreateVector(three);
    flatbuffers::Offset<void> request;
    if (body == wire::RequestBody::Compress) {
      request =
          wire::CreateCompress(b, arena_->id(), 0, 0, 0, wire::DType::f32, false, after).Union();
    } else if (body == wire::RequestBody::Decompress) {
      request =
          wire::CreateDecompress(b, arena_->id(), 0, 0, 0, wire::DType::f32, false, after).Union();
    } else {
      request = wire::CreateCopy(b, arena_->id(), 0, 1, false, after).Union();
    }
    b.Finish(wire::CreateRequest(b, id, body, request));
    ASSERT_TRUE(peer.send_frame(b));
    const auto reply = peer.read_reply();
    ASSERT_TRUE(reply.has_value());
    const auto* r = statepool::testing::as_reply(*reply);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->id(), id);
    EXPECT_EQ(r->status(), wire::Status::invalid_argument);
    ASSERT_NE(r->message(), nullptr);
    EXPECT_NE(r->message()->str().find("`after` holds 3 bytes"), std::string::npos)
        << r->message()->str();
    ++id;
  }
  b.Clear();
  b.Finish(wire::CreateRequest(b, id, wire::RequestBody::Ping, wire::CreatePing(b).Union()));
  ASSERT_TRUE(peer.send_frame(b));
  const auto pong = peer.read_reply();
  ASSERT_TRUE(pong.has_value());
  EXPECT_EQ(statepool::testing::as_reply(*pong)->status(), wire::Status::ok);
}

// ---- configuration ----------------------------------------------------------------------

namespace {

using statepool::testing::Exit;
using statepool::testing::run_daemon;

class BadConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_.emplace("/tmp/statepool-config");
    dir_ = tmp_->path();
    socket_ = dir_ + "/sock";
  }
  void TearDown() override { tmp_.reset(); }
  void expect_rejected(std::vector<std::string> args, const std::string& mention) {
    if (std::find(args.begin(), args.end(), "--metrics-address") == args.end())
      args.insert(args.begin(), {"--metrics-address", "off"});
    if (std::find(args.begin(), args.end(), "--socket") == args.end())
      args.insert(args.begin(), {"--socket", socket_});
    const Exit e = run_daemon(args, dir_);
    EXPECT_EQ(e.code, 2) << e.stderr_text;
    EXPECT_NE(e.stderr_text.find(mention), std::string::npos) << e.stderr_text;
    EXPECT_FALSE(std::filesystem::exists(socket_)) << "created the socket before validating";
  }
  std::optional<statepool::testing::TempDir> tmp_;
  std::string dir_;
  std::string socket_;
};

}  // namespace

TEST_F(BadConfig, EachBadValueNamesTheOptionAndCreatesNothing) {
  expect_rejected({"--pool-capacity", "lots"}, "--pool-capacity");
  expect_rejected({"--grace-period", "5 parsecs"}, "--grace-period");
  expect_rejected({"--arena-pages", "0"}, "--arena-pages");
  expect_rejected({"--socket-mode", "999"}, "--socket-mode");
  expect_rejected({"--backend", "tpu"}, "--backend");
  expect_rejected({"--metrics-address", "localhost"}, "--metrics-address");
  expect_rejected({"--metrics-address", "localhost:9464"}, "is not an IP address");
  expect_rejected({"--no-such-flag"}, "no-such-flag");
  expect_rejected({"--tenant", "bad name!"}, "tenant name");
  expect_rejected({"--socket", "@statepool"}, "abstract sockets");
  expect_rejected({"--config", dir_ + "/missing.conf"}, "cannot read config file");
}

TEST_F(BadConfig, TenantLimitsAreCheckedAndNamed) {
  expect_rejected({"--tenant-max-layouts", "0"}, "--tenant-max-layouts must be between 1 and");
  expect_rejected({"--tenant-max-connections", "70000"}, "--tenant-max-connections");
  expect_rejected({"--tenant-max-staging-bytes", "0"}, "--tenant-max-staging-bytes");
  expect_rejected({"--staging-capacity", "0"}, "--staging-capacity");
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "[tenant.alice]\nmax-arenas = 0\n";
  expect_rejected({"--config", file}, "[tenant.alice] max-arenas must be between 1 and");
  std::ofstream(file) << "[tenant.alice]\nmax-plans = many\n";
  expect_rejected({"--config", file}, "[tenant.alice] max-plans");
  expect_rejected({"--tenant-max-pinned-snapshots", "0"}, "--tenant-max-pinned-snapshots");
  std::ofstream(file) << "[tenant.alice]\nsnapshot-namespace = two words\n";
  expect_rejected({"--config", file},
                  "[tenant.alice] snapshot-namespace must be 1-64 letters, digits, '_', '-' or "
                  "'.', got 'two words'");
}

TEST_F(BadConfig, SnapshotNamespacesAndPinLimitsArePrinted) {
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "[tenant.alice]\nsnapshot-namespace = team\nmax-pinned-snapshots = 7\n"
                         "[tenant.bob]\n";
  const Exit e = run_daemon({"--config", file, "--print-config", "--socket", socket_}, dir_);
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("8.0 GiB staging, 7 pinned snapshots; snapshot namespace team\n"),
            std::string::npos)
      << e.stdout_text;
  EXPECT_NE(e.stdout_text.find("8.0 GiB staging, 256 pinned snapshots\n"), std::string::npos)
      << e.stdout_text;
}

TEST_F(BadConfig, TenantLimitsComeFromTheFlagsAndEachSectionMayOverrideThem) {
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "[tenant.alice]\nmax-layouts = 5\nmax-staging-bytes = 1GiB\n"
                         "[tenant.bob]\n";
  const Exit e = run_daemon({"--config", file, "--print-config", "--socket", socket_,
                             "--tenant-max-plans", "3", "--tenant-max-connections", "9"},
                            dir_);
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("tenant alice: quota unlimited; at most 5 layouts, 3 plans, 64 "
                               "arenas, 9 connections, 1.0 GiB staging"),
            std::string::npos)
      << e.stdout_text;
  EXPECT_NE(e.stdout_text.find("tenant bob: quota unlimited; at most 64 layouts, 3 plans, 64 "
                               "arenas, 9 connections, 8.0 GiB staging"),
            std::string::npos)
      << e.stdout_text;
}

// --max-connections is checked against the descriptor limit before anything is created.
TEST_F(BadConfig, MaxConnectionsBeyondTheDescriptorLimitIsRefusedAtStart) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit low{512, 512};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) ::_exit(3);
    const Exit e = run_daemon(
        {"--socket", socket_, "--metrics-address", "off", "--max-connections", "1000"}, dir_);
    const bool named = e.stderr_text.find(
                           "--max-connections 1000 needs at least 1064 file "
                           "descriptors") != std::string::npos &&
                       e.stderr_text.find("limit is 512") != std::string::npos;
    ::_exit(e.code == 2 && named && !std::filesystem::exists(socket_) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "statepoold did not refuse clearly (see the code above)";
}

TEST_F(BadConfig, TheCudaBackendsOptionsAreCheckedBeforeAnythingStarts) {
  // A fraction of device memory is for the cuda backend only, and must be in (0, 1].
  expect_rejected({"--pool-capacity", "0.5"}, "needs --backend cuda");
  expect_rejected({"--pool-capacity", "80%"}, "needs --backend cuda");
#if defined(STATEPOOL_HAVE_CUDA)
  expect_rejected({"--backend", "cuda", "--pool-capacity", "150%"}, "fraction must be in (0, 1]");
  expect_rejected({"--backend", "cuda", "--pool-capacity", "0.0"}, "fraction must be in (0, 1]");
  expect_rejected({"--backend", "cuda", "--device", "-1"}, "--device");
#else
  expect_rejected({"--backend", "cuda"}, "built without CUDA");
#endif
}

TEST(CudaBackend, WithoutAUsableGpuStatepooldExitsOneNamingTheDeviceAndTheWayOut) {
#if !defined(STATEPOOL_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA (the configuration refuses --backend cuda: BadConfig)";
#else
  const statepool::testing::TempDir tmp("/tmp/statepool-cuda");
  const std::string& dir = tmp.path();
  const Exit e = run_daemon({"--socket", dir + "/sock", "--metrics-address", "off", "--api-address",
                             "off", "--backend", "cuda", "--device", "7"},
                            dir);
  if (e.code == 0) GTEST_SKIP() << "device 7 exists here";
  EXPECT_EQ(e.code, 1) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("CUDA device 7"), std::string::npos) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("--backend host"), std::string::npos) << e.stderr_text;
#endif
}

TEST_F(BadConfig, ConfigFileErrorsNameTheKey) {
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "pool-capacity = 1GiB\n[tenant.alice]\nquota = 2GiB\ncolour = blue\n";
  expect_rejected({"--config", file}, "colour");
  std::ofstream(file) << "pool-capacty = 1GiB\n";
  expect_rejected({"--config", file}, "pool-capacty");
}

TEST_F(BadConfig, AGoodConfigFileIsAcceptedAndPrinted) {
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "pool-capacity = 2GiB\ngrace-period = 45s\n[tenant.alice]\n"
                         "quota = 512MiB\nuids = 1000, 1001\n[tenant.bob]\n";
  const Exit e = run_daemon({"--config", file, "--print-config", "--socket", socket_}, dir_);
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("pool capacity 2.0 GiB"), std::string::npos) << e.stdout_text;
  EXPECT_NE(e.stdout_text.find("grace period 45000 ms"), std::string::npos) << e.stdout_text;
  EXPECT_NE(e.stdout_text.find("tenant alice: quota 512 MiB, 2 uids"), std::string::npos)
      << e.stdout_text;
  EXPECT_NE(e.stdout_text.find("tenant bob: quota unlimited"), std::string::npos) << e.stdout_text;
  EXPECT_FALSE(std::filesystem::exists(socket_));
}
