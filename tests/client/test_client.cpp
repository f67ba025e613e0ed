// Client library tests against a scripted fake daemon (no statepoold needed): handshake,
// error statuses, descriptor receipt and mapping, RAII frees, and every way the transport
// can fail (daemon gone mid-reply, garbage, silence, stray descriptors) ending in a clear
// ConnectionError instead of a hang or a leak.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/testing/gtest/fake_daemon.hpp"

namespace sc = statepool::client;
namespace sk = statepool::kernels;
namespace wire = statepool::wire;
namespace protocol = statepool::protocol;
using statepool::testing::FakeDaemon;
using statepool::testing::FakePeer;
using statepool::testing::open_fd_count;
using Kind = sc::ConnectionError::Kind;

namespace {

sc::Options options_for(const FakeDaemon& daemon,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
  sc::Options o;
  o.socket_path = daemon.path();
  o.client_name = "unit-test";
  o.timeout = timeout;
  return o;
}

// A memfd of `bytes` bytes whose byte i holds `fill(i)`.
int make_memfd(std::size_t bytes, unsigned char seed = 0) {
  const int fd = ::memfd_create("client-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  std::vector<unsigned char> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(seed + i * 7);
  EXPECT_EQ(::pwrite(fd, data.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return fd;
}

void reply_staging(FakePeer& peer, std::uint64_t id, std::uint32_t staging_id, std::uint64_t bytes,
                   const std::vector<int>& fds, std::uint32_t flags = protocol::kFlagFdAttached) {
  flatbuffers::FlatBufferBuilder b;
  peer.reply_ok(id, wire::ReplyBody::OpenStagingReply, b,
                wire::CreateOpenStagingReply(b, staging_id, bytes), flags, fds);
}

void reply_ping(FakePeer& peer, std::uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  peer.reply_ok(id, wire::ReplyBody::PingReply, b, wire::CreatePingReply(b, 42));
}

void reply_allocate(FakePeer& peer, std::uint64_t id, const std::vector<std::uint32_t>& slots) {
  flatbuffers::FlatBufferBuilder b;
  peer.reply_ok(id, wire::ReplyBody::AllocateReply, b, wire::CreateAllocateReplyDirect(b, &slots));
}

// Reads a Free and answers it; returns the slot ids it named.
std::vector<std::uint32_t> serve_free(FakePeer& peer, std::uint32_t arena) {
  const auto r = peer.expect(wire::RequestBody::Free);
  const auto* f = r.request->body_as_Free();
  EXPECT_EQ(f->arena_id(), arena);
  std::vector<std::uint32_t> ids(f->slots()->begin(), f->slots()->end());
  flatbuffers::FlatBufferBuilder b;
  peer.reply_ok(r.request->id(), wire::ReplyBody::FreeReply, b,
                wire::CreateFreeReply(b, static_cast<std::uint32_t>(ids.size())));
  return ids;
}

sk::StateLayout small_layout() {
  sk::StateLayout l;
  l.name = "small";
  l.num_layers = 2;
  l.num_heads = 2;
  l.key_dim = 8;
  l.value_dim = 8;
  l.codec.id = sk::CodecId::fp32;
  return l;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Handshake

TEST(ClientHello, SendsOptionsAndExposesTheLease) {
  FakeDaemon daemon([](FakePeer& peer) {
    const auto r = peer.expect(wire::RequestBody::Hello);
    const auto* h = r.request->body_as_Hello();
    EXPECT_EQ(h->min_version(), protocol::kMinProtocolVersion);
    EXPECT_EQ(h->max_version(), protocol::kMaxProtocolVersion);
    EXPECT_EQ(h->tenant()->str(), "team-a");
    EXPECT_EQ(h->lease_token()->str(), "old-token");
    EXPECT_EQ(h->client_name()->str(), "unit-test");
    EXPECT_EQ(r.flags, protocol::kFlagNone);
    peer.reply_hello(r, "new-token", true, 3);
    EXPECT_TRUE(peer.wait_for_eof());
  });
  auto options = options_for(daemon);
  options.tenant = "team-a";
  options.lease_token = "old-token";
  {
    auto conn = sc::Connection::connect(options);
    EXPECT_EQ(conn.lease_token(), "new-token");
    EXPECT_TRUE(conn.lease_resumed());
    EXPECT_EQ(conn.resumed_slots(), 3u);
    EXPECT_EQ(conn.grace_period(), std::chrono::milliseconds(30000));
    EXPECT_EQ(conn.protocol_version(), 1);
    EXPECT_EQ(conn.server(), "fake-statepoold 0");
    EXPECT_EQ(conn.max_frame_bytes(), protocol::kDefaultMaxPayload);
    EXPECT_TRUE(conn.healthy());
  }
  daemon.join();
}

TEST(ClientHello, DefaultClientNameNamesTheProgram) {
  FakeDaemon daemon([](FakePeer& peer) {
    const auto r = peer.expect(wire::RequestBody::Hello);
    const std::string name = r.request->body_as_Hello()->client_name()->str();
    EXPECT_NE(name.find('[' + std::to_string(::getpid()) + ']'), std::string::npos) << name;
    peer.reply_hello(r);
  });
  auto options = options_for(daemon);
  options.client_name.clear();
  (void)sc::Connection::connect(options);
}

TEST(ClientHello, AbstractSocketNames) {
  FakeDaemon daemon([](FakePeer& peer) { peer.handshake(); }, /*abstract=*/true);
  ASSERT_EQ(daemon.path().front(), '@');
  auto conn = sc::Connection::connect(options_for(daemon));
  EXPECT_TRUE(conn.healthy());
}

TEST(ClientHello, ConnectFailureSaysWhatToDo) {
  sc::Options options;
  options.socket_path = "/nonexistent-statepool-dir/statepool.sock";
  try {
    (void)sc::Connection::connect(options);
    FAIL() << "connect succeeded";
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::connect_failed);
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent-statepool-dir/statepool.sock"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
    EXPECT_NE(what.find("is statepoold running"), std::string::npos) << what;
  }
}

TEST(ClientHello, TooLongSocketPathIsRefusedClearly) {
  sc::Options options;
  options.socket_path = "/tmp/" + std::string(200, 'x');
  try {
    (void)sc::Connection::connect(options);
    FAIL() << "connect succeeded";
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::connect_failed);
    EXPECT_NE(std::string(e.what()).find("shorter path"), std::string::npos) << e.what();
  }
}

TEST(ClientHello, UnsupportedVersionChosenByDaemonIsAnError) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.reply_hello(peer.expect(wire::RequestBody::Hello), "t", false, 0, /*version=*/7);
  });
  try {
    (void)sc::Connection::connect(options_for(daemon));
    FAIL() << "connect succeeded";
  } catch (const sc::ConnectionError& e) {
    FAIL() << "expected a status error, got ConnectionError: " << e.what();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::unsupported_version);
  }
}

