#pragma once
// parallel_for over [0, n) with up to `threads` std::threads (internal). The first
// exception thrown by any call is rethrown in the caller after every worker has stopped.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace statepool::calibration::detail {

template <typename Fn>
void parallel_for(std::size_t n, std::uint32_t threads, Fn&& fn) {
  const std::size_t workers = std::min<std::size_t>(std::max<std::uint32_t>(threads, 1), n);
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) {
      fn(i);
    }
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n || failed.load()) {
        return;
      }
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) {
          error = std::current_exception();
        }
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (std::size_t t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads; the ones running (and this one) do the rest
    }
  }
  work();
  for (std::thread& thread : pool) {
    thread.join();
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

}  // namespace statepool::calibration::detail
