#include "handover/transfer.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/fd_passing.hpp"

namespace statepool::service::handover {
namespace {

constexpr std::array<std::byte, 4> kMagic = {std::byte{'S'}, std::byte{'P'}, std::byte{'H'},
                                             std::byte{'O'}};
constexpr std::size_t kHeaderBytes = 16;

const char* kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::request: return "request";
    case MessageKind::descriptors: return "descriptors";
    case MessageKind::state: return "state";
    case MessageKind::verdict: return "verdict";
    case MessageKind::refusal: return "refusal";
  }
  return "unknown";
}

void put_le(std::byte* out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

std::uint64_t get_le(const std::byte* in, std::size_t bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    value |= std::uint64_t{std::to_integer<std::uint8_t>(in[i])} << (8 * i);
  return value;
}

/// Waits until the socket is ready for `events` or the deadline passes (HandoverError).
void wait_for(int socket, short events, Deadline deadline, const char* doing) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw HandoverError(std::string("timed out ") + doing);
    pollfd p{socket, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (n > 0) return;
    if (n < 0 && errno != EINTR) {
      throw HandoverError(std::string("poll while ") + doing + ": " + support::errno_text(errno));
    }
  }
}

void send_all(int socket, std::span<const std::byte> bytes, std::span<const int> fds,
              Deadline deadline) {
  bool fds_sent = fds.empty();
  while (!bytes.empty() || !fds_sent) {
    wait_for(socket, POLLOUT, deadline, "sending to the other statepoold");
    const ssize_t n = support::send_with_fds(socket, bytes, fds_sent ? std::span<const int>{} : fds,
                                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw HandoverError(std::string("sending to the other statepoold: ") +
                          support::errno_text(errno));
    }
    fds_sent = true;
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

/// Reads exactly `out.size()` bytes, collecting descriptors into `fds`.
void receive_all(int socket, std::span<std::byte> out, std::vector<support::UniqueFd>& fds,
                 Deadline deadline) {
  while (!out.empty()) {
    wait_for(socket, POLLIN, deadline, "waiting for the other statepoold");
    const ssize_t n = support::recv_with_fds(socket, out, fds, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw HandoverError(std::string("receiving from the other statepoold: ") +
                          support::errno_text(errno));
    }
    if (n == 0) throw HandoverError("the other statepoold closed the hand-over connection");
    out = out.subspan(static_cast<std::size_t>(n));
  }
}

std::string text_of(const Message& message) {
  return {reinterpret_cast<const char*>(message.body.data()), message.body.size()};
}

}  // namespace

void send_message(int socket, MessageKind kind, std::span<const std::byte> body,
                  std::span<const int> fds, Deadline deadline) {
  if (fds.size() > kFdsPerMessage || (!fds.empty() && kind != MessageKind::descriptors)) {
    throw HandoverError("descriptors only ride on descriptors messages, at most 16 each");
  }
  std::array<std::byte, kHeaderBytes> header{};
  std::copy(kMagic.begin(), kMagic.end(), header.begin());
  put_le(header.data() + 4, static_cast<std::uint16_t>(kind), 2);
  put_le(header.data() + 8, body.size(), 8);
  send_all(socket, header, fds, deadline);
  send_all(socket, body, {}, deadline);
}

void send_text(int socket, MessageKind kind, const std::string& text, Deadline deadline) {
  send_message(socket, kind, std::as_bytes(std::span(text)), {}, deadline);
}

Message receive_message(int socket, std::uint64_t max_body, Deadline deadline) {
  Message message;
  std::array<std::byte, kHeaderBytes> header{};
  receive_all(socket, header, message.fds, deadline);
  if (!std::equal(kMagic.begin(), kMagic.end(), header.begin()) ||
      get_le(header.data() + 6, 2) != 0) {
    throw HandoverError("the other side does not speak the hand-over protocol");
  }
  const auto kind = get_le(header.data() + 4, 2);
  if (kind < static_cast<std::uint64_t>(MessageKind::request) ||
      kind > static_cast<std::uint64_t>(MessageKind::refusal)) {
    throw HandoverError("hand-over message of unknown kind " + std::to_string(kind));
  }
  message.kind = static_cast<MessageKind>(kind);
  const std::uint64_t length = get_le(header.data() + 8, 8);
  if (length > max_body) {
    throw HandoverError(std::string("hand-over ") + kind_name(message.kind) + " message of " +
                        std::to_string(length) + " bytes, more than the " +
                        std::to_string(max_body) + " allowed");
  }
  message.body.resize(static_cast<std::size_t>(length));
  receive_all(socket, message.body, message.fds, deadline);
  if (!message.fds.empty() &&
      (message.kind != MessageKind::descriptors || message.fds.size() > kFdsPerMessage)) {
    throw HandoverError(std::string("descriptors attached to a hand-over ") +
                        kind_name(message.kind) + " message");
  }
  return message;
}

void send_state(int socket, std::span<const NamedFd> fds, std::span<const std::byte> image,
                Deadline deadline) {
  for (std::size_t at = 0; at < fds.size(); at += kFdsPerMessage) {
    const std::size_t count = std::min(kFdsPerMessage, fds.size() - at);
    std::string names;
    std::vector<int> batch;
    for (std::size_t i = at; i < at + count; ++i) {
      names += fds[i].name + "\n";
      batch.push_back(fds[i].fd);
    }
    send_message(socket, MessageKind::descriptors, std::as_bytes(std::span(names)), batch,
                 deadline);
  }
  send_message(socket, MessageKind::state, image, {}, deadline);
}

ReceivedState receive_state(int socket, std::size_t max_fds, std::uint64_t max_image,
                            Deadline deadline) {
  ReceivedState out;
  for (;;) {
    Message message = receive_message(socket, max_image, deadline);
    switch (message.kind) {
      case MessageKind::refusal:
        throw HandoverError("the running statepoold refused to hand over: " + text_of(message));
      case MessageKind::state: out.image = std::move(message.body); return out;
      case MessageKind::descriptors: {
        std::vector<std::string> names;
        const std::string text = text_of(message);
        for (std::size_t at = 0; at < text.size();) {
          const std::size_t end = text.find('\n', at);
          if (end == std::string::npos || end - at > 64) {
            throw HandoverError("descriptors message with malformed names");
          }
          names.push_back(text.substr(at, end - at));
          at = end + 1;
        }
        if (names.size() != message.fds.size()) {
          throw HandoverError(std::to_string(message.fds.size()) + " descriptors arrived with " +
                              std::to_string(names.size()) + " names");
        }
        if (out.fds.size() + names.size() > max_fds) {
          throw HandoverError("more than " + std::to_string(max_fds) + " descriptors offered");
        }
        for (std::size_t i = 0; i < names.size(); ++i) {
          out.fds.emplace_back(std::move(names[i]), std::move(message.fds[i]));
        }
        break;
      }
      default:
        throw HandoverError(std::string("unexpected hand-over ") + kind_name(message.kind) +
                            " message");
    }
  }
}

support::UniqueFd connect(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) throw HandoverError("hand-over socket path too long");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  support::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw HandoverError(std::string("socket: ") + support::errno_text(errno));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    const std::string what = "no statepoold hands over on " + path + " (" +
                             support::errno_text(err) +
                             "): is one running with this --socket / --handover-socket?";
    if (err == ENOENT || err == ECONNREFUSED) throw NoPredecessor(what);
    throw HandoverError(what);
  }
  return fd;
}

}  // namespace statepool::service::handover