// Guards the EPIPE path: a daemon at its connection limit writes an id-0 error and closes
// without reading the Hello. The client must report the daemon's reason, not "closed".
TEST(ClientHello, RefusalBeforeHelloIsReportedWithTheDaemonsReason) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.reply_error(0, statepool::Status::too_many_connections, "connection limit of 2 reached");
  });
  try {
    (void)sc::Connection::connect(options_for(daemon));
    FAIL() << "connect succeeded";
  } catch (const sc::ConnectionError& e) {
    FAIL() << "expected the daemon's status, got ConnectionError: " << e.what();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::too_many_connections);
    EXPECT_STREQ(e.what(), "connection limit of 2 reached");
  }
}

TEST(ClientHello, FromFdSpeaksOnASocketpair) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  std::thread server([fd = sv[1]] {
    FakePeer peer(fd);
    try {
      peer.handshake();
      const auto r = peer.expect(wire::RequestBody::Ping);
      reply_ping(peer, r.request->id());
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
    ::close(fd);
  });
  {
    auto conn = sc::Connection::from_fd(sv[0], {});
    EXPECT_GE(conn.ping().count(), 0);
  }
  server.join();
}

// ---------------------------------------------------------------------------------------
// Status errors

TEST(ClientErrors, ErrorStatusKeepsStatusAndMessageAndTheConnection) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Allocate);
    EXPECT_EQ(r.request->body_as_Allocate()->arena_id(), 7u);
    EXPECT_EQ(r.request->body_as_Allocate()->count(), 2u);
    peer.reply_error(r.request->id(), statepool::Status::quota_exceeded,
                     "tenant 'a' would exceed its quota of 1 MiB");
    const auto p = peer.expect(wire::RequestBody::Ping);
    reply_ping(peer, p.request->id());
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.allocate(7, 2);
    FAIL() << "allocate succeeded";
  } catch (const sc::ConnectionError& e) {
    FAIL() << "a status error must not be a ConnectionError: " << e.what();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::quota_exceeded);
    EXPECT_STREQ(e.what(), "tenant 'a' would exceed its quota of 1 MiB");
  }
  EXPECT_TRUE(conn.healthy());
  EXPECT_NO_THROW((void)conn.ping());
}

TEST(ClientErrors, ErrorIsAStatusError) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Ping);
    peer.reply_error(r.request->id(), statepool::Status::draining, "");
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.ping();
    FAIL();
  } catch (const statepool::StatusError& e) {
    EXPECT_EQ(e.status(), statepool::Status::draining);
    EXPECT_NE(std::string(e.what()).find("draining"), std::string::npos) << e.what();
  }
}

TEST(ClientErrors, ProtocolErrorStatusBreaksTheConnection) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Ping);
    peer.reply_error(r.request->id(), statepool::Status::protocol_error, "bad request");
    EXPECT_TRUE(peer.wait_for_eof());
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  EXPECT_THROW((void)conn.ping(), sc::Error);
  EXPECT_FALSE(conn.healthy());
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::closed);
    EXPECT_NE(std::string(e.what()).find("bad request"), std::string::npos) << e.what();
  }
}

TEST(ClientErrors, RequestLargerThanTheDaemonsFrameLimitIsRefusedLocally) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.reply_hello(peer.expect(wire::RequestBody::Hello), "t", false, 0, 1,
                     /*max_frame_bytes=*/256);
    const auto r = peer.expect(wire::RequestBody::Ping);  // nothing else reached us
    reply_ping(peer, r.request->id());
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  const std::vector<sc::SlotId> many(1000, 1);
  try {
    (void)conn.free(1, many);
    FAIL();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::invalid_argument);
  }
  EXPECT_TRUE(conn.healthy());
  EXPECT_NO_THROW((void)conn.ping());
}

