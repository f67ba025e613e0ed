#pragma once
// The one place a memory backend is chosen (--backend): its memory resource, where arenas
// and staging buffers come from, and its executor, which runs compress, decompress and
// copy on that memory.
//
//   host   HostMemfdResource + HostExecutor (a WorkerPool over every core)
//   cuda   the CUDA backend issue adds: a VMM resource (cuMemCreate, POSIX fd handles)
//          and a stream + event executor, here and nowhere else
//
// Thread-safety: make_backend is called once at start.

#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "exec/executor.hpp"
#include "exec/worker_pool.hpp"
#include "memory/resource.hpp"

namespace statepool::service {

struct Backend {
  std::shared_ptr<MemoryResource> memory;
  std::unique_ptr<Executor> executor;
};

/// The backends this build offers, for --help and error messages.
[[nodiscard]] std::vector<std::string> available_backends();

/// Builds the backend config.backend names. `workers` must outlive the result. Throws
/// std::runtime_error with an actionable message when the backend cannot start.
[[nodiscard]] Backend make_backend(const Config& config, WorkerPool& workers);

}  // namespace statepool::service
