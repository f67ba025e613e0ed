// The CUDA backend's memory (kernels/cuda/vmm, service/memory/cuda_resource) on a real
// device: the memory-resource conformance suite, sharing with a second process through
// each handle kind, and device memory that is really given back. Every test skips cleanly
// without a usable CUDA device.
//
// The second process is cuda_peer (tests/gpu/cuda_peer.cpp), started with posix_spawn so
// that it never inherits this process's CUDA context (fork without exec would).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memory/cuda_resource.hpp"
#include "memory/limiting.hpp"
#include "memory/tracking.hpp"
#include "memory_resource_conformance.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/cuda/vmm.hpp"
#include "statepool/support/fd_passing.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/unique_fd.hpp"

extern char** environ;

namespace statepool::kernels {
// Readable parameters in test listings.
static void PrintTo(HandleKind kind, std::ostream* os) {
  *os << to_string(kind);
}
}  // namespace statepool::kernels

namespace statepool::service {
namespace {

namespace cuda = kernels::cuda;
using support::UniqueFd;

constexpr int kDevice = 0;

// --- helpers ----------------------------------------------------------------------------

/// Why the tests cannot run here, or empty. A device without POSIX-fd export still runs
/// them (its resource shares IPC handles only).
std::string gpu_unavailable() {
  const cuda::CudaUsability usable = cuda::cuda_usability(kDevice);
  if (usable || usable.problem == cuda::CudaProblem::no_posix_fd) return {};
  return "no usable CUDA device: " + usable.reason;
}

#define STATEPOOL_SKIP_WITHOUT_GPU()                                 \
  do {                                                               \
    if (const std::string why_ = gpu_unavailable(); !why_.empty()) { \
      GTEST_SKIP() << why_;                                          \
    }                                                                \
  } while (false)

std::size_t free_device_bytes() {
  return cuda::memory_info(kDevice).free_bytes;
}

/// Polls until the device's free memory is back to at least `floor` (the driver may
/// reclaim a dead process's memory a moment after waitpid returns); the last reading.
std::size_t free_bytes_reaching(std::size_t floor) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::size_t now = free_device_bytes();
  while (now < floor && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = free_device_bytes();
  }
  return now;
}

std::string hex(const cuda::IpcHandleBytes& bytes) {
  std::string out;
  char digits[3];
  for (const std::byte b : bytes) {
    std::snprintf(digits, sizeof digits, "%02x", std::to_integer<unsigned>(b));
    out += digits;
  }
  return out;
}

/// A running cuda_peer (see cuda_peer.cpp for its protocol).
class Peer {
 public:
  /// Starts a peer on `info`'s memory: for cuda_vmm_fd it is sent the descriptor, for
  /// cuda_ipc it gets the handle's bytes on its command line.
  Peer(const AllocationInfo& info, std::byte expect, std::byte reply, bool hold) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      throw std::runtime_error("socketpair failed");
    }
    socket_ = UniqueFd(pair[0]);
    // Moved to a descriptor above 3, so that the dup2 to 3 below always clears its
    // close-on-exec flag (dup2 of a descriptor onto itself would not).
    const UniqueFd theirs(::fcntl(pair[1], F_DUPFD_CLOEXEC, 10));
    ::close(pair[1]);
    if (!theirs) throw std::runtime_error("F_DUPFD_CLOEXEC failed");

