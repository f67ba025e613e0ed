// ClientMemory (service/memory/client_memory.hpp): memory a client lends the daemon. A
// sealable memfd is sealed and shared both ways; an unsealable one is guarded, and a
// client that truncates it under the daemon breaks it instead of crashing the daemon; a
// SIGBUS anywhere else still kills; bad descriptors are refused without side effects; the
// guard table survives concurrent registration, release and faults, and never leaks.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "memory/client_memory.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/unique_fd.hpp"

// AddressSanitizer and ThreadSanitizer report a fatal SIGBUS themselves (see
// expect_died_of_sigbus).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STATEPOOL_TEST_SANITIZED_SIGBUS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STATEPOOL_TEST_SANITIZED_SIGBUS 1
#endif
#endif

namespace statepool::service {
namespace {

using support::UniqueFd;

const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

/// A client's memory as SGLang makes it: a memfd (sealable or not) of `bytes`, mapped
/// MAP_SHARED in the client's own view.
class ClientFile {
 public:
  ClientFile(std::size_t bytes, bool sealable, const char* name = "cm-test")
      : fd_(::memfd_create(name, MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0u))),
        bytes_(bytes) {
    if (!fd_ || ::ftruncate(fd_.get(), static_cast<off_t>(bytes)) != 0) {
      ADD_FAILURE() << "memfd: " << std::strerror(errno);
      return;
    }
    void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (addr == MAP_FAILED) {
      ADD_FAILURE() << "mmap: " << std::strerror(errno);
      return;
    }
    data_ = static_cast<std::byte*>(addr);
  }
  ~ClientFile() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  ClientFile(const ClientFile&) = delete;
  ClientFile& operator=(const ClientFile&) = delete;

  [[nodiscard]] int fd() const { return fd_.get(); }
  /// The client's own view (do not touch past a truncation).
  [[nodiscard]] std::byte* data() const { return data_; }
  /// What the client sends: a second descriptor for the same open file.
  [[nodiscard]] UniqueFd send() const { return support::duplicate(fd_.get()); }
  void truncate(off_t size) const { ASSERT_EQ(::ftruncate(fd_.get(), size), 0); }
  void fill(std::uint8_t seed) const {
    for (std::size_t i = 0; i < bytes_; ++i) data_[i] = pattern(i, seed);
  }
  [[nodiscard]] static std::byte pattern(std::size_t i, std::uint8_t seed) {
    return static_cast<std::byte>((i * 131 + seed) % 251 + 1);  // never 0
  }

 private:
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  std::size_t bytes_;
};

/// Reads every byte through a volatile pointer, so that each access really happens.
std::uint64_t sum_bytes(const std::byte* data, std::size_t bytes) {
  const volatile std::byte* p = data;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < bytes; ++i) sum += std::to_integer<unsigned>(p[i]);
  return sum;
}

std::byte read_byte(const std::byte* p) {
  return *static_cast<const volatile std::byte*>(p);
}

bool matches(const std::byte* data, std::size_t bytes, std::uint8_t seed) {
  for (std::size_t i = 0; i < bytes; ++i) {
    if (data[i] != ClientFile::pattern(i, seed)) return false;
  }
  return true;
}

std::size_t open_descriptors() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++count;
  }
  return count;
}

/// Mappings of memfds named `name` in this process.
std::size_t mappings_named(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:" + name + " ") != std::string::npos) ++count;
  }
  return count;
}

/// Maps guarded memories until the table refuses; returns how many it took (all are
/// released again). Proves that every slot is free when it returns kMaxGuarded.
std::size_t free_guard_slots() {
  std::vector<std::shared_ptr<ClientMemory>> held;
  for (;;) {
    UniqueFd fd(::memfd_create("cm-fill", MFD_CLOEXEC));
    if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(kPage)) != 0) {
      ADD_FAILURE() << "memfd: " << std::strerror(errno);
      return held.size();
    }
    try {
      held.push_back(ClientMemory::map(std::move(fd), kPage, "fill"));
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::pool_exhausted) << e.what();
      return held.size();
    }
    if (held.size() > ClientMemory::kMaxGuarded) {
      ADD_FAILURE() << "the guard table took more than kMaxGuarded";
      return held.size();
    }
  }
}

/// Expects map() to refuse with invalid_argument and a message holding `needle`.
void expect_refused(UniqueFd fd, std::uint64_t bytes, const std::string& needle) {
  try {
    (void)ClientMemory::map(std::move(fd), bytes, "refused");
    ADD_FAILURE() << "expected a refusal containing '" << needle << "'";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'refused'"), std::string::npos) << e.what();
  }
}

