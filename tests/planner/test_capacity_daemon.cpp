// Capacity questions asked of a running statepoold: PlanCapacity and FitsNow through the
// client library, and `statepoolctl fits`, against the pool's real arenas and quotas.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <csignal>
#include <string>

#include "statepool/client.hpp"
#include "statepool/planner/planner.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepoolctl_run.hpp"

namespace statepool {
namespace {

using kernels::CodecId;
using namespace std::chrono_literals;

using statepool::testing::model_path;
using statepool::testing::statepoolctl;
using statepool::testing::ToolRun;

class CapacityDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<testing::DaemonProcess>(std::vector<std::string>{
        "--pool-capacity", "1GiB", "--tenant", "alice:512MiB", "--tenant", "bob"});
    client::Options o;
    o.socket_path = daemon_->socket_path();
    o.tenant = "alice";
    conn_ = std::make_unique<client::Connection>(client::Connection::connect(o));
  }
  void TearDown() override {
    conn_.reset();
    EXPECT_EQ(daemon_->stop(SIGTERM, 10s), 0) << daemon_->log();
  }
  std::unique_ptr<testing::DaemonProcess> daemon_;
  std::unique_ptr<client::Connection> conn_;
};

TEST_F(CapacityDaemon, PlanCapacityIsThePlannersReportWithTheTenantsLiveFits) {
  const std::string text = statepool::testing::model_text("qwen3.5-27b.json");
  client::PlanRequest request;
  request.model_config = text;
  request.context = 65'536;
  request.gpu_memory = 80'000'000'000;
  request.codecs = {CodecId::int6, CodecId::stepquant6};
  request.slots = 2;
  const boost::json::value v = boost::json::parse(conn_->plan_capacity(request));

  planner::PlanInputs in;
  in.context = 65'536;
  in.gpu_memory = 80'000'000'000;
  in.codecs = {CodecId::int6, CodecId::stepquant6};
  in.slots = 2;
  const auto local =
      boost::json::parse(planner::format_json(planner::plan(planner::parse_model(text), in)));
  EXPECT_EQ(v.at("codecs"), local.at("codecs"));
  EXPECT_EQ(v.at("inputs"), local.at("inputs"));
  EXPECT_EQ(v.at("weights_bytes"), local.at("weights_bytes"));

  // alice's quota (512 MiB) is smaller than the pool: int6 pages of Qwen3.5-27B.
  const auto& fits = v.at("fits_now");
  EXPECT_EQ(fits.at("pool").at("tenant").as_string(), "alice");
  EXPECT_EQ(fits.at("slots").as_int64(), 2);
  const auto& int6 = fits.at("codecs").at(0);
  const std::int64_t stride = int6.at("page_stride").as_int64();
  EXPECT_EQ(stride, local.at("codecs").at(0).at("page_stride").as_int64());
  EXPECT_EQ(int6.at("requests").as_int64(), (512ll << 20) / stride / 2);
  EXPECT_EQ(int6.at("limited_by").as_string(), "quota");
}

TEST_F(CapacityDaemon, PlanCapacityRefusesBadConfigsAndInputs) {
  client::PlanRequest request;
  request.model_config = R"({"model_type": "llama", "hidden_size": 4096})";
  try {
    (void)conn_->plan_capacity(request);
    ADD_FAILURE() << "llama accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("llama"), std::string::npos) << e.what();
  }
  request.model_config = statepool::testing::model_text("kimi-linear-48b-a3b-instruct.json");
  request.kv = "fp4";
  try {
    (void)conn_->plan_capacity(request);
    ADD_FAILURE() << "kv fp4 accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("fp4"), std::string::npos) << e.what();
  }
  request.kv = "kivi2";
  request.reserved = 0.0;
  request.concurrency = 0;
  const auto v = boost::json::parse(conn_->plan_capacity(request));  // the connection is fine
  EXPECT_EQ(v.at("inputs").at("kv").as_string(), "kivi2");
  EXPECT_EQ(v.at("inputs").at("reserved").as_double(), 0.0);
  EXPECT_EQ(v.at("codecs").at(0).at("breakdown").at("concurrency").as_int64(), 0);
}

TEST_F(CapacityDaemon, FitsNowCountsTheArenaForItsCodecAndNewArenasForTheOthers) {
  kernels::StateLayout l;
  l.name = "fits-demo";
  l.num_layers = 4;
  l.num_heads = 8;
  l.key_dim = 128;
  l.value_dim = 128;
  l.codec.id = CodecId::int8;
  const auto layout = conn_->register_layout(l);
  auto arena = conn_->open_arena(layout, 40);
  const auto slots = conn_->allocate(arena, 9);

  const client::Fits fits = conn_->fits_now(layout, 2);
  EXPECT_EQ(fits.tenant, "alice");
  EXPECT_EQ(fits.pool_capacity_bytes, 1ull << 30);
  EXPECT_EQ(fits.pool_free_bytes, (1ull << 30) - arena.bytes());
  ASSERT_TRUE(fits.quota_free_bytes.has_value());
  EXPECT_EQ(*fits.quota_free_bytes, (512ull << 20) - arena.bytes());
  ASSERT_EQ(fits.codecs.size(), 6u);
  for (const client::CodecFit& f : fits.codecs) {
    if (f.codec == CodecId::int8) {
      EXPECT_EQ(f.limited_by, "arena");
      EXPECT_EQ(f.arena_free_pages, 31u);
      EXPECT_EQ(f.new_arena_pages, 0u);
      EXPECT_EQ(f.requests, 15u);
      EXPECT_EQ(f.page_stride, arena.page_stride());
    } else {
      EXPECT_EQ(f.limited_by, "quota") << kernels::to_string(f.codec);
      EXPECT_EQ(f.new_arena_pages, *fits.quota_free_bytes / f.page_stride);
      EXPECT_EQ(f.requests, f.new_arena_pages / 2);
    }
  }
  // 4 x 8 x 128 x 128 x 4 B of FP32 state.
  EXPECT_EQ(fits.codecs.front().page_stride, 2'097'152u);
  const client::Fits one = conn_->fits_now(layout, 1, {CodecId::fp32});
  ASSERT_EQ(one.codecs.size(), 1u);
  EXPECT_EQ(one.codecs[0].requests, *fits.quota_free_bytes / 2'097'152u);
}

