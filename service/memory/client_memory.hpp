#pragma once
// ClientMemory: memory a client lends the daemon. The client sends its own memfd (or any
// regular file: tmpfs, disk) with SCM_RIGHTS and the daemon maps it MAP_SHARED, reading
// and writing the client's bytes in place (SGLang's host KV and state pools are memfds
// created without MFD_ALLOW_SEALING).
//
// The client keeps the file and may truncate it at any time; an access to a mapped page
// past the new end is SIGBUS. Shared memory is input, so that must never crash the daemon:
//   - sealed: when the file accepts F_SEAL_SHRINK (a memfd created with
//     MFD_ALLOW_SEALING), the daemon adds it: the file can no longer shrink and the
//     mapping never faults. Seals cannot be removed: the file stays unshrinkable after
//     the memory is released.
//   - guarded: otherwise the mapping is registered in a process-wide table (kMaxGuarded
//     slots) watched by a SIGBUS handler, as libwayland-server does for wl_shm buffers.
//     A fault inside a guarded mapping replaces the whole mapping with private anonymous
//     zero pages (the faulting access then completes: reads give 0, writes go nowhere)
//     and marks the ClientMemory broken(). The client's file is never touched again. A
//     fault anywhere else goes to the handler that was installed before (a sanitizer's,
//     or the default action: the process dies with SIGBUS, as without statepool's).
// A caller that reads or writes guarded memory checks broken() after the access and
// discards what it read (or reports that its write was lost): once broken, the bytes are
// zeros and the daemon's writes. System calls given a broken range (write(2) from it) get
// EFAULT instead of a signal, as for any bad address. broken() only says that a fault
// happened: a client that shrinks and regrows its file between two accesses shows zeros
// without one. The client's bytes are input either way.
//
// The SIGBUS handler is installed with the first guarded mapping and stays for the life
// of the process; a SIGBUS handler installed later must chain to it. Hugetlbfs files are
// refused (running out of huge pages is SIGBUS even in a sealed file).
//
// info(): data is the daemon's mapping, bytes the registered size (the mapping covers it
// rounded up to the page size; where.granularity is 1), host memory shared as memfd, fd -1:
// the daemon never sends the descriptor back (map() closes it once mapped; the mapping
// keeps the file alive).
//
// Errors (map()): StatusError(invalid_argument) for a size of 0 or over kMaxBytes, a
// descriptor that is not a regular file opened for reading and writing, a file shorter
// than the size, or one the kernel will not map shared and writable (e.g. F_SEAL_WRITE);
// StatusError(pool_exhausted) when the guard table is full or the address space is;
// StatusError(internal) when the handler cannot be installed. Messages name the label,
// the size and the reason. A refused call adds no seal and keeps no mapping.
//
// Thread-safety: map() may be called concurrently, and objects destroyed concurrently,
// while other threads fault on guarded mappings. sealed() and broken() may be called from
// any thread. The bytes are shared as for any Allocation (and with the client); the
// daemon must keep the object alive while an access may run (executors hold the
// shared_ptr of running work), since the destructor unregisters and unmaps.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "memory/resource.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {

class ClientMemory final : public Allocation {
  struct Key {};  // map() is the only way to build one

 public:
  /// The largest size a client may register: 1 TiB.
  static constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 40;
  /// How many guarded (unsealed) mappings may be live in the process at once.
  static constexpr std::size_t kMaxGuarded = 4096;

  /// Maps the first `bytes` of the file `fd` refers to, read-write and shared, sealing or
  /// guarding it as described at the top of this file. Takes `fd` (closed before
  /// returning, whatever the outcome). `label` names the memory in error messages.
  [[nodiscard]] static std::shared_ptr<ClientMemory> map(support::UniqueFd fd, std::uint64_t bytes,
                                                         std::string_view label);

  ClientMemory(Key, const AllocationInfo& info, std::size_t mapped_bytes, int slot) noexcept;
  ~ClientMemory() override;

  /// True when the file was sealed against shrinking: the mapping cannot fault.
  [[nodiscard]] bool sealed() const noexcept { return slot_ < 0; }
  /// True once a fault in this guarded mapping replaced it with anonymous memory (the
  /// client shrank its file): the bytes are no longer the client's. Always false when
  /// sealed().
  [[nodiscard]] bool broken() const noexcept;

 private:
  std::size_t mapped_bytes_;  // info().bytes rounded up to the page size
  int slot_;                  // index in the guard table; -1 when sealed
};

}  // namespace statepool::service
