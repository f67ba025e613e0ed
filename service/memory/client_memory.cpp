#include "memory/client_memory.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/file_type.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using support::errno_text;

// --- the guard table and the SIGBUS handler ------------------------------------------------
//
// Everything the handler touches is a lock-free atomic in static storage: no locks, no
// allocation, nothing that a fault in the middle of map() or ~ClientMemory could find
// half-built.

enum : std::uint64_t { kFree = 0, kClaimed = 1, kActive = 2, kPhaseMask = 3 };

struct GuardSlot {
  // The low two bits are the phase (free, claimed by a registration being written,
  // active); the rest counts transitions, so that the handler can tell an unchanged slot
  // from one that was released and reused while it read begin and length.
  std::atomic<std::uint64_t> state{kFree};
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::size_t> length{0};  // page multiple
  std::atomic<bool> broken{false};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uintptr_t>::is_always_lock_free);
static_assert(std::atomic<std::size_t>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);

constinit std::array<GuardSlot, ClientMemory::kMaxGuarded> g_slots{};

// The action that was installed before ours; null until it is completely written.
constinit struct sigaction g_previous_storage {};
constinit std::atomic<const struct sigaction*> g_previous{nullptr};

constexpr std::uint64_t next_state(std::uint64_t state, std::uint64_t phase) noexcept {
  return ((state >> 2) + 1) << 2 | phase;
}

/// Replaces [begin, begin + length) with private anonymous zero pages. A raw system call:
/// the sanitizers' mmap interceptors would rewrite their shadow of the whole range from a
/// signal handler (ThreadSanitizer as a write that races with every other reader), and
/// none of them needs to know: the range stays mapped, readable and writable.
bool remap_anonymous(std::uintptr_t begin, std::size_t length) noexcept {
#if defined(SYS_mmap)
  const long result = ::syscall(SYS_mmap, static_cast<long>(begin), static_cast<long>(length),
                                long{PROT_READ | PROT_WRITE},
                                long{MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS}, long{-1}, long{0});
  return result == static_cast<long>(begin);
#else
  void* const addr = reinterpret_cast<void*>(begin);
  return ::mmap(addr, length, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1,
                0) == addr;
#endif
}

/// A SIGBUS that is not ours: the previous handler's, or the default action.
void chain(int sig, siginfo_t* info, void* context) noexcept {
  const struct sigaction* previous = g_previous.load(std::memory_order_acquire);
  if (previous != nullptr && (previous->sa_flags & SA_SIGINFO) != 0 &&
      previous->sa_sigaction != nullptr) {
    previous->sa_sigaction(sig, info, context);
    return;
  }
  if (previous != nullptr && previous->sa_handler != SIG_DFL && previous->sa_handler != SIG_IGN) {
    previous->sa_handler(sig);
    return;
  }
  // Default action (an ignored SIGBUS from a fault kills too): restore it and let the
  // faulting instruction run again, so that the process dies of this very fault with its
  // core. A signal that was sent, not a fault, would not come back: send it again (it is
  // blocked until this handler returns).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(sig, &fallback, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // si_code > 0: the kernel reports a fault and si_addr is its address.
  if (info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    for (GuardSlot& slot : g_slots) {
      const std::uint64_t state = slot.state.load(std::memory_order_acquire);
      if ((state & kPhaseMask) != kActive) continue;
      // Acquire loads keep the second read of the state after them: if either value
      // belongs to a later registration of this slot, the state has moved on.
      const std::uintptr_t begin = slot.begin.load(std::memory_order_acquire);
      const std::size_t length = slot.length.load(std::memory_order_acquire);
      if (slot.state.load(std::memory_order_acquire) != state) continue;
      if (addr - begin >= length) continue;
      // The first thread to fault replaces the mapping; any other one that faulted
      // meanwhile returns and retries its access until the replacement is in place.
      if (!slot.broken.exchange(true, std::memory_order_acq_rel) &&
          !remap_anonymous(begin, length)) {
        break;  // cannot repair: die of the fault
      }
      errno = saved_errno;
      return;
    }
  }
  errno = saved_errno;
  chain(sig, info, context);
}

void install_handler_once() {
  static std::once_flag once;
  static int error = 0;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    // SA_ONSTACK: where a thread has an alternate signal stack (a crash reporter's, the
    // sanitizers'), this handler and the one it chains to run there, as that one expects.
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGBUS, &action, &g_previous_storage) != 0) {
      error = errno;
      return;
    }
    g_previous.store(&g_previous_storage, std::memory_order_release);
  });
  STATEPOOL_EXPECTS(
      error == 0, Status::internal,
      std::string("client memory: cannot install the SIGBUS handler: ") + errno_text(error));
}

