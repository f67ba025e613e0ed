// The daemon's HTTP JSON API (docs/http-api.md) against a running statepoold with real
// arenas and quotas: POST /v1/plan and GET /v1/fits checked against hand arithmetic and
// the planner library, every error status, HTTP/1.0, keep-alive, 100-continue, drain,
// and the --api-address configuration.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <boost/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/planner/model.hpp"
#include "statepool/planner/planner.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace planner = statepool::planner;
namespace json = boost::json;
using statepool::testing::DaemonProcess;
using statepool::testing::http_raw;
using statepool::testing::http_request;
using statepool::testing::HttpResponse;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kCapacity = 1ull << 30;  // --pool-capacity 1GiB
constexpr std::uint64_t kAliceQuota = 512ull << 20;
constexpr std::uint32_t kArenaPages = 10;
constexpr std::uint32_t kSlotsUsed = 3;
constexpr std::uint64_t kMaxArenaPages = 1u << 20;  // the default --max-arena-pages

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string model_text() {
  return read_file(std::string(STATEPOOL_MODELS_DIR) + "/qwen3-next-80b-a3b-instruct.json");
}

std::uint64_t u64(const json::value& v) {
  return v.to_number<std::uint64_t>();
}

std::string str(const json::value& v) {
  return std::string(v.as_string());
}

const json::object& row_of(const json::value& codecs, const std::string& codec) {
  for (const auto& row : codecs.as_array())
    if (row.at("codec").as_string() == codec) return row.as_object();
  throw std::runtime_error("no row for codec " + codec);
}

std::uint64_t aligned(std::uint64_t bytes) {
  return (bytes + planner::kPageAlignment - 1) / planner::kPageAlignment * planner::kPageAlignment;
}

class HttpApi : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--pool-capacity", "1GiB", "--tenant", "alice:512MiB", "--tenant",
                                 "bob", "--log-level", "debug"},
        statepool::testing::DaemonOptions{.metrics = false, .api = true});
    port_ = daemon_->api_port();
    client::Options o;
    o.socket_path = daemon_->socket_path();
    o.tenant = "alice";
    conn_ = std::make_unique<client::Connection>(client::Connection::connect(o));
    shape_.name = "http-demo";
    shape_.num_layers = 2;
    shape_.num_heads = 2;
    shape_.key_dim = 64;
    shape_.value_dim = 64;
    shape_.codec.id = kernels::CodecId::int6;
    layout_ = conn_->register_layout(shape_);
    arena_ = std::make_unique<client::Arena>(conn_->open_arena(layout_, kArenaPages));
    slots_ = conn_->allocate(*arena_, kSlotsUsed);
    arena_bytes_ = std::uint64_t{arena_->page_count()} * arena_->page_stride();
  }

  // Every test ends with a clean drain: exit 0 (under the sanitizers, also no report).
  void TearDown() override {
    slots_.clear();
    arena_.reset();
    conn_.reset();
    EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0) << daemon_->log();
  }

  [[nodiscard]] HttpResponse get(const std::string& target) const {
    return http_request(port_, "GET", target);
  }
  [[nodiscard]] HttpResponse post(const std::string& target, const std::string& body) const {
    return http_request(port_, "POST", target, body);
  }

  // An error reply: status, JSON content type, {"error": "..."} with `mention` in it.
  void expect_error(const HttpResponse& r, int status, const std::string& mention) const {
    EXPECT_EQ(r.status, status) << r.headers << "\n" << r.body;
    EXPECT_EQ(r.header("Content-Type"), "application/json") << r.headers;
    ASSERT_FALSE(r.body.empty()) << r.headers;
    EXPECT_EQ(r.body.back(), '\n');
    json::error_code ec;
    const json::value v = json::parse(r.body, ec);
    ASSERT_FALSE(ec) << r.body;
    ASSERT_TRUE(v.is_object() && v.as_object().size() == 1 && v.as_object().contains("error"))
        << r.body;
    EXPECT_NE(str(v.at("error")).find(mention), std::string::npos) << r.body;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  int port_ = 0;
  std::unique_ptr<client::Connection> conn_;
  kernels::StateLayout shape_;
  client::LayoutInfo layout_;
  std::unique_ptr<client::Arena> arena_;
  std::vector<client::Slot> slots_;
  std::uint64_t arena_bytes_ = 0;
};

}  // namespace