// --- sealed --------------------------------------------------------------------------------

// A memfd created with MFD_ALLOW_SEALING is sealed against shrinking (not growing) and
// shared in place: each side sees the other's bytes, including an odd-sized tail.
TEST(ClientMemory, SealableMemfdIsSealedAndSharedBothWays) {
  const std::size_t bytes = 3 * kPage + 123;
  ClientFile client(bytes, /*sealable=*/true);
  client.fill(7);
  const auto memory = ClientMemory::map(client.send(), bytes, "sealed");
  EXPECT_TRUE(memory->sealed());
  EXPECT_FALSE(memory->broken());

  const AllocationInfo& info = memory->info();
  ASSERT_NE(info.data, nullptr);
  EXPECT_NE(info.data, client.data());  // the daemon's own mapping
  EXPECT_EQ(info.bytes, bytes);
  EXPECT_EQ(info.where.space, MemorySpace::host);
  EXPECT_EQ(info.where.device, -1);
  EXPECT_EQ(info.where.handle_kind, HandleKind::memfd);
  EXPECT_EQ(info.where.granularity, 1u);  // bytes as registered
  EXPECT_EQ(info.fd, -1);

  EXPECT_TRUE(matches(memory->host_bytes().data(), bytes, 7));
  for (std::size_t i = 0; i < bytes; ++i) memory->host_bytes()[i] = ClientFile::pattern(i, 42);
  EXPECT_TRUE(matches(client.data(), bytes, 42));

  EXPECT_NE(::fcntl(client.fd(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  errno = 0;
  EXPECT_EQ(::ftruncate(client.fd(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(client.fd(), static_cast<off_t>(bytes + kPage)), 0);  // growing is fine
  EXPECT_TRUE(matches(memory->host_bytes().data(), bytes, 42));
}

// A client that sealed F_SEAL_SHRINK itself (and then F_SEAL_SEAL) is sealed too.
TEST(ClientMemory, AlreadySealedMemfdCountsAsSealed) {
  ClientFile client(kPage, /*sealable=*/true);
  ASSERT_EQ(::fcntl(client.fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  const auto memory = ClientMemory::map(client.send(), kPage, "client-sealed");
  EXPECT_TRUE(memory->sealed());
}

// --- guarded -------------------------------------------------------------------------------

// SGLang's memfds (no MFD_ALLOW_SEALING) are guarded. The client truncates one to 0; the
// daemon then reads it from several threads at once and writes it: no crash, the reads
// give 0, the memory is broken, the client's file gets none of the writes. Another
// guarded memory is untouched: unbroken, bytes intact.
TEST(ClientMemory, TruncatedGuardedMemfdReadsZerosAndBreaks) {
  const std::size_t bytes = 16 * kPage;
  ClientFile victim(bytes, /*sealable=*/false);
  ClientFile bystander(bytes, /*sealable=*/false);
  victim.fill(1);
  bystander.fill(2);
  const auto broken = ClientMemory::map(victim.send(), bytes, "victim");
  const auto intact = ClientMemory::map(bystander.send(), bytes, "bystander");
  EXPECT_FALSE(broken->sealed());
  EXPECT_FALSE(intact->sealed());
  EXPECT_EQ(::fcntl(victim.fd(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  EXPECT_TRUE(matches(broken->host_bytes().data(), bytes, 1));
  EXPECT_FALSE(broken->broken());

  victim.truncate(0);

  constexpr int kReaders = 4;
  std::barrier start(kReaders);
  std::vector<std::uint64_t> sums(kReaders, 1);
  std::vector<std::thread> readers;
  readers.reserve(kReaders);
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      start.arrive_and_wait();
      sums[static_cast<std::size_t>(t)] = sum_bytes(broken->host_bytes().data(), bytes);
    });
  }
  for (auto& reader : readers) reader.join();
  for (const std::uint64_t sum : sums) EXPECT_EQ(sum, 0u);
  EXPECT_TRUE(broken->broken());

  std::memset(broken->host_bytes().data(), 0xab, bytes);  // goes nowhere, but completes
  EXPECT_EQ(read_byte(broken->host_bytes().data() + bytes - 1), std::byte{0xab});
  struct stat st {};
  ASSERT_EQ(::fstat(victim.fd(), &st), 0);
  EXPECT_EQ(st.st_size, 0);

  EXPECT_FALSE(intact->broken());
  EXPECT_TRUE(matches(intact->host_bytes().data(), bytes, 2));
  EXPECT_TRUE(matches(bystander.data(), bytes, 2));
}

// A partial truncation breaks the whole mapping, not only the pages past the new end:
// the bytes the daemon sees are either all the client's or all replaced.
TEST(ClientMemory, FaultReplacesTheWholeMapping) {
  const std::size_t bytes = 8 * kPage;
  ClientFile client(bytes, /*sealable=*/false);
  client.fill(3);
  const auto memory = ClientMemory::map(client.send(), bytes, "half");
  const std::byte* data = memory->host_bytes().data();
  client.truncate(static_cast<off_t>(bytes / 2));

  EXPECT_EQ(read_byte(data), ClientFile::pattern(0, 3));  // still inside the file
  EXPECT_FALSE(memory->broken());
  EXPECT_EQ(read_byte(data + bytes - 1), std::byte{0});  // past the end: faults
  EXPECT_TRUE(memory->broken());
  EXPECT_EQ(read_byte(data), std::byte{0});                // the first half was replaced too
  EXPECT_EQ(client.data()[0], ClientFile::pattern(0, 3));  // the client's file was not
}

// Any regular file may be lent (here one on the test's temporary directory): it cannot be
// sealed, so it is guarded.
TEST(ClientMemory, RegularFileIsGuarded) {
  std::string path = ::testing::TempDir() + "/client-memory-XXXXXX";
  UniqueFd fd(::mkstemp(path.data()));
  ASSERT_TRUE(fd.valid()) << std::strerror(errno);
  ::unlink(path.c_str());
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(kPage)), 0);
  const auto memory = ClientMemory::map(std::move(fd), kPage, "file");
  EXPECT_FALSE(memory->sealed());
  memory->host_bytes()[0] = std::byte{9};
  EXPECT_EQ(read_byte(memory->host_bytes().data()), std::byte{9});
  EXPECT_FALSE(memory->broken());
}

// --- faults that are not ours --------------------------------------------------------------

/// Runs `body` in a forked child; returns its wait status. A handler that swallowed the
/// fault would make the child retry it forever: the alarm ends that (SIGALRM, not SIGBUS).
template <class Body>
int run_in_child(Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(30);
    body();
    ::_exit(0);  // survived: the test fails
  }
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  return status;
}

/// Death by SIGBUS. Under AddressSanitizer the fault goes on to its handler (installed
/// before ours), and ThreadSanitizer takes over a fatal SIGBUS too: either reports "BUS on
/// unknown address" and exits non-zero (or aborts). A child that lives on fails both ways.
void expect_died_of_sigbus(int status) {
#if defined(STATEPOOL_TEST_SANITIZED_SIGBUS)
  EXPECT_TRUE(
      (WIFSIGNALED(status) && (WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT)) ||
      (WIFEXITED(status) && WEXITSTATUS(status) != 0))
      << "wait status " << status;
#else
  ASSERT_TRUE(WIFSIGNALED(status)) << "wait status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
#endif
}

// The handler only repairs guarded mappings: a truncated mapping that was never
// registered still kills the process with SIGBUS, as it would without statepool.
TEST(ClientMemory, FaultOutsideGuardedMemoryStillKills) {
  ClientFile guarded(kPage, /*sealable=*/false);
  const auto memory = ClientMemory::map(guarded.send(), kPage, "installs-the-handler");
  ASSERT_FALSE(memory->sealed());

  const int status = run_in_child([] {
    const int fd = ::memfd_create("cm-unguarded", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(kPage)) != 0) ::_exit(2);
    void* addr = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED || ::ftruncate(fd, 0) != 0) ::_exit(3);
    (void)read_byte(static_cast<const std::byte*>(addr));
  });
  expect_died_of_sigbus(status);
  EXPECT_FALSE(memory->broken());
}

// A SIGBUS that was sent, not caused by a fault, has no address to repair: it kills.
TEST(ClientMemory, SentSigbusStillKills) {
  ClientFile guarded(kPage, /*sealable=*/false);
  const auto memory = ClientMemory::map(guarded.send(), kPage, "installs-the-handler");
  const int status = run_in_child([] { ::raise(SIGBUS); });
  expect_died_of_sigbus(status);
}

// --- refusals ------------------------------------------------------------------------------

TEST(ClientMemory, RefusesBadSizes) {
  ClientFile client(kPage, /*sealable=*/true);
  expect_refused(client.send(), 0, "size is 0");
  expect_refused(client.send(), ClientMemory::kMaxBytes + 1, "1 TiB");
  // Shorter than asked: refused, and no seal was added to the client's file.
  expect_refused(client.send(), kPage + 1, "holds only " + std::to_string(kPage) + " bytes");
  EXPECT_EQ(::fcntl(client.fd(), F_GET_SEALS), 0);
}

TEST(ClientMemory, RefusesDescriptorsThatAreNotWritableRegularFiles) {
  ClientFile client(kPage, /*sealable=*/true);
  const std::string self = "/proc/self/fd/" + std::to_string(client.fd());
  expect_refused(UniqueFd(::open(self.c_str(), O_RDONLY | O_CLOEXEC)), kPage, "read-only");
  expect_refused(UniqueFd(::open(self.c_str(), O_WRONLY | O_CLOEXEC)), kPage,
                 "not open for reading and writing");
  expect_refused(UniqueFd(::open(self.c_str(), O_PATH | O_CLOEXEC)), kPage, "O_PATH");
  EXPECT_EQ(::fcntl(client.fd(), F_GET_SEALS), 0);  // nothing was sealed on the way

  expect_refused(UniqueFd(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)), kPage, "a directory");
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd pipe_read(pipe_fds[0]);
  expect_refused(UniqueFd(pipe_fds[1]), kPage, "a pipe");
  expect_refused(UniqueFd(), kPage, "no file descriptor");
}

// A memfd the client sealed against writing cannot be mapped shared and writable.
TEST(ClientMemory, RefusesWriteSealedMemfd) {
  UniqueFd fd(::memfd_create("cm-write-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(kPage)), 0);
  ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  expect_refused(std::move(fd), kPage, "mmap");
}

// --- the guard table -----------------------------------------------------------------------

// The table holds kMaxGuarded guarded memories; one more is pool_exhausted with a clear
// message, a sealed one still maps, and a released slot is usable again.
TEST(ClientMemory, FullGuardTableRefusesUntilASlotIsReleased) {
  std::vector<std::shared_ptr<ClientMemory>> held;
  for (std::size_t i = 0; i < ClientMemory::kMaxGuarded; ++i) {
    ClientFile client(kPage, /*sealable=*/false);
    held.push_back(ClientMemory::map(client.send(), kPage, "held"));
  }
  ClientFile extra(kPage, /*sealable=*/false);
  try {
    (void)ClientMemory::map(extra.send(), kPage, "one-too-many");
    ADD_FAILURE() << "expected pool_exhausted";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::pool_exhausted);
    EXPECT_NE(std::string(e.what()).find("one-too-many"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos) << e.what();
  }
  ClientFile sealable(kPage, /*sealable=*/true);
  EXPECT_TRUE(ClientMemory::map(sealable.send(), kPage, "sealed-while-full")->sealed());
  held.pop_back();
  EXPECT_FALSE(ClientMemory::map(extra.send(), kPage, "after-release")->sealed());
  held.clear();
  EXPECT_EQ(free_guard_slots(), ClientMemory::kMaxGuarded);
}

// Threads map and release sealed and guarded memories while another one keeps faulting on
// freshly truncated guarded memories (the handler scans the table while slots change
// hands). Nothing crashes, every fault breaks its own memory only, and afterwards no
// descriptor, mapping or slot is left.
TEST(ClientMemory, ConcurrentMappingAndFaultsLeakNothing) {
  const std::size_t fds_before = open_descriptors();
  constexpr int kWorkers = 3;
  constexpr int kRounds = 150;
  std::atomic<bool> failed{false};
  std::atomic<int> faults{0};

  std::vector<std::thread> threads;
  threads.reserve(kWorkers + 1);
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < kRounds && !failed; ++round) {
        const bool sealable = (round + w) % 2 == 0;
        const std::size_t bytes = kPage * static_cast<std::size_t>(1 + round % 4);
        ClientFile client(bytes, sealable, "cm-stress");
        const auto seed = static_cast<std::uint8_t>(round + w);
        client.fill(seed);
        const auto memory = ClientMemory::map(client.send(), bytes, "stress");
        if (memory->sealed() != sealable || memory->broken() ||
            !matches(memory->host_bytes().data(), bytes, seed)) {
          failed = true;
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int round = 0; round < kRounds && !failed; ++round) {
      ClientFile client(2 * kPage, /*sealable=*/false, "cm-stress");
      client.fill(5);
      const auto memory = ClientMemory::map(client.send(), 2 * kPage, "faulting");
      client.truncate(0);
      if (sum_bytes(memory->host_bytes().data(), 2 * kPage) != 0 || !memory->broken()) {
        failed = true;
      }
      ++faults;
    }
  });
  for (auto& thread : threads) thread.join();

  EXPECT_FALSE(failed);
  EXPECT_EQ(faults, kRounds);
  EXPECT_EQ(open_descriptors(), fds_before);
  EXPECT_EQ(mappings_named("cm-stress"), 0u);
  EXPECT_EQ(free_guard_slots(), ClientMemory::kMaxGuarded);
}

}  // namespace
}  // namespace statepool::service