/// Claims a free slot for [begin, begin + length); -1 when the table is full.
int register_guard(std::uintptr_t begin, std::size_t length) noexcept {
  for (std::size_t i = 0; i < g_slots.size(); ++i) {
    GuardSlot& slot = g_slots[i];
    std::uint64_t state = slot.state.load(std::memory_order_relaxed);
    if ((state & kPhaseMask) != kFree) continue;
    if (!slot.state.compare_exchange_strong(state, next_state(state, kClaimed),
                                            std::memory_order_acq_rel)) {
      continue;
    }
    slot.begin.store(begin, std::memory_order_release);
    slot.length.store(length, std::memory_order_release);
    slot.broken.store(false, std::memory_order_release);
    slot.state.store(next_state(next_state(state, kClaimed), kActive), std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void unregister_guard(int index) noexcept {
  GuardSlot& slot = g_slots[static_cast<std::size_t>(index)];
  const std::uint64_t state = slot.state.load(std::memory_order_relaxed);
  slot.state.store(next_state(state, kFree), std::memory_order_release);
}

// --- map() ---------------------------------------------------------------------------------

}  // namespace

ClientMemory::ClientMemory(Key, const AllocationInfo& info, std::size_t mapped_bytes,
                           int slot) noexcept
    : Allocation(info), mapped_bytes_(mapped_bytes), slot_(slot) {}

ClientMemory::~ClientMemory() {
  // Unregister first: once unmapped, the address range may be given to anything else.
  if (slot_ >= 0) unregister_guard(slot_);
  if (::munmap(info().data, mapped_bytes_) != 0) {
    const int err = errno;
    std::fprintf(stderr, "statepool: munmap(%p, %zu) of client memory failed: %s\n",
                 static_cast<void*>(info().data), mapped_bytes_, errno_text(err));
  }
}

bool ClientMemory::broken() const noexcept {
  return slot_ >= 0 &&
         g_slots[static_cast<std::size_t>(slot_)].broken.load(std::memory_order_acquire);
}

std::shared_ptr<ClientMemory> ClientMemory::map(support::UniqueFd fd, std::uint64_t bytes,
                                                std::string_view label) {
  const std::string what =
      "client memory '" + std::string(label) + "' (" + std::to_string(bytes) + " bytes)";
  const auto refuse = [&](const std::string& reason) {
    return StatusError(Status::invalid_argument, what + ": " + reason);
  };

  if (bytes == 0) throw refuse("the size is 0");
  if (bytes > kMaxBytes) throw refuse("larger than the limit of 1 TiB");
  if (!fd.valid()) throw refuse("no file descriptor");

  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0) throw refuse(std::string("not an open descriptor: ") + errno_text(errno));
  if ((flags & O_PATH) != 0) throw refuse("an O_PATH descriptor cannot be mapped");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw refuse(std::string("fstat: ") + errno_text(errno));
  if (!S_ISREG(st.st_mode)) {
    throw refuse(std::string("the descriptor is ") + support::file_type_text(st.st_mode) +
                 ", not a regular file (a memfd)");
  }
  if ((flags & O_ACCMODE) == O_RDONLY) {
    throw refuse("the descriptor is open read-only; the daemon reads and writes the memory");
  }
  if ((flags & O_ACCMODE) != O_RDWR) {
    throw refuse("the descriptor is not open for reading and writing");
  }
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC) {
    throw refuse("hugetlbfs files are not supported (running out of huge pages faults)");
  }
  const auto too_short = [&](off_t size) {
    return refuse("the file holds only " + std::to_string(size) + " bytes");
  };
  if (static_cast<std::uint64_t>(st.st_size) < bytes) throw too_short(st.st_size);

  // Fails (EPERM, EINVAL) for files that cannot be sealed, and when the client sealed
  // the seals; either way the seals the file now has decide.
  (void)::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK);
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  const bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  if (sealed) {
    // The client may have shrunk the file before the seal: this size is final.
    if (::fstat(fd.get(), &st) != 0) throw refuse(std::string("fstat: ") + errno_text(errno));
    if (static_cast<std::uint64_t>(st.st_size) < bytes) throw too_short(st.st_size);
  }

  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto length = static_cast<std::size_t>(bytes);
  const std::size_t mapped = (length + page - 1) / page * page;
  void* const addr = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      throw StatusError(Status::pool_exhausted, what + ": mmap: " + errno_text(err));
    }
    throw refuse(std::string("mmap (shared, read-write): ") + errno_text(err));
  }
  fd.reset();  // the mapping keeps the file

  int slot = -1;
  try {
    if (!sealed) {
      install_handler_once();
      slot = register_guard(reinterpret_cast<std::uintptr_t>(addr), mapped);
      STATEPOOL_EXPECTS(slot >= 0, Status::pool_exhausted,
                        what + ": " + std::to_string(kMaxGuarded) +
                            " unsealed client memories are registered already (the most the "
                            "daemon guards); create memfds with MFD_ALLOW_SEALING");
    }
    AllocationInfo info;
    info.data = static_cast<std::byte*>(addr);
    info.bytes = length;
    info.where.space = MemorySpace::host;
    info.where.device = -1;
    info.where.handle_kind = HandleKind::memfd;
    info.where.granularity = 1;  // bytes as registered (AllocationInfo::bytes)
    info.fd = -1;
    return std::make_shared<ClientMemory>(Key{}, info, mapped, slot);
  } catch (...) {
    if (slot >= 0) unregister_guard(slot);
    ::munmap(addr, mapped);
    throw;
  }
}

}  // namespace statepool::service
