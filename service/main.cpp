// statepoold: the statepool daemon. See `statepoold --help` and docs/operations.md.

#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "memory/tracking.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"
#include "server/crash_journal.hpp"
#include "server/server.hpp"
#include "server/systemd.hpp"
#include "server/takeover.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"
#include "statepool/support/version.hpp"
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
    std::optional<Pool> pool_storage;
    const auto new_pool = [&](bool log) {
      pool_storage.reset();
      pool_storage.emplace(pool_config, backend.memory);
      for (std::size_t i = 0; i < plans.size(); ++i) {
        const PlanInfo info = pool_storage->install_plan(plans[i]);
        if (!log) continue;
        LOG_INFO("pool", "plan ", info.digest, " from ", config.plan_files[i], ": ", info.units,
                 " units, ", info.pivots, " pivots, ", info.average_bits, " bits on average");
      }
    };
    new_pool(true);
    // --take-over: the running daemon's pool (none with --take-over=if-running when no
    // daemon runs). The predecessor waits paused until confirm() below.
    std::optional<TakenOver> taken;
    if (config.take_over) taken = take_over(config, *pool_storage);
    // What systemd passed: a socket unit's socket, and what a crashed predecessor kept in
    // the descriptor store (server/crash_journal.hpp), recovered before anything serves.
    std::vector<systemd::PassedFd> passed = systemd::passed_fds();
    if (taken && !passed.empty()) {
      LOG_INFO("server", "the pool was taken over: closing the ", passed.size(),
               " descriptors systemd passed (its store keeps them)");
      passed.clear();
    }
    statepool::support::UniqueFd passed_socket = systemd::passed_socket(config.socket_path, passed);
    std::optional<Recovered> recovered;
    std::chrono::milliseconds recovery_took{0};
    if (has_crash_state(passed)) {
      const auto started = std::chrono::steady_clock::now();
      bool spoiled = false;
      recovered = recover(*pool_storage, passed, spoiled);
      if (spoiled) new_pool(false);
      recovery_took = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - started);
    }
    for (const systemd::PassedFd& unknown : passed) {
      LOG_WARN("server", "systemd passed a descriptor named '", unknown.name,
               "' that statepoold does not use; closing it");
    }
    passed.clear();
    Pool& pool = *pool_storage;
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
    std::optional<KeptJournal> kept_journal;
    std::uint64_t generation = 0;
    std::uint64_t first_journal_index = recovered ? recovered->next_journal_index : 0;
    if (taken) {
      generation = taken->meta.generation + 1;
      metrics.taken_over(taken->report, std::chrono::duration<double>(taken->took).count());
      server.bind_handed_over(std::move(taken->listeners));
      confirm(*taken);
      server.own_socket_files();
      if (taken->journal) {
        // Its arenas are stored again at the first write (the store keeps one copy).
        try {
          kept_journal = KeptJournal{
              handover::Journal::open(std::move(taken->journal)), taken->journal_name, {}};
        } catch (const handover::JournalError& e) {
          LOG_WARN("journal", "the predecessor's crash journal ", taken->journal_name,
                   " cannot be continued (", e.what(), "); starting a new one");
          systemd::remove_stored_fd(taken->journal_name);
        }
      }
    } else {
      if (recovered) {
        for (const std::string& line : recovered->dropped) LOG_WARN("recovery", "dropped ", line);
        if (recovered->journal) {
          generation = recovered->meta.generation + 1;
          LOG_INFO("recovery", "recovered generation ", recovered->meta.generation,
                   "'s pool from its crash journal (", recovered->journal->name, ", write ",
                   recovered->sequence, ", ", recovered->age.count(),
                   " ms old): ", recovered->report.arenas, " arenas (",
                   statepool::support::format_bytes(recovered->report.bytes), "), ",
                   recovered->report.pages, " pages in use, ", recovered->report.leases,
                   " leases, ", recovered->report.snapshots, " snapshots; ",
                   recovered->dropped_leases, " leases and ", recovered->dropped_snapshots,
                   " snapshots dropped; ", recovery_took.count(), " ms");
          metrics.recovered(recovered->report, recovered->dropped_leases,
                            recovered->dropped_snapshots);
          kept_journal = std::move(recovered->journal);
        } else {
          LOG_ERROR("recovery",
                    "a crashed statepoold left state in the descriptor store, but nothing "
                    "could be recovered (see the lines above); starting with an empty pool");
        }
      }
      server.bind(std::move(passed_socket));
    }
    server.set_generation(generation);
    metrics.set_generation(generation);
    // The crash journal: only where a service manager keeps descriptors, and memory that
    // outlives a process (legacy CUDA IPC handles do not).
    std::unique_ptr<CrashJournal> crash_journal;
    if (config.crash_journal_interval.count() > 0 && systemd::has_service_manager()) {
      if (backend.memory->handle_kinds().front() == statepool::kernels::HandleKind::cuda_ipc) {
        LOG_WARN("journal", "no crash journal: legacy CUDA IPC memory does not outlive a crash");
      } else {
        handover::ImageMeta meta;
        meta.generation = generation;
        meta.daemon_version = std::string("statepoold ") + statepool::support::version();
        meta.backend = std::string(pool.backend_name());
        meta.device = pool.memory().device();
        try {
          crash_journal =
              std::make_unique<CrashJournal>(pool, &metrics, meta, config.crash_journal_interval,
                                             std::move(kept_journal), first_journal_index);
          server.set_crash_journal(crash_journal.get());
        } catch (const handover::JournalError& e) {
          LOG_ERROR("journal", "no crash journal: ", e.what());
        }
      }
    }
    // A journal recovered or handed over that no writer continues would describe a pool
    // that moves on without it: it and the memory stored beside it leave the store.
    if (!crash_journal && kept_journal) {
      LOG_WARN("journal", "not continuing the crash journal ", kept_journal->name,
               ": it leaves the descriptor store");
      for (const PoolStateArena& arena : pool.save_state().arenas) {
        systemd::remove_stored_fd(std::string(kStoredArenaPrefix) + std::to_string(arena.id));
      }
      systemd::remove_stored_fd(kept_journal->name);
      kept_journal.reset();
    }
    if (config.wait_after_handover && systemd::has_service_manager()) {
      LOG_WARN("server",
               "--after-handover=wait under a service manager: after a hand-over this process "
               "waits for a SIGTERM that systemd (whose main process is then the successor) "
               "does not send; use --after-handover=exit with systemd");
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
    // A clean stop leaves nothing to recover; after a hand-over the journal is the
    // successor's.
    if (crash_journal) crash_journal->stop(/*forget=*/!server.handed_over());
    server.set_crash_journal(nullptr);
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