TEST_F(HttpApi, IndexListsTheEndpointsAndTheStartLogNamesThePort) {
  const HttpResponse r = get("/v1");
  ASSERT_EQ(r.status, 200) << r.headers << r.body << daemon_->log();
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  ASSERT_FALSE(r.body.empty());
  EXPECT_EQ(r.body.back(), '\n');
  const json::value v = json::parse(r.body);
  std::vector<std::string> seen;
  for (const auto& e : v.at("endpoints").as_array())
    seen.push_back(str(e.at("method")) + " " + str(e.at("path")));
  EXPECT_EQ(seen, (std::vector<std::string>{"GET /v1", "POST /v1/plan", "GET /v1/fits"}));
  const std::string line = "api: serving http://127.0.0.1:" + std::to_string(port_) + "/v1";
  EXPECT_TRUE(statepool::testing::eventually(
      [&] { return daemon_->log().find(line) != std::string::npos; }, 5s))
      << daemon_->log();
}

TEST_F(HttpApi, PlanIsThePlannersReportWithFitsNowFromTheLivePool) {
  const std::string text = model_text();
  ASSERT_FALSE(text.empty());
  const HttpResponse r = post("/v1/plan?context=65536&tenant=alice", text);
  ASSERT_EQ(r.status, 200) << r.body << daemon_->log();
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  const json::value v = json::parse(r.body);

  planner::PlanInputs inputs;
  inputs.context = 65536;
  const planner::PlanReport expected = planner::plan(planner::parse_model(text), inputs);
  const auto& rows = v.at("codecs").as_array();
  ASSERT_EQ(rows.size(), expected.rows.size());
  EXPECT_EQ(u64(v.at("inputs").at("context")), 65536u);

  // Alice's arena has another shape, so every codec is a new arena: the room is the
  // smaller of the pool's free bytes and alice's quota left.
  const std::uint64_t pool_free = kCapacity - arena_bytes_;
  const std::uint64_t quota_free = kAliceQuota - arena_bytes_;
  const json::value& fits = v.at("fits_now");
  EXPECT_EQ(str(fits.at("pool").at("tenant")), "alice");
  EXPECT_EQ(u64(fits.at("pool").at("free_bytes")), pool_free);
  EXPECT_EQ(u64(fits.at("pool").at("quota_free_bytes")), quota_free);
  const auto& fit_rows = fits.at("codecs").as_array();
  ASSERT_EQ(fit_rows.size(), expected.rows.size());
  for (std::size_t i = 0; i < expected.rows.size(); ++i) {
    const planner::CodecRow& want = expected.rows[i];
    const std::string codec = kernels::to_string(want.codec);
    SCOPED_TRACE(codec);
    EXPECT_EQ(str(rows[i].at("codec")), codec);
    EXPECT_EQ(u64(rows[i].at("page_stride")), want.page_stride);
    EXPECT_EQ(u64(rows[i].at("max_concurrency")), want.max_concurrency);
    const json::value& fit = fit_rows[i];
    EXPECT_EQ(str(fit.at("codec")), codec);
    EXPECT_EQ(u64(fit.at("page_stride")), want.page_stride);
    const std::uint64_t pages = std::min(quota_free / want.page_stride, kMaxArenaPages);
    EXPECT_EQ(u64(fit.at("arena_free_pages")), 0u);
    EXPECT_EQ(u64(fit.at("new_arena_pages")), pages);
    EXPECT_EQ(u64(fit.at("requests")), pages);
    EXPECT_EQ(str(fit.at("limited_by")), "quota");
  }
}

