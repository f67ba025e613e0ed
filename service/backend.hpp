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

#include <memory>

#include "config/config.hpp"
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

/// Builds the backend config.backend names. `workers` must outlive the result. Throws
/// std::runtime_error with an actionable message when the backend cannot start.
[[nodiscard]] Backend make_backend(const Config& config, support::WorkerPool& workers);

/// The pool capacity in bytes: config.pool.capacity_bytes, or config.capacity_fraction of
/// what `memory` says is free now. Throws std::runtime_error when a fraction cannot be
/// resolved.
[[nodiscard]] std::uint64_t pool_capacity(const Config& config, const MemoryResource& memory);

}  // namespace statepool::service
