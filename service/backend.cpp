#include "backend.hpp"

#include <stdexcept>

#include "exec/host_executor.hpp"
#include "memory/host_memfd.hpp"

namespace statepool::service {

std::vector<std::string> available_backends() {
  return {"host"};
}

Backend make_backend(const Config& config, WorkerPool& workers) {
  if (config.backend == "host") {
    return Backend{std::make_shared<HostMemfdResource>(), std::make_unique<HostExecutor>(workers)};
  }
  throw std::runtime_error("unknown backend '" + config.backend + "'");
}

}  // namespace statepool::service