TEST_F(HttpApi, PlanParametersArePercentDecodedAndApplied) {
  // bob has no quota: the pool limits; two slots per request halve the count.
  const std::string text = model_text();
  const HttpResponse r =
      post("/v1/plan?state-codec=int8%2Cfp32&slots=2&gpu-memory=80GB&kv=kivi2&tenant=bob", text);
  ASSERT_EQ(r.status, 200) << r.body;
  const json::value v = json::parse(r.body);
  EXPECT_EQ(u64(v.at("inputs").at("gpu_memory")), 80'000'000'000u);
  EXPECT_EQ(str(v.at("inputs").at("kv")), "kivi2");
  const auto& fits = v.at("fits_now").at("codecs").as_array();
  ASSERT_EQ(fits.size(), 2u);
  EXPECT_EQ(str(fits[0].at("codec")), "int8");
  EXPECT_EQ(str(fits[1].at("codec")), "fp32");
  const std::uint64_t pool_free = kCapacity - arena_bytes_;
  for (const auto& fit : fits) {
    const std::uint64_t stride = u64(fit.at("page_stride"));
    EXPECT_EQ(u64(fit.at("requests")), pool_free / stride / 2) << fit;
    EXPECT_EQ(str(fit.at("limited_by")), "pool") << fit;
  }
  EXPECT_EQ(u64(v.at("fits_now").at("slots")), 2u);

  // Without a tenant: the pool-wide view (no quota, no arenas).
  const HttpResponse wide = post("/v1/plan?state-codec=int6", text);
  ASSERT_EQ(wide.status, 200) << wide.body;
  const json::value w = json::parse(wide.body);
  EXPECT_TRUE(w.at("fits_now").at("pool").at("tenant").is_null());
  EXPECT_TRUE(w.at("fits_now").at("pool").at("quota_free_bytes").is_null());
}

TEST_F(HttpApi, FitsCountsTheArenaOfTheLayoutAndNewArenasUnderTheQuota) {
  const HttpResponse r = get("/v1/fits?layout=http-demo&tenant=alice");
  ASSERT_EQ(r.status, 200) << r.body << daemon_->log();
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  const json::value v = json::parse(r.body);
  EXPECT_EQ(u64(v.at("slots")), 1u);
  EXPECT_EQ(u64(v.at("shape").at("layers")), 2u);

  const json::object& int6 = row_of(v.at("codecs"), "int6");
  EXPECT_EQ(str(int6.at("limited_by")), "arena");
  EXPECT_EQ(u64(int6.at("arena_free_pages")), kArenaPages - kSlotsUsed);
  EXPECT_EQ(u64(int6.at("new_arena_pages")), 0u);
  EXPECT_EQ(u64(int6.at("requests")), kArenaPages - kSlotsUsed);
  EXPECT_EQ(u64(int6.at("page_stride")), arena_->page_stride());

  const json::object& fp32 = row_of(v.at("codecs"), "fp32");
  const std::uint64_t stride = aligned(planner::page_bytes(shape_, kernels::CodecId::fp32));
  EXPECT_EQ(u64(fp32.at("page_stride")), stride);
  EXPECT_EQ(str(fp32.at("limited_by")), "quota");
  EXPECT_EQ(u64(fp32.at("arena_free_pages")), 0u);
  EXPECT_EQ(u64(fp32.at("new_arena_pages")), (kAliceQuota - arena_bytes_) / stride);
  EXPECT_EQ(u64(fp32.at("requests")), (kAliceQuota - arena_bytes_) / stride);

  // Two slots per request and a codec list: int6 only, 7 free pages -> 3 requests.
  const HttpResponse two = get("/v1/fits?layout=http-demo&tenant=alice&slots=2&state-codec=int6");
  ASSERT_EQ(two.status, 200) << two.body;
  const json::value t = json::parse(two.body);
  ASSERT_EQ(t.at("codecs").as_array().size(), 1u);
  EXPECT_EQ(u64(row_of(t.at("codecs"), "int6").at("requests")), (kArenaPages - kSlotsUsed) / 2);

  // bob has no arena of it and no quota: a new int6 arena, limited by the pool.
  const HttpResponse bob = get("/v1/fits?layout=http-demo&tenant=bob&state-codec=int6");
  ASSERT_EQ(bob.status, 200) << bob.body;
  const json::value b = json::parse(bob.body);
  const json::object& bob_int6 = row_of(b.at("codecs"), "int6");
  EXPECT_EQ(str(bob_int6.at("limited_by")), "pool");
  EXPECT_EQ(u64(bob_int6.at("new_arena_pages")),
            (kCapacity - arena_bytes_) / arena_->page_stride());
}

TEST_F(HttpApi, ErrorsHaveTheirStatusAndAMessageAndTheDaemonCarriesOn) {
  const std::string text = model_text();
  const HttpResponse llama = post("/v1/plan", R"({"model_type":"llama"})");
  expect_error(llama, 400, "llama");
  expect_error(llama, 400, "architecture");
  expect_error(post("/v1/plan", ""), 400, "config.json");
  const HttpResponse unknown = post("/v1/plan?context=4096&colour=blue", text);
  expect_error(unknown, 400, "unknown query parameter 'colour'");
  expect_error(unknown, 400, "gpu-memory");  // the known ones are listed
  expect_error(post("/v1/plan?slots=0", text), 400, "slots");
  expect_error(post("/v1/plan?context=lots", text), 400, "context");
  expect_error(post("/v1/plan?context=1&context=2", text), 400, "more than once");
  expect_error(post("/v1/plan?context", text), 400, "no value");
  expect_error(post("/v1/plan?tenant=carol", text), 400, "unknown tenant");
  expect_error(post("/v1/plan?context=6%G5", text), 400, "percent escape");
  expect_error(post("/v1/plan?context=65536%", text), 400, "percent escape");
  expect_error(get("/v1/fits?tenant=alice"), 400, "layout");
  expect_error(get("/v1/fits?layout=http-demo&slots=0"), 400, "slots");
  expect_error(get("/v1/fits?layout=http-demo&state-codec=int5"), 400, "int5");
  expect_error(get("/v1/fits?layout=http-demo&tenant=carol"), 400, "unknown tenant");
  expect_error(get("/v1/fits?layout=http-demo&codec=int6"), 400, "'codec'");
  expect_error(get("/v1/fits?layout=nope"), 404,
               "no layout named 'nope' in the pool (layouts in use: http-demo)");
  // Asked about one tenant, the 404 names only that tenant's layouts.
  expect_error(get("/v1/fits?layout=nope&tenant=bob"), 404,
               "no layout named 'nope' in the pool (no arenas are open for tenant 'bob')");
  expect_error(get("/v1/fits?layout=nope&tenant=alice"), 404,
               "(layouts in use: http-demo for tenant 'alice')");
  const HttpResponse stranger = get("/v1/fits?layout=http-demo&tenant=carol");
  EXPECT_EQ(stranger.body.find("alice"), std::string::npos) << "names no tenant: " << stranger.body;

  const HttpResponse wrong_method = get("/v1/plan");
  expect_error(wrong_method, 405, "POST");
  EXPECT_EQ(wrong_method.header("Allow"), "POST");
  const HttpResponse post_fits = post("/v1/fits?layout=http-demo", "x");
  expect_error(post_fits, 405, "GET");
  EXPECT_EQ(post_fits.header("Allow"), "GET");
  expect_error(get("/nope"), 404, "/nope");
  expect_error(get("/v1/plans"), 404, "GET /v1");

  const std::string big((1u << 20) + 1, ' ');
  expect_error(post("/v1/plan", big), 413, "larger than 1048576 bytes");
  // A body of exactly 1 MiB is read (and is not a model config).
  expect_error(post("/v1/plan", std::string(1u << 20, ' ')), 400, "");

  // Not HTTP at all.
  const std::string garbage = http_raw(port_, "HELLO\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;

  // Still serving, and SIGTERM with an idle HTTP connection open still exits 0.
  EXPECT_EQ(get("/v1").status, 200);
  const int idle = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port_));
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  TearDown();  // SIGTERM: exits 0
  ::close(idle);
  const std::string log = daemon_->log();
  EXPECT_NE(log.find("GET /v1/fits?layout=nope -> 404"), std::string::npos) << log;
}