TEST(ClientErrors, LocalChecksNeedNoRoundTrip) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    EXPECT_TRUE(peer.wait_for_eof());  // no request ever arrives
  });
  {
    auto conn = sc::Connection::connect(options_for(daemon));
    auto bad = small_layout();
    bad.key_dim = 0;
    try {
      (void)conn.register_layout(bad);
      FAIL();
    } catch (const sc::Error& e) {
      EXPECT_EQ(e.status(), statepool::Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("key_dim"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)conn.open_staging(0), sc::Error);
    EXPECT_THROW((void)conn.allocate(1, 0), sc::Error);
    auto a = conn.adopt(1, 1);
    auto b = conn.adopt(2, 1);
    EXPECT_THROW(conn.copy(a, b), sc::Error);
    (void)a.release();
    (void)b.release();
  }
  daemon.join();
}

// ---------------------------------------------------------------------------------------
// Descriptors and mappings

TEST(ClientStaging, ReceivesAndMapsTheMemfdAndClosesItOnTheDaemon) {
  const std::size_t fds_before = open_fd_count();
  {
    int server_memfd = -1;
    FakeDaemon daemon([&](FakePeer& peer) {
      peer.handshake();
      const auto r = peer.expect(wire::RequestBody::OpenStaging);
      EXPECT_EQ(r.request->body_as_OpenStaging()->bytes(), 4000u);
      server_memfd = make_memfd(4096, 3);
      reply_staging(peer, r.request->id(), 5, 4096, {server_memfd});
      // The client writes through its mapping, then pings: the bytes must be here.
      const auto p = peer.expect(wire::RequestBody::Ping);
      unsigned char seen[4] = {};
      EXPECT_EQ(::pread(server_memfd, seen, 4, 100), 4);
      EXPECT_EQ(seen[0], 0xAB);
      EXPECT_EQ(seen[3], 0xCD);
      reply_ping(peer, p.request->id());
      const auto c = peer.expect(wire::RequestBody::CloseStaging);
      EXPECT_EQ(c.request->body_as_CloseStaging()->staging_id(), 5u);
      flatbuffers::FlatBufferBuilder b;
      peer.reply_ok(c.request->id(), wire::ReplyBody::CloseStagingReply, b,
                    wire::CreateCloseStagingReply(b));
      ::close(server_memfd);
    });
    auto conn = sc::Connection::connect(options_for(daemon));
    {
      auto staging = conn.open_staging(4000);
      EXPECT_EQ(staging.id(), 5u);
      EXPECT_EQ(staging.size(), 4096u);
      ASSERT_EQ(staging.bytes().size(), 4096u);
      EXPECT_GE(staging.fd(), 0);
      const int fd_flags = ::fcntl(staging.fd(), F_GETFD);
      EXPECT_NE(fd_flags & FD_CLOEXEC, 0) << "received descriptors must be close-on-exec";
      for (std::size_t i = 0; i < 4096; i += 511) {
        EXPECT_EQ(static_cast<unsigned char>(staging.bytes()[i]),
                  static_cast<unsigned char>(3 + i * 7));
      }
      staging.bytes()[100] = std::byte{0xAB};
      staging.bytes()[103] = std::byte{0xCD};
      (void)conn.ping();
    }  // ~Staging: CloseStaging
    daemon.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

TEST(ClientStaging, DescriptorSmallerThanTheRegionIsNotMapped) {
  const std::size_t fds_before = open_fd_count();
  {
    FakeDaemon daemon([](FakePeer& peer) {
      peer.handshake();
      const auto r = peer.expect(wire::RequestBody::OpenStaging);
      const int memfd = make_memfd(100);
      reply_staging(peer, r.request->id(), 9, 8192, {memfd});
      ::close(memfd);
      // The client refuses the mapping and gives the buffer back.
      const auto c = peer.expect(wire::RequestBody::CloseStaging);
      EXPECT_EQ(c.request->body_as_CloseStaging()->staging_id(), 9u);
      flatbuffers::FlatBufferBuilder b;
      peer.reply_ok(c.request->id(), wire::ReplyBody::CloseStagingReply, b,
                    wire::CreateCloseStagingReply(b));
    });
    auto conn = sc::Connection::connect(options_for(daemon));
    try {
      (void)conn.open_staging(8192);
      FAIL() << "mapped a descriptor too small for the region";
    } catch (const sc::Error& e) {
      EXPECT_EQ(e.status(), statepool::Status::internal);
    }
    EXPECT_TRUE(conn.healthy());
    daemon.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

// Guards "never leak a descriptor": extra SCM_RIGHTS fds on a reply, fds on a reply that
// should have none, and fds on an error reply are all closed.
TEST(ClientStaging, UnexpectedDescriptorsAreClosed) {
  const std::size_t fds_before = open_fd_count();
  {
    FakeDaemon daemon([](FakePeer& peer) {
      peer.handshake();
      auto r = peer.expect(wire::RequestBody::OpenStaging);
      const int a = make_memfd(4096);
      const int b = make_memfd(4096);
      const int c = make_memfd(4096);
      reply_staging(peer, r.request->id(), 1, 4096, {a, b, c});
      ::close(a);
      ::close(b);
      ::close(c);

      r = peer.expect(wire::RequestBody::Ping);  // a reply with an fd but no flag
      const int d = make_memfd(64);
      {
        flatbuffers::FlatBufferBuilder fb;
        peer.reply_ok(r.request->id(), wire::ReplyBody::PingReply, fb, wire::CreatePingReply(fb, 1),
                      protocol::kFlagNone, {d});
      }
      ::close(d);

      r = peer.expect(wire::RequestBody::OpenStaging);  // an error reply carrying an fd
      const int e = make_memfd(64);
      {
        flatbuffers::FlatBufferBuilder fb;
        fb.Finish(wire::CreateReply(fb, r.request->id(), wire::Status::pool_exhausted,
                                    fb.CreateString("no staging memory left")));
        peer.send(fb, protocol::kFlagFdAttached, {e});
      }
      ::close(e);

      const auto close = peer.expect(wire::RequestBody::CloseStaging);
      flatbuffers::FlatBufferBuilder fb;
      peer.reply_ok(close.request->id(), wire::ReplyBody::CloseStagingReply, fb,
                    wire::CreateCloseStagingReply(fb));
    });
    auto conn = sc::Connection::connect(options_for(daemon));
    {
      auto staging = conn.open_staging(4096);
      EXPECT_EQ(staging.size(), 4096u);
      EXPECT_NO_THROW((void)conn.ping());
      try {
        (void)conn.open_staging(64);
        FAIL();
      } catch (const sc::Error& e) {
        EXPECT_EQ(e.status(), statepool::Status::pool_exhausted);
      }
      EXPECT_TRUE(conn.healthy());
    }
    daemon.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

TEST(ClientStaging, FdFlagWithoutDescriptorIsABadFrame) {
  const std::size_t fds_before = open_fd_count();
  {
    FakeDaemon daemon([](FakePeer& peer) {
      peer.handshake();
      const auto r = peer.expect(wire::RequestBody::OpenStaging);
      reply_staging(peer, r.request->id(), 1, 4096, {});
    });
    auto conn = sc::Connection::connect(options_for(daemon));
    try {
      (void)conn.open_staging(4096);
      FAIL();
    } catch (const sc::ConnectionError& e) {
      EXPECT_EQ(e.kind(), Kind::bad_frame);
      EXPECT_EQ(e.status(), statepool::Status::protocol_error);
    }
    EXPECT_FALSE(conn.healthy());
    daemon.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

TEST(ClientArena, RegistersTheLayoutAndMapsPagesWithTheirCodec) {
  const std::size_t fds_before = open_fd_count();
  {
    FakeDaemon daemon([](FakePeer& peer) {
      peer.handshake();
      auto r = peer.expect(wire::RequestBody::RegisterLayout);
      const sk::PageCodec codec(
          protocol::from_wire(*r.request->body_as_RegisterLayout()->layout()).layout);
      EXPECT_EQ(codec.layout().name, "small");
      {
        flatbuffers::FlatBufferBuilder b;
        peer.reply_ok(r.request->id(), wire::ReplyBody::RegisterLayoutReply, b,
                      wire::CreateRegisterLayoutReply(b, 11, codec.page_bytes(), codec.fp32_bytes(),
                                                      codec.staged_bytes(sk::DType::f32),
                                                      codec.staged_bytes(sk::DType::bf16)));
      }
      r = peer.expect(wire::RequestBody::OpenArena);
      EXPECT_EQ(r.request->body_as_OpenArena()->layout_id(), 11u);
      EXPECT_EQ(r.request->body_as_OpenArena()->pages(), 3u);
      const std::size_t stride = (codec.page_bytes() + 255) / 256 * 256;
      const int memfd = make_memfd(3 * stride);
      for (unsigned char page = 0; page < 3; ++page) {
        const unsigned char marker = static_cast<unsigned char>(0xA0 + page);
        EXPECT_EQ(::pwrite(memfd, &marker, 1, static_cast<off_t>(page * stride)), 1);
      }
      {
        flatbuffers::FlatBufferBuilder b;
        peer.reply_ok(r.request->id(), wire::ReplyBody::OpenArenaReply, b,
                      wire::CreateOpenArenaReplyDirect(b, 4, 3 * stride, codec.page_bytes(), stride,
                                                       3, "host", true),
                      protocol::kFlagFdAttached, {memfd});
      }
      ::close(memfd);
      r = peer.expect(wire::RequestBody::Allocate);
      reply_allocate(peer, r.request->id(), {2});
      EXPECT_EQ(serve_free(peer, 4), std::vector<std::uint32_t>{2});
    });
    auto conn = sc::Connection::connect(options_for(daemon));
    const auto info = conn.register_layout(small_layout());
    EXPECT_EQ(info.id, 11u);
    EXPECT_EQ(info.layout.name, "small");
    EXPECT_GT(info.page_bytes, 0u);
    EXPECT_EQ(info.state_bytes(sk::DType::f32), info.state_bytes_f32);
    {
      auto arena = conn.open_arena(info, 3);
      EXPECT_EQ(arena.id(), 4u);
      EXPECT_EQ(arena.layout_id(), 11u);
      EXPECT_EQ(arena.backend(), "host");
      EXPECT_TRUE(arena.created());
      EXPECT_TRUE(arena.mapped());
      EXPECT_EQ(arena.page_count(), 3u);
      EXPECT_EQ(arena.page_stride() % 256, 0u);
      ASSERT_TRUE(arena.has_codec());
      EXPECT_EQ(arena.codec().page_bytes(), arena.page_bytes());
      for (sc::SlotId s = 0; s < 3; ++s) {
        const auto page = arena.page(s);
        EXPECT_EQ(page.size(), arena.page_bytes());
        EXPECT_EQ(static_cast<unsigned char>(page[0]), 0xA0 + s);
      }
      EXPECT_THROW((void)arena.page(3), std::out_of_range);

      auto slots = conn.allocate(arena, 1);
      ASSERT_EQ(slots.size(), 1u);
      EXPECT_EQ(slots[0].arena_id(), 4u);
      EXPECT_EQ(static_cast<unsigned char>(arena.page(slots[0])[0]), 0xA2);
      auto foreign = conn.adopt(5, 0);
      EXPECT_THROW((void)arena.page(foreign), std::invalid_argument);
      (void)foreign.release();

      sc::Arena moved = std::move(arena);
      EXPECT_TRUE(moved.mapped());
      EXPECT_FALSE(arena.mapped());  // NOLINT(bugprone-use-after-move): documented state
    }
    daemon.join();
  }
  EXPECT_EQ(open_fd_count(), fds_before);
}

// ---------------------------------------------------------------------------------------
// Slots

// The reply's memory descriptor, not the backend's name, decides how memory is mapped:
// device memory is left to the engine's CUDA context (its descriptor kept, nothing
// mmap'd), a legacy IPC handle comes without a descriptor.
TEST(ClientArena, DeviceMemoryIsDescribedNotMappedWhenTheClientSaysSo) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const int vmm_fd = make_memfd(4096);  // stands in for a CUDA VMM POSIX descriptor
    auto r = peer.expect(wire::RequestBody::OpenArena);
    {
      flatbuffers::FlatBufferBuilder b;
      const auto memory = wire::CreateMemoryDescriptor(b, wire::MemorySpace::device, 1,
                                                       wire::HandleKind::cuda_vmm_fd, 2 << 20);
      peer.reply_ok(
          r.request->id(), wire::ReplyBody::OpenArenaReply, b,
          wire::CreateOpenArenaReplyDirect(b, 7, 2 << 20, 1000, 1024, 2, "cuda", true, memory),
          protocol::kFlagFdAttached, {vmm_fd});
    }
    ::close(vmm_fd);
    r = peer.expect(wire::RequestBody::OpenArena);
    {
      flatbuffers::FlatBufferBuilder b;
      std::vector<std::uint8_t> handle(64);
      for (std::size_t i = 0; i < handle.size(); ++i) handle[i] = static_cast<std::uint8_t>(i);
      const auto memory = wire::CreateMemoryDescriptorDirect(
          b, wire::MemorySpace::device, 0, wire::HandleKind::cuda_ipc, 2 << 20, &handle);
      peer.reply_ok(
          r.request->id(), wire::ReplyBody::OpenArenaReply, b,
          wire::CreateOpenArenaReplyDirect(b, 8, 2 << 20, 1000, 1024, 2, "cuda", true, memory));
    }
    r = peer.expect(wire::RequestBody::OpenArena);
    {  // a descriptor kind that needs a descriptor, without one
      flatbuffers::FlatBufferBuilder b;
      const auto memory = wire::CreateMemoryDescriptor(b, wire::MemorySpace::device, 0,
                                                       wire::HandleKind::cuda_vmm_fd, 2 << 20);
      peer.reply_ok(
          r.request->id(), wire::ReplyBody::OpenArenaReply, b,
          wire::CreateOpenArenaReplyDirect(b, 9, 2 << 20, 1000, 1024, 2, "cuda", true, memory));
    }
    reply_ping(peer, peer.expect(wire::RequestBody::Ping).request->id());
  });
  sc::Options options = options_for(daemon);
  options.map_device_memory = false;
  auto conn = sc::Connection::connect(options);
  {
    const sc::Arena vmm = conn.open_arena(41, 2);
    EXPECT_EQ(vmm.backend(), "cuda");
    EXPECT_FALSE(vmm.mapped()) << "device memory is never mmap'd by the client";
    EXPECT_EQ(vmm.device_data(), nullptr);
    EXPECT_THROW((void)vmm.device_page(0), std::logic_error);
    EXPECT_TRUE(vmm.data().empty());
    EXPECT_EQ(vmm.memory().space, sk::MemorySpace::device);
    EXPECT_EQ(vmm.memory().device, 1);
    EXPECT_EQ(vmm.memory().handle_kind, sk::HandleKind::cuda_vmm_fd);
    EXPECT_EQ(vmm.memory().granularity, std::size_t{2} << 20);
    EXPECT_GE(vmm.fd(), 0) << "the VMM descriptor is kept for the engine to import";
    EXPECT_THROW((void)vmm.page(0), std::logic_error);
  }
  {
    const sc::Arena ipc = conn.open_arena(42, 2);
    EXPECT_FALSE(ipc.mapped());
    EXPECT_EQ(ipc.fd(), -1);
    EXPECT_EQ(ipc.memory().handle_kind, sk::HandleKind::cuda_ipc);
    EXPECT_EQ(ipc.memory().ipc_handle[63], std::byte{63});
  }
  try {
    (void)conn.open_arena(43, 2);
    FAIL() << "expected an inconsistent-reply error";
  } catch (const sc::ConnectionError& e) {
    FAIL() << "not a transport failure: " << e.what();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::internal);
    EXPECT_NE(std::string(e.what()).find("no file descriptor"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(conn.healthy());
  (void)conn.ping();
}

TEST(ClientArena, DeviceMemoryThatCannotBeMappedIsAClearErrorAndLegacyIpcIsAsked) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    // A memfd is no CUDA VMM descriptor: importing it fails (no driver, or the driver
    // refuses it), and the client must say so, naming the way out.
    const int fake_fd = make_memfd(4096);
    auto r = peer.expect(wire::RequestBody::OpenArena);
    EXPECT_TRUE(r.request->body_as_OpenArena()->legacy_ipc());
    {
      flatbuffers::FlatBufferBuilder b;
      const auto memory = wire::CreateMemoryDescriptor(b, wire::MemorySpace::device, 0,
                                                       wire::HandleKind::cuda_vmm_fd, 2 << 20);
      peer.reply_ok(
          r.request->id(), wire::ReplyBody::OpenArenaReply, b,
          wire::CreateOpenArenaReplyDirect(b, 7, 2 << 20, 1000, 1024, 2, "cuda", true, memory),
          protocol::kFlagFdAttached, {fake_fd});
    }
    ::close(fake_fd);
    reply_ping(peer, peer.expect(wire::RequestBody::Ping).request->id());
  });
  sc::Options options = options_for(daemon);
  options.legacy_ipc = true;
  auto conn = sc::Connection::connect(options);
  try {
    (void)conn.open_arena(41, 2);
    FAIL() << "expected a mapping error";
  } catch (const sc::ConnectionError& e) {
    FAIL() << "not a transport failure: " << e.what();
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::internal);
    EXPECT_NE(std::string(e.what()).find("map_device_memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("arena 7"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(conn.healthy());
  (void)conn.ping();
}

TEST(ClientSlots, FreedOnDestructionUnlessReleasedAndBatchFreed) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    auto r = peer.expect(wire::RequestBody::Allocate);
    EXPECT_EQ(r.request->body_as_Allocate()->count(), 3u);
    reply_allocate(peer, r.request->id(), {4, 5, 6});
    // slot 4 released; 5 and 6 freed one by one when the vector dies
    EXPECT_EQ(serve_free(peer, 1), std::vector<std::uint32_t>{5});
    EXPECT_EQ(serve_free(peer, 1), std::vector<std::uint32_t>{6});
    EXPECT_EQ(serve_free(peer, 1), std::vector<std::uint32_t>{4});  // free by id
    r = peer.expect(wire::RequestBody::Allocate);
    reply_allocate(peer, r.request->id(), {7, 8});
    EXPECT_EQ(serve_free(peer, 1), (std::vector<std::uint32_t>{7, 8}));  // one batch
    EXPECT_TRUE(peer.wait_for_eof());
  });
  {
    auto conn = sc::Connection::connect(options_for(daemon));
    sc::SlotId kept = 0;
    {
      auto slots = conn.allocate(1, 3);
      ASSERT_EQ(slots.size(), 3u);
      kept = slots[0].release();
      EXPECT_FALSE(slots[0].valid());
      EXPECT_THROW((void)slots[0].release(), std::logic_error);
    }
    EXPECT_EQ(kept, 4u);
    const sc::SlotId ids[] = {kept};
    EXPECT_EQ(conn.free(1, ids), 1u);
    auto batch = conn.allocate(1, 2);
    EXPECT_EQ(conn.free(batch), 2u);
    EXPECT_FALSE(batch[0].valid());
    EXPECT_FALSE(batch[1].valid());
  }
  daemon.join();
}

TEST(ClientSlots, SlotOutlivesItsConnectionObject) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Allocate);
    reply_allocate(peer, r.request->id(), {9});
    EXPECT_EQ(serve_free(peer, 2), std::vector<std::uint32_t>{9});
    EXPECT_TRUE(peer.wait_for_eof());  // the socket closes with the last Slot
  });
  sc::Slot slot;
  {
    auto conn = sc::Connection::connect(options_for(daemon));
    slot = std::move(conn.allocate(2, 1).front());
  }
  EXPECT_TRUE(slot.valid());
  EXPECT_EQ(slot.id(), 9u);
  slot = sc::Slot();  // frees through the shared connection state
  daemon.join();
}

