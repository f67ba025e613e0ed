#pragma once
// A raw Unix-socket peer for tests that must send what no well-behaved client would
// (framed requests built by hand, garbage, half frames), and read the daemon's replies.
//
// Thread-safety: a RawPeer belongs to one thread.

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "statepool/protocol/frame.hpp"

namespace statepool::testing {

class RawPeer {
 public:
  explicit RawPeer(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  [[nodiscard]] bool connected() const { return connected_; }
  [[nodiscard]] int fd() const { return fd_; }

  bool send_bytes(const void* data, std::size_t n) {
    return ::send(fd_, data, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
  }
  bool send_frame(const flatbuffers::FlatBufferBuilder& b, std::uint32_t flags = 0) {
    const auto frame = protocol::make_frame(protocol::FrameType::request, flags,
                                            {b.GetBufferPointer(), b.GetSize()});
    return send_bytes(frame.data(), frame.size());
  }

  /// Reads one reply frame; nullopt when the daemon closed the connection (or timeout).
  /// The returned bytes are the verified payload.
  std::optional<std::vector<std::byte>> read_reply(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::array<std::byte, protocol::kHeaderBytes> head{};
    if (!read_exact(head.data(), head.size(), timeout)) return std::nullopt;
    const auto header = protocol::decode_header(head);
    if (protocol::check_header(header, protocol::FrameType::reply, protocol::kAbsoluteMaxPayload) !=
        protocol::FrameError::none)
      return std::nullopt;
    std::vector<std::byte> payload(header.length);
    if (!read_exact(payload.data(), payload.size(), timeout)) return std::nullopt;
    return payload;
  }

  /// Waits until the daemon has read every byte sent (nothing left in this socket's send
  /// queue, SIOCOUTQ); false when it has not within the timeout.
  bool wait_until_read(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int unread = -1;
      if (::ioctl(fd_, SIOCOUTQ, &unread) == 0 && unread == 0) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  /// True when the daemon has closed its end (EOF within the timeout).
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    char c;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

 private:
  bool read_exact(std::byte* out, std::size_t n, std::chrono::milliseconds timeout) {
    std::size_t got = 0;
    while (got < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
      const ssize_t r = ::recv(fd_, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
};

inline const wire::Reply* as_reply(const std::vector<std::byte>& payload) {
  protocol::FrameError error = protocol::FrameError::none;
  return protocol::verify_reply(payload, error);
}

}  // namespace statepool::testing
