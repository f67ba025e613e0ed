#include "memory/host_memfd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {
namespace {

using support::errno_text;
using support::UniqueFd;

/// A failed system call: resource shortages are the pool's problem (the operator can act
/// on them), everything else is ours.
[[noreturn]] void throw_os_error(const char* call, std::string_view label, std::size_t bytes,
                                 int err) {
  const bool shortage =
      err == ENOMEM || err == ENOSPC || err == EFBIG || err == EMFILE || err == ENFILE;
  std::string message = std::string(call) + "('" + std::string(label) + "', " +
                        std::to_string(bytes) + " bytes): " + errno_text(err);
  // A shortage is the client's pool_exhausted, but the operator must see it too: the
  // host (descriptors, memory, tmpfs space) is short, not the pool's capacity.
  if (shortage) LOG_WARN("memory", "host memory allocation failed: ", message);
  throw StatusError(shortage ? Status::pool_exhausted : Status::internal, message);
}

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

class HostMemfdAllocation final : public Allocation {
 public:
  HostMemfdAllocation(const AllocationInfo& info, UniqueFd fd) noexcept
      : Allocation(info), fd_(std::move(fd)) {}
  ~HostMemfdAllocation() override {
    // Destructors never throw; a failing munmap means a corrupted address, so say so.
    if (::munmap(info().data, info().bytes) != 0) {
      const int err = errno;
      std::fprintf(stderr, "statepool: munmap(%p, %zu) failed: %s\n",
                   static_cast<void*>(info().data), info().bytes, errno_text(err));
    }
  }

 private:
  UniqueFd fd_;  // closed after the unmap above (either order is valid)
};

/// Maps the sealed memfd `fd` of `bytes` bytes and returns it as an allocation that owns
/// the mapping and the descriptor; `populate`: with its page tables filled now.
std::shared_ptr<Allocation> map_memfd(UniqueFd fd, std::size_t bytes, const std::string& name,
                                      std::size_t granularity, bool populate) {
  const int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd.get(), 0);
  if (addr == MAP_FAILED) throw_os_error("mmap", name, bytes, errno);

  AllocationInfo info;
  info.data = static_cast<std::byte*>(addr);
  info.bytes = bytes;
  info.where.space = MemorySpace::host;
  info.where.device = -1;
  info.where.handle_kind = HandleKind::memfd;
  info.where.granularity = granularity;
  info.fd = fd.get();
  try {
    return std::make_shared<HostMemfdAllocation>(info, std::move(fd));
  } catch (...) {
    ::munmap(addr, bytes);  // fd is still ours if make_shared threw before taking it
    throw;
  }
}

}  // namespace

std::span<const HandleKind> HostMemfdResource::handle_kinds() const noexcept {
  static constexpr HandleKind kKinds[] = {HandleKind::memfd};
  return kKinds;
}

std::shared_ptr<Allocation> HostMemfdResource::do_allocate(std::size_t bytes,
                                                           std::string_view label, HandleKind) {
  STATEPOOL_EXPECTS(bytes <= static_cast<std::size_t>(std::numeric_limits<off_t>::max()),
                    Status::pool_exhausted,
                    "host memory: " + std::to_string(bytes) + " bytes is too large");
  const std::string name = memfd_name(label);

  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_os_error("memfd_create", name, bytes, errno);

  const auto size = static_cast<off_t>(bytes);
  if (::ftruncate(fd.get(), size) != 0) throw_os_error("ftruncate", name, bytes, errno);

  // Commit the pages now (see the header). Filesystems without fallocate support keep the
  // lazy behaviour.
  if (const int err = ::posix_fallocate(fd.get(), 0, size);
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    throw_os_error("fallocate", name, bytes, err);
  }

  // No shrink, no grow (the size is the contract), no further seals: nobody may add
  // F_SEAL_WRITE and freeze the memory.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw_os_error("fcntl(F_ADD_SEALS)", name, bytes, errno);
  }

  return map_memfd(std::move(fd), bytes, name, granularity(), true);
}

std::shared_ptr<Allocation> HostMemfdResource::do_adopt(UniqueFd fd, std::size_t bytes,
                                                        std::string_view label, HandleKind) {
  const auto refuse = [&](const std::string& why) {
    return StatusError(Status::invalid_argument,
                       "host memory '" + std::string(label) + "' to take over: " + why);
  };
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw refuse(std::string("fstat: ") + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("the descriptor is not a memfd");
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) != bytes) {
    throw refuse("it is " + std::to_string(st.st_size) + " bytes, " + std::to_string(bytes) +
                 " expected");
  }
  // Only a memfd sealed as ours are (do_allocate) cannot shrink under the mapping: a file
  // that could would turn a peer's ftruncate into this process's SIGBUS.
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) throw refuse("the descriptor is not a memfd (F_GET_SEALS refused)");
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    throw refuse("the memfd is not sealed against shrinking and growing");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    throw refuse("the memfd is sealed against writes");
  }
  // Not populated: its pages are committed already (a first touch is a minor fault), and
  // filling a large pool's page tables here would lengthen a hand-over's pause.
  return map_memfd(std::move(fd), bytes, memfd_name(label), granularity(), false);
}

}  // namespace statepool::service