TEST(ClientSlots, DataRequestsCarryTheirFields) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    auto r = peer.expect(wire::RequestBody::Compress);
    const auto* c = r.request->body_as_Compress();
    EXPECT_EQ(c->arena_id(), 3u);
    EXPECT_EQ(c->slot(), 1u);
    EXPECT_EQ(c->staging_id(), 8u);
    EXPECT_EQ(c->offset(), 4096u);
    EXPECT_EQ(c->dtype(), wire::DType::bf16);
    ASSERT_NE(c->after(), nullptr);  // the engine's event, byte for byte
    ASSERT_EQ(c->after()->size(), 64u);
    EXPECT_EQ(c->after()->Get(0), 0x01);
    EXPECT_EQ(c->after()->Get(63), 0x40);
    EXPECT_FALSE(c->event());
    {
      flatbuffers::FlatBufferBuilder b;
      peer.reply_ok(r.request->id(), wire::ReplyBody::CompressReply, b,
                    wire::CreateCompressReply(b, 1234));
    }
    r = peer.expect(wire::RequestBody::Decompress);
    const auto* d = r.request->body_as_Decompress();
    EXPECT_EQ(d->arena_id(), 3u);
    EXPECT_EQ(d->slot(), 2u);
    EXPECT_EQ(d->dtype(), wire::DType::f32);
    EXPECT_EQ(d->after(), nullptr);  // none asked for
    {
      flatbuffers::FlatBufferBuilder b;
      peer.reply_ok(r.request->id(), wire::ReplyBody::DecompressReply, b,
                    wire::CreateDecompressReply(b, 5678));
    }
    r = peer.expect(wire::RequestBody::Copy);
    EXPECT_EQ(r.request->body_as_Copy()->src_slot(), 1u);
    EXPECT_EQ(r.request->body_as_Copy()->dst_slot(), 2u);
    ASSERT_NE(r.request->body_as_Copy()->after(), nullptr);
    EXPECT_EQ(r.request->body_as_Copy()->after()->size(), 64u);
    // An empty reply table may be sent without its union body.
    flatbuffers::FlatBufferBuilder b;
    b.Finish(wire::CreateReply(b, r.request->id()));
    peer.send(b);
    r = peer.expect(wire::RequestBody::Drain);
    flatbuffers::FlatBufferBuilder b2;
    peer.reply_ok(r.request->id(), wire::ReplyBody::DrainReply, b2, wire::CreateDrainReply(b2));
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  sc::IpcEventBytes event{};
  for (std::size_t i = 0; i < event.size(); ++i) event[i] = static_cast<std::byte>(i + 1);
  EXPECT_EQ(conn.compress(3, 1, 8, 4096, sk::DType::bf16, event), 1234u);
  EXPECT_EQ(conn.decompress(3, 2, 8, 0), 5678u);
  auto a = conn.adopt(3, 1);
  auto b = conn.adopt(3, 2);
  conn.copy(a, b, event);
  (void)a.release();
  (void)b.release();
  conn.drain();
}

