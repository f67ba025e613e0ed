// A real Prometheus server scrapes a running statepoold and evaluates the rules in
// charts/prometheus/statepool-rules.yaml; the test reads the results back through the
// Prometheus HTTP API. Skipped when /usr/bin/prometheus is not installed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/temp_dir.hpp"

extern char** environ;

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

constexpr const char* kPrometheus = "/usr/bin/prometheus";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The values of an instant-query reply ({"status":"success","data":{"resultType":"vector",
// "result":[{"metric":{...},"value":[ts,"v"]},...]}}), in order. Label values here never
// contain the text `"value":[`.
std::vector<double> vector_values(const std::string& json) {
  std::vector<double> values;
  if (json.find("\"status\":\"success\"") == std::string::npos) return values;
  const std::string key = "\"value\":[";
  for (auto pos = json.find(key); pos != std::string::npos; pos = json.find(key, pos + 1)) {
    const auto comma = json.find(",\"", pos);
    const auto end = json.find('"', comma + 2);
    if (comma == std::string::npos || end == std::string::npos) break;
    values.push_back(std::stod(json.substr(comma + 2, end - comma - 2)));
  }
  return values;
}

// A Prometheus server on 127.0.0.1:port, scraping `target` every second as job "statepool"
// and evaluating `rules` every second. Stopped (SIGTERM, then SIGKILL) on destruction.
class PrometheusProcess {
 public:
  PrometheusProcess(const std::string& dir, const std::string& target, const std::string& rules)
      : port_(statepool::testing::free_tcp_port()), log_(dir + "/prometheus.log") {
    const std::string config = dir + "/prometheus.yml";
    std::ofstream(config) << "global:\n"
                             "  scrape_interval: 1s\n"
                             "  scrape_timeout: 1s\n"
                             "  evaluation_interval: 1s\n"
                             "rule_files:\n"
                             "  - \""
                          << rules
                          << "\"\n"
                             "scrape_configs:\n"
                             "  - job_name: statepool\n"
                             "    static_configs:\n"
                             "      - targets: [\""
                          << target << "\"]\n";
    std::vector<std::string> args = {
        kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/data",
        "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = ::posix_spawn(&pid_, kPrometheus, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start prometheus: " + std::to_string(rc));
  }
  ~PrometheusProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  PrometheusProcess(const PrometheusProcess&) = delete;
  PrometheusProcess& operator=(const PrometheusProcess&) = delete;

  [[nodiscard]] bool running() const { return ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  [[nodiscard]] std::string log() const { return slurp(log_); }
  [[nodiscard]] int port() const noexcept { return port_; }

  /// Values of the instant query `promql` (empty while there is no result).
  [[nodiscard]] std::vector<double> query(const std::string& promql) const {
    return vector_values(
        statepool::testing::http_get(port_, "/api/v1/query?query=" + url_encode(promql)));
  }

  /// Polls `promql` until it returns exactly one value, or `timeout` passes.
  [[nodiscard]] std::optional<double> wait_for_value(const std::string& promql,
                                                     std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto values = query(promql);
      if (values.size() == 1) return values[0];
      if (std::chrono::steady_clock::now() >= deadline || !running()) return std::nullopt;
      std::this_thread::sleep_for(100ms);  // polling interval, not a wait for an outcome
    }
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

}  // namespace

TEST(Prometheus, ScrapesTheDaemonAndEvaluatesTheRules) {
  if (::access(kPrometheus, X_OK) != 0)
    GTEST_SKIP() << kPrometheus << " not installed (Debian package 'prometheus')";

  DaemonProcess daemon({}, true);
  auto conn = client::Connection::connect(statepool::testing::client_options(daemon));
  kernels::StateLayout l;
  l.name = "prom-demo";
  l.num_layers = 2;
  l.num_heads = 2;
  l.key_dim = 64;
  l.value_dim = 64;
  l.codec.id = kernels::CodecId::int6;
  const auto layout = conn.register_layout(l);
  auto arena = conn.open_arena(layout, 8);
  const auto slots = conn.allocate(arena, 3);
  ASSERT_EQ(slots.size(), 3u);

  const statepool::testing::TempDir dir;
  PrometheusProcess prometheus(dir.path(), "127.0.0.1:" + std::to_string(daemon.metrics_port()),
                               STATEPOOL_RULES_FILE);

  // The scraped gauge: the workload's used pages.
  const std::string arena_id = std::to_string(arena.id());
  const auto used =
      prometheus.wait_for_value("statepool_arena_pages{job=\"statepool\",state=\"used\"}", 15s);
  ASSERT_TRUE(used.has_value()) << "no scraped value\n--- prometheus log ---\n"
                                << prometheus.log() << "\n--- daemon log ---\n"
                                << daemon.log();
  EXPECT_EQ(*used, 3.0);

  // Recording rules from the rules file, evaluated by the server.
  const auto utilisation = prometheus.wait_for_value(
      "statepool:arena_page_utilisation:ratio{arena=\"" + arena_id + "\"}", 10s);
  ASSERT_TRUE(utilisation.has_value()) << "recording rule produced nothing\n" << prometheus.log();
  EXPECT_DOUBLE_EQ(*utilisation, 3.0 / 8.0);
  const auto ratio = prometheus.wait_for_value(
      "statepool:compression_ratio:by_tenant_codec{tenant=\"default\",codec=\"int6\"}", 10s);
  ASSERT_TRUE(ratio.has_value()) << prometheus.log();
  EXPECT_NEAR(*ratio, layout.compression_ratio(), 1e-9);

  // The target alerts stay silent while the daemon is up. StatepoolTargetDown finds the
  // daemon's target through the recording rule statepool:scrape_targets:info.
  EXPECT_EQ(prometheus.query("up{job=\"statepool\"}"), std::vector<double>{1.0});
  const auto target = prometheus.wait_for_value("statepool:scrape_targets:info", 10s);
  ASSERT_TRUE(target.has_value()) << prometheus.log();
  EXPECT_EQ(*target, 1.0);
  // StatepoolAbsent may be pending from an evaluation before the first scrape; it must
  // resolve (neither alert is active) once the target is scraped.
  const std::string target_alerts = "ALERTS{alertname=~\"StatepoolTargetDown|StatepoolAbsent\"}";
  EXPECT_TRUE(
      statepool::testing::eventually([&] { return prometheus.query(target_alerts).empty(); }, 10s))
      << statepool::testing::http_get(prometheus.port(),
                                      "/api/v1/query?query=" + url_encode(target_alerts));
}
