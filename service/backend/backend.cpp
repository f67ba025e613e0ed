#include "backend/backend.hpp"

#include <cmath>
#include <stdexcept>

#include "exec/host_executor.hpp"
#include "memory/host_memfd.hpp"
#include "statepool/support/size.hpp"
#if defined(STATEPOOL_HAVE_CUDA)
#include "exec/cuda_executor.hpp"
#include "memory/cuda_resource.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/support/log.hpp"
#endif

namespace statepool::service {

Backend make_backend(const BackendConfig& config, support::WorkerPool& workers) {
  if (config.name == "host") {
    return Backend{std::make_shared<HostMemfdResource>(), nullptr,
                   std::make_unique<HostExecutor>(workers)};
  }
#if defined(STATEPOOL_HAVE_CUDA)
  if (config.name == "cuda") {
    // What a destructor fails to release (memory, a mapping, an import) goes to the log.
    kernels::cuda::set_failure_reporter([](std::string_view message) noexcept {
      support::log_line(support::LogLevel::error, "cuda", message);
    });
    // The resource checks the driver and the device first: its error says what is missing.
    auto memory = std::make_shared<CudaResource>(config.device);
    auto executor_memory = std::make_unique<TrackingResource>(*memory);
    auto executor = std::make_unique<CudaExecutor>(config.device, *executor_memory);
    return Backend{std::move(memory), std::move(executor_memory), std::move(executor)};
  }
#endif
  throw std::runtime_error("unknown backend '" + config.name + "'");
}

std::uint64_t pool_capacity(const BackendConfig& config, const MemoryResource& memory) {
  if (config.capacity_fraction <= 0.0) return config.capacity_bytes;
  const std::optional<std::uint64_t> free = memory.available_bytes();
  if (!free) {
    throw std::runtime_error(
        "--pool-capacity as a fraction needs a backend that knows its free "
        "memory; the " +
        std::string(memory.name()) + " backend does not");
  }
  const auto bytes =
      static_cast<std::uint64_t>(std::floor(config.capacity_fraction * static_cast<double>(*free)));
  if (bytes == 0) {
    throw std::runtime_error("--pool-capacity " + std::to_string(config.capacity_fraction) +
                             " of " + support::format_bytes(*free) + " free is 0 bytes");
  }
  return bytes;
}

}  // namespace statepool::service
