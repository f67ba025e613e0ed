// Descriptor passing: what is sent arrives, close-on-exec, with the first byte; extras
// are owned (and so closed) by the receiver; bad input is an error, not a crash.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

#include "statepool/support/fd_passing.hpp"

namespace statepool::support {
namespace {

struct Pair {
  UniqueFd a, b;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

TEST(FdPassing, DescriptorsTravelWithTheFirstByteAndArriveCloseOnExec) {
  Pair p;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);  // not close-on-exec on this side
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  const std::array<int, 2> send = {read_end.get(), write_end.get()};
  const std::string text = "hello";
  ASSERT_EQ(send_with_fds(p.a.get(), std::as_bytes(std::span(text)), send, MSG_NOSIGNAL), 5);

  std::array<std::byte, 16> buffer{};
  std::vector<UniqueFd> got;
  ASSERT_EQ(recv_with_fds(p.b.get(), buffer, got, 0), 5);
  ASSERT_EQ(got.size(), 2u);
  for (const auto& fd : got) EXPECT_EQ(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  // The received write end writes into our pipe.
  ASSERT_EQ(::write(got[1].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(FdPassing, APlainSendCarriesNoDescriptorAndEndOfStreamIsZero) {
  Pair p;
  const std::string text = "ab";
  ASSERT_EQ(send_with_fds(p.a.get(), std::as_bytes(std::span(text)), {}, MSG_NOSIGNAL), 2);
  std::array<std::byte, 2> buffer{};
  std::vector<UniqueFd> got;
  ASSERT_EQ(recv_with_fds(p.b.get(), buffer, got, 0), 2);
  EXPECT_TRUE(got.empty());
  p.a.reset();
  EXPECT_EQ(recv_with_fds(p.b.get(), buffer, got, 0), 0);
}

TEST(FdPassing, TooManyDescriptorsAndBadSocketsAreErrors) {
  Pair p;
  std::vector<int> many(kMaxFdsPerRead + 1, p.a.get());
  const std::byte one{};
  errno = 0;
  EXPECT_EQ(send_with_fds(p.a.get(), {&one, 1}, many, MSG_NOSIGNAL), -1);
  EXPECT_EQ(errno, EINVAL);
  std::vector<UniqueFd> got;
  std::byte buffer{};
  errno = 0;
  EXPECT_EQ(recv_with_fds(-1, {&buffer, 1}, got, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(send_with_fds(-1, {&one, 1}, {}, MSG_NOSIGNAL), -1);
}

}  // namespace
}  // namespace statepool::support
