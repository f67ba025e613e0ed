#pragma once
// WorkerPool: host threads for work that must not run on the caller's thread, or that
// one thread should not do alone. The daemon's: host codec work (HostExecutor) and
// blocking calls (allocating arena and staging memory, building large page formats,
// releasing large mappings). A client's: the fused decode step on host pages
// (client/decode_step.hpp), split over heads.
//
// post() queues a task; parallel_for() splits a range into chunks that the calling
// thread and any idle worker run together, so one large state uses every core while
// several states still share them. parallel_for may be called from a worker (it never
// waits for a queued task: the caller runs whatever chunks nobody else has taken).
//
// Thread-safety: every member may be called from any thread; the destructor runs the
// tasks still queued, then joins the threads.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace statepool::support {

class WorkerPool {
 public:
  /// `threads` >= 1 worker threads. `nice` > 0 lowers their scheduling priority (Linux
  /// per-thread nice), so that I/O threads stay responsive while codec work saturates
  /// the cores; 0 keeps the process's priority.
  explicit WorkerPool(unsigned threads, int nice = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

  /// Queues `task`. A task that throws is reported on stderr and otherwise ignored: tasks
  /// deliver their own errors.
  void post(std::function<void()> task);

  /// Calls fn(begin, end) for consecutive chunks [begin, end) covering [0, count), each at
  /// most `grain` (>= 1) long, on this thread and idle workers; returns when every chunk
  /// has run. If chunks throw, every chunk still runs and the exception of the lowest
  /// chunk is rethrown (deterministic whatever the scheduling).
  void parallel_for(std::size_t count, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& fn);

  /// Blocks until the queue is empty and no task is running (shutdown: after it, no task
  /// posted before touches anything any more). Must not be called from a worker.
  void wait_idle();

 private:
  void run_worker(int nice);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  unsigned running_ = 0;  // tasks being run
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace statepool::support
