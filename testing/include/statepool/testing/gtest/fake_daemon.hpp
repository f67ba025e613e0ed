#pragma once
// A scripted stand-in for statepoold, for client tests that need no daemon: it listens on
// a Unix socket in a fresh temporary directory, accepts one connection on its own thread
// and runs a script against it. The script reads requests and writes replies (with file
// descriptors when asked) through FakePeer. Every wait is bounded, so a broken client
// makes a test fail, never hang.
//
// GoogleTest only (header-only): the script runs on its own thread, where an exception
// cannot reach the test, so a failing script reports with ADD_FAILURE, and expect()
// checks with EXPECT_EQ.

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "statepool/testing/fds.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/fd_passing.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::testing {

/// Thrown inside a script when the client went away or took too long; ends the script.
struct PeerGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One request as received: its payload (kept alive) and the verified root.
struct ReceivedRequest {
  std::vector<std::byte> payload;
  const wire::Request* request = nullptr;
  std::uint32_t flags = 0;
};

/// The daemon side of one accepted connection.
class FakePeer {
 public:
  explicit FakePeer(int fd) : fd_(fd) {}

  [[nodiscard]] int fd() const { return fd_; }

  /// Reads one request frame (5 s limit) and verifies it.
  ReceivedRequest read() {
    std::array<std::byte, protocol::kHeaderBytes> head{};
    read_exact(head.data(), head.size());
    const auto header = protocol::decode_header(head);
    const auto error =
        protocol::check_header(header, protocol::FrameType::request, protocol::kDefaultMaxPayload);
    if (error != protocol::FrameError::none) {
      throw std::runtime_error(std::string("fake daemon: bad request header: ") +
                               protocol::to_string(error));
    }
    ReceivedRequest r;
    r.flags = header.flags;
    r.payload.resize(header.length);
    read_exact(r.payload.data(), r.payload.size());
    protocol::FrameError verify_error = protocol::FrameError::none;
    r.request = protocol::verify_request(r.payload, verify_error);
    if (r.request == nullptr) throw std::runtime_error("fake daemon: request does not verify");
    return r;
  }

  /// Reads one request and checks its type.
  ReceivedRequest expect(wire::RequestBody type) {
    auto r = read();
    EXPECT_EQ(r.request->body_type(), type)
        << "got " << protocol::request_name(r.request->body_type()) << ", expected "
        << protocol::request_name(type);
    return r;
  }

  /// Sends a finished Reply buffer as one frame; `fds` ride along as SCM_RIGHTS on the
  /// frame's first byte, and `flags` is the header's flag word.
  void send(const flatbuffers::FlatBufferBuilder& b, std::uint32_t flags = protocol::kFlagNone,
            const std::vector<int>& fds = {}) {
    const std::string frame = protocol::make_frame(protocol::FrameType::reply, flags,
                                                   {b.GetBufferPointer(), b.GetSize()});
    send_raw(frame.data(), frame.size(), fds);
  }

  void send_raw(const void* data, std::size_t size, const std::vector<int>& fds = {}) {
    const ssize_t n =
        support::send_with_fds(fd_, {static_cast<const std::byte*>(data), size}, fds, MSG_NOSIGNAL);
    if (n < 0) throw PeerGone("fake daemon: send failed");
    if (static_cast<std::size_t>(n) < size) {
      send_all(static_cast<const char*>(data) + n, size - static_cast<std::size_t>(n));
    }
  }

  /// Replies ok with a HelloReply to a Hello just read.
  void reply_hello(const ReceivedRequest& hello, const std::string& token = "token-1",
                   bool resumed = false, std::uint32_t resumed_slots = 0, std::uint16_t version = 1,
                   std::uint32_t max_frame_bytes = protocol::kDefaultMaxPayload) {
    flatbuffers::FlatBufferBuilder b;
    const auto body =
        wire::CreateHelloReplyDirect(b, version, token.c_str(), resumed, resumed_slots,
                                     "fake-statepoold 0", 30000, max_frame_bytes);
    b.Finish(wire::CreateReply(b, hello.request->id(), wire::Status::ok, 0,
                               wire::ReplyBody::HelloReply, body.Union()));
    send(b);
  }

  /// Reads a Hello and accepts it.
  void handshake() { reply_hello(expect(wire::RequestBody::Hello)); }

  /// Replies with an error status and message, no body.
  void reply_error(std::uint64_t id, Status status, const std::string& message) {
    flatbuffers::FlatBufferBuilder b;
    b.Finish(wire::CreateReply(b, id, protocol::to_wire(status), b.CreateString(message)));
    send(b);
  }

  /// Replies ok with a body built by `build`.
  template <class Body>
  void reply_ok(std::uint64_t id, wire::ReplyBody type, flatbuffers::FlatBufferBuilder& b,
                flatbuffers::Offset<Body> body, std::uint32_t flags = protocol::kFlagNone,
                const std::vector<int>& fds = {}) {
    b.Finish(wire::CreateReply(b, id, wire::Status::ok, 0, type, body.Union()));
    send(b, flags, fds);
  }

  /// Waits (5 s) until the client closes its end; returns true on EOF.
  bool wait_for_eof() {
    char byte = 0;
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      const ssize_t n = ::recv(fd_, &byte, 1, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

 private:
  void read_exact(std::byte* out, std::size_t size) {
    std::size_t got = 0;
    while (got < size) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) throw PeerGone("fake daemon: timed out reading");
      const ssize_t n = ::recv(fd_, out + got, size - got, 0);
      if (n <= 0) throw PeerGone("fake daemon: client closed");
      got += static_cast<std::size_t>(n);
    }
  }

  void send_all(const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
      if (n <= 0) throw PeerGone("fake daemon: send failed");
      data += n;
      size -= static_cast<std::size_t>(n);
    }
  }

  int fd_;
};

/// Listens on <tmpdir>/d.sock; serves one connection with `script` on a thread.
class FakeDaemon {
 public:
  using Script = std::function<void(FakePeer&)>;

  /// `abstract`: listen on a Linux abstract socket ("@name") instead of a path.
  explicit FakeDaemon(Script script, bool abstract = false) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socklen_t addr_len = sizeof(addr);
    if (abstract) {
      static std::atomic<int> counter{0};
      path_ =
          "@statepool-client-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
      std::memcpy(addr.sun_path, path_.data(), path_.size());
      addr.sun_path[0] = '\0';
      addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_.size());
    } else {
      dir_.emplace("/tmp/statepool-client-test");  // short: sun_path holds 108 bytes
      path_ = dir_->file("d.sock");
      std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    }
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
        ::listen(listener_, 4) != 0) {
      throw std::runtime_error("fake daemon: bind/listen failed");
    }
    thread_ = std::thread([this, script = std::move(script)] {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return;  // the test never connected
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      FakePeer peer(fd);
      try {
        script(peer);
      } catch (const PeerGone&) {
        // the client left early: the test's own assertions say whether that was expected
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
      }
      ::close(fd);
    });
  }

  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  ~FakeDaemon() { join(); }

  /// Waits for the script to finish and removes the socket.
  void join() {
    if (thread_.joinable()) thread_.join();
    if (listener_ >= 0) ::close(listener_);
    listener_ = -1;
    dir_.reset();
  }

  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::optional<TempDir> dir_;  // none for an abstract socket
  std::string path_;
  int listener_ = -1;
  std::thread thread_;
};

}  // namespace statepool::testing
