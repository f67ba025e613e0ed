// statepoold: the statepool daemon. See `statepoold --help` and docs/operations.md.

#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <vector>

#include "config/config.hpp"
#include "log.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"
#include "server/server.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

int main(int argc, char** argv) {
  using namespace statepool::service;
  // Before any thread exists: SIGTERM/SIGINT stay blocked in every thread and are taken by
  // Server::run (sigtimedwait), so no signal can kill the daemon half-way through a drain.
  const sigset_t drain_signals = Server::drain_signals();
  pthread_sigmask(SIG_BLOCK, &drain_signals, nullptr);
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
  set_log_level(config.log_level);
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

  try {
    for (std::istringstream lines(describe(config)); !lines.eof();) {
      std::string line;
      std::getline(lines, line);
      if (!line.empty()) LOG_INFO("config", line);
    }
    Pool pool(config.pool, std::make_unique<HostBackend>());
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const PlanInfo info = pool.install_plan(plans[i]);
      LOG_INFO("pool", "plan ", info.digest, " from ", config.plan_files[i], ": ", info.units,
               " units, ", info.pivots, " pivots, ", info.average_bits, " bits on average");
    }
    Metrics metrics(pool);
    Server server(config, pool, &metrics);
    server.bind();
    if (!config.metrics_address.empty()) {
      metrics.start_exporter(config.metrics_address);
      const auto ports = metrics.listening_ports();
      const auto host = config.metrics_address.substr(0, config.metrics_address.rfind(':'));
      LOG_INFO("metrics", "serving http://", host, ":", ports.empty() ? 0 : ports.front(),
               "/metrics");
    }
    if (!config.api_address.empty()) {
      const auto host = config.api_address.substr(0, config.api_address.rfind(':'));
      LOG_INFO("api", "serving http://", host, ":", server.api_port(), "/v1");
    }
    LOG_INFO("server", "ready on ", config.socket_path);
    const std::size_t forced = server.run();
    const auto problems = pool.check();
    for (const auto& p : problems) LOG_ERROR("pool", "consistency check at exit: ", p);
    LOG_INFO("server", "stopped",
             forced > 0 ? cat(" (", forced, " busy connections closed at the drain timeout)")
                        : std::string());
    return problems.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    LOG_ERROR("server", e.what());
    return 1;
  }
}
