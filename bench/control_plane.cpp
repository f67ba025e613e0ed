// Control-plane latency and throughput of a running statepoold over its Unix socket.
//
//   bench_control_plane [--socket PATH] [--iterations N] [--clients N] [--tenant NAME]
//
// Each client is a thread with its own Connection. Phases, each started by all clients at
// once: ping round trips, then allocate(1) + free round trips on one shared arena of a
// tiny layout. Prints p50/p99/mean latency in microseconds per request type and the
// aggregate throughput (requests per second over the phase's wall time). Not a test:
// it asserts nothing and needs a daemon.

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/tools/cli.hpp"

namespace {

namespace sc = statepool::client;
using Clock = std::chrono::steady_clock;

struct Args {
  sc::Options options;
  std::uint32_t iterations = 20000;
  std::uint32_t clients = 1;
  std::uint32_t warmup = 200;
};

// The options, or the exit status to leave with now (--help, a usage error).
std::optional<int> parse(int argc, char** argv, Args& args) {
  using statepool::tools::bounded;
  namespace po = statepool::tools::po;
  if (const char* env = std::getenv("STATEPOOL_SOCKET"); env != nullptr && *env != '\0') {
    args.options.socket_path = env;
  }
  args.options.client_name = "bench_control_plane";
  std::string usage =
      "usage: bench_control_plane [--socket PATH] [--iterations N] [--clients N] [--tenant NAME]\n"
      "  --socket PATH     statepoold socket (default $STATEPOOL_SOCKET or ";
  usage += sc::kDefaultSocketPath;
  usage +=
      ")\n"
      "  --iterations N    round trips per client and request type (default 20000)\n"
      "  --clients N       concurrent clients, one connection each (default 1)\n"
      "  --tenant NAME     tenant to connect as\n";
  statepool::tools::CommandLine cli("bench_control_plane", usage);
  // clang-format off
  cli.add_options()
      ("socket", po::value(&args.options.socket_path))
      ("tenant", po::value(&args.options.tenant))
      ("iterations", bounded(args.iterations, 1, 100000000))
      ("clients", bounded(args.clients, 1, 1024));
  // clang-format on
  return cli.parse(argc, argv);
}

struct Samples {
  std::vector<double> ping_us, alloc_us, free_us, pair_us;
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0.0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double mean(const std::vector<double>& v) {
  double sum = 0.0;
  for (const double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const auto exit_status = parse(argc, argv, args)) return *exit_status;
  try {
    // A tiny layout (one 16x16 FP32 head): the page work is negligible, the round trip is
    // what is measured. One arena, shared by all clients of the tenant.
    auto main_conn = sc::Connection::connect(args.options);
    statepool::kernels::StateLayout layout;
    layout.name = "bench-control-plane";
    layout.num_layers = 1;
    layout.num_heads = 1;
    layout.key_dim = 16;
    layout.value_dim = 16;
    layout.codec.id = statepool::kernels::CodecId::fp32;
    const auto info = main_conn.register_layout(layout);
    const std::uint32_t pages = std::max<std::uint32_t>(64, args.clients * 4);
    const auto arena = main_conn.open_arena(info, pages);
    if (arena.page_count() < args.clients) {
      std::cerr << "bench_control_plane: arena " << arena.id() << " has " << arena.page_count()
                << " pages, fewer than the " << args.clients << " clients\n";
      return 1;
    }
    std::cout << main_conn.server() << " at " << args.options.socket_path << ": " << args.clients
              << " client(s) x " << args.iterations << " iterations, arena " << arena.id() << " ("
              << arena.page_count() << " pages)\n";

    std::vector<Samples> samples(args.clients);
    std::barrier sync(static_cast<std::ptrdiff_t>(args.clients) + 1);
    std::mutex error_mutex;
    std::string first_error;
    std::vector<std::thread> threads;
    for (std::uint32_t c = 0; c < args.clients; ++c) {
      threads.emplace_back([&, c] {
        Samples& s = samples[c];
        s.ping_us.reserve(args.iterations);
        s.alloc_us.reserve(args.iterations);
        s.free_us.reserve(args.iterations);
        s.pair_us.reserve(args.iterations);
        std::string error;
        std::optional<sc::Connection> conn;
        try {
          conn.emplace(sc::Connection::connect(args.options));
          for (std::uint32_t i = 0; i < args.warmup; ++i) {
            (void)conn->ping();
            (void)conn->allocate(arena.id(), 1);
          }
        } catch (const std::exception& e) {
          error = e.what();
        }
        sync.arrive_and_wait();  // phase 1: ping
        for (std::uint32_t i = 0; error.empty() && i < args.iterations; ++i) {
          try {
            const auto t = Clock::now();
            (void)conn->ping();
            s.ping_us.push_back(us_since(t));
          } catch (const std::exception& e) {
            error = e.what();
          }
        }
        sync.arrive_and_wait();
        sync.arrive_and_wait();  // phase 2: allocate + free
        for (std::uint32_t i = 0; error.empty() && i < args.iterations; ++i) {
          try {
            const auto t0 = Clock::now();
            auto slots = conn->allocate(arena.id(), 1);
            const auto t1 = Clock::now();
            slots.front().free();
            const auto t2 = Clock::now();
            s.alloc_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            s.free_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
            s.pair_us.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
          } catch (const std::exception& e) {
            error = e.what();
          }
        }
        sync.arrive_and_wait();
        if (!error.empty()) {
          const std::lock_guard lock(error_mutex);
          if (first_error.empty()) first_error = error;
        }
      });
    }
    sync.arrive_and_wait();
    const auto ping_start = Clock::now();
    sync.arrive_and_wait();
    const double ping_wall = us_since(ping_start) / 1e6;
    sync.arrive_and_wait();
    const auto alloc_start = Clock::now();
    sync.arrive_and_wait();
    const double alloc_wall = us_since(alloc_start) / 1e6;
    for (auto& t : threads) t.join();
    if (!first_error.empty()) {
      std::cerr << "bench_control_plane: " << first_error << '\n';
      return 1;
    }

    Samples all;
    for (auto& s : samples) {
      all.ping_us.insert(all.ping_us.end(), s.ping_us.begin(), s.ping_us.end());
      all.alloc_us.insert(all.alloc_us.end(), s.alloc_us.begin(), s.alloc_us.end());
      all.free_us.insert(all.free_us.end(), s.free_us.begin(), s.free_us.end());
      all.pair_us.insert(all.pair_us.end(), s.pair_us.begin(), s.pair_us.end());
    }
    std::printf("\n%-16s %8s %10s %9s %9s %9s %12s\n", "request", "clients", "count", "p50 us",
                "p99 us", "mean us", "requests/s");
    // requests/s: requests completed by all clients over the phase's wall time; the
    // allocate and free rows share one phase, so only their sum has a rate.
    auto row = [&](const char* name, std::vector<double>& v, double requests_per_s) {
      const double m = mean(v);
      const double p50 = percentile(v, 0.50);
      const double p99 = percentile(v, 0.99);
      char rate[32] = "-";
      if (requests_per_s > 0.0) std::snprintf(rate, sizeof rate, "%.0f", requests_per_s);
      std::printf("%-16s %8u %10zu %9.1f %9.1f %9.1f %12s\n", name, args.clients, v.size(), p50,
                  p99, m, rate);
    };
    const auto rate = [](std::size_t requests, double wall) {
      return wall > 0.0 ? static_cast<double>(requests) / wall : 0.0;
    };
    row("ping", all.ping_us, rate(all.ping_us.size(), ping_wall));
    row("allocate(1)", all.alloc_us, 0.0);
    row("free(1)", all.free_us, 0.0);
    row("allocate+free", all.pair_us, rate(2 * all.pair_us.size(), alloc_wall));
    std::printf("\nallocate+free: one sample = both round trips; its requests/s counts both.\n");
    return 0;
  } catch (const sc::Error& e) {
    std::cerr << "bench_control_plane: " << e.what() << '\n';
    return 1;
  }
}
