#include "memory/resource.hpp"

#include <stdexcept>
#include <string>

#include "statepool/protocol/status.hpp"

namespace statepool::service {

std::span<std::byte> Allocation::host_bytes() const {
  if (info_.where.space != MemorySpace::host) {
    throw std::logic_error("Allocation::host_bytes: the memory is on CUDA device " +
                           std::to_string(info_.where.device) + ", not in host memory");
  }
  return {info_.data, info_.bytes};
}

std::size_t MemoryResource::allocation_size(std::size_t bytes) const noexcept {
  const std::size_t unit = granularity() == 0 ? 1 : granularity();
  const std::size_t rest = bytes % unit;
  return rest == 0 ? bytes : bytes + (unit - rest);
}

std::shared_ptr<Allocation> MemoryResource::allocate(std::size_t bytes, std::string_view label) {
  STATEPOOL_EXPECTS(
      bytes > 0, Status::invalid_argument,
      std::string(name()) + " memory: cannot allocate 0 bytes for '" + std::string(label) + "'");
  STATEPOOL_EXPECTS(
      allocation_size(bytes) >= bytes, Status::pool_exhausted,
      std::string(name()) + " memory: " + std::to_string(bytes) + " bytes is too large");
  return do_allocate(allocation_size(bytes), label);
}

}  // namespace statepool::service