    const bool vmm = info.where.handle_kind == HandleKind::cuda_vmm_fd;
    // STATEPOOL_CUDA_PEER in the environment: tests run away from their build tree
    // (scripts/gpu-check --from).
    const char* moved = std::getenv("STATEPOOL_CUDA_PEER");
    std::vector<std::string> args = {moved != nullptr && *moved != '\0' ? moved
                                                                        : STATEPOOL_CUDA_PEER,
                                     vmm ? "vmm" : "ipc",
                                     std::to_string(info.where.device),
                                     std::to_string(info.bytes),
                                     std::to_string(std::to_integer<int>(expect)),
                                     std::to_string(std::to_integer<int>(reply)),
                                     hold ? "hold" : "exit"};
    if (!vmm) args.push_back(hex(info.where.ipc_handle));
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, theirs.get(), 3);
    const int err = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(err));

    if (vmm) {
      const std::byte byte{1};
      const int fd = info.fd;
      if (support::send_with_fds(socket_.get(), {&byte, 1}, std::span<const int>(&fd, 1),
                                 MSG_NOSIGNAL) != 1) {
        kill();  // no destructor runs after a throwing constructor
        (void)wait();
        throw std::runtime_error("cannot send the descriptor to the peer");
      }
    }
  }
  ~Peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)wait();
    }
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  /// True once the peer has checked the bytes and written its own (its 'k').
  bool done() {
    pollfd p{socket_.get(), POLLIN, 0};
    if (::poll(&p, 1, 60'000) != 1) return false;
    char byte = 0;
    return ::recv(socket_.get(), &byte, 1, 0) == 1 && byte == 'k';
  }
  /// Its exit status (0..255), or 128 + the signal that killed it.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void kill() { ::kill(pid_, SIGKILL); }

 private:
  UniqueFd socket_;
  pid_t pid_ = -1;
};

/// The traits' share hook: a peer maps the allocation, checks, writes; 0 on success.
int share_with_peer(const Allocation& a, std::byte expect, std::byte reply) {
  Peer peer(a.info(), expect, reply, /*hold=*/false);
  const bool done = peer.done();
  const int status = peer.wait();
  return done ? status : (status == 0 ? -1 : status);
}

void device_fill(const Allocation& a, std::byte value) {
  const cuda::DeviceGuard guard(a.info().where.device);
  cuda::check(cudaMemset(a.info().data, std::to_integer<int>(value), a.size()), "cudaMemset",
              a.info().where.device);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", a.info().where.device);
}

bool device_all(const Allocation& a, std::byte value) {
  const cuda::DeviceGuard guard(a.info().where.device);
  std::vector<std::byte> host(a.size());
  cuda::check(cudaMemcpy(host.data(), a.info().data, a.size(), cudaMemcpyDeviceToHost),
              "cudaMemcpy", a.info().where.device);
  for (const std::byte b : host) {
    if (b != value) return false;
  }
  return true;
}

/// Lets the driver open whatever descriptors it keeps for the process (the first VMM
/// export and IPC handle may open driver files), so that the suite's descriptor counts
/// see only what allocations hold.
void warm_up(MemoryResource& r) {
  for (const HandleKind kind : r.handle_kinds()) (void)r.allocate(1, "warm-up", kind);
}

/// Shares as legacy IPC handles by default: the CUDA resource with its second kind first,
/// so that the whole suite runs for that kind too.
class IpcFirst final : public ResourceAdaptor {
 public:
  using ResourceAdaptor::ResourceAdaptor;
  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override {
    static constexpr HandleKind kKinds[] = {HandleKind::cuda_ipc};
    return kKinds;
  }

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override {
    return upstream().allocate(bytes, label, handle);
  }
};

// --- the conformance suite --------------------------------------------------------------

struct CudaTraits {
  CudaResource cuda{kDevice};
  CudaTraits() { warm_up(cuda); }
  static std::string unavailable() { return gpu_unavailable(); }
  MemoryResource& resource() { return cuda; }
  /// More than the device has: the driver itself refuses.
  std::size_t refused_bytes() const { return cuda.total_bytes() + cuda.granularity(); }
  static std::nullptr_t refuse() { return nullptr; }
  static void fill(const Allocation& a, std::byte value) { device_fill(a, value); }
  static bool all(const Allocation& a, std::byte value) { return device_all(a, value); }
  static int share_with_child(const Allocation& a, std::byte expect, std::byte reply) {
    return share_with_peer(a, expect, reply);
  }
  static constexpr const char* kName = "cuda";
};

struct IpcCudaTraits : CudaTraits {
  IpcFirst ipc{cuda};
  MemoryResource& resource() { return ipc; }
};

struct LimitedCudaTraits : CudaTraits {
  LimitingResource limited{cuda, std::uint64_t{256} << 20, Status::pool_exhausted,
                           LimitText{"test capacity", "reserved", " capacity"}};
  MemoryResource& resource() { return limited; }
  static std::size_t refused_bytes() { return std::size_t{257} << 20; }
};

struct TrackedCudaTraits : CudaTraits {
  TrackingResource tracked{cuda};
  MemoryResource& resource() { return tracked; }
};

using Implementations =
    ::testing::Types<CudaTraits, IpcCudaTraits, LimitedCudaTraits, TrackedCudaTraits>;
class ImplementationNames {
 public:
  template <class T>
  static std::string GetName(int /*index*/) {
    if constexpr (std::is_same_v<T, CudaTraits>) return "cuda_vmm";
    if constexpr (std::is_same_v<T, IpcCudaTraits>) return "cuda_ipc";
    if constexpr (std::is_same_v<T, LimitedCudaTraits>) return "limiting_over_cuda";
    if constexpr (std::is_same_v<T, TrackedCudaTraits>) return "tracking_over_cuda";
    return "unknown";
  }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, MemoryResourceConformance, Implementations,
                               ImplementationNames);

// --- two processes, each handle kind ------------------------------------------------------

class CudaSharing : public ::testing::TestWithParam<HandleKind> {
 protected:
  void SetUp() override {
    STATEPOOL_SKIP_WITHOUT_GPU();
    resource_ = std::make_unique<CudaResource>(kDevice);
    if (!resource_->shares_as(GetParam())) {
      GTEST_SKIP() << "the device cannot share as " << kernels::to_string(GetParam());
    }
    warm_up(*resource_);
  }
  std::unique_ptr<CudaResource> resource_;
};

TEST_P(CudaSharing, TwoProcessesSeeEachOthersWrites) {
  const auto a = resource_->allocate(8 << 20, "sharing", GetParam());
  ASSERT_EQ(a->info().where.handle_kind, GetParam());
  device_fill(*a, std::byte{0x5a});
  EXPECT_EQ(share_with_peer(*a, std::byte{0x5a}, std::byte{0xc3}), 0)
      << "the peer did not see this process's bytes";
  EXPECT_TRUE(device_all(*a, std::byte{0xc3})) << "this process does not see the peer's bytes";
  // And a second peer sees what the first one wrote, after this process writes again.
  device_fill(*a, std::byte{0x11});
  EXPECT_EQ(share_with_peer(*a, std::byte{0x11}, std::byte{0x22}), 0);
  EXPECT_TRUE(device_all(*a, std::byte{0x22}));
}

TEST_P(CudaSharing, AKilledPeerLeavesNoDeviceMemoryBehind) {
  const std::size_t tolerance = resource_->granularity();
  const std::size_t before = free_device_bytes();
  {
    auto a = resource_->allocate(64 << 20, "killed-peer", GetParam());
    Peer peer(a->info(), std::byte{0}, std::byte{0x77}, /*hold=*/true);
    ASSERT_TRUE(peer.done()) << "the peer did not map the memory";
    peer.kill();
    EXPECT_EQ(peer.wait(), 128 + SIGKILL);
    EXPECT_TRUE(device_all(*a, std::byte{0x77})) << "the peer's writes are lost";
    a.reset();  // the daemon releases the allocation
  }
  const std::size_t after = free_bytes_reaching(before - tolerance);
  EXPECT_GE(after + tolerance, before)
      << "free device memory: " << before << " bytes before, " << after << " after";
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaSharing,
                         ::testing::Values(HandleKind::cuda_vmm_fd, HandleKind::cuda_ipc),
                         [](const ::testing::TestParamInfo<HandleKind>& kind) {
                           return std::string(kernels::to_string(kind.param));
                         });

// --- the kernels' types -------------------------------------------------------------------

TEST(VmmAllocation, RoundsToTheGranularityZeroesAndExportsACloseOnExecDescriptor) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const std::size_t unit = cuda::VmmAllocation::granularity(kDevice);
  ASSERT_GT(unit, 0u);
  EXPECT_EQ(unit & (unit - 1), 0u) << "a power of two";
  const cuda::VmmAllocation a(kDevice, unit + 1);
  EXPECT_EQ(a.size(), 2 * unit);
  EXPECT_EQ(a.granularity(), unit);
  EXPECT_EQ(a.device(), kDevice);
  ASSERT_GE(a.fd(), 0);
  EXPECT_EQ(::fcntl(a.fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  std::vector<unsigned char> host(a.size(), 1);
  ASSERT_EQ(cudaMemcpy(host.data(), a.data(), a.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (const unsigned char b : host) ASSERT_EQ(b, 0);
  EXPECT_THROW(cuda::VmmAllocation(kDevice, 0), std::invalid_argument);
}

TEST(VmmAllocation, ReleasesDeviceMemoryOnDestruction) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const std::size_t unit = cuda::VmmAllocation::granularity(kDevice);
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  { const cuda::VmmAllocation warm(kDevice, 1); }
  const std::size_t before = free_device_bytes();
  int fd = -1;
  {
    const cuda::VmmAllocation a(kDevice, kBytes);
    fd = a.fd();
    EXPECT_LE(free_device_bytes() + kBytes, before + unit) << "the memory is not taken";
  }
  const std::size_t after = free_bytes_reaching(before - unit);
  EXPECT_GE(after + unit, before);
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "the descriptor is closed";
  EXPECT_EQ(errno, EBADF);
}

TEST(IpcAllocation, ReleasesDeviceMemoryOnDestruction) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const std::size_t unit = cuda::VmmAllocation::granularity(kDevice);
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  { const cuda::IpcAllocation warm(kDevice, 1); }
  const std::size_t before = free_device_bytes();
  {
    const cuda::IpcAllocation a(kDevice, kBytes);
    EXPECT_EQ(a.size(), kBytes);
    EXPECT_NE(a.handle(), cuda::IpcHandleBytes{}) << "the handle has bytes";
    EXPECT_LE(free_device_bytes() + kBytes, before + unit) << "the memory is not taken";
  }
  const std::size_t after = free_bytes_reaching(before - unit);
  EXPECT_GE(after + unit, before);
}

TEST(ImportedVmm, MapsAnExportedAllocationAndChecksItsSize) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  if (!cuda::query_device(kDevice).posix_fd) GTEST_SKIP() << "no POSIX-fd export";
  const cuda::VmmAllocation a(kDevice, 1);
  ASSERT_EQ(cudaMemset(a.data(), 0x42, a.size()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    // A second mapping of the same memory in this process: what a client does.
    const cuda::ImportedVmm mapped(a.fd(), a.size(), kDevice);
    EXPECT_NE(mapped.data(), a.data());
    std::vector<unsigned char> host(a.size());
    ASSERT_EQ(cudaMemcpy(host.data(), mapped.data(), a.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(host.front(), 0x42);
    EXPECT_EQ(host.back(), 0x42);
  }
  EXPECT_THROW(cuda::ImportedVmm(a.fd(), a.size() + 1, kDevice), std::invalid_argument);
  EXPECT_THROW(cuda::ImportedVmm(-1, a.size(), kDevice), std::invalid_argument);
}

TEST(DeviceGuard, RestoresTheCallersDevice) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int other = count - 1;
  ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
  {
    const cuda::DeviceGuard guard(kDevice);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, kDevice);
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, other);
  ASSERT_EQ(cudaSetDevice(kDevice), cudaSuccess);
}

// --- the resource -------------------------------------------------------------------------

TEST(CudaResource, DescribesItsDevice) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const CudaResource r(kDevice);
  EXPECT_EQ(r.name(), "cuda");
  EXPECT_EQ(r.space(), MemorySpace::device);
  EXPECT_EQ(r.device(), kDevice);
  EXPECT_EQ(r.granularity(), cuda::VmmAllocation::granularity(kDevice));
  ASSERT_FALSE(r.handle_kinds().empty());
  EXPECT_TRUE(r.shares_as(HandleKind::cuda_ipc));
  EXPECT_FALSE(r.shares_as(HandleKind::memfd));
  if (r.device_info().posix_fd) {
    EXPECT_EQ(r.handle_kinds().front(), HandleKind::cuda_vmm_fd);
  }
  EXPECT_FALSE(r.device_info().name.empty());
  EXPECT_GE(r.device_info().compute_major, 8);  // the kernels are built for sm_80 and sm_90
  EXPECT_GT(r.total_bytes(), 0u);
  EXPECT_LE(r.free_bytes(), r.total_bytes());
}

TEST(CudaResource, IpcAllocationsCarryTheHandleAndNoDescriptor) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  CudaResource r(kDevice);
  const auto a = r.allocate(4096, "ipc", HandleKind::cuda_ipc);
  EXPECT_EQ(a->info().fd, -1);
  EXPECT_EQ(a->info().where.handle_kind, HandleKind::cuda_ipc);
  EXPECT_NE(a->info().where.ipc_handle, cuda::IpcHandleBytes{});
  EXPECT_EQ(a->size(), r.granularity());
  EXPECT_THROW((void)a->host_bytes(), std::logic_error);
}

TEST(CudaResource, OutOfMemoryIsPoolExhaustedNamingTheLabel) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  CudaResource r(kDevice);
  for (const HandleKind kind : r.handle_kinds()) {
    try {
      (void)r.allocate(r.total_bytes() + r.granularity(), "far-too-big", kind);
      ADD_FAILURE() << "expected pool_exhausted for " << kernels::to_string(kind);
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::pool_exhausted) << e.what();
      EXPECT_NE(std::string(e.what()).find("far-too-big"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("CUDA device 0"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaResource, AMissingDeviceIsAClearError) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  try {
    CudaResource r(count + 3);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA device " + std::to_string(count + 3)), std::string::npos) << what;
    EXPECT_NE(what.find("--backend host"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace statepool::service
