#pragma once
// Memory resources: where arena and staging bytes live and how a peer maps them — RMM's
// memory-resource idea, for memory that is shared with other processes.
//
//   MemoryResource     allocates zeroed, shareable memory: HostMemfdResource (memfd +
//                      mmap, host_memfd.hpp); the CUDA resource (cuMemCreate with POSIX
//                      file-descriptor handles, or legacy IPC handles) implements the same
//                      interface.
//   LimitingResource   adaptor: refuses allocations beyond a byte limit (the pool's
//                      capacity, a tenant's quota, a connection's staging), limiting.hpp.
//   TrackingResource   adaptor: counts live allocations and bytes (accounting, metrics,
//                      leak checks), tracking.hpp.
//
// Adaptors wrap their upstream's allocations: releasing an allocation gives its bytes
// back to every adaptor it went through, then frees the memory. Allocations are shared
// objects: the pool holds an arena's, and an executor holds the ones an operation reads
// and writes until it completes, so memory never disappears under running work.
//
// Errors: StatusError(pool_exhausted) when memory or a limit runs out (a limit may use
// another status, e.g. quota_exceeded), StatusError(invalid_argument) for a zero size,
// StatusError(internal) for other failures; messages name the label and the size.
// Thread-safety: every resource and adaptor may be used from several threads at once; an
// allocation's bytes may be touched concurrently where the users touch disjoint bytes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "statepool/kernels/memory.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {

using kernels::HandleKind;
using kernels::MemorySpace;

/// Everything this process needs to use an allocation and a peer needs to map it.
struct AllocationInfo {
  std::byte* data = nullptr;        ///< the bytes in this process (host or device address)
  std::size_t bytes = 0;            ///< size: the request rounded up to where.granularity
  kernels::MemoryDescriptor where;  ///< space, device, handle kind, granularity, IPC bytes
  /// memfd and cuda_vmm_fd: the descriptor to send with SCM_RIGHTS. Borrowed: valid as
  /// long as the allocation lives. -1 for other handle kinds.
  int fd = -1;
};

/// One live allocation. Destroying the last reference releases it.
class Allocation {
 public:
  virtual ~Allocation() = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  [[nodiscard]] const AllocationInfo& info() const noexcept { return info_; }
  [[nodiscard]] std::size_t size() const noexcept { return info_.bytes; }
  /// The whole allocation as a buffer an executor can use.
  [[nodiscard]] kernels::BufferRef buffer() const noexcept {
    return {info_.data, info_.bytes, info_.where.space, info_.where.device};
  }
  /// Host memory as bytes. Throws std::logic_error for device memory.
  [[nodiscard]] std::span<std::byte> host_bytes() const;

 protected:
  explicit Allocation(const AllocationInfo& info) noexcept : info_(info) {}

 private:
  AllocationInfo info_;
};

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;

  /// The backend's name for logs, metrics labels and replies: "host", "cuda".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual MemorySpace space() const noexcept = 0;
  /// CUDA device ordinal; -1 for host memory.
  [[nodiscard]] virtual int device() const noexcept = 0;
  /// Allocation sizes are rounded up to a multiple of this.
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;
  /// What an allocation of `bytes` really takes: `bytes` rounded up to granularity().
  [[nodiscard]] std::size_t allocation_size(std::size_t bytes) const noexcept;
  /// How this resource can share memory with a peer; the first kind is its default
  /// (host: memfd; cuda: cuda_vmm_fd, then cuda_ipc).
  [[nodiscard]] virtual std::span<const HandleKind> handle_kinds() const noexcept = 0;
  [[nodiscard]] bool shares_as(HandleKind kind) const noexcept;
  /// What the backend could still allocate now (a device's free memory, which other
  /// processes share), or nothing when it cannot say (host memory: the kernel
  /// overcommits). Capacity planning answers against it.
  [[nodiscard]] virtual std::optional<std::uint64_t> available_bytes() const {
    return std::nullopt;
  }

  /// Allocates allocation_size(bytes) zeroed, shareable bytes (`bytes` > 0), shared as
  /// `handle` (default: handle_kinds().front()). `label` names the memory for debugging
  /// (the memfd's name) and in error messages. Throws StatusError as described at the top
  /// of this file (invalid_argument for a handle kind this resource cannot give); a
  /// failed call leaves nothing allocated and no limit charged.
  [[nodiscard]] std::shared_ptr<Allocation> allocate(std::size_t bytes, std::string_view label,
                                                     std::optional<HandleKind> handle = {});

  /// Takes over memory that another process (the daemon this one replaces, docs/
  /// operations.md) allocated from the same kind of resource and shared as `handle`:
  /// `fd` is its descriptor, received with SCM_RIGHTS, and `bytes` its size. The memory
  /// is then an allocation of this resource as if allocate() had made it (adaptors charge
  /// and count it; its bytes are whatever the other process left there). The descriptor
  /// is input: one that is not such memory, or of another size, is refused with
  /// StatusError(invalid_argument) naming `label`; a handle kind that cannot move
  /// between processes (cuda_ipc) likewise. A failed call closes `fd` and charges nothing.
  [[nodiscard]] std::shared_ptr<Allocation> adopt(support::UniqueFd fd, std::size_t bytes,
                                                  std::string_view label, HandleKind handle);

 private:
  /// `bytes` is rounded and positive, `handle` one of handle_kinds().
  virtual std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                                  HandleKind handle) = 0;

 protected:
  /// `fd` is valid, `bytes` positive and a multiple of granularity(), `handle` one of
  /// handle_kinds(). The default refuses: the resource cannot take memory over.
  virtual std::shared_ptr<Allocation> do_adopt(support::UniqueFd fd, std::size_t bytes,
                                               std::string_view label, HandleKind handle);
};

/// An allocation made through an adaptor: the upstream's allocation plus whatever the
/// adaptor must undo when it is released (in the derived class's destructor, which runs
/// before the upstream allocation is let go).
class AdaptedAllocation : public Allocation {
 public:
  explicit AdaptedAllocation(std::shared_ptr<Allocation> upstream) noexcept
      : Allocation(upstream->info()), upstream_(std::move(upstream)) {}

 private:
  std::shared_ptr<Allocation> upstream_;
};

/// An adaptor's common part: it forwards what the memory is to its upstream.
class ResourceAdaptor : public MemoryResource {
 public:
  explicit ResourceAdaptor(MemoryResource& upstream) noexcept : upstream_(upstream) {}
  [[nodiscard]] std::string_view name() const noexcept override { return upstream_.name(); }
  [[nodiscard]] MemorySpace space() const noexcept override { return upstream_.space(); }
  [[nodiscard]] int device() const noexcept override { return upstream_.device(); }
  [[nodiscard]] std::size_t granularity() const noexcept override {
    return upstream_.granularity();
  }
  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override {
    return upstream_.handle_kinds();
  }
  [[nodiscard]] std::optional<std::uint64_t> available_bytes() const override {
    return upstream_.available_bytes();
  }
  [[nodiscard]] MemoryResource& upstream() const noexcept { return upstream_; }

 private:
  MemoryResource& upstream_;
};

}  // namespace statepool::service
