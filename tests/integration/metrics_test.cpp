// The Prometheus endpoint of a running daemon: content after a workload, `promtool check
// metrics` on the real output (skipped when promtool is not installed), and the endpoint's
// HTTP behaviour.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "statepool/client.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

using Labels = std::map<std::string, std::string>;

// Value of the sample `name` whose labels are exactly `labels` (in any order); -1 if absent.
// Parses the text exposition format's sample lines: name{a="x",b="y"} value.
double sample_value(const std::string& text, const std::string& name, const Labels& labels = {}) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    const auto brace = line.find('{');
    const std::string series = line.substr(0, space);
    if (series.substr(0, std::min(brace, space)) != name) continue;
    Labels found;
    if (brace != std::string::npos) {
      // Label values here never contain '"' or ',' (no escapes to handle).
      std::istringstream pairs(series.substr(brace + 1, series.size() - brace - 2));
      std::string pair;
      while (std::getline(pairs, pair, ',')) {
        const auto eq = pair.find('=');
        found[pair.substr(0, eq)] = pair.substr(eq + 2, pair.size() - eq - 3);
      }
    }
    if (found == labels) return std::stod(line.substr(space + 1));
  }
  return -1;
}

std::string find_promtool() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    const std::string path = std::string(dir) + "/promtool";
    if (std::filesystem::exists(path)) return path;
  }
  return {};
}

class Metrics : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--tenant", "alice:1GiB", "--tenant", "bob"}, true);
    client::Options o;
    o.socket_path = daemon_->socket_path();
    o.tenant = "alice";
    conn_ = std::make_unique<client::Connection>(client::Connection::connect(o));
    kernels::StateLayout l;
    l.name = "metrics-demo";
    l.num_layers = 2;
    l.num_heads = 2;
    l.key_dim = 64;
    l.value_dim = 64;
    l.codec.id = kernels::CodecId::int6;
    layout_ = conn_->register_layout(l);
    arena_ = std::make_unique<client::Arena>(conn_->open_arena(layout_, 10));
    slots_ = conn_->allocate(*arena_, 3);
    staging_ = std::make_unique<client::Staging>(conn_->open_staging(layout_.state_bytes_f32));
    conn_->compress(slots_[0], *staging_, 0);
    try {
      (void)conn_->allocate(*arena_, 100);
    } catch (const client::Error&) {
      // counted as an error by code
    }
    text_ = statepool::testing::http_get(daemon_->metrics_port(), "/metrics");
  }
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<client::Connection> conn_;
  client::LayoutInfo layout_;
  std::unique_ptr<client::Arena> arena_;
  std::vector<client::Slot> slots_;
  std::unique_ptr<client::Staging> staging_;
  std::string text_;
};

}  // namespace

