// Control-plane latency and throughput of a running statepoold over its Unix socket,
// beside Redis's on the same machine in the same run.
//
//   bench_control_plane [--socket PATH] [--iterations N] [--clients N] [--tenant NAME]
//                       [--no-redis]
//
// Each client is a thread with its own Connection. Phases, each started by all clients at
// once: ping round trips, then allocate(1) + free round trips on one shared arena of a
// tiny layout. Prints p50/p99/mean latency in microseconds per request type and the
// aggregate throughput (requests per second over the phase's wall time).
//
// The reference: when redis-server and redis-benchmark are on PATH (Debian's
// redis-server and redis-tools), a redis-server on a Unix socket in a temporary folder,
// and redis-benchmark with as many clients and requests, no pipelining (PING_MBULK: a
// PING in Redis's protocol; SET against allocate+free). statepool and Redis run twice
// each, alternating, and the ratio is of each side's better run (the machine is shared;
// both sides get the same chance). Not a test: it asserts nothing and needs a daemon.

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
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
  bool redis = true;
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
      "  --tenant NAME     tenant to connect as\n"
      "  --no-redis        skip the redis-benchmark reference run\n";
  statepool::tools::CommandLine cli("bench_control_plane", usage);
  bool no_redis = false;
  // clang-format off
  cli.add_options()
      ("socket", po::value(&args.options.socket_path))
      ("tenant", po::value(&args.options.tenant))
      ("iterations", bounded(args.iterations, 1, 100000000))
      ("clients", bounded(args.clients, 1, 1024))
      ("no-redis", po::bool_switch(&no_redis));
  // clang-format on
  if (const auto exit_status = cli.parse(argc, argv)) return exit_status;
  args.redis = !no_redis;
  return std::nullopt;
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

double rate(std::size_t requests, double wall_s) {
  return wall_s > 0.0 ? static_cast<double>(requests) / wall_s : 0.0;
}

/// One run of both phases by every client: the samples, each phase's requests/s.
struct Run {
  Samples all;
  double ping_per_s = 0.0;
  double pair_per_s = 0.0;  ///< allocate and free requests together
};

Run run_clients(const Args& args, std::uint32_t arena) {
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
          (void)conn->allocate(arena, 1);
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
          auto slots = conn->allocate(arena, 1);
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
  if (!first_error.empty()) throw std::runtime_error(first_error);

  Run run;
  for (auto& s : samples) {
    run.all.ping_us.insert(run.all.ping_us.end(), s.ping_us.begin(), s.ping_us.end());
    run.all.alloc_us.insert(run.all.alloc_us.end(), s.alloc_us.begin(), s.alloc_us.end());
    run.all.free_us.insert(run.all.free_us.end(), s.free_us.begin(), s.free_us.end());
    run.all.pair_us.insert(run.all.pair_us.end(), s.pair_us.begin(), s.pair_us.end());
  }
  run.ping_per_s = rate(run.all.ping_us.size(), ping_wall);
  run.pair_per_s = rate(2 * run.all.pair_us.size(), alloc_wall);
  return run;
}

// --- the Redis reference ---------------------------------------------------------------

/// The full path of `name` on PATH, or "" when it is not there.
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::filesystem::path candidate = std::filesystem::path(dirs.substr(at, end - at)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    at = end + 1;
  }
  return "";
}

