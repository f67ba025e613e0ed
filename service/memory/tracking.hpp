#pragma once
// TrackingResource: an adaptor that counts what passes through it (RMM's
// statistics_resource_adaptor): live allocations and bytes, and totals since start. The
// daemon puts one under the pool (arena memory) and one under staging, so metrics and
// the exit self-check see every byte the backend holds, whatever limit it went through.
//
// Thread-safety: allocate() and the getters may be called concurrently. Allocations
// keep the adaptor's counters alive, so they may outlive the adaptor object.

#include <atomic>
#include <cstdint>
#include <memory>

#include "memory/resource.hpp"

namespace statepool::service {

/// A consistent-enough snapshot of the counters (each read atomically).
struct MemoryUsage {
  std::uint64_t live_allocations = 0;
  std::uint64_t live_bytes = 0;
  std::uint64_t allocations_total = 0;  ///< successful allocations since start
  std::uint64_t bytes_total = 0;        ///< bytes of those allocations
  std::uint64_t failures_total = 0;     ///< allocations the upstream refused
  std::uint64_t peak_bytes = 0;         ///< highest live_bytes seen
};

class TrackingResource final : public ResourceAdaptor {
 public:
  explicit TrackingResource(MemoryResource& upstream);
  [[nodiscard]] MemoryUsage usage() const noexcept;

 private:
  struct Counters {
    std::atomic<std::uint64_t> live_allocations{0};
    std::atomic<std::uint64_t> live_bytes{0};
    std::atomic<std::uint64_t> allocations_total{0};
    std::atomic<std::uint64_t> bytes_total{0};
    std::atomic<std::uint64_t> failures_total{0};
    std::atomic<std::uint64_t> peak_bytes{0};
  };
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override;
  std::shared_ptr<Allocation> do_adopt(support::UniqueFd fd, std::size_t bytes,
                                       std::string_view label, HandleKind handle) override;
  /// Counts the allocation `upstream()` returns (allocate or adopt), or its failure.
  template <class Upstream>
  std::shared_ptr<Allocation> tracked(Upstream&& upstream);

  std::shared_ptr<Counters> counters_;
};

}  // namespace statepool::service
