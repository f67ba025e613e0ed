// The executor conformance suite (executor_conformance.hpp) for the host executor: one
// worker, several workers, and the coarsest split.
#include <cstring>
#include <string>
#include <vector>

#include "exec/host_executor.hpp"
#include "executor_conformance.hpp"
#include "memory/host_memfd.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::service {
namespace {

/// Host executors use the test's vectors directly.
struct HostRig {
  HostMemfdResource host;
  MemoryResource& memory() { return host; }
  static kernels::BufferRef bind(std::vector<std::byte>& bytes) {
    return {bytes.data(), bytes.size(), MemorySpace::host, -1};
  }
  static void sync() {}
  static std::string missing() { return {}; }
  static std::string kv_missing() { return {}; }
  static void upload(const Allocation& allocation, const std::vector<std::byte>& bytes) {
    std::memcpy(allocation.host_bytes().data(), bytes.data(), bytes.size());
  }
};

struct OneWorker : HostRig {
  support::WorkerPool workers{1};
  HostExecutor host_executor{workers};
  Executor& executor() { return host_executor; }
};
struct ThreeWorkers : HostRig {
  support::WorkerPool workers{3};
  HostExecutor host_executor{workers};
  Executor& executor() { return host_executor; }
};
struct CoarseSplit : HostRig {  // one chunk per worker: the fewest, largest pieces
  support::WorkerPool workers{2};
  HostExecutor host_executor{workers, 1};
  Executor& executor() { return host_executor; }
};

using Executors = ::testing::Types<OneWorker, ThreeWorkers, CoarseSplit>;
class ExecutorNames {
 public:
  template <class T>
  static std::string GetName(int /*index*/) {
    if constexpr (std::is_same_v<T, OneWorker>) return "host_1_worker";
    if constexpr (std::is_same_v<T, ThreeWorkers>) return "host_3_workers";
    if constexpr (std::is_same_v<T, CoarseSplit>) return "host_coarse_split";
    return "unknown";
  }
};
}  // namespace

// In the suite's namespace (gtest's registration names live there).
namespace conformance {
INSTANTIATE_TYPED_TEST_SUITE_P(Host, ExecutorConformance, Executors, ExecutorNames);
}  // namespace conformance
}  // namespace statepool::service
