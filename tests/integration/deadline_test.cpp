// --io-timeout against a real statepoold (docs/protocol.md, 5.2 and 5.5): it limits the
// time to receive a frame once its first byte has arrived and the time to write a reply
// the socket did not take at once, never the time a request waits for the executor or
// runs. And a drain closes idle connections only once the listener is closed.
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace protocol = statepool::protocol;
namespace wire = statepool::wire;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using statepool::testing::RawPeer;
using namespace std::chrono_literals;

namespace {

std::string request_frame(std::uint64_t id, wire::RequestBody type, flatbuffers::Offset<void> body,
                          flatbuffers::FlatBufferBuilder& b) {
  b.Finish(wire::CreateRequest(b, id, type, body));
  return protocol::make_frame(protocol::FrameType::request, 0, {b.GetBufferPointer(), b.GetSize()});
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
std::uint64_t ok_reply_id(RawPeer& peer, wire::ReplyBody type) {
  const auto reply = peer.read_reply();
  if (!reply) return 0;
  const auto* r = statepool::testing::as_reply(*reply);
  return r != nullptr && r->status() == wire::Status::ok && r->body_type() == type ? r->id() : 0;
}

// A raw connection that has said Hello.
std::unique_ptr<RawPeer> attached_peer(const DaemonProcess& daemon) {
  auto peer = std::make_unique<RawPeer>(daemon.socket_path());
  if (!peer->connected()) return nullptr;
  const std::string hello = hello_frame(1);
  if (!peer->send_bytes(hello.data(), hello.size())) return nullptr;
  if (ok_reply_id(*peer, wire::ReplyBody::HelloReply) != 1u) return nullptr;
  return peer;
}

bool log_has(const DaemonProcess& daemon, const std::string& text) {
  return daemon.log().find(text) != std::string::npos;
}

}  // namespace

// The reported failure: with one worker and a short --io-timeout, clients whose compress
// waited in the executor's queue lost their connection without a reply, though the work
// was done. Every request that arrived is answered, however long it queued and ran.
TEST(IoTimeout, NeverCutsOffARequestThatQueuesOrRunsLongerThanIt) {
  DaemonProcess daemon({"--io-timeout", "10ms", "--workers", "1", "--threads", "2"});
  kernels::StateLayout layout;
  layout.name = "deadline-large";
  layout.num_layers = 16;
  layout.num_heads = 16;
  layout.key_dim = 128;
  layout.value_dim = 128;  // 16 MiB of FP32 per state
  layout.codec.id = kernels::CodecId::int6;

  constexpr int kClients = 16;
  client::Options options = client_options(daemon);
  options.timeout = 120s;
  std::vector<client::Connection> connections;
  std::vector<client::Arena> arenas;
  std::vector<client::Staging> stagings;
  std::vector<client::Slot> slots;
  for (int i = 0; i < kClients; ++i) {
    connections.push_back(client::Connection::connect(options));
    auto& conn = connections.back();
    const auto registered = conn.register_layout(layout);
    arenas.push_back(conn.open_arena(registered, kClients));
    stagings.push_back(conn.open_staging(registered.state_bytes_f32));
    const auto values = statepool::synthetic::gaussian_values(
        registered.state_bytes_f32 / sizeof(float), 100 + i, 0.05f);
    std::memcpy(stagings.back().bytes().data(), values.data(), registered.state_bytes_f32);
    auto allocated = conn.allocate(arenas.back(), 1);
    slots.push_back(std::move(allocated.at(0)));
  }

  std::barrier start(kClients);
  std::vector<std::string> errors(kClients);
  std::vector<std::chrono::milliseconds> took(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      const auto begun = std::chrono::steady_clock::now();
      try {
        connections[i].compress(slots[i], stagings[i], 0);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      took[i] = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - begun);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(errors[i], "") << "client " << i;
  // The boundary was crossed: one worker ran sixteen compresses of 16 MiB one after
  // another (256 MiB of states: about 30 ms at 9 GB/s), so the last reply came well after
  // --io-timeout.
  EXPECT_GT(*std::max_element(took.begin(), took.end()), 10ms);
  EXPECT_FALSE(log_has(daemon, "timed out")) << daemon.log();
  // Every connection is still usable.
  for (auto& conn : connections) EXPECT_GT(conn.ping().count(), 0);
  slots.clear();
  EXPECT_EQ(daemon.stop(SIGTERM, 30s), 0) << daemon.log();
}

// A frame whose bytes arrive in pieces is served when the last one comes within
// --io-timeout of the first, and cut off, with the log line of docs/protocol.md 5.2,
// when it does not.
TEST(IoTimeout, LimitsTheTimeToReceiveAFrameFromItsFirstByte) {
  DaemonProcess daemon({"--io-timeout", "1s"});
  const std::string ping = ping_frame(5);
  const std::size_t first = protocol::kHeaderBytes + 2;

  auto in_time = attached_peer(daemon);
  ASSERT_NE(in_time, nullptr);
  ASSERT_TRUE(in_time->send_bytes(ping.data(), first));
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(in_time->send_bytes(ping.data() + first, ping.size() - first));
  EXPECT_EQ(ok_reply_id(*in_time, wire::ReplyBody::PingReply), 5u);

  auto too_late = attached_peer(daemon);
  ASSERT_NE(too_late, nullptr);
  ASSERT_TRUE(too_late->send_bytes(ping.data(), first));
  EXPECT_TRUE(too_late->closed_by_peer(10s));
  EXPECT_TRUE(log_has(daemon, "timed out after 1000 ms inside a frame; closing")) << daemon.log();
  // The deadline belonged to that frame: the served connection has none left running.
  std::this_thread::sleep_for(1200ms);
  EXPECT_GT(client::Connection::connect(client_options(daemon)).ping().count(), 0);
  const std::string again = ping_frame(6);
  ASSERT_TRUE(in_time->send_bytes(again.data(), again.size()));
  EXPECT_EQ(ok_reply_id(*in_time, wire::ReplyBody::PingReply), 6u);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

// A client that sends requests and never reads their replies: once its socket is full,
// the reply being written has --io-timeout to go out, then the connection is closed.
TEST(IoTimeout, LimitsTheTimeToWriteAReplyTheClientDoesNotRead) {
  DaemonProcess daemon({"--io-timeout", "200ms"});
  auto peer = attached_peer(daemon);
  ASSERT_NE(peer, nullptr);
  const int small = 4096;
  ASSERT_EQ(::setsockopt(peer->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  // Far more replies than the socket buffers hold; sent without blocking: once the daemon
  // stops reading, this side's send buffer fills too.
  std::string burst;
  for (std::uint64_t id = 10; id < 20'010; ++id) burst += ping_frame(id);
  std::size_t sent = 0;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (sent < burst.size() && !log_has(daemon, "writing a reply") &&
         std::chrono::steady_clock::now() < deadline) {
    const ssize_t n =
        ::send(peer->fd(), burst.data() + sent, burst.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0)
      sent += static_cast<std::size_t>(n);
    else
      std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(eventually([&] { return log_has(daemon, "writing a reply"); }, 20s)) << daemon.log();
  EXPECT_TRUE(log_has(daemon, "timed out after 200 ms writing a reply; closing"));
  // What was written can still be read, then EOF: fewer replies than requests.
  std::size_t replies = 0;
  while (peer->read_reply(5s)) ++replies;
  EXPECT_GT(replies, 0u);
  EXPECT_LT(replies, 20'000u);
  EXPECT_GT(client::Connection::connect(client_options(daemon)).ping().count(), 0);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

// The drain closes a connection with nothing to serve only once the listener is closed:
// a client that sees EOF and reconnects at once is refused (ECONNREFUSED), never served
// by the draining daemon. Many clients, each pinging in a loop until its connection
// ends and then reconnecting at once, as an engine's client does; another connection
// keeps the drain going meanwhile (half a request).
TEST(Drain, ClientsThatReconnectAtEofAreRefused) {
  constexpr int kClients = 32;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    DaemonProcess daemon({"--drain-timeout", "20s", "--threads", "2"});
    std::vector<std::unique_ptr<RawPeer>> peers;
    for (int i = 0; i < kClients; ++i) {
      peers.push_back(attached_peer(daemon));
      ASSERT_NE(peers.back(), nullptr);
    }
    auto busy = attached_peer(daemon);
    ASSERT_NE(busy, nullptr);
    const std::string ping = ping_frame(2);
    const std::size_t first = protocol::kHeaderBytes + 2;
    ASSERT_TRUE(busy->send_bytes(ping.data(), first));
    ASSERT_TRUE(busy->wait_until_read());

    std::atomic<int> closed{0};
    std::atomic<int> reconnected{0};
    std::atomic<int> pinging{0};
    std::vector<int> errors(kClients, 0);
    std::vector<std::thread> clients;
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        RawPeer& peer = *peers[i];
        ++pinging;
        for (std::uint64_t id = 10;; ++id) {
          const std::string frame = ping_frame(id);
          if (!peer.send_bytes(frame.data(), frame.size())) break;
          if (ok_reply_id(peer, wire::ReplyBody::PingReply) != id) break;
        }
        ++closed;
        const RawPeer again(daemon.socket_path());
        errors[i] = errno;
        if (again.connected()) ++reconnected;
      });
    }
    ASSERT_TRUE(eventually([&] { return pinging.load() == kClients; }, 10s));
    ASSERT_EQ(::kill(daemon.pid(), SIGTERM), 0);
    for (auto& t : clients) t.join();
    EXPECT_EQ(closed.load(), kClients);
    EXPECT_EQ(reconnected.load(), 0) << "clients reconnected to a draining daemon";
    for (int i = 0; i < kClients; ++i)
      EXPECT_EQ(errors[i], ECONNREFUSED) << i << ": " << std::strerror(errors[i]);
    // The daemon was still draining: the request in flight is answered.
    ASSERT_TRUE(busy->send_bytes(ping.data() + first, ping.size() - first));
    EXPECT_EQ(ok_reply_id(*busy, wire::ReplyBody::PingReply), 2u);
    EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
  }
}
