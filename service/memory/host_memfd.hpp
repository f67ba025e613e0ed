#pragma once
// The host backend's memory: a sealed memfd mapped MAP_SHARED. The descriptor is what
// clients receive over SCM_RIGHTS and map themselves. The embedded default, so everything
// runs without a GPU.
//
// Pages are committed at allocation (posix_fallocate), so running out of memory is a
// clean pool_exhausted here, not a SIGBUS on first touch later, and the daemon's mapping
// is populated then too (MAP_POPULATE): the first write into a page costs no fault (a
// put into an arena's fresh pages ran 4x slower than into reused ones). The memfd is sealed
// against shrinking and growing before it is shared: a client holding the descriptor
// cannot truncate memory under the daemon. Descriptors are close-on-exec. A successor
// daemon takes the memfds over (adopt()).
//
// Thread-safety: allocate() may be called concurrently.

#include "memory/resource.hpp"

namespace statepool::service {

class HostMemfdResource final : public MemoryResource {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "host"; }
  [[nodiscard]] MemorySpace space() const noexcept override { return MemorySpace::host; }
  [[nodiscard]] int device() const noexcept override { return -1; }
  /// A memfd has any length (the kernel backs it with whole pages): 1.
  [[nodiscard]] std::size_t granularity() const noexcept override { return 1; }
  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override;

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override;
  /// A memfd of exactly `bytes` bytes, sealed against shrinking and growing as
  /// do_allocate() seals its own, and not against writes.
  std::shared_ptr<Allocation> do_adopt(support::UniqueFd fd, std::size_t bytes,
                                       std::string_view label, HandleKind handle) override;
};

}  // namespace statepool::service
