// statepoold: the statepool daemon. See `statepoold --help` and docs/operations.md.

#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "memory/tracking.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"
#include "server/server.hpp"
#include "server/systemd.hpp"
#include "server/takeover.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"
#include "statepool/support/worker_pool.hpp"
#include "store/redis_store.hpp"
#include "store/tiers.hpp"

namespace {
/// Worker threads run at this nice increment: codec work fills the cores, and the I/O
/// threads (at the process's priority) must still answer pings and scrapes promptly.
constexpr int kWorkerNice = 5;
}  // namespace

int main(int argc, char** argv) {
  using namespace statepool::service;
  // Before any thread exists: SIGTERM/SIGINT stay blocked in every thread and are taken by
  // Server::run (sigtimedwait), so no signal can kill the daemon half-way through a drain.
  const sigset_t handled_signals = Server::handled_signals();
  pthread_sigmask(SIG_BLOCK, &handled_signals, nullptr);
  ParsedArgs args;
  try {
    args = parse_args(argc, argv);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "statepoold: configuration error: %s\n", e.what());
    return 2;
  }
  if (args.exit_now) {
    std::fputs(args.output.c_str(), stdout);
    return args.exit_code;
  }
  const Config& config = args.config;
  statepool::support::set_log_level(config.log_level);
  std::uint64_t descriptor_limit = 0;
  try {
    descriptor_limit = Server::prepare_descriptor_limit(config);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "statepoold: configuration error: %s\n", e.what());
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);

  // Plans are configuration: load and validate them all before creating anything.
  std::vector<std::shared_ptr<const statepool::kernels::stepquant::Plan>> plans;
  for (const auto& file : config.plan_files) {
    try {
      plans.push_back(std::make_shared<const statepool::kernels::stepquant::Plan>(
          statepool::kernels::stepquant::load(file)));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "statepoold: configuration error: plan %s: %s\n", file.c_str(),
                   e.what());
      return 2;
    }
  }
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (const std::string note = statepool::kernels::stepquant::page_format_note(*plans[i]);
        !note.empty()) {
      LOG_WARN("config", "plan ", config.plan_files[i], ": ", note);
    }
  }

  try {
    for (std::istringstream lines(describe(config)); !lines.eof();) {
      std::string line;
      std::getline(lines, line);
      if (!line.empty()) LOG_INFO("config", line);
    }
    // The snapshot tiers before the workers (which finish their publications), the
    // workers before the server: everything the server's sessions await outlives it.
    std::unique_ptr<SnapshotTiers> tiers;
    if (config.snapshot_host_capacity > 0 || !config.snapshot_remote.empty()) {
      std::unique_ptr<RemoteStore> remote;
      if (!config.snapshot_remote.empty()) {
        RedisOptions redis = parse_redis_url(config.snapshot_remote);  // checked by the config
        redis.timeout = config.snapshot_remote_timeout;
        redis.ttl = config.snapshot_remote_ttl;
        remote = make_redis_store(std::move(redis));
      }
      tiers = std::make_unique<SnapshotTiers>(
          TiersConfig{config.snapshot_host_capacity, TiersConfig{}.max_pending_writes},
          std::move(remote));
      LOG_INFO("store", "snapshot tiers below the pool: ", tiers->describe());
    }
    statepool::support::WorkerPool workers(config.workers, kWorkerNice);
    const BackendConfig backend_config{config.backend, config.device, config.pool.capacity_bytes,
                                       config.capacity_fraction};
    Backend backend = make_backend(backend_config, workers);
    LOG_INFO("server", "backend ", config.backend, ": ", workers.size(), " worker threads, ",
             backend.executor->name(), " executor; descriptor limit ", descriptor_limit);
    if (backend.memory->handle_kinds().front() == statepool::kernels::HandleKind::cuda_ipc) {
      LOG_WARN("server", "device ", config.device,
               " has no POSIX file-descriptor handles: arenas and staging are shared as legacy "
               "CUDA IPC handles (cudaIpcOpenMemHandle) whatever the clients ask for");
    }
    TrackingResource staging_memory(*backend.memory);
    PoolConfig pool_config = config.pool;
    pool_config.capacity_bytes = pool_capacity(backend_config, *backend.memory);
    if (config.capacity_fraction > 0) {
      LOG_INFO("pool", "capacity ", statepool::support::format_bytes(pool_config.capacity_bytes),
               " (", config.capacity_fraction * 100, "% of the device's free memory)");
    }
    Pool pool(pool_config, backend.memory);
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const PlanInfo info = pool.install_plan(plans[i]);
      LOG_INFO("pool", "plan ", info.digest, " from ", config.plan_files[i], ": ", info.units,
               " units, ", info.pivots, " pivots, ", info.average_bits, " bits on average");
    }
    Metrics metrics(pool, protocol_labels(), &staging_memory, tiers.get(),
                    backend.executor_memory.get());
    Server server(config, pool, &metrics, staging_memory, workers, *backend.executor, tiers.get());
    // SIGUSR2 starts the binary installed where this one was started from (an upgrade
    // replaces that file), with the same arguments.
    {
      std::vector<std::string> successor(argv, argv + argc);
      std::error_code ec;
      const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
      if (!ec) successor[0] = exe.string();
      server.set_successor(std::move(successor));
    }
    if (config.take_over) {
      TakenOver taken = take_over(config, pool);
      server.set_generation(taken.meta.generation + 1);
      metrics.set_generation(taken.meta.generation + 1);
      metrics.taken_over(taken.report, std::chrono::duration<double>(taken.took).count());
      server.bind_handed_over(std::move(taken.listeners));
      confirm(taken);
      server.own_socket_files();
    } else {
      server.bind();
    }
    if (!config.metrics_address.empty()) {
      const auto host = config.metrics_address.substr(0, config.metrics_address.rfind(':'));
      LOG_INFO("metrics", "serving http://", host, ":", server.metrics_port(), "/metrics");
    }
    if (!config.api_address.empty()) {
      const auto host = config.api_address.substr(0, config.api_address.rfind(':'));
      LOG_INFO("api", "serving http://", host, ":", server.api_port(), "/v1");
    }
    LOG_INFO("server", "ready on ", config.socket_path);
    // After the socket listens: a connect() from a unit ordered after ours succeeds.
    systemd::notify("READY=1\nSTATUS=serving " + config.socket_path);
    const std::size_t forced = server.run();  // every operation has completed
    const auto problems = pool.check();
    for (const auto& p : problems) LOG_ERROR("pool", "consistency check at exit: ", p);
    // The executor gives back its own device memory (tables, scratch) when it stops.
    backend.executor.reset();
    bool executor_leaked = false;
    if (backend.executor_memory != nullptr) {
      const MemoryUsage left = backend.executor_memory->usage();
      if (left.live_allocations != 0) {
        LOG_ERROR("pool", "consistency check at exit: the executor's memory still holds ",
                  left.live_bytes, " bytes in ", left.live_allocations, " allocations");
        executor_leaked = true;
      }
    }
    if (server.handed_over()) {
      LOG_INFO("server", "handed over to the successor; exiting");
      return problems.empty() && !executor_leaked ? 0 : 1;
    }
    LOG_INFO("server", "stopped",
             forced > 0 ? statepool::support::cat(" (", forced,
                                                  " busy connections closed at the drain timeout)")
                        : std::string());
    return problems.empty() && !executor_leaked ? 0 : 1;
  } catch (const std::exception& e) {
    LOG_ERROR("server", e.what());
    return 1;
  }
}
