#include "statepool/support/worker_pool.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>

namespace statepool::support {
namespace {

/// One parallel_for: chunks are claimed with an atomic counter; `done` counts finished
/// chunks. Shared, because a helper task may start after the call has returned.
struct Batch {
  std::size_t count = 0;
  std::size_t grain = 1;
  std::size_t chunks = 0;
  const std::function<void(std::size_t, std::size_t)>* fn = nullptr;
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::vector<std::exception_ptr> errors;  // one per chunk, written by its runner only

  /// Runs chunks until none is left. Returns after the last chunk it ran.
  void work() noexcept {
    for (;;) {
      const std::size_t chunk = next.fetch_add(1);
      if (chunk >= chunks) return;
      const std::size_t begin = chunk * grain;
      const std::size_t end = std::min(count, begin + grain);
      try {
        (*fn)(begin, end);
      } catch (...) {
        errors[chunk] = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == chunks) done.notify_all();
    }
  }
};

}  // namespace

WorkerPool::WorkerPool(unsigned threads, int nice) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this, nice] { run_worker(nice); });
}

WorkerPool::~WorkerPool() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void WorkerPool::run_worker(int nice) {
  if (nice > 0) {
    // Per-thread on Linux (the "process" is the thread id). Failure only costs latency.
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    (void)::setpriority(PRIO_PROCESS, tid, nice);
  }
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    try {
      task();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "statepool: worker task failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "statepool: worker task failed with an unknown exception\n");
    }
    task = nullptr;  // what it captured goes now, not when the next task arrives
    const std::lock_guard lock(mutex_);
    if (--running_ == 0 && queue_.empty()) idle_.notify_all();
  }
}

void WorkerPool::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return running_ == 0 && queue_.empty(); });
}

void WorkerPool::post(std::function<void()> task) {
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void WorkerPool::parallel_for(std::size_t count, std::size_t grain,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  if (count == 0) return;
  if (grain == 0) grain = 1;
  const std::size_t chunks = (count + grain - 1) / grain;
  if (chunks == 1) {
    fn(0, count);
    return;
  }
  auto batch = std::make_shared<Batch>();
  batch->count = count;
  batch->grain = grain;
  batch->chunks = chunks;
  batch->fn = &fn;
  batch->errors.resize(chunks);
  // At most one helper per other chunk; helpers that find nothing left return at once.
  const std::size_t helpers = std::min<std::size_t>(threads_.size(), chunks - 1);
  {
    const std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < helpers; ++i) queue_.push_back([batch] { batch->work(); });
  }
  if (helpers == 1) {
    wake_.notify_one();
  } else {
    wake_.notify_all();
  }
  batch->work();
  // Chunks other threads claimed may still run: wait for them (they read `fn`).
  for (std::size_t seen = batch->done.load(); seen != chunks; seen = batch->done.load()) {
    batch->done.wait(seen);
  }
  for (const auto& error : batch->errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace statepool::support
