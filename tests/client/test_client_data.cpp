// The data requests' two forms against a scripted fake daemon: the waiting form
// (compress, decompress, copy) and the *_async form are one request apart only in its
// `event` flag; only the *_async form reads the reply's event.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/testing/gtest/fake_daemon.hpp"

namespace sc = statepool::client;
namespace sk = statepool::kernels;
namespace wire = statepool::wire;
using statepool::testing::FakeDaemon;
using statepool::testing::FakePeer;

namespace {

sc::Options options_for(const FakeDaemon& daemon) {
  sc::Options o;
  o.socket_path = daemon.path();
  o.client_name = "unit-test";
  o.timeout = std::chrono::milliseconds(3000);
  return o;
}

// An event whose byte i is i + seed.
std::vector<std::uint8_t> event_bytes(std::size_t size, std::uint8_t seed) {
  std::vector<std::uint8_t> out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::uint8_t>(i + seed);
  return out;
}

sc::IpcEventBytes ipc_event(std::uint8_t seed) {
  sc::IpcEventBytes out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i + seed);
  return out;
}

}  // namespace

TEST(ClientData, AsyncFormsAskForAnEventAndReturnIt) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    auto r = peer.expect(wire::RequestBody::Compress);
    const auto* c = r.request->body_as_Compress();
    EXPECT_TRUE(c->event());  // the other fields as compress() sends them
    EXPECT_EQ(c->offset(), 64u);
    ASSERT_NE(c->after(), nullptr);
    EXPECT_EQ(c->after()->Get(0), 5);
    {
      flatbuffers::FlatBufferBuilder b;
      const auto event = event_bytes(64, 1);
      peer.reply_ok(r.request->id(), wire::ReplyBody::CompressReply, b,
                    wire::CreateCompressReplyDirect(b, 1234, &event));
    }
    r = peer.expect(wire::RequestBody::Decompress);
    EXPECT_TRUE(r.request->body_as_Decompress()->event());
    EXPECT_EQ(r.request->body_as_Decompress()->after(), nullptr);
    {
      flatbuffers::FlatBufferBuilder b;  // a host daemon: done already, no event
      peer.reply_ok(r.request->id(), wire::ReplyBody::DecompressReply, b,
                    wire::CreateDecompressReply(b, 5678));
    }
    r = peer.expect(wire::RequestBody::Copy);
    EXPECT_TRUE(r.request->body_as_Copy()->event());
    EXPECT_EQ(r.request->body_as_Copy()->src_slot(), 1u);
    EXPECT_EQ(r.request->body_as_Copy()->dst_slot(), 2u);
    {
      flatbuffers::FlatBufferBuilder b;
      const auto event = event_bytes(64, 9);
      peer.reply_ok(r.request->id(), wire::ReplyBody::CopyReply, b,
                    wire::CreateCopyReplyDirect(b, &event));
    }
    r = peer.expect(wire::RequestBody::Copy);
    {
      flatbuffers::FlatBufferBuilder b;  // an empty reply table may come without its body
      b.Finish(wire::CreateReply(b, r.request->id()));
      peer.send(b);
    }
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  const sc::Pending compressed = conn.compress_async(3, 1, 8, 64, sk::DType::bf16, ipc_event(5));
  EXPECT_EQ(compressed.bytes, 1234u);
  ASSERT_TRUE(compressed.event.has_value());
  EXPECT_EQ(*compressed.event, ipc_event(1));

  const sc::Pending decompressed = conn.decompress_async(3, 2, 8, 0);
  EXPECT_EQ(decompressed.bytes, 5678u);
  EXPECT_FALSE(decompressed.event.has_value());

  const sc::Pending copied = conn.copy_async(3, 1, 2);
  EXPECT_EQ(copied.bytes, 0u);
  ASSERT_TRUE(copied.event.has_value());
  EXPECT_EQ(*copied.event, ipc_event(9));

  const sc::Pending bare = conn.copy_async(3, 1, 2);
  EXPECT_EQ(bare.bytes, 0u);
  EXPECT_FALSE(bare.event.has_value());
  daemon.join();
}

// An event of the wrong size is an inconsistent reply for the *_async form; the waiting
// form never reads the reply's event.
TEST(ClientData, OnlyTheAsyncFormReadsTheReplysEvent) {
  FakeDaemon daemon([](FakePeer& peer) {
    peer.handshake();
    for (const bool async : {false, true}) {
      const auto r = peer.expect(wire::RequestBody::Compress);
      EXPECT_EQ(r.request->body_as_Compress()->event(), async);
      flatbuffers::FlatBufferBuilder b;
      const auto event = event_bytes(3, 0);
      peer.reply_ok(r.request->id(), wire::ReplyBody::CompressReply, b,
                    wire::CreateCompressReplyDirect(b, 77, &event));
    }
  });
  auto conn = sc::Connection::connect(options_for(daemon));
  EXPECT_EQ(conn.compress(1, 2, 3, 0), 77u);
  try {
    (void)conn.compress_async(1, 2, 3, 0);
    ADD_FAILURE() << "an IPC event of 3 bytes was accepted";
  } catch (const sc::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::internal);
    EXPECT_NE(std::string(e.what()).find("an IPC event of 3 bytes (expected 64)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(conn.healthy());
  daemon.join();
}