TEST_F(HttpApi, Http10KeepAliveAndExpectContinue) {
  const HttpResponse old = http_request(port_, "GET", "/v1", "", "1.0");
  EXPECT_EQ(old.status, 200);
  EXPECT_EQ(old.headers.rfind("HTTP/1.0 200", 0), 0u) << old.headers;

  // Two requests on one connection; the second one closes it.
  const std::string two = http_raw(
      port_,
      "GET /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
      "GET /v1/fits?layout=http-demo&tenant=alice&state-codec=int6 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Connection: close\r\n\r\n");
  EXPECT_EQ(two.rfind("HTTP/1.1 200", 0), 0u) << two;
  EXPECT_NE(two.find("HTTP/1.1 200", 1), std::string::npos) << two;
  EXPECT_NE(two.find("\"limited_by\":\"arena\""), std::string::npos) << two;

  // curl's Expect: 100-continue gets its interim reply, then the real one.
  const std::string text = model_text();
  const std::string expect =
      http_raw(port_,
               "POST /v1/plan?context=4096 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
               "Expect: 100-continue\r\nContent-Length: " +
                   std::to_string(text.size()) + "\r\n\r\n" + text);
  EXPECT_EQ(expect.rfind("HTTP/1.1 100 Continue\r\n", 0), 0u) << expect.substr(0, 200);
  EXPECT_NE(expect.find("\r\n\r\nHTTP/1.1 200 OK\r\n"), std::string::npos) << expect.substr(0, 200);
}