TEST(ClientStats, MirrorsTheReply) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Stats);
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<wire::ArenaStats>> arenas{wire::CreateArenaStatsDirect(
        b, 1, "team-a", 2, "qwen", wire::CodecId::int6, "host", 1000, 1024, 8, 2, 8192, 10000)};
    std::vector<flatbuffers::Offset<wire::TenantStats>> tenants{
        wire::CreateTenantStatsDirect(b, "team-a", 1 << 20, 8192, 2, 2000, 10000)};
    peer.reply_ok(
        r.request->id(), wire::ReplyBody::StatsReply, b,
        wire::CreateStatsReplyDirect(b, &arenas, &tenants, 3, 2, 1, 17, 1 << 30, 8192, 12.5));
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  const sc::Stats s = conn.stats();
  ASSERT_EQ(s.arenas.size(), 1u);
  ASSERT_EQ(s.tenants.size(), 1u);
  const auto& a = s.arenas[0];
  EXPECT_EQ(a.arena_id, 1u);
  EXPECT_EQ(a.tenant, "team-a");
  EXPECT_EQ(a.layout_name, "qwen");
  EXPECT_EQ(a.codec, sk::CodecId::int6);
  EXPECT_EQ(a.pages_total, 8u);
  EXPECT_EQ(a.pages_used, 2u);
  EXPECT_EQ(a.stored_bytes_used(), 2000u);
  EXPECT_DOUBLE_EQ(a.compression_ratio(), 5.0);
  EXPECT_EQ(s.tenants[0].quota_bytes, 1u << 20);
  EXPECT_DOUBLE_EQ(s.tenants[0].compression_ratio(), 5.0);
  EXPECT_EQ(s.clients_connected, 3u);
  EXPECT_EQ(s.leases_active, 2u);
  EXPECT_EQ(s.leases_orphaned, 1u);
  EXPECT_EQ(s.pages_reclaimed_total, 17u);
  EXPECT_EQ(s.pool_capacity_bytes, 1u << 30);
  EXPECT_DOUBLE_EQ(s.uptime_seconds, 12.5);
}

