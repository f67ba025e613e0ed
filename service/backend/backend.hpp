#pragma once
// The one place a memory backend is chosen (--backend): its memory resource, where arenas
// and staging buffers come from, and its executor, which runs compress, decompress and
// copy on that memory.
//
//   host   HostMemfdResource + HostExecutor (a WorkerPool over every core)
//   cuda   CudaResource (cuMemCreate with POSIX-fd handles, or legacy IPC handles;
//          memory/cuda_resource.hpp) + CudaExecutor (a stream and events,
//          exec/cuda_executor.hpp), whose own device memory goes through a
//          TrackingResource over the same CudaResource; only in builds with CUDA
//
// Thread-safety: make_backend is called once at start.

#include <cstdint>
#include <memory>
#include <string>

#include "exec/executor.hpp"
#include "memory/resource.hpp"
#include "memory/tracking.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::service {

struct Backend {
  std::shared_ptr<MemoryResource> memory;
  /// The executor's own device memory (tables, check results, scratch), counted apart
  /// from arenas and staging; null for an executor that allocates none (host).
  std::unique_ptr<TrackingResource> executor_memory;
  std::unique_ptr<Executor> executor;  // destroyed first: it releases executor_memory
};

/// What the backend needs of the daemon's configuration (config/config.hpp fills it from
/// the flags; main.cpp passes it), so that the backend depends on no other folder's config.
struct BackendConfig {
  std::string name = "host";         ///< --backend: "host" or "cuda"
  int device = 0;                    ///< --device: the CUDA device ordinal (cuda)
  std::uint64_t capacity_bytes = 0;  ///< --pool-capacity as a size
  /// --pool-capacity as a fraction of the device's free memory at start (0 < f <= 1);
  /// 0: capacity_bytes as given.
  double capacity_fraction = 0;
};

/// Builds the backend config.name names. `workers` must outlive the result. Throws
/// std::runtime_error with an actionable message when the backend cannot start.
[[nodiscard]] Backend make_backend(const BackendConfig& config, support::WorkerPool& workers);

/// The pool capacity in bytes: config.capacity_bytes, or config.capacity_fraction of what
/// `memory` says is free now. Throws std::runtime_error when a fraction cannot be resolved.
[[nodiscard]] std::uint64_t pool_capacity(const BackendConfig& config,
                                          const MemoryResource& memory);

}  // namespace statepool::service
