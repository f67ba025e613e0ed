// The hand-over (docs/operations.md §10, "Upgrade without losing state") and the crash
// recovery ("Crash recovery") beside a plain restart, side by side in one run: a daemon
// holding LEASES parked leases of PAGES pages in all is replaced by a successor started
// with --take-over, killed (SIGKILL) and started again under a service manager that kept
// its descriptors (statepool::testing's ServiceManager plays systemd), or stopped
// (SIGTERM) and started again, in turn (A B C A B C ...).
//
//   bench_handover [--leases N] [--pages N] [--rounds N]
//
// Hand-over: from spawning the successor to its "ready on" line (its backend, the
// request, the predecessor's pause, the image and the descriptors, the mapping of the
// memory, the checks), then every lease resumed by its token with its slots. Restart: from
// SIGTERM to a fresh daemon's "ready on" (its clients then start from scratch). Crash:
// from SIGKILL to the restarted daemon's "ready on" (it reads the journal, adopts the
// memory and restores the pool first), then every lease resumed; the journal's last write
// (statepool_journal_write_seconds) and image size are printed beside it. The daemons are
// the build's statepoold (statepool::testing's Daemon, as the tests start it).

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/daemon.hpp"
#include "statepool/testing/service_manager.hpp"
#include "statepool/testing/temp_dir.hpp"
#include "statepool/tools/cli.hpp"

namespace {

namespace sc = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::Daemon;
using statepool::testing::DaemonOptions;
using Clock = std::chrono::steady_clock;

struct Args {
  std::uint32_t leases = 1000;
  std::uint32_t pages = 10000;
  std::uint32_t rounds = 3;
};

constexpr const char* kUsage =
    "usage: bench_handover [--leases N] [--pages N] [--rounds N]\n"
    "  --leases N   parked leases (default 1000)\n"
    "  --pages N    pages they hold in all, spread evenly (default 10000)\n"
    "  --rounds N   hand-overs and restarts, in turn (default 3)\n";

std::optional<int> parse(int argc, char** argv, Args& args) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_handover", kUsage);
  // clang-format off
  cli.add_options()
      ("leases", bounded(args.leases, 1, 100000))
      ("pages", bounded(args.pages, 1, 1000000))
      ("rounds", bounded(args.rounds, 1, 100));
  // clang-format on
  return cli.parse(argc, argv, [&](const statepool::tools::po::variables_map&) {
    if (args.pages < args.leases) throw std::invalid_argument("--pages must be >= --leases");
  });
}

kernels::StateLayout layout() {
  kernels::StateLayout l;
  l.name = "bench-handover";
  l.arch = kernels::Arch::gdn;
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.codec.id = kernels::CodecId::int8;
  return l;
}

std::vector<std::string> daemon_args(const Args& args) {
  return {"--grace-period",    "600s",
          "--pool-capacity",   "4GiB",
          "--max-arena-pages", std::to_string(args.pages),
          "--workers",         "2"};
}

/// Parks args.leases leases holding args.pages pages in one arena; returns their tokens.
std::vector<std::string> park(const Daemon& daemon, const Args& args) {
  std::vector<std::string> tokens;
  for (std::uint32_t i = 0; i < args.leases; ++i) {
    auto conn = sc::Connection::connect(statepool::testing::client_options(daemon));
    auto arena = conn.open_arena(conn.register_layout(layout()), args.pages);
    const std::uint32_t count = args.pages / args.leases + (i < args.pages % args.leases ? 1 : 0);
    for (auto& slot : conn.allocate(arena, count)) (void)slot.release();
    tokens.push_back(conn.lease_token());
  }
  return tokens;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

/// Every lease resumed by its token with all its slots, or an error.
void expect_resumed(const Daemon& daemon, const std::vector<std::string>& tokens,
                    const Args& args) {
  std::uint32_t resumed = 0;
  std::uint64_t slots = 0;
  for (const std::string& token : tokens) {
    auto options = statepool::testing::client_options(daemon);
    options.lease_token = token;
    auto conn = sc::Connection::connect(options);
    resumed += conn.lease_resumed() ? 1 : 0;
    slots += conn.resumed_slots();
  }
  if (resumed != args.leases || slots != args.pages) {
    throw std::runtime_error("only " + std::to_string(resumed) + " leases with " +
                             std::to_string(slots) + " slots came back");
  }
}

/// The value of metric `series` (-1 when absent).
double metric(int port, const std::string& series) {
  const std::string text = statepool::testing::http_get(port, "/metrics");
  const auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 2));
}