// ---------------------------------------------------------------------------------------
// Transport failures: always a ConnectionError, never a hang

TEST(ClientTransport, DaemonClosingMidReplyIsAConnectionError) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    (void)peer.expect(wire::RequestBody::Ping);
    const char half[8] = {'S', 'P', 'L', '1', 1, 0, 2, 0};
    peer.send_raw(half, sizeof half);
  });  // the fd closes when the script returns
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::closed) << e.what();
    EXPECT_NE(std::string(e.what()).find("reconnect"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(conn.healthy());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((void)conn.ping(), sc::ConnectionError);  // at once, no I/O
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
}

// Guards MSG_NOSIGNAL: writing to a socket the daemon closed must not kill the process.
TEST(ClientTransport, WritingToAClosedDaemonIsAConnectionErrorNotSigpipe) {
  FakeDaemon daemon([](FakePeer& peer) { peer.handshake(); });
  auto conn = sc::Connection::connect(options_for(daemon));
  daemon.join();  // the daemon side is closed now
  for (int i = 0; i < 3 && conn.healthy(); ++i) {
    EXPECT_THROW((void)conn.ping(), sc::ConnectionError);
  }
  EXPECT_FALSE(conn.healthy());
}

TEST(ClientTransport, GarbageIsABadFrame) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    (void)peer.expect(wire::RequestBody::Ping);
    const char garbage[16] = "HTTP/1.1 200 OK";
    peer.send_raw(garbage, sizeof garbage);
    EXPECT_TRUE(peer.wait_for_eof());
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::bad_frame);
    EXPECT_EQ(e.status(), statepool::Status::protocol_error);
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(conn.healthy());  // and the socket was closed: the daemon saw EOF
}

