// HostBackend: zeroed shared memory that a peer maps through the fd, sealed against
// resizing, errors classified (shortage -> pool_exhausted).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include "backend/memory.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

/// A second, independent mapping of a share fd: what a client does after SCM_RIGHTS.
class PeerMapping {
 public:
  PeerMapping(int fd, std::size_t size) : size_(size) {
    addr_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ~PeerMapping() {
    if (addr_ != MAP_FAILED) ::munmap(addr_, size_);
  }
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  [[nodiscard]] bool ok() const { return addr_ != MAP_FAILED; }
  [[nodiscard]] std::byte* data() const { return static_cast<std::byte*>(addr_); }

 private:
  void* addr_ = MAP_FAILED;
  std::size_t size_;
};

TEST(UniqueFd, ClosesOnDestructionAndMoves) {
  int raw = ::memfd_create("unique-fd-test", MFD_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd a(raw);
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    EXPECT_EQ(b.get(), raw);
    UniqueFd c;
    c = std::move(b);
    EXPECT_EQ(c.get(), raw);
    EXPECT_EQ(::fcntl(raw, F_GETFD), FD_CLOEXEC);
  }
  errno = 0;
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  raw = ::memfd_create("unique-fd-test", MFD_CLOEXEC);
  ASSERT_GE(raw, 0);
  UniqueFd d(raw);
  EXPECT_EQ(d.release(), raw);
  EXPECT_FALSE(d);
  EXPECT_EQ(::close(raw), 0);  // release() handed ownership back
}

TEST(HostBackend, AllocatesZeroedMemoryOfTheRequestedSize) {
  HostBackend backend;
  EXPECT_EQ(backend.name(), "host");
  auto memory = backend.allocate(1 << 20, "test-zeroed");
  ASSERT_NE(memory, nullptr);
  const auto bytes = memory->bytes();
  ASSERT_EQ(bytes.size(), 1u << 20);
  for (const std::byte b : bytes) ASSERT_EQ(b, std::byte{0});
  struct stat st {};
  ASSERT_EQ(::fstat(memory->share_fd(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  EXPECT_EQ(::fcntl(memory->share_fd(), F_GETFD), FD_CLOEXEC);
}

TEST(HostBackend, PeerMappingSeesTheSameBytes) {
  HostBackend backend;
  auto memory = backend.allocate(64 << 10, "test-peer");
  PeerMapping peer(memory->share_fd(), 64 << 10);
  ASSERT_TRUE(peer.ok()) << std::strerror(errno);
  memory->bytes()[12345] = std::byte{0x5a};
  EXPECT_EQ(peer.data()[12345], std::byte{0x5a});
  peer.data()[777] = std::byte{0xa5};
  EXPECT_EQ(memory->bytes()[777], std::byte{0xa5});
}

TEST(HostBackend, ShareFdIsSealedAgainstResizing) {
  HostBackend backend;
  auto memory = backend.allocate(8192, "test-sealed");
  const int fd = memory->share_fd();
  const int seals = ::fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  EXPECT_EQ(seals & F_SEAL_WRITE, 0);  // clients must be able to write pages

  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 1 << 20), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);  // nobody can freeze the arena
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(memory->bytes().size(), 8192u);
  memory->bytes()[8191] = std::byte{1};  // still mapped and writable
}

TEST(HostBackend, ZeroBytesIsInvalid) {
  HostBackend backend;
  try {
    (void)backend.allocate(0, "test-zero");
    FAIL() << "expected StatusError";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
  }
}

TEST(HostBackend, LongOrOddLabelsAreAccepted) {
  HostBackend backend;
  std::string label(1000, 'x');
  label[10] = '\0';
  auto memory = backend.allocate(4096, label);
  EXPECT_EQ(memory->bytes().size(), 4096u);
}

// Guards the error classification: a size the system refuses is pool_exhausted (the
// operator can act on it), with the errno text in the message. RLIMIT_FSIZE makes
// ftruncate fail with EFBIG without touching real memory.
TEST(HostBackend, RefusedSizeIsPoolExhausted) {
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct sigaction ignore {};
  struct sigaction old_action {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);

  HostBackend backend;
  bool threw = false;
  try {
    (void)backend.allocate(4 << 20, "test-too-big");
  } catch (const StatusError& e) {
    threw = true;
    EXPECT_EQ(e.status(), Status::pool_exhausted);
    EXPECT_NE(std::string(e.what()).find("ftruncate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test-too-big"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &old_action, nullptr), 0);
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace statepool::service
