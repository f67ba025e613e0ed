// The memory-resource conformance suite (memory_resource_conformance.hpp) for the host
// memfd resource and for each adaptor over it (a limit that is not reached, tracking);
// tests/gpu/test_cuda_memory_gpu.cpp instantiates it for the CUDA resource. Host-specific
// and adaptor-specific behaviour follows the suite.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memory/host_memfd.hpp"
#include "memory/limiting.hpp"
#include "memory/tracking.hpp"
#include "memory_resource_conformance.hpp"
#include "statepool/support/fd_passing.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

// --- helpers ----------------------------------------------------------------------------

/// Makes ftruncate of a memfd beyond 1 MiB fail with EFBIG (no real memory is touched).
class FileSizeLimit {
 public:
  FileSizeLimit() {
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_), 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    EXPECT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action_), 0);
    struct rlimit limited = saved_;
    limited.rlim_cur = 1 << 20;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::sigaction(SIGXFSZ, &old_action_, nullptr);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit saved_ {};
  struct sigaction old_action_ {};
};

/// Sends `fd` over a socketpair to a forked child, which maps it as a client would, checks
/// that it sees `expect` at every byte, writes `reply` everywhere and exits 0 (else 1..5).
/// Returns the child's exit status.
int share_fd_with_child(int fd, std::size_t bytes, std::byte expect, std::byte reply) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pair[0]);
    std::byte byte{};
    std::vector<support::UniqueFd> received;
    if (support::recv_with_fds(pair[1], {&byte, 1}, received, 0) != 1) ::_exit(1);
    if (received.size() != 1) ::_exit(2);
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, received[0].get(), 0);
    if (addr == MAP_FAILED) ::_exit(3);
    auto* data = static_cast<std::byte*>(addr);
    for (std::size_t i = 0; i < bytes; ++i) {
      if (data[i] != expect) ::_exit(4);
    }
    std::memset(data, std::to_integer<int>(reply), bytes);
    if (::munmap(addr, bytes) != 0) ::_exit(5);
    ::_exit(0);
  }
  ::close(pair[1]);
  const std::byte byte{1};
  const bool sent =
      support::send_with_fds(pair[0], {&byte, 1}, std::span<const int>(&fd, 1), MSG_NOSIGNAL) == 1;
  ::close(pair[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!sent) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

// --- the implementations under test ------------------------------------------------------
// Each traits type owns a resource (and its upstream), says how to make it refuse an
// allocation with pool_exhausted, reads and writes the memory it gives and shares it with
// a child process (memory_resource_conformance.hpp describes the traits).

struct HostTraits {
  HostMemfdResource host;
  static std::string unavailable() { return {}; }
  MemoryResource& resource() { return host; }
  /// A size the resource refuses while the returned guard lives.
  static std::size_t refused_bytes() { return 4 << 20; }
  static std::unique_ptr<FileSizeLimit> refuse() { return std::make_unique<FileSizeLimit>(); }
  static void fill(const Allocation& a, std::byte value) {
    std::memset(a.host_bytes().data(), std::to_integer<int>(value), a.size());
  }
  static bool all(const Allocation& a, std::byte value) {
    for (const std::byte b : a.host_bytes()) {
      if (b != value) return false;
    }
    return true;
  }
  static int share_with_child(const Allocation& a, std::byte expect, std::byte reply) {
    EXPECT_TRUE(a.info().where.handle_is_fd()) << "the host kinds share descriptors";
    if (!a.info().where.handle_is_fd()) return -4;
    return share_fd_with_child(a.info().fd, a.size(), expect, reply);
  }
  static constexpr const char* kName = "host";
};

struct LimitedHostTraits : HostTraits {
  LimitingResource limited{host, std::uint64_t{64} << 20, Status::pool_exhausted,
                           LimitText{"test capacity", "reserved", " capacity"}};
  MemoryResource& resource() { return limited; }
  /// The limit refuses: no file-size trick needed.
  static std::size_t refused_bytes() { return std::size_t{65} << 20; }
  static std::unique_ptr<FileSizeLimit> refuse() { return nullptr; }
};

struct TrackedHostTraits : HostTraits {
  TrackingResource tracked{host};
  MemoryResource& resource() { return tracked; }
};

using Implementations = ::testing::Types<HostTraits, LimitedHostTraits, TrackedHostTraits>;
class ImplementationNames {
 public:
  template <class T>
  static std::string GetName(int /*index*/) {
    if constexpr (std::is_same_v<T, HostTraits>) return "host_memfd";
    if constexpr (std::is_same_v<T, LimitedHostTraits>) return "limiting_over_host";
    if constexpr (std::is_same_v<T, TrackedHostTraits>) return "tracking_over_host";
    return "unknown";
  }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Host, MemoryResourceConformance, Implementations,
                               ImplementationNames);

// --- host memfd specifics -----------------------------------------------------------------

// A client holding the descriptor must not be able to truncate memory under the daemon
// (SIGBUS) or grow it: the memfd is sealed.
TEST(HostMemfdResource, DescriptorIsSealedAgainstResizing) {
  HostMemfdResource host;
  const auto a = host.allocate(8192, "test-sealed");
  const int fd = a->info().fd;
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(fd, 16384), -1);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  a->host_bytes()[8191] = std::byte{1};  // still mapped and writable
}

