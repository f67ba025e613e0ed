// Control-plane latency under codec load: a client's ping round trips on an idle daemon,
// then the same client's pings while other clients compress and decompress large states
// in a loop, side by side in one run against one daemon.
//
//   bench_load_latency --socket PATH [--loaders N] [--seconds S] [--layers N] [--heads N]
//                      [--codec NAME] [--tenant NAME]
//
// Each side pings back to back for --seconds (default 5), so the loaded side spans many
// compress/decompress operations.
//
// Default load: two clients, each parking and resuming a Qwen3.5-27B-sized state (48 GDN
// layers x 48 heads x 128 x 128, conv 10240 x 3 bf16: 151 MB in FP32) with int8 pages, as
// fast as the daemon answers. The daemon must allow the staging (2 x 151 MB) and the
// arenas (2 pages per loader).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.hpp"
#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/tools/cli.hpp"

namespace {

namespace sc = statepool::client;
using statepool::kernels::CodecId;
using statepool::kernels::DType;

struct Args {
  sc::Options options;
  std::uint32_t loaders = 2;
  std::uint32_t seconds = 5;
  std::uint32_t layers = 48;
  std::uint32_t heads = 48;
  std::string codec = "int8";
};

constexpr const char* kUsage =
    "usage: bench_load_latency [--socket PATH] [--loaders N] [--seconds S] [--layers N]\n"
    "                          [--heads N] [--codec NAME] [--tenant NAME]\n"
    "  --socket PATH   statepoold socket (default $STATEPOOL_SOCKET or the default path)\n"
    "  --loaders N     clients compressing and decompressing in a loop (default 2)\n"
    "  --seconds S     how long to ping idle, then under load (default 5)\n"
    "  --layers N      layers of the loaders' state (default 48: Qwen3.5-27B)\n"
    "  --heads N       heads per layer (default 48)\n"
    "  --codec NAME    page codec of the loaders (default int8; not stepquant)\n"
    "  --tenant NAME   tenant to connect as\n";

std::optional<int> parse(int argc, char** argv, Args& args) {
  using statepool::tools::bounded;
  namespace po = statepool::tools::po;
  if (const char* env = std::getenv("STATEPOOL_SOCKET"); env != nullptr && *env != '\0') {
    args.options.socket_path = env;
  }
  args.options.timeout = std::chrono::milliseconds(120000);  // one 151 MB compress may be slow
  statepool::tools::CommandLine cli("bench_load_latency", kUsage);
  // clang-format off
  cli.add_options()
      ("socket", po::value(&args.options.socket_path))
      ("tenant", po::value(&args.options.tenant))
      ("loaders", bounded(args.loaders, 0, 64))
      ("seconds", bounded(args.seconds, 1, 3600))
      ("layers", bounded(args.layers, 1, 1024))
      ("heads", bounded(args.heads, 1, 1024))
      ("codec", po::value(&args.codec));
  // clang-format on
  return cli.parse(argc, argv, [&](const po::variables_map&) {
    CodecId id{};
    if (!statepool::kernels::parse_codec(args.codec, id) || id == CodecId::stepquant4 ||
        id == CodecId::stepquant6) {
      throw statepool::tools::UsageError("--codec '" + args.codec +
                                         "' is not a codec this benchmark runs (fp32, bf16, "
                                         "fp16, int8, int6, int4, dsq6, dsq4)");
    }
  });
}

struct Percentiles {
  std::size_t count = 0;
  double p50 = 0, p99 = 0, p999 = 0, max = 0;
};

Percentiles percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) {
    return us[std::min(us.size() - 1,
                       static_cast<std::size_t>(q * static_cast<double>(us.size())))];
  };
  return {us.size(), at(0.50), at(0.99), at(0.999), us.back()};
}

/// Round trips back to back for `seconds`, in microseconds each.
std::vector<double> ping_us(sc::Connection& conn, double seconds) {
  std::vector<double> out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    out.push_back(std::chrono::duration<double, std::micro>(conn.ping()).count());
  }
  return out;
}