/// A redis-server of its own on a Unix socket in a temporary folder, stopped and removed
/// with the object.
class RedisServer {
 public:
  explicit RedisServer(const std::string& program) {
    char dir_template[] = "/tmp/bench-control-plane-XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir_template;
    socket_ = dir_ + "/redis.sock";
    const std::string log = dir_ + "/redis.log";
    std::vector<std::string> argv_s = {
        program, "--port",    "0", "--unixsocket", socket_, "--save", "", "--appendonly",
        "no",    "--logfile", log, "--dir",        dir_};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, program.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      cleanup();
      throw std::runtime_error("could not start " + program);
    }
    struct stat st {};
    for (int i = 0; i < 200 && ::stat(socket_.c_str(), &st) != 0; ++i) ::usleep(25000);
    if (::stat(socket_.c_str(), &st) != 0) {
      cleanup();
      throw std::runtime_error("redis-server did not create " + socket_ + " (see " + log + ")");
    }
  }
  ~RedisServer() { cleanup(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  [[nodiscard]] const std::string& socket() const noexcept { return socket_; }

 private:
  void cleanup() noexcept {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
};

/// requests/s of each test redis-benchmark ran ("PING_MBULK" -> 90000), from its -q
/// --csv output ("test","rps",...).
std::map<std::string, double> redis_benchmark(const std::string& program, const std::string& socket,
                                              const std::string& tests, std::uint64_t requests,
                                              std::uint32_t clients) {
  const std::string command = "'" + program + "' -s '" + socket + "' -t " + tests + " -n " +
                              std::to_string(requests) + " -c " + std::to_string(clients) +
                              " -P 1 --csv 2>&1";
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) throw std::runtime_error("could not run " + program);
  std::map<std::string, double> rates;
  std::array<char, 512> line{};
  while (std::fgets(line.data(), static_cast<int>(line.size()), out) != nullptr) {
    // "PING_MBULK","89285.71","0.007",...  (a header row "test","rps",... is skipped)
    const std::string text(line.data());
    if (text.size() < 2 || text[0] != '"') continue;
    const std::size_t name_end = text.find('"', 1);
    if (name_end == std::string::npos || text.compare(name_end, 3, "\",\"") != 0) continue;
    const std::string name = text.substr(1, name_end - 1);
    try {
      rates[name] = std::stod(text.substr(name_end + 3));
    } catch (const std::exception&) {
      // the header row, or a line this version prints differently
    }
  }
  const int status = ::pclose(out);
  if (status != 0 || rates.empty())
    throw std::runtime_error("redis-benchmark failed (exit status " + std::to_string(status) + ")");
  return rates;
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

    const std::string redis_server = args.redis ? on_path("redis-server") : "";
    const std::string redis_bench = args.redis ? on_path("redis-benchmark") : "";
    const bool with_redis = !redis_server.empty() && !redis_bench.empty();

    // Alternating runs, two of each, each side's better one: the machine is shared, and
    // both sides get the same chance.
    Run first = run_clients(args, arena.id());
    std::map<std::string, double> redis;
    std::optional<Run> second;
    if (with_redis) {
      const RedisServer server(redis_server);
      const std::uint64_t requests = std::uint64_t{args.iterations} * args.clients;
      redis = redis_benchmark(redis_bench, server.socket(), "ping,set", requests, args.clients);
      second = run_clients(args, arena.id());
      for (const auto& [test, rate] :
           redis_benchmark(redis_bench, server.socket(), "ping,set", requests, args.clients))
        redis[test] = std::max(redis[test], rate);
    }

    std::printf("\n%-16s %8s %10s %9s %9s %9s %12s\n", "request", "clients", "count", "p50 us",
                "p99 us", "mean us", "requests/s");
    // requests/s: requests completed by all clients over the phase's wall time; the
    // allocate and free rows share one phase, so only their sum has a rate.
    auto row = [&](const char* name, std::vector<double>& v, double requests_per_s) {
      const double m = mean(v);
      const double p50 = percentile(v, 0.50);
      const double p99 = percentile(v, 0.99);
      char rate_text[32] = "-";
      if (requests_per_s > 0.0) std::snprintf(rate_text, sizeof rate_text, "%.0f", requests_per_s);
      std::printf("%-16s %8u %10zu %9.1f %9.1f %9.1f %12s\n", name, args.clients, v.size(), p50,
                  p99, m, rate_text);
    };
    Run& shown = (second && second->ping_per_s > first.ping_per_s) ? *second : first;
    row("ping", shown.all.ping_us, shown.ping_per_s);
    row("allocate(1)", shown.all.alloc_us, 0.0);
    row("free(1)", shown.all.free_us, 0.0);
    row("allocate+free", shown.all.pair_us, shown.pair_per_s);
    std::printf("\nallocate+free: one sample = both round trips; its requests/s counts both.\n");
    if (!with_redis) {
      std::printf("\nno Redis reference: %s\n",
                  args.redis ? "redis-server or redis-benchmark is not on PATH (Debian: "
                               "redis-server, redis-tools)"
                             : "--no-redis");
      return 0;
    }
    const double ping = std::max(first.ping_per_s, second->ping_per_s);
    const double pair = std::max(first.pair_per_s, second->pair_per_s);
    const double redis_ping = redis.count("PING_MBULK") ? redis["PING_MBULK"] : 0.0;
    const double redis_set = redis.count("SET") ? redis["SET"] : 0.0;
    std::printf(
        "\nbeside redis-server on a Unix socket, same machine, same run (%u client(s), "
        "no pipelining):\n",
        args.clients);
    std::printf("%-34s %12s %12s %8s\n", "", "statepool/s", "redis/s", "ratio");
    std::printf("%-34s %12.0f %12.0f %7.2fx\n", "ping vs PING_MBULK", ping, redis_ping,
                redis_ping > 0 ? ping / redis_ping : 0.0);
    std::printf("%-34s %12.0f %12.0f %7.2fx\n", "allocate+free vs SET", pair, redis_set,
                redis_set > 0 ? pair / redis_set : 0.0);
    std::printf("each side: the better of two runs, alternating (statepool ping/s %.0f, %.0f)\n",
                first.ping_per_s, second->ping_per_s);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_control_plane: " << e.what() << '\n';
    return 1;
  }
}
