#include "transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/fd_passing.hpp"

namespace statepool::client::detail {
namespace {

using Kind = ConnectionError::Kind;

using support::errno_text;

[[noreturn]] void throw_closed(const char* what) {
  throw ConnectionError(
      Kind::closed, std::string("statepoold closed the connection while the client was ") + what +
                        " (the daemon stopped, or it dropped this client after an "
                        "error: see its log); reconnect");
}

[[noreturn]] void throw_io(int err, const char* what) {
  if (err == EPIPE || err == ECONNRESET) throw_closed(what);
  throw ConnectionError(Kind::io_error,
                        std::string("socket error while ") + what + ": " + errno_text(err));
}

[[noreturn]] void throw_timeout(const char* what) {
  throw ConnectionError(Kind::timed_out,
                        std::string("timed out ") + what +
                            " (statepoold is hung or overloaded, or Options::timeout is too "
                            "short); the connection is closed, reconnect");
}

// Waits until `events` are ready on fd or the deadline passes.
void wait_for(int fd, short events, const Deadline& deadline, const char* what) {
  for (;;) {
    pollfd p{};
    p.fd = fd;
    p.events = events;
    const int rc = ::poll(&p, 1, deadline.poll_ms());
    if (rc > 0) return;  // ready, or HUP/ERR: the next read/write reports it
    if (rc == 0) throw_timeout(what);
    if (errno != EINTR) throw_io(errno, what);
  }
}

void set_nonblocking_cloexec(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw ConnectionError(Kind::io_error,
                          std::string("fcntl(O_NONBLOCK) failed: ") + errno_text(errno));
  }
  const int fd_flags = ::fcntl(fd, F_GETFD);
  if (fd_flags < 0 || ::fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) < 0) {
    throw ConnectionError(Kind::io_error,
                          std::string("fcntl(FD_CLOEXEC) failed: ") + errno_text(errno));
  }
}

std::string connect_hint(int err) {
  switch (err) {
    case ENOENT:
    case ECONNREFUSED:
      return " — is statepoold running, and is this its socket (--socket / socket_path)?";
    case EACCES:
    case EPERM:
      return " — the socket's mode/group does not let this user in; ask the operator to add "
             "you to the daemon's socket group";
    case ENOTDIR: return " — a component of the path is not a directory";
    case EAGAIN: return " — statepoold's accept queue is full (daemon overloaded or hung)";
    default: return "";
  }
}

}  // namespace

Deadline Deadline::after(std::chrono::milliseconds timeout) noexcept {
  Deadline d;
  if (timeout.count() > 0) {
    d.infinite = false;
    d.at = Clock::now() + timeout;
  }
  return d;
}

int Deadline::poll_ms() const noexcept {
  if (infinite) return -1;
  const auto left = at - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > 1000 * 1000 * 1000 ? 1000 * 1000 * 1000 : static_cast<int>(ms);
}

UniqueFd connect_unix(const std::string& path, std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const bool abstract = !path.empty() && path.front() == '@';
  if (path.empty()) {
    throw ConnectionError(Kind::connect_failed, "cannot connect: the socket path is empty");
  }
  if (path.size() >= sizeof(addr.sun_path)) {
    throw ConnectionError(Kind::connect_failed,
                          "cannot connect to " + path + ": the path is " +
                              std::to_string(path.size()) + " bytes, Unix sockets allow at most " +
                              std::to_string(sizeof(addr.sun_path) - 1) + " — use a shorter path");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (abstract) addr.sun_path[0] = '\0';
  const auto addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (abstract ? 0 : 1));

  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    throw ConnectionError(Kind::connect_failed,
                          std::string("cannot create a Unix socket: ") + errno_text(errno));
  }
  // A blocking AF_UNIX connect waits for room in the listener's backlog for at most
  // SO_SNDTIMEO; then it fails with EAGAIN. The socket turns non-blocking afterwards.
  if (timeout.count() > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  int rc = 0;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), addr_len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    const Kind kind = err == EAGAIN ? Kind::timed_out : Kind::connect_failed;
    throw ConnectionError(kind,
                          "cannot connect to " + path + ": " + errno_text(err) + connect_hint(err));
  }
  timeval none{};
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  set_nonblocking_cloexec(fd.get());
  return fd;
}

void prepare_socket(int fd) {
  set_nonblocking_cloexec(fd);
}

void send_frame(int fd, std::span<const std::byte> head, std::span<const std::byte> body,
                const Deadline& deadline, int attach) {
  std::size_t sent = 0;
  const std::size_t total = head.size() + body.size();
  while (sent < total) {
    iovec iov[2]{};
    int iov_count = 0;
    if (sent < head.size()) {
      iov[iov_count].iov_base = const_cast<std::byte*>(head.data() + sent);
      iov[iov_count].iov_len = head.size() - sent;
      ++iov_count;
      iov[iov_count].iov_base = const_cast<std::byte*>(body.data());
      iov[iov_count].iov_len = body.size();
      ++iov_count;
    } else {
      const std::size_t off = sent - head.size();
      iov[iov_count].iov_base = const_cast<std::byte*>(body.data() + off);
      iov[iov_count].iov_len = body.size() - off;
      ++iov_count;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(iov_count);
    // A descriptor goes with the frame's first bytes (the header, alone), once.
    const ssize_t n = attach >= 0 && sent == 0
                          ? support::send_with_fds(fd, head, std::span<const int>(&attach, 1),
                                                   MSG_NOSIGNAL | MSG_DONTWAIT)
                          : ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_for(fd, POLLOUT, deadline, "sending a request");
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    throw_io(n < 0 ? errno : EPIPE, "sending a request");
  }
}

void wait_readable(int fd, const Deadline& deadline, const char* what) {
  wait_for(fd, POLLIN, deadline, what);
}

std::size_t recv_some(int fd, std::span<std::byte> first, std::span<std::byte> second,
                      std::vector<UniqueFd>& fds, const Deadline& deadline, const char* what) {
  for (;;) {
    const ssize_t n = support::recv_with_fds(fd, first, second, fds, MSG_DONTWAIT);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n == 0) throw_closed(what);
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(fd, POLLIN, deadline, what);
      continue;
    }
    if (errno != EINTR) throw_io(errno, what);
  }
}

void recv_exact(int fd, std::span<std::byte> out, std::vector<UniqueFd>& fds,
                const Deadline& deadline, const char* what) {
  std::size_t got = 0;
  while (got < out.size()) {
    // Descriptors are owned (appended to `fds`) as they arrive, so none leaks whatever
    // happens next.
    const ssize_t n = support::recv_with_fds(fd, out.subspan(got), fds, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_for(fd, POLLIN, deadline, what);
        continue;
      }
      if (errno == EINTR) continue;
      throw_io(errno, what);
    }
    if (n == 0) throw_closed(what);
    got += static_cast<std::size_t>(n);
  }
}

}  // namespace statepool::client::detail
