#pragma once
// The calibration's threads (internal): a head per task over support::WorkerPool, the
// project's one parallel_for, or the calling thread alone when one thread is asked for.
// Made once per pass over a trace, so that its threads serve every block of tokens.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "statepool/support/worker_pool.hpp"

namespace statepool::calibration::detail {

class HeadThreads {
 public:
  /// `threads` in all: the caller and threads - 1 workers (none for 0 or 1).
  explicit HeadThreads(std::uint32_t threads) {
    if (threads > 1) pool_.emplace(threads - 1);
  }

  /// fn(h) for every h < n. With workers, every call runs even if some throw, and the
  /// exception of the lowest h is rethrown (WorkerPool::parallel_for); alone, the first
  /// exception stops the loop.
  template <class Fn>
  void for_each(std::size_t n, const Fn& fn) {
    if (!pool_) {
      for (std::size_t h = 0; h < n; ++h) fn(h);
      return;
    }
    pool_->parallel_for(n, 1, [&](std::size_t first, std::size_t last) {
      for (std::size_t h = first; h < last; ++h) fn(h);
    });
  }

 private:
  std::optional<support::WorkerPool> pool_;
};

}  // namespace statepool::calibration::detail