// A successor takes over only a memfd sealed as the daemon seals its own: one a peer
// could shrink would be a SIGBUS waiting in the successor, one sealed against writes
// cannot hold pages.
TEST(HostMemfdResource, AdoptRefusesAnUnsealedOrWriteSealedMemfd) {
  HostMemfdResource host;
  const auto refusal = [&](int flags, int seals) -> std::string {
    support::UniqueFd fd(::memfd_create("test-adopt", MFD_CLOEXEC | flags));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::ftruncate(fd.get(), 8192), 0);
    if (seals != 0) {
      EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
    }
    try {
      (void)host.adopt(std::move(fd), 8192, "test-adopt", HandleKind::memfd);
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal(0, 0).find("not sealed"), std::string::npos) << refusal(0, 0);
  EXPECT_NE(refusal(MFD_ALLOW_SEALING, F_SEAL_SHRINK).find("not sealed"), std::string::npos);
  EXPECT_NE(refusal(MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)
                .find("sealed against writes"),
            std::string::npos);
  EXPECT_EQ(refusal(MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW), "accepted");
}

TEST(HostMemfdResource, LongOrOddLabelsAreAccepted) {
  HostMemfdResource host;
  std::string label(1000, 'x');
  label[10] = '\0';
  EXPECT_EQ(host.allocate(4096, label)->size(), 4096u);
}

// A size the system refuses is pool_exhausted (the operator can act on it), with the
// failing call, the label and the errno text in the message.
TEST(HostMemfdResource, RefusedSizeNamesTheCallAndTheLabel) {
  HostMemfdResource host;
  FileSizeLimit limit;
  try {
    (void)host.allocate(4 << 20, "test-too-big");
    FAIL() << "expected StatusError";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::pool_exhausted);
    EXPECT_NE(std::string(e.what()).find("ftruncate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test-too-big"), std::string::npos) << e.what();
  }
}

// Running out of descriptors is a shortage too (issue: EMFILE used to be `internal`).
TEST(HostMemfdResource, OutOfDescriptorsIsPoolExhausted) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers' runtime needs descriptors itself: UBSan's type check, run in the very
  // constructor of the StatusError this test expects, tests memory through a pipe and
  // aborts when none can be made. The normal build runs the test.
  GTEST_SKIP() << "needs free descriptors under the sanitizers";
#endif
  HostMemfdResource host;
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit limited = saved;
  limited.rlim_cur = open_fd_count() + 1;  // one more descriptor, then EMFILE
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limited), 0);
  std::vector<std::shared_ptr<Allocation>> held;
  std::exception_ptr refusal;
  for (int i = 0; i < 8 && !refusal; ++i) {
    try {
      held.push_back(host.allocate(4096, "test-emfile"));
    } catch (...) {
      refusal = std::current_exception();
    }
  }
  held.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(refusal) << "no EMFILE with the descriptor limit at the open count + 1";
  try {
    std::rethrow_exception(refusal);
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::pool_exhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("memfd_create"), std::string::npos) << e.what();
  }
}