// ---- configuration ----------------------------------------------------------------------

namespace {

using statepool::testing::Exit;
using statepool::testing::run_daemon;

class ApiConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_.emplace("/tmp/statepool-api-config");
    dir_ = tmp_->path();
    socket_ = dir_ + "/sock";
  }
  void TearDown() override { tmp_.reset(); }
  Exit run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", socket_, "--metrics-address", "off"});
    return run_daemon(args, dir_);
  }
  std::optional<statepool::testing::TempDir> tmp_;
  std::string dir_;
  std::string socket_;
};

}  // namespace

TEST_F(ApiConfig, BadAddressesAreConfigurationErrorsNamingTheOption) {
  for (const std::string bad :
       {"nonsense", "localhost:9465", "127.0.0.1:70000", ":9465", "::1:9465", "127.0.0.1:http"}) {
    SCOPED_TRACE(bad);
    const Exit e = run({"--api-address", bad});
    EXPECT_EQ(e.code, 2) << e.stderr_text;
    EXPECT_NE(e.stderr_text.find("--api-address"), std::string::npos) << e.stderr_text;
    EXPECT_FALSE(std::filesystem::exists(socket_));
  }
  const Exit host = run({"--api-address", "localhost:9465"});
  EXPECT_NE(host.stderr_text.find("not an IP address"), std::string::npos) << host.stderr_text;
}

TEST_F(ApiConfig, PrintConfigShowsTheAddressOrDisabled) {
  Exit e = run({"--print-config"});
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("api 127.0.0.1:9465"), std::string::npos) << e.stdout_text;
  e = run({"--print-config", "--api-address", "off"});
  EXPECT_NE(e.stdout_text.find("api disabled"), std::string::npos) << e.stdout_text;
  e = run({"--print-config", "--api-address", " [::1]:0 "});
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("api [::1]:0"), std::string::npos) << e.stdout_text;
  const std::string file = dir_ + "/statepool.conf";
  std::ofstream(file) << "api-address = none\n";
  e = run({"--print-config", "--config", file});
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("api disabled"), std::string::npos) << e.stdout_text;
}