TEST(ClientTransport, PayloadThatDoesNotVerifyIsABadFrame) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    (void)peer.expect(wire::RequestBody::Ping);
    const std::vector<std::uint8_t> junk(64, 0xFF);
    const std::string frame = protocol::make_frame(protocol::FrameType::reply, 0, junk);
    peer.send_raw(frame.data(), frame.size());
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::bad_frame);
  }
}

TEST(ClientTransport, WrongReplyIdOrBodyIsABadFrame) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Ping);
    reply_ping(peer, r.request->id() + 5);
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::bad_frame);
    EXPECT_NE(std::string(e.what()).find("reply to request"), std::string::npos) << e.what();
  }

  FakeDaemon daemon2([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Allocate);
    reply_ping(peer, r.request->id());  // right id, wrong body
  });
  auto conn2 = sc::Connection::connect(options_for(daemon2));
  try {
    (void)conn2.allocate(1, 1);
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::bad_frame);
    EXPECT_NE(std::string(e.what()).find("PingReply"), std::string::npos) << e.what();
  }
}

TEST(ClientTransport, ReplyLargerThanTheClientsLimitIsRefusedWithAHint) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Stats);
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<wire::TenantStats>> tenants;
    for (int i = 0; i < 100; ++i) {
      tenants.push_back(wire::CreateTenantStatsDirect(b, ("tenant-" + std::to_string(i)).c_str()));
    }
    peer.reply_ok(r.request->id(), wire::ReplyBody::StatsReply, b,
                  wire::CreateStatsReplyDirect(b, nullptr, &tenants));
  });
  auto options = options_for(daemon);
  options.max_reply_bytes = 1024;
  auto conn = sc::Connection::connect(options);
  try {
    (void)conn.stats();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::bad_frame);
    EXPECT_NE(std::string(e.what()).find("max_reply_bytes"), std::string::npos) << e.what();
  }
}