// --- adaptors -----------------------------------------------------------------------------

/// An upstream that fails when told to.
class FlakyResource final : public MemoryResource {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "flaky"; }
  [[nodiscard]] MemorySpace space() const noexcept override { return MemorySpace::host; }
  [[nodiscard]] int device() const noexcept override { return -1; }
  [[nodiscard]] std::size_t granularity() const noexcept override { return 4096; }
  std::atomic<bool> fail{false};
  std::atomic<int> calls{0};

  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override {
    return inner_.handle_kinds();
  }

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override {
    ++calls;
    if (fail) throw StatusError(Status::internal, "flaky: no memory today");
    return inner_.allocate(bytes, label, handle);
  }
  HostMemfdResource inner_;
};

TEST(LimitingResource, ChargesUntilTheLimitAndRefusesWithItsStatusAndText) {
  FlakyResource upstream;
  LimitingResource quota(upstream, 3 * 4096, Status::quota_exceeded,
                         LimitText{"tenant 'a' quota", "reserved", " quota"});
  EXPECT_EQ(quota.name(), "flaky");
  EXPECT_EQ(quota.granularity(), 4096u);
  auto a = quota.allocate(100, "a");  // rounded up to the granularity: one unit
  EXPECT_EQ(a->size(), 4096u);
  EXPECT_EQ(quota.used(), 4096u);
  auto b = quota.allocate(2 * 4096, "b");
  EXPECT_EQ(quota.used(), 3 * 4096u);
  EXPECT_EQ(quota.available(), 0u);
  EXPECT_FALSE(quota.fits(1));
  EXPECT_FALSE(quota.fits(~std::uint64_t{0}));  // no overflow
  const int calls = upstream.calls;
  try {
    (void)quota.allocate(1, "c");
    FAIL() << "expected LimitExceeded";
  } catch (const LimitExceeded& e) {
    EXPECT_EQ(e.status(), Status::quota_exceeded);
    EXPECT_EQ(std::string(e.what()),
              "tenant 'a' quota exceeded: 12 KiB reserved + 4.0 KiB requested > 12 KiB quota");
  }
  EXPECT_EQ(upstream.calls, calls) << "a refusal never reaches the upstream";
  a.reset();
  EXPECT_EQ(quota.used(), 2 * 4096u);
  EXPECT_TRUE(quota.fits(4096));
}

TEST(LimitingResource, AnUpstreamFailureChargesNothing) {
  FlakyResource upstream;
  LimitingResource limit(upstream, 1 << 20, Status::pool_exhausted, LimitText{"cap"});
  upstream.fail = true;
  try {
    (void)limit.allocate(4096, "x");
    FAIL() << "expected the upstream's error";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::internal);
    EXPECT_EQ(std::string(e.what()), "flaky: no memory today");
  }
  EXPECT_EQ(limit.used(), 0u);
}

// Memory taken over counts against a limit as memory allocated does: a successor with a
// smaller quota refuses the arena (and closes its descriptor) instead of passing it.
TEST(LimitingResource, AdoptedMemoryIsChargedAndRefusedPastTheLimit) {
  HostMemfdResource host;
  LimitingResource quota(host, 3 * 4096, Status::quota_exceeded, LimitText{"tenant 'a' quota"});
  const auto first = host.allocate(2 * 4096, "test-old-arena");
  const auto second = host.allocate(2 * 4096, "test-old-arena-2");
  {
    const auto adopted =
        quota.adopt(support::duplicate(first->info().fd), first->size(), "a", HandleKind::memfd);
    EXPECT_EQ(quota.used(), 2u * 4096);
    const std::size_t fds = open_fd_count();
    try {
      (void)quota.adopt(support::duplicate(second->info().fd), second->size(), "b",
                        HandleKind::memfd);
      FAIL() << "expected quota_exceeded";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::quota_exceeded);
      EXPECT_NE(std::string(e.what()).find("tenant 'a' quota exceeded"), std::string::npos);
    }
    EXPECT_EQ(open_fd_count(), fds);
    EXPECT_EQ(quota.used(), 2u * 4096);
  }
  EXPECT_EQ(quota.used(), 0u);
}

