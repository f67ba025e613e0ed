#include "statepool/support/fd_passing.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace statepool::support {

ssize_t send_with_fds(int socket, std::span<const std::byte> bytes, std::span<const int> fds,
                      int flags) noexcept {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)];
  if (!fds.empty()) {
    if (fds.size() > kMaxFdsPerRead) {
      errno = EINVAL;
      return -1;
    }
    std::memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(socket, &msg, flags);
}

ssize_t recv_with_fds(int socket, std::span<std::byte> out, std::vector<UniqueFd>& fds, int flags) {
  return recv_with_fds(socket, out, {}, fds, flags);
}

ssize_t recv_with_fds(int socket, std::span<std::byte> first, std::span<std::byte> second,
                      std::vector<UniqueFd>& fds, int flags) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)];
  iovec iov[2] = {{first.data(), first.size()}, {second.data(), second.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = second.empty() ? 1 : 2;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  // Own every descriptor at once (a local vector first: none leaks if push_back throws).
  std::vector<UniqueFd> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      UniqueFd owned(fd);
      received.push_back(std::move(owned));
    }
  }
  for (auto& fd : received) fds.push_back(std::move(fd));
  return n;
}

}  // namespace statepool::support