TEST(ClientTransport, SilentDaemonTimesOut) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    (void)peer.expect(wire::RequestBody::Ping);
    EXPECT_TRUE(peer.wait_for_eof());  // never answers; sees the client give up
  });
  auto conn = sc::Connection::connect(options_for(daemon, std::chrono::milliseconds(200)));
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)conn.ping();
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::timed_out);
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::milliseconds(150));
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  EXPECT_FALSE(conn.healthy());
  daemon.join();
}

TEST(ClientTransport, SilentDaemonDuringHelloTimesOut) {
  FakeDaemon daemon([](FakePeer& peer) {
    (void)peer.expect(wire::RequestBody::Hello);
    EXPECT_TRUE(peer.wait_for_eof());
  });
  try {
    (void)sc::Connection::connect(options_for(daemon, std::chrono::milliseconds(200)));
    FAIL();
  } catch (const sc::ConnectionError& e) {
    EXPECT_EQ(e.kind(), Kind::timed_out);
  }
}

TEST(ClientTransport, BestEffortDestructorsDoNothingOnABrokenConnection) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    const auto r = peer.expect(wire::RequestBody::Allocate);
    reply_allocate(peer, r.request->id(), {1, 2});
  });  // then the daemon goes away
  auto conn = sc::Connection::connect(options_for(daemon));
  auto slots = conn.allocate(1, 2);
  daemon.join();
  EXPECT_THROW((void)conn.ping(), sc::ConnectionError);
  const auto start = std::chrono::steady_clock::now();
  slots.clear();  // must neither throw nor wait
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
}

TEST(ClientTransport, MovedFromConnectionThrows) {
  FakeDaemon daemon([](FakePeer& peer) { peer.handshake(); });
  auto conn = sc::Connection::connect(options_for(daemon));
  auto other = std::move(conn);
  EXPECT_TRUE(other.healthy());
  EXPECT_FALSE(conn.healthy());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_THROW((void)conn.ping(), sc::ConnectionError);
}

// ---------------------------------------------------------------------------------------
// Threads

TEST(ClientThreads, ConcurrentCallsAreSerializedOnOneConnection) {
  constexpr int kThreads = 4;
  constexpr int kCalls = 50;
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    std::set<std::uint64_t> ids;
    for (int i = 0; i < kThreads * kCalls; ++i) {
      const auto r = peer.expect(wire::RequestBody::Ping);
      EXPECT_TRUE(ids.insert(r.request->id()).second) << "request id reused";
      reply_ping(peer, r.request->id());
    }
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        try {
          (void)conn.ping();
          ++ok;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kCalls);
}

TEST(ClientNames, ConnectionErrorKinds) {
  EXPECT_STREQ(sc::to_string(Kind::timed_out), "timed_out");
  EXPECT_STREQ(sc::to_string(Kind::bad_frame), "bad_frame");
  const sc::ConnectionError e(Kind::io_error, "x");
  EXPECT_EQ(e.status(), statepool::Status::internal);
}
