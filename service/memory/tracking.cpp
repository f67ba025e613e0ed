#include "memory/tracking.hpp"

#include <utility>

namespace statepool::service {
namespace {

template <class Counters>
class TrackedAllocation final : public AdaptedAllocation {
 public:
  TrackedAllocation(std::shared_ptr<Allocation> upstream, std::shared_ptr<Counters> counters)
      : AdaptedAllocation(std::move(upstream)), counters_(std::move(counters)) {}
  ~TrackedAllocation() override {
    counters_->live_allocations.fetch_sub(1);
    counters_->live_bytes.fetch_sub(size());
  }

 private:
  std::shared_ptr<Counters> counters_;
};

}  // namespace

TrackingResource::TrackingResource(MemoryResource& upstream)
    : ResourceAdaptor(upstream), counters_(std::make_shared<Counters>()) {}

MemoryUsage TrackingResource::usage() const noexcept {
  MemoryUsage out;
  out.live_allocations = counters_->live_allocations.load();
  out.live_bytes = counters_->live_bytes.load();
  out.allocations_total = counters_->allocations_total.load();
  out.bytes_total = counters_->bytes_total.load();
  out.failures_total = counters_->failures_total.load();
  out.peak_bytes = counters_->peak_bytes.load();
  return out;
}

template <class Upstream>
std::shared_ptr<Allocation> TrackingResource::tracked(Upstream&& upstream) {
  std::shared_ptr<Allocation> memory;
  try {
    memory = upstream();
  } catch (...) {
    counters_->failures_total.fetch_add(1);
    throw;
  }
  // Constructed before counting: if make_shared throws, the upstream memory is released
  // and nothing was counted.
  auto tracked = std::make_shared<TrackedAllocation<Counters>>(std::move(memory), counters_);
  const std::uint64_t size = tracked->size();
  counters_->live_allocations.fetch_add(1);
  const std::uint64_t live = counters_->live_bytes.fetch_add(size) + size;
  counters_->allocations_total.fetch_add(1);
  counters_->bytes_total.fetch_add(size);
  std::uint64_t peak = counters_->peak_bytes.load();
  while (live > peak && !counters_->peak_bytes.compare_exchange_weak(peak, live)) {
  }
  return tracked;
}

std::shared_ptr<Allocation> TrackingResource::do_allocate(std::size_t bytes, std::string_view label,
                                                          HandleKind handle) {
  return tracked([&] { return this->upstream().allocate(bytes, label, handle); });
}

std::shared_ptr<Allocation> TrackingResource::do_adopt(support::UniqueFd fd, std::size_t bytes,
                                                       std::string_view label, HandleKind handle) {
  return tracked([&] { return this->upstream().adopt(std::move(fd), bytes, label, handle); });
}

}  // namespace statepool::service