/// "NAME N ms" of a log line containing `marker` (the last number before " ms").
double logged_ms(const std::string& log, const std::string& marker, const std::string& before) {
  const auto at = log.find(marker);
  if (at == std::string::npos) return -1;
  const auto end = log.find(before, at);
  if (end == std::string::npos) return -1;
  auto start = end;
  while (start > at && (std::isdigit(static_cast<unsigned char>(log[start - 1])) != 0)) --start;
  return std::stod(log.substr(start, end - start));
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const auto exit = parse(argc, argv, args)) return *exit;
  std::printf("bench_handover: %u leases, %u pages (int8, %s), %u rounds of each\n", args.leases,
              args.pages, "2x4 heads of 32x32", args.rounds);
  try {
    std::vector<double> handover, successor_own, paused, restart, crash, recovery_own, journal_ms;
    double image_bytes = 0;
    for (std::uint32_t round = 0; round < args.rounds; ++round) {
      {
        Daemon old(daemon_args(args), DaemonOptions{});
        const std::vector<std::string> tokens = park(old, args);
        const auto start = Clock::now();
        Daemon next(daemon_args(args), DaemonOptions{false, false, 0, &old});
        handover.push_back(ms_since(start));
        if (!statepool::testing::eventually([&] { return !old.running(); },
                                            std::chrono::seconds(30))) {
          throw std::runtime_error("the predecessor did not exit:\n" + old.log());
        }
        successor_own.push_back(logged_ms(next.log(), "took over generation", " ms\n"));
        paused.push_back(logged_ms(old.log(), "; paused ", " ms,"));
        expect_resumed(next, tokens, args);
      }
      {
        statepool::testing::TempDir dir("/tmp/statepool-bench");
        statepool::testing::ServiceManager manager(dir.path());
        DaemonOptions options;
        options.metrics = true;
        options.service_manager = &manager;
        auto crashed = std::make_unique<Daemon>(daemon_args(args), options);
        const std::vector<std::string> tokens = park(*crashed, args);
        // Journaled once no change is left to write: two scrapes an interval apart agree.
        if (!statepool::testing::eventually(
                [&] {
                  const double before =
                      metric(crashed->metrics_port(), "statepool_journal_writes_total");
                  std::this_thread::sleep_for(std::chrono::milliseconds(100));
                  const double after =
                      metric(crashed->metrics_port(), "statepool_journal_writes_total");
                          return after > 0 && before == after;
                },
                std::chrono::seconds(30))) {
          throw std::runtime_error("the crash journal kept changing");
        }
        journal_ms.push_back(1000 *
                             metric(crashed->metrics_port(), "statepool_journal_write_seconds"));
        image_bytes = metric(crashed->metrics_port(), "statepool_journal_image_bytes");
        const auto start = Clock::now();
        crashed->stop(SIGKILL, std::chrono::seconds(5));
        crashed.reset();
        Daemon restarted(daemon_args(args), options);
        crash.push_back(ms_since(start));
        recovery_own.push_back(logged_ms(restarted.log(), "snapshots dropped; ", " ms\n"));
        expect_resumed(restarted, tokens, args);
      }
      {
        auto old = std::make_unique<Daemon>(daemon_args(args), DaemonOptions{});
        (void)park(*old, args);
        const auto start = Clock::now();
        old->stop(SIGTERM, std::chrono::seconds(30));
        Daemon fresh(daemon_args(args), DaemonOptions{});
        restart.push_back(ms_since(start));
        old.reset();
      }
      std::printf(
          "round %u: hand-over %.1f ms (successor's own %.0f ms, predecessor paused %.0f ms), "
          "every lease back; crash recovery %.1f ms (restarted daemon's own %.0f ms; journal "
          "write %.1f ms, image %.0f KB), every lease back; restart %.1f ms, every lease lost; "
          "hand-over / restart %.2fx, crash recovery / restart %.2fx\n",
          round + 1, handover.back(), successor_own.back(), paused.back(), crash.back(),
          recovery_own.back(), journal_ms.back(), image_bytes / 1000, restart.back(),
          handover.back() / restart.back(), crash.back() / restart.back());
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf(
        "median: hand-over %.1f ms, crash recovery %.1f ms (journal write %.1f ms), restart "
        "%.1f ms; hand-over / restart %.2fx, crash recovery / restart %.2fx\n",
        median(handover), median(crash), median(journal_ms), median(restart),
        median(handover) / median(restart), median(crash) / median(restart));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_handover: %s\n", e.what());
    return 1;
  }
  return 0;
}
