#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "backend/memory.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {

// --- UniqueFd ----------------------------------------------------------------------

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

UniqueFd::~UniqueFd() {
  reset();
}

int UniqueFd::release() noexcept {
  return std::exchange(fd_, -1);
}

void UniqueFd::reset(int fd) noexcept {
  const int old = std::exchange(fd_, fd);
  // close() may report EINTR on some systems, but the descriptor is released either way
  // on Linux: retrying would close a descriptor another thread may have just received.
  if (old >= 0 && old != fd) ::close(old);
}

// --- Mapping -----------------------------------------------------------------------

namespace {

/// Thread-safe and allocation-free (usable from destructors), unlike strerror.
const char* errno_text(int err) noexcept {
  const char* text = ::strerrordesc_np(err);
  return text != nullptr ? text : "unknown error";
}

/// A failed system call: resource shortages are the pool's problem (the operator can
/// act on them), everything else is ours.
[[noreturn]] void throw_os_error(const char* call, std::string_view label, std::size_t bytes,
                                 int err) {
  const bool shortage = err == ENOMEM || err == ENOSPC || err == EFBIG;
  std::string message = std::string(call) + "('" + std::string(label) + "', " +
                        std::to_string(bytes) + " bytes): " + errno_text(err);
  throw StatusError(shortage ? Status::pool_exhausted : Status::internal, message);
}

/// Owns one mmap'd range; munmap on destruction. Move-only.
class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(void* addr, std::size_t size) noexcept : addr_(addr), size_(size) {}
  Mapping(Mapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      unmap();
      addr_ = std::exchange(other.addr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { unmap(); }

  [[nodiscard]] std::span<std::byte> bytes() const noexcept {
    return {static_cast<std::byte*>(addr_), size_};
  }

 private:
  void unmap() noexcept {
    if (addr_ != nullptr && ::munmap(addr_, size_) != 0) {
      // Destructors never throw; a failing munmap means a corrupted address, so say so.
      const int err = errno;
      std::fprintf(stderr, "statepool: munmap(%p, %zu) failed: %s\n", addr_, size_,
                   errno_text(err));
    }
    addr_ = nullptr;
    size_ = 0;
  }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

class HostMemory final : public Memory {
 public:
  HostMemory(UniqueFd fd, Mapping mapping) noexcept
      : fd_(std::move(fd)), mapping_(std::move(mapping)) {}

  [[nodiscard]] std::span<std::byte> bytes() noexcept override { return mapping_.bytes(); }
  [[nodiscard]] int share_fd() const noexcept override { return fd_.get(); }

 private:
  // Members die in reverse order: munmap first, then close (either order is valid).
  UniqueFd fd_;
  Mapping mapping_;
};

/// memfd names are limited to 249 bytes and must not hold NUL.
std::string memfd_name(std::string_view label) {
  constexpr std::size_t kMaxName = 249;
  std::string name(label.substr(0, kMaxName));
  for (char& c : name) {
    if (c == '\0') c = '_';
  }
  if (name.empty()) name = "statepool";
  return name;
}

}  // namespace

// --- HostBackend -------------------------------------------------------------------

std::unique_ptr<Memory> HostBackend::allocate(std::size_t bytes, std::string_view label) {
  STATEPOOL_EXPECTS(bytes > 0, Status::invalid_argument,
                    "host backend: cannot allocate 0 bytes for '" + std::string(label) + "'");
  STATEPOOL_EXPECTS(bytes <= static_cast<std::size_t>(std::numeric_limits<off_t>::max()),
                    Status::pool_exhausted,
                    "host backend: " + std::to_string(bytes) + " bytes is too large");
  const std::string name = memfd_name(label);

  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_os_error("memfd_create", name, bytes, errno);

  const auto size = static_cast<off_t>(bytes);
  if (::ftruncate(fd.get(), size) != 0) throw_os_error("ftruncate", name, bytes, errno);

  // Commit the pages now. A memfd is sparse; without this, memory shortage would show up
  // later as SIGBUS on first touch (in the daemon or in a client) instead of as a clean
  // pool_exhausted here. Filesystems without fallocate support keep the lazy behaviour.
  if (const int err = ::posix_fallocate(fd.get(), 0, size);
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    throw_os_error("fallocate", name, bytes, err);
  }

  // No shrink: a client holding the fd cannot truncate pages away under the daemon (that
  // would SIGBUS us). No grow: the size is the arena's contract. No further seals: nobody
  // may add F_SEAL_WRITE and freeze the arena.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw_os_error("fcntl(F_ADD_SEALS)", name, bytes, errno);
  }

  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) throw_os_error("mmap", name, bytes, errno);
  Mapping mapping(addr, bytes);

  return std::make_unique<HostMemory>(std::move(fd), std::move(mapping));
}

}  // namespace statepool::service