TEST_F(Metrics, ReportCapacityAccountingRequestsAndErrors) {
  ASSERT_FALSE(text_.empty()) << daemon_->log();
  const Labels arena = {{"arena", std::to_string(arena_->id())},
                        {"backend", "host"},
                        {"codec", "int6"},
                        {"layout", "metrics-demo"},
                        {"tenant", "alice"}};
  auto with_state = [&](const char* state) {
    auto l = arena;
    l["state"] = state;
    return l;
  };
  const Labels alice_int6 = {{"codec", "int6"}, {"tenant", "alice"}};
  EXPECT_EQ(sample_value(text_, "statepool_arena_pages", with_state("used")), 3) << text_;
  EXPECT_EQ(sample_value(text_, "statepool_arena_pages", with_state("free")), 7);
  EXPECT_EQ(sample_value(text_, "statepool_arena_bytes", with_state("used")),
            3.0 * static_cast<double>(arena_->page_stride()));
  EXPECT_EQ(sample_value(text_, "statepool_arena_page_bytes", arena),
            static_cast<double>(layout_.page_bytes));
  // The tracking adaptors: every byte the backend holds, arenas and staging apart.
  const Labels arenas_use = {{"backend", "host"}, {"use", "arenas"}};
  const Labels staging_use = {{"backend", "host"}, {"use", "staging"}};
  EXPECT_EQ(sample_value(text_, "statepool_memory_bytes", arenas_use),
            static_cast<double>(arena_->bytes()));
  EXPECT_EQ(sample_value(text_, "statepool_memory_allocations", arenas_use), 1);
  EXPECT_EQ(sample_value(text_, "statepool_memory_bytes", staging_use),
            static_cast<double>(staging_->size()));
  EXPECT_EQ(sample_value(text_, "statepool_memory_allocations", staging_use), 1);
  EXPECT_EQ(sample_value(text_, "statepool_memory_allocation_failures_total", staging_use), 0);
  EXPECT_EQ(sample_value(text_, "statepool_stored_bytes", alice_int6),
            3.0 * static_cast<double>(layout_.page_bytes));
  EXPECT_EQ(sample_value(text_, "statepool_fp32_equivalent_bytes", alice_int6),
            3.0 * static_cast<double>(layout_.fp32_bytes));
  EXPECT_NEAR(sample_value(text_, "statepool_compression_ratio", alice_int6),
              layout_.compression_ratio(), 1e-6);
  const Labels alice_host = {{"backend", "host"}, {"tenant", "alice"}};
  EXPECT_EQ(sample_value(text_, "statepool_tenant_quota_bytes", alice_host), 1073741824.0);
  EXPECT_EQ(sample_value(text_, "statepool_tenant_reserved_bytes", alice_host),
            static_cast<double>(arena_->bytes()));
  EXPECT_EQ(sample_value(text_, "statepool_requests_total", {{"type", "allocate"}}), 2);
  EXPECT_EQ(sample_value(text_, "statepool_request_duration_seconds_count", {{"type", "compress"}}),
            1);
  EXPECT_EQ(sample_value(text_, "statepool_errors_total", {{"code", "pool_exhausted"}}), 1);
  EXPECT_EQ(sample_value(text_, "statepool_clients_connected"), 1);
  EXPECT_EQ(sample_value(text_, "statepool_leases", {{"state", "active"}}), 1);
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}

TEST_F(Metrics, PassPromtoolCheckMetrics) {
  const std::string promtool = find_promtool();
  if (promtool.empty()) GTEST_SKIP() << "promtool not installed (Debian package 'prometheus')";
  ASSERT_FALSE(text_.empty());
  const std::string file = daemon_->dir() + "/metrics.txt";
  const std::string out = daemon_->dir() + "/promtool.txt";
  std::ofstream(file) << text_;
  const std::string cmd = promtool + " check metrics < " + file + " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream report;
  report << in.rdbuf();
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << report.str() << "\n--- metrics ---\n" << text_;
  EXPECT_EQ(report.str(), "") << "promtool reported lint problems";
}

// The endpoint as Prometheus and a curious operator meet it: the text format's content
// type, HEAD without a body, 405 with Allow for other methods, 404 for other paths, and
// a scrape during a drain still answered (statepool_draining 1).
TEST_F(Metrics, TheEndpointSpeaksHttpAsPrometheusExpects) {
  const int port = daemon_->metrics_port();
  const std::string get = statepool::testing::http_raw(
      port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(get.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << get.substr(0, 200);
  EXPECT_NE(get.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << get.substr(0, 300);
  const std::string head = statepool::testing::http_raw(
      port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("# HELP"), std::string::npos) << "HEAD sent a body";
  const std::string post = statepool::testing::http_raw(
      port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405 ", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD\r\n"), std::string::npos) << post;
  const std::string other = statepool::testing::http_raw(
      port, "GET /v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(other.rfind("HTTP/1.1 404 ", 0), 0u) << other;
  EXPECT_NE(other.find("/metrics"), std::string::npos) << other;

  // A drain waits for a frame that has begun (here: 3 bytes of a header, never finished):
  // meanwhile, scrapes are answered.
  std::string during;
  {
    statepool::testing::RawPeer peer(daemon_->socket_path());
    ASSERT_TRUE(peer.connected());
    const char start[3] = {'S', 'P', 'O'};
    ASSERT_TRUE(peer.send_bytes(start, sizeof start));
    std::this_thread::sleep_for(100ms);  // the daemon has seen the first byte
    ::kill(daemon_->pid(), SIGTERM);
    ASSERT_TRUE(statepool::testing::eventually(
        [&] { return daemon_->log().find("draining (SIGTERM)") != std::string::npos; }, 5s));
    during = statepool::testing::http_get(port, "/metrics");
  }  // the peer goes: the drain ends
  EXPECT_EQ(sample_value(during, "statepool_draining"), 1) << daemon_->log();
  EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0);
}