TEST(LimitingResource, ZeroMeansUnlimitedButCounted) {
  HostMemfdResource host;
  LimitingResource unlimited(host, 0, Status::pool_exhausted, LimitText{"cap"});
  EXPECT_TRUE(unlimited.unlimited());
  auto a = unlimited.allocate(1 << 20, "x");
  EXPECT_EQ(unlimited.used(), 1u << 20);
  EXPECT_TRUE(unlimited.fits(std::uint64_t{1} << 62));
}

TEST(LimitingResource, ChainedLimitsEachChargeAndEachReleaseOnce) {
  HostMemfdResource host;
  LimitingResource capacity(host, 1 << 20, Status::pool_exhausted,
                            LimitText{"pool capacity", "reserved", " capacity"});
  LimitingResource quota_a(capacity, 0, Status::quota_exceeded, LimitText{"tenant 'a' quota"});
  LimitingResource quota_b(capacity, 0, Status::quota_exceeded, LimitText{"tenant 'b' quota"});
  auto a = quota_a.allocate(512 << 10, "a");
  auto b = quota_b.allocate(512 << 10, "b");
  EXPECT_EQ(capacity.used(), 1u << 20);
  try {
    (void)quota_a.allocate(1, "a2");
    FAIL() << "expected the capacity to refuse";
  } catch (const LimitExceeded& e) {
    EXPECT_EQ(e.status(), Status::pool_exhausted);
    EXPECT_EQ(std::string(e.what()).rfind("pool capacity exceeded: ", 0), 0u) << e.what();
  }
  EXPECT_EQ(quota_a.used(), 512u << 10) << "the inner refusal gave the outer charge back";
  b.reset();
  EXPECT_EQ(capacity.used(), 512u << 10);
  EXPECT_EQ(quota_b.used(), 0u);
}

TEST(LimitingResource, ConcurrentChargesNeverPassTheLimit) {
  HostMemfdResource host;
  LimitingResource limit(host, 10 * 4096, Status::pool_exhausted, LimitText{"cap"});
  std::atomic<int> granted{0};
  std::atomic<int> refused{0};
  std::vector<std::shared_ptr<Allocation>> kept(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 16; ++i) {
        try {
          kept[static_cast<std::size_t>(t * 16 + i)] = limit.allocate(4096, "c");
          ++granted;
        } catch (const LimitExceeded&) {
          ++refused;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(granted, 10);
  EXPECT_EQ(refused, 54);
  EXPECT_EQ(limit.used(), 10u * 4096);
}

TEST(LimitingResource, AllocationsMayOutliveTheAdaptor) {
  HostMemfdResource host;
  std::shared_ptr<Allocation> survivor;
  {
    LimitingResource limit(host, 1 << 20, Status::pool_exhausted, LimitText{"cap"});
    survivor = limit.allocate(4096, "outlives");
  }
  survivor->host_bytes()[0] = std::byte{7};
  survivor.reset();  // gives its bytes back to a counter that outlived the adaptor
}

TEST(TrackingResource, CountsLiveAndTotalAllocationsAndFailures) {
  FlakyResource upstream;
  TrackingResource tracking(upstream);
  auto a = tracking.allocate(1, "a");
  auto b = tracking.allocate(4096 + 1, "b");
  MemoryUsage u = tracking.usage();
  EXPECT_EQ(u.live_allocations, 2u);
  EXPECT_EQ(u.live_bytes, 3u * 4096);
  EXPECT_EQ(u.allocations_total, 2u);
  EXPECT_EQ(u.bytes_total, 3u * 4096);
  EXPECT_EQ(u.peak_bytes, 3u * 4096);
  upstream.fail = true;
  EXPECT_THROW((void)tracking.allocate(4096, "c"), StatusError);
  a.reset();
  u = tracking.usage();
  EXPECT_EQ(u.failures_total, 1u);
  EXPECT_EQ(u.live_allocations, 1u);
  EXPECT_EQ(u.live_bytes, 2u * 4096);
  EXPECT_EQ(u.allocations_total, 2u);
  EXPECT_EQ(u.peak_bytes, 3u * 4096);
  b.reset();
  EXPECT_EQ(tracking.usage().live_bytes, 0u);
}

}  // namespace
}  // namespace statepool::service