// The access model: an operator's API, on loopback unless a bearer token guards it.
TEST_F(ApiConfig, OffLoopbackTheApiNeedsATokenFileOnlyItsOwnerCanRead) {
  Exit e = run({"--api-address", "0.0.0.0:0"});
  EXPECT_EQ(e.code, 2) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("is not a loopback address"), std::string::npos) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("--api-token-file"), std::string::npos) << e.stderr_text;
  const std::string token_file = dir_ + "/token";
  std::ofstream(token_file) << "0123456789abcdef0123456789abcdef\n";
  ::chmod(token_file.c_str(), 0644);
  e = run({"--api-address", "0.0.0.0:0", "--api-token-file", token_file});
  EXPECT_EQ(e.code, 2) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("may be read by others (mode 0644); chmod 600 it"),
            std::string::npos)
      << e.stderr_text;
  ::chmod(token_file.c_str(), 0600);
  e = run({"--api-address", "0.0.0.0:0", "--api-token-file", token_file, "--print-config"});
  EXPECT_EQ(e.code, 0) << e.stderr_text;
  EXPECT_NE(e.stdout_text.find("api 0.0.0.0:0 (bearer token required)"), std::string::npos)
      << e.stdout_text;
  std::ofstream(token_file) << "short\n";
  e = run({"--api-token-file", token_file});
  EXPECT_EQ(e.code, 2) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("16 to 1024 visible ASCII characters"), std::string::npos)
      << e.stderr_text;
  e = run({"--api-token-file", dir_});
  EXPECT_NE(e.stderr_text.find("is a directory"), std::string::npos) << e.stderr_text;
}

TEST(HttpApiToken, EveryRequestNeedsTheBearerTokenAndNoBodyIsReadWithoutIt) {
  statepool::testing::TempDir dir("/tmp/statepool-token");
  const std::string token = "s3cr3t-token-0123456789abcdef";
  const std::string token_file = dir.file("token");
  std::ofstream(token_file) << token << "\n";
  ::chmod(token_file.c_str(), 0600);
  DaemonProcess daemon({"--api-token-file", token_file},
                       statepool::testing::DaemonOptions{.metrics = false, .api = true});
  const auto request = [&](const std::string& authorization) {
    std::string raw = "GET /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (!authorization.empty()) raw += "Authorization: " + authorization + "\r\n";
    return statepool::testing::http_raw(daemon.api_port(), raw + "\r\n");
  };
  const std::string none = request("");
  EXPECT_EQ(none.rfind("HTTP/1.1 401", 0), 0u) << none;
  EXPECT_NE(none.find("WWW-Authenticate: Bearer realm=\"statepool\""), std::string::npos) << none;
  EXPECT_NE(none.find("Authorization: Bearer TOKEN"), std::string::npos) << none;
  EXPECT_EQ(request("Bearer " + token + "x").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(request("Bearer " + token.substr(1)).rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(request("Basic " + token).rfind("HTTP/1.1 401", 0), 0u);
  const std::string ok = request("Bearer " + token);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  EXPECT_NE(ok.find("/v1/fits"), std::string::npos) << ok;
  EXPECT_EQ(request("bearer " + token).rfind("HTTP/1.1 200", 0), 0u) << "the scheme ignores case";
  // A POST without the token is answered after its header: the body is never read.
  const std::string post = statepool::testing::http_raw(
      daemon.api_port(),
      "POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 900000\r\n\r\n{");
  EXPECT_EQ(post.rfind("HTTP/1.1 401", 0), 0u) << post;
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0) << daemon.log();
}

TEST_F(ApiConfig, APortInUseStopsTheStartWithAnActionableError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const Exit e = run({"--api-address", address});
  ::close(fd);
  EXPECT_EQ(e.code, 1) << e.stderr_text;
  EXPECT_NE(e.stderr_text.find("cannot listen on " + address + " for --api-address"),
            std::string::npos)
      << e.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(socket_)) << "left the socket file behind";
}
