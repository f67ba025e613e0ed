// WorkerPool: every chunk runs exactly once, on the caller and the workers together;
// nested parallel loops cannot deadlock; errors are deterministic; wait_idle waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "statepool/support/worker_pool.hpp"

namespace statepool::support {
namespace {

TEST(WorkerPool, ParallelForCoversTheRangeExactlyOnce) {
  WorkerPool workers(3);
  for (const std::size_t count : {1u, 2u, 7u, 64u, 1000u}) {
    for (const std::size_t grain : {1u, 3u, 64u, 5000u}) {
      std::vector<std::atomic<int>> hits(count);
      workers.parallel_for(count, grain, [&](std::size_t begin, std::size_t end) {
        EXPECT_LT(begin, end);
        EXPECT_LE(end - begin, grain);
        for (std::size_t i = begin; i < end; ++i) ++hits[i];
      });
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "count " << count << " grain " << grain << " index " << i;
      }
    }
  }
  workers.parallel_for(0, 1, [](std::size_t, std::size_t) { FAIL() << "empty range ran"; });
}

TEST(WorkerPool, ChunksRunOnSeveralThreads) {
  WorkerPool workers(3);
  std::mutex mutex;
  std::set<std::thread::id> seen;
  workers.parallel_for(64, 1, [&](std::size_t, std::size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::lock_guard lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_GE(seen.size(), 2u) << "64 sleeping chunks stayed on one thread";
}

TEST(WorkerPool, NestedParallelForFromEveryWorkerCompletes) {
  WorkerPool workers(2);
  std::atomic<int> total{0};
  std::vector<std::promise<void>> done(6);
  for (auto& d : done) {
    workers.post([&, p = &d] {
      workers.parallel_for(100, 7,
                           [&](std::size_t b, std::size_t e) { total += static_cast<int>(e - b); });
      p->set_value();
    });
  }
  for (auto& d : done) {
    ASSERT_EQ(d.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready)
        << "a nested parallel_for deadlocked";
  }
  EXPECT_EQ(total, 600);
}

TEST(WorkerPool, TheLowestFailingChunksErrorIsRethrownAfterEveryChunkRan) {
  WorkerPool workers(3);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> ran{0};
    try {
      workers.parallel_for(40, 1, [&](std::size_t begin, std::size_t) {
        ++ran;
        if (begin == 31 || begin == 17 || begin == 25) {
          throw std::runtime_error("chunk " + std::to_string(begin));
        }
      });
      FAIL() << "expected an exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk 17");
    }
    EXPECT_EQ(ran, 40);
  }
}

TEST(WorkerPool, WaitIdleWaitsForQueuedAndRunningTasks) {
  WorkerPool workers(2);
  std::atomic<int> finished{0};
  for (int i = 0; i < 10; ++i) {
    workers.post([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++finished;
    });
  }
  workers.wait_idle();
  EXPECT_EQ(finished, 10);
}

TEST(WorkerPool, ATaskThatThrowsDoesNotStopTheWorker) {
  WorkerPool workers(1);
  workers.post([] { throw std::runtime_error("task failed on purpose"); });
  std::promise<void> after;
  workers.post([&] { after.set_value(); });
  EXPECT_EQ(after.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

TEST(WorkerPool, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    WorkerPool workers(1);
    for (int i = 0; i < 50; ++i) workers.post([&] { ++ran; });
  }
  EXPECT_EQ(ran, 50);
}

}  // namespace
}  // namespace statepool::support
