#include "memory/resource.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

std::string handle_kind_list(const MemoryResource& resource) {
  std::string out;
  for (const HandleKind kind : resource.handle_kinds()) {
    if (!out.empty()) out += ", ";
    out += kernels::to_string(kind);
  }
  return out;
}

}  // namespace

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

bool MemoryResource::shares_as(HandleKind kind) const noexcept {
  const auto kinds = handle_kinds();
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

std::shared_ptr<Allocation> MemoryResource::allocate(std::size_t bytes, std::string_view label,
                                                     std::optional<HandleKind> handle) {
  STATEPOOL_EXPECTS(
      bytes > 0, Status::invalid_argument,
      std::string(name()) + " memory: cannot allocate 0 bytes for '" + std::string(label) + "'");
  STATEPOOL_EXPECTS(
      allocation_size(bytes) >= bytes, Status::pool_exhausted,
      std::string(name()) + " memory: " + std::to_string(bytes) + " bytes is too large");
  const HandleKind kind = handle.value_or(handle_kinds().front());
  STATEPOOL_EXPECTS(shares_as(kind), Status::invalid_argument,
                    std::string("the ") + std::string(name()) + " backend cannot share memory as " +
                        kernels::to_string(kind) + " (it offers " + handle_kind_list(*this) + ")");
  return do_allocate(allocation_size(bytes), label, kind);
}

std::shared_ptr<Allocation> MemoryResource::adopt(support::UniqueFd fd, std::size_t bytes,
                                                  std::string_view label, HandleKind handle) {
  const auto refuse = [&](const std::string& why) {
    return StatusError(Status::invalid_argument,
                       std::string(name()) + " memory '" + std::string(label) + "': " + why);
  };
  if (!fd) throw refuse("no descriptor to take over");
  if (bytes == 0) throw refuse("cannot take over 0 bytes");
  if (allocation_size(bytes) != bytes) {
    throw refuse(std::to_string(bytes) + " bytes is not a multiple of the " +
                 std::to_string(granularity()) + "-byte granularity");
  }
  if (!shares_as(handle)) {
    throw refuse(std::string("cannot take over memory shared as ") + kernels::to_string(handle) +
                 " (this backend offers " + handle_kind_list(*this) + ")");
  }
  return do_adopt(std::move(fd), bytes, label, handle);
}

std::shared_ptr<Allocation> MemoryResource::do_adopt(support::UniqueFd, std::size_t,
                                                     std::string_view label, HandleKind handle) {
  throw StatusError(Status::invalid_argument,
                    std::string("the ") + std::string(name()) + " backend cannot take over '" +
                        std::string(label) + "' shared as " + kernels::to_string(handle));
}

}  // namespace statepool::service