statepool::kernels::StateLayout load_layout(const Args& args) {
  CodecId codec{};
  (void)statepool::kernels::parse_codec(args.codec, codec);  // checked by parse()
  statepool::kernels::StateLayout layout =
      statepool::bench::gdn_layout(args.layers, args.heads, 10240, codec);
  layout.name = "bench-load";
  return layout;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  args.options.client_name = "bench_load_latency";
  if (const auto exit_status = parse(argc, argv, args)) return *exit_status;
  try {
    sc::Connection pinger = sc::Connection::connect(args.options);
    (void)ping_us(pinger, 0.2);  // warm-up
    const Percentiles idle = percentiles(ping_us(pinger, args.seconds));

    std::atomic<bool> stop{false};
    std::atomic<std::uint32_t> ready{0};
    std::atomic<std::uint64_t> operations{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> loaders;
    std::uint64_t state_bytes = 0;
    {
      sc::Connection setup = sc::Connection::connect(args.options);
      state_bytes = setup.register_layout(load_layout(args)).state_bytes_f32;
    }
    for (std::uint32_t i = 0; i < args.loaders; ++i) {
      loaders.emplace_back([&, i] {
        try {
          sc::Options options = args.options;
          options.client_name = "bench_load_latency-loader-" + std::to_string(i);
          sc::Connection conn = sc::Connection::connect(options);
          const sc::LayoutInfo info = conn.register_layout(load_layout(args));
          sc::Arena arena = conn.open_arena(info, 2 * args.loaders);
          sc::Staging staging = conn.open_staging(info.state_bytes_f32);
          const auto bytes = staging.bytes();
          std::vector<float> values(bytes.size() / 4);
          statepool::synthetic::fill_gaussian(values, i, 0.05f);
          std::memcpy(bytes.data(), values.data(), 4 * values.size());
          // The conv tail holds bf16 bit patterns of those floats: finite either way.
          std::vector<sc::Slot> slots = conn.allocate(arena, 1);
          conn.compress(slots[0], staging, 0);
          ++ready;
          while (!stop.load()) {
            conn.compress(slots[0], staging, 0);
            conn.decompress(slots[0], staging, 0);
            operations += 2;
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_load_latency: loader %u: %s\n", i, e.what());
          failed = true;
          ++ready;
        }
      });
    }
    while (ready.load() < args.loaders) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto load_start = std::chrono::steady_clock::now();
    const std::uint64_t ops_before = operations.load();
    const Percentiles loaded = percentiles(ping_us(pinger, args.seconds));
    const double load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    const std::uint64_t ops = operations.load() - ops_before;
    stop = true;
    for (auto& t : loaders) t.join();
    if (failed) return 1;

    std::printf(
        "load: %u clients compressing + decompressing %.1f MB %s states in a loop; "
        "%u s of back-to-back pings on each side\n",
        args.loaders, static_cast<double>(state_bytes) / 1e6, args.codec.c_str(), args.seconds);
    std::printf("\n%-8s %9s %10s %10s %10s %10s\n", "daemon", "pings", "p50 us", "p99 us",
                "p99.9 us", "max us");
    for (const auto& [name, p] : {std::pair{"idle", idle}, std::pair{"loaded", loaded}}) {
      std::printf("%-8s %9zu %10.1f %10.1f %10.1f %10.1f\n", name, p.count, p.p50, p.p99, p.p999,
                  p.max);
    }
    std::printf("%-8s %9s %10.2f %10.2f %10.2f %10.2f\n", "ratio", "", loaded.p50 / idle.p50,
                loaded.p99 / idle.p99, loaded.p999 / idle.p999, loaded.max / idle.max);
    std::printf(
        "\nwhile the loaded pings ran: %llu compress/decompress operations in %.2f s "
        "(%.2f GB/s of FP32 state through the codecs)\n",
        static_cast<unsigned long long>(ops), load_seconds,
        static_cast<double>(ops) * static_cast<double>(state_bytes) / load_seconds / 1e9);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_load_latency: %s\n", e.what());
    return 1;
  }
}
