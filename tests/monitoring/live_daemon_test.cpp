// A running statepoold's /metrics output, checked from outside:
// - `promtool check metrics` (Prometheus's naming lint) accepts it, with every metric
//   family holding samples: promtool lints only families that have samples;
// - a statepool-demo run, STEPQuant plans included, leaves no error counted.
// The promtool test is skipped when promtool is not installed (Debian package
// 'prometheus').
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/plans.hpp"
#include "statepool/testing/temp_dir.hpp"

extern char** environ;

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using statepool::testing::TempDir;

namespace {

struct Outcome {
  int status = -1;  ///< exit status; 128+N when killed by signal N; -1 when not started
  std::string out;  ///< stdout and stderr together
};

// Runs `args` (args[0] is the program's path) with stdin from `stdin_path` and its output
// captured in `dir`, to completion.
Outcome run_program(const TempDir& dir, std::vector<std::string> args,
                    const std::string& stdin_path) {
  const std::string out_path = dir.file("output.txt");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  Outcome r;
  if (rc != 0) {
    r.out = "cannot start " + args[0];
    return r;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = statepool::testing::read_bytes(out_path);
  return r;
}

// The sample lines of `family` in exposition text `text` (not its HELP/TYPE lines).
std::vector<std::string> samples_of(const std::string& text, const std::string& family) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > family.size() && line.rfind(family, 0) == 0 &&
        (line[family.size()] == '{' || line[family.size()] == ' '))
      lines.push_back(line);
  }
  return lines;
}

// The metric families that have a TYPE line in `text`.
std::vector<std::string> families_of(const std::string& text) {
  std::vector<std::string> names;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string hash, keyword, name;
    if (words >> hash >> keyword >> name && hash == "#" && keyword == "TYPE") names.push_back(name);
  }
  return names;
}

}  // namespace

// Guards the metric names against Prometheus's lint (promtool check metrics exits 3 on,
// for example, a non-base unit such as "bits" in a name).
TEST(LiveMetrics, PromtoolCheckMetricsAcceptsEveryFamily) {
  if (::access(STATEPOOL_PROMTOOL, X_OK) != 0)
    GTEST_SKIP() << STATEPOOL_PROMTOOL << " not installed (Debian package 'prometheus')";

  DaemonProcess daemon({}, true);
  auto conn = client::Connection::connect(client_options(daemon));
  // A uniform-codec arena with slots, a STEPQuant plan and its layout, and an error: every
  // family the daemon can export then has samples.
  kernels::StateLayout l;
  l.name = "lint";
  l.num_layers = 1;
  l.num_heads = 2;
  l.key_dim = 32;
  l.value_dim = 32;
  l.codec.id = kernels::CodecId::int6;
  const auto layout = conn.register_layout(l);
  auto arena = conn.open_arena(layout, 4);
  const auto slots = conn.allocate(arena, 2);  // held until the scrape (a Slot frees itself)
  ASSERT_EQ(slots.size(), 2u);
  const auto plan = statepool::testing::uniform_plan(kernels::Arch::gdn, 1, 2, 32, 32, 6);
  (void)conn.install_plan(plan);
  (void)conn.register_layout(statepool::testing::plan_layout(plan, kernels::CodecId::stepquant6));
  EXPECT_THROW((void)conn.allocate(arena, 100), client::Error);  // pool_exhausted

  const std::string text = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  ASSERT_FALSE(text.empty()) << daemon.log();
  for (const auto& family : families_of(text)) {
    EXPECT_FALSE(samples_of(text, family).empty() && samples_of(text, family + "_count").empty())
        << family << " has no samples, so promtool would not lint it";
  }

  TempDir dir;
  const std::string metrics_path = dir.file("metrics.txt");
  statepool::testing::write_bytes(metrics_path, text);
  const Outcome lint = run_program(dir, {STATEPOOL_PROMTOOL, "check", "metrics"}, metrics_path);
  EXPECT_EQ(lint.status, 0) << "promtool check metrics:\n" << lint.out;
}

// Guards against the demo's requests showing up as errors: it used to register each
// stepquant layout first and install its plan only after the daemon answered not_found,
// which counted one not_found per plan in statepool_errors_total on every run.
// statepool-demo run again by the same tenant with more slots: its arenas from the first
// run are full, so the daemon adds larger ones beside them (the quota allows) instead of
// refusing the second run.
TEST(LiveMetrics, DemoRunAgainWithMoreSlotsGetsTheArenasItNeeds) {
  DaemonProcess daemon({}, true);
  TempDir dir;
  const auto demo = [&](const char* slots) {
    return run_program(dir,
                       {STATEPOOL_DEMO, "--socket", daemon.socket_path(), "--layers", "1",
                        "--heads", "2", "--slots", slots, "--steps", "4", "--decode-tokens", "2"},
                       "/dev/null");
  };
  const Outcome first = demo("1");
  ASSERT_EQ(first.status, 0) << first.out;
  const Outcome second = demo("3");
  ASSERT_EQ(second.status, 0) << second.out;
  const std::string text = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  EXPECT_EQ(samples_of(text, "statepool_errors_total"), std::vector<std::string>{})
      << "second statepool-demo output:\n"
      << second.out;
  // The int8 layout has two arenas now: the first run's page and the second run's three.
  const std::string free_pages =
      "layout=\"demo-qwen3next-int8\",codec=\"int8\",backend=\"host\",state=\"free\"} ";
  EXPECT_NE(text.find(free_pages + "1\n"), std::string::npos) << text;
  EXPECT_NE(text.find(free_pages + "3\n"), std::string::npos) << text;
}

TEST(LiveMetrics, DemoRunLeavesNoErrorCounted) {
  DaemonProcess daemon({}, true);
  TempDir dir;
  // Plans shaped like the demo's layout with --layers 1 --heads 2 (128 x 128 heads).
  const std::string plan6 = dir.file("plan6.spqp");
  const std::string plan4 = dir.file("plan4.spqp");
  sq::save(statepool::testing::uniform_plan(kernels::Arch::gdn, 1, 2, 128, 128, 6), plan6);
  sq::save(statepool::testing::uniform_plan(kernels::Arch::gdn, 1, 2, 128, 128, 4), plan4);

  const Outcome demo =
      run_program(dir,
                  {STATEPOOL_DEMO, "--socket", daemon.socket_path(), "--layers", "1", "--heads",
                   "2", "--slots", "1", "--steps", "8", "--plan", plan6, "--plan", plan4},
                  "/dev/null");
  ASSERT_EQ(demo.status, 0) << demo.out;

  const std::string text = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  ASSERT_FALSE(text.empty()) << daemon.log();
  // The demo did use both plans.
  EXPECT_NE(text.find("\nstatepool_requests_total{type=\"install_plan\"} 2\n"), std::string::npos)
      << text;
  EXPECT_EQ(samples_of(text, "statepool_errors_total"), std::vector<std::string>{})
      << "statepool-demo output:\n"
      << demo.out;
}