TEST_F(CapacityDaemon, StatepoolctlFitsAsksTheDaemonForAModel) {
  const std::string common = "--socket " + daemon_->socket_path() + " --tenant bob";
  const ToolRun text = statepoolctl(common + " fits --model " +
                                    model_path("qwen3-next-80b-a3b-instruct.json") + " --slots 2");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("tenant     'bob'"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("36 layers x 32 heads"), std::string::npos) << text.output;

  const ToolRun json = statepoolctl(common + " --json fits --state-codec fp32,int6 --model " +
                                    model_path("qwen3-next-80b-a3b-instruct.json"));
  ASSERT_EQ(json.code, 0) << json.output;
  const auto v = boost::json::parse(json.output);
  ASSERT_EQ(v.at("codecs").as_array().size(), 2u);
  EXPECT_EQ(v.at("codecs").at(0).at("page_stride").as_int64(), 77'266'944);
  EXPECT_EQ(v.at("codecs").at(0).at("requests").as_int64(), (1ll << 30) / 77'266'944);
  EXPECT_EQ(v.at("codecs").at(0).at("limited_by").as_string(), "pool");
  EXPECT_TRUE(v.at("pool").at("quota_free_bytes").is_null());

  const ToolRun no_model = statepoolctl(common + " fits");
  EXPECT_EQ(no_model.code, 2) << no_model.output;
  EXPECT_NE(no_model.output.find("fits needs --model"), std::string::npos) << no_model.output;
  const ToolRun bad_tp =
      statepoolctl(common + " fits --tp 0 --model " + model_path("qwen3.5-27b.json"));
  EXPECT_EQ(bad_tp.code, 2) << bad_tp.output;
  EXPECT_NE(bad_tp.output.find("--tp must be"), std::string::npos) << bad_tp.output;
  const ToolRun missing = statepoolctl(common + " fits --model /nonexistent/config.json");
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent/config.json"), std::string::npos) << missing.output;
}

// ping and stats --json are JSON documents with the wire schema's names (ratios null
// while nothing is stored); the command line is the tools' shared prologue (a usage error
// exits 2 with the message, a blank line and the usage).
TEST_F(CapacityDaemon, StatepoolctlJsonDocumentsAndUsageErrors) {
  const std::string socket = "--socket=" + daemon_->socket_path();
  const ToolRun ping = statepoolctl(socket + " --tenant alice ping --json --count=3");
  ASSERT_EQ(ping.code, 0) << ping.output;
  const auto p = boost::json::parse(ping.output);
  EXPECT_EQ(p.at("count").as_int64(), 3);
  EXPECT_FALSE(p.at("server").as_string().empty());
  EXPECT_GT(p.at("protocol_version").as_int64(), 0);
  for (const char* field : {"min_us", "mean_us", "max_us"}) {
    EXPECT_GT(p.at(field).to_number<double>(), 0.0) << field;
  }

  const ToolRun stats = statepoolctl("stats --json --tenant=alice " + socket);
  ASSERT_EQ(stats.code, 0) << stats.output;
  const auto st = boost::json::parse(stats.output);
  EXPECT_EQ(st.at("pool_capacity_bytes").as_int64(), 1ll << 30);
  EXPECT_GE(st.at("uptime_seconds").to_number<double>(), 0.0);
  EXPECT_TRUE(st.at("arenas").is_array());
  bool saw_alice = false;
  for (const auto& tenant : st.at("tenants").as_array()) {
    if (tenant.at("tenant").as_string() != "alice") continue;
    saw_alice = true;
    EXPECT_EQ(tenant.at("quota_bytes").as_int64(), 512ll << 20);
    EXPECT_TRUE(tenant.at("compression_ratio").is_null()) << "nothing stored: undefined";
  }
  EXPECT_TRUE(saw_alice) << stats.output;

  const auto usage_error = [&](const std::string& args, const std::string& message) {
    const ToolRun run = statepoolctl(args);
    EXPECT_EQ(run.code, 2) << args << ": " << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << args << ": " << run.output;
    EXPECT_NE(run.output.find("\n\nusage: statepoolctl"), std::string::npos) << run.output;
  };
  usage_error(socket + " ping --count 0", "--count must be between 1 and 1000000, got 0");
  usage_error(socket + " ping --count=-1", "--count expects a number, got '-1'");
  usage_error(socket + " ping stats", "unexpected argument 'stats' (one command at a time)");
  usage_error(socket + " ping --colour red", "unrecognised option '--colour'");
  usage_error(socket + " ping --tenant a --tenant b",
              "'--tenant' cannot be specified more than once");
  usage_error("ping --socket", "the required argument for option '--socket' is missing");
  usage_error(socket, "no command given");
  const ToolRun help = statepoolctl("ping --help");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_EQ(help.output.rfind("usage: statepoolctl", 0), 0u) << help.output;
}

}  // namespace
}  // namespace statepool
