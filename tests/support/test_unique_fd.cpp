// support::UniqueFd and support::duplicate: the one descriptor owner of statepool.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::support {
namespace {

bool is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

int new_fd() {
  const int fd = ::memfd_create("support-unique-fd-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0) << errno_text(errno);
  return fd;
}

TEST(UniqueFd, ClosesOnDestruction) {
  const int raw = new_fd();
  { const UniqueFd owner(raw); }
  EXPECT_FALSE(is_open(raw));
  EXPECT_EQ(errno, EBADF);
}

TEST(UniqueFd, EmptyByDefault) {
  const UniqueFd none;
  EXPECT_FALSE(none.valid());
  EXPECT_FALSE(none);
  EXPECT_EQ(none.get(), -1);
}

TEST(UniqueFd, MovesOwnership) {
  const int raw = new_fd();
  UniqueFd a(raw);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b.get(), raw);
  const int other = new_fd();
  UniqueFd c(other);
  c = std::move(b);  // closes what c held
  EXPECT_EQ(c.get(), raw);
  EXPECT_FALSE(is_open(other));
  EXPECT_TRUE(is_open(raw));
  auto& same = c;
  c = std::move(same);  // self-move keeps the descriptor
  EXPECT_EQ(c.get(), raw);
  EXPECT_TRUE(is_open(raw));
}

TEST(UniqueFd, ReleaseGivesUpWithoutClosing) {
  const int raw = new_fd();
  UniqueFd owner(raw);
  EXPECT_EQ(owner.release(), raw);
  EXPECT_FALSE(owner);
  EXPECT_TRUE(is_open(raw));
  EXPECT_EQ(::close(raw), 0);
}

TEST(UniqueFd, ResetClosesTheOldOne) {
  const int first = new_fd();
  const int second = new_fd();
  UniqueFd owner(first);
  owner.reset(second);
  EXPECT_FALSE(is_open(first));
  EXPECT_EQ(owner.get(), second);
  owner.reset(second);  // the same descriptor again: kept open
  EXPECT_TRUE(is_open(second));
  owner.reset();
  EXPECT_FALSE(owner);
  EXPECT_FALSE(is_open(second));
}

TEST(UniqueFd, CloseReportsAndEmpties) {
  UniqueFd owner(new_fd());
  const int raw = owner.get();
  EXPECT_TRUE(owner.close());
  EXPECT_FALSE(owner);
  EXPECT_FALSE(is_open(raw));
  EXPECT_TRUE(owner.close());  // nothing left to close
}

TEST(Duplicate, GivesASecondCloexecDescriptor) {
  const int raw = ::memfd_create("support-dup-test", 0);  // without CLOEXEC on purpose
  ASSERT_GE(raw, 0);
  const UniqueFd original(raw);
  ASSERT_EQ(::fcntl(raw, F_GETFD) & FD_CLOEXEC, 0);
  const UniqueFd copy = duplicate(raw);
  ASSERT_TRUE(copy);
  EXPECT_NE(copy.get(), raw);
  EXPECT_EQ(::fcntl(copy.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  // The same open file: a write through one is seen through the other.
  ASSERT_EQ(::write(raw, "x", 1), 1);
  EXPECT_EQ(::lseek(copy.get(), 0, SEEK_CUR), 1);
}

TEST(Duplicate, ThrowsForABadDescriptor) {
  EXPECT_THROW((void)duplicate(-1), std::system_error);
}

TEST(ErrnoText, NamesTheError) {
  EXPECT_STREQ(errno_text(ENOENT), "No such file or directory");
  EXPECT_STREQ(errno_text(123456), "unknown error");
}

}  // namespace
}  // namespace statepool::support
