// The planner against a live Pool (service/server/capacity): which arenas count, quotas,
// pool-wide views, and the daemon's JSON report for a model.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "handlers/live_capacity.hpp"
#include "memory/host_memfd.hpp"
#include "memory/resource.hpp"
#include "statepool/testing/gtest/pool.hpp"

namespace statepool::service {
namespace {

using kernels::CodecId;
using testing::expect_status;
using testing::make_pool;
using testing::small_layout;
using testing::tenant;

const planner::FitRow& row(const planner::FitsReport& r, CodecId id) {
  for (const auto& x : r.rows)
    if (x.codec == id) return x;
  throw std::logic_error("codec not in report");
}

std::string model_text(const std::string& file) {
  std::ifstream in(std::string(STATEPOOL_MODELS_DIR) + "/" + file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class LiveCapacity : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = testing::config({tenant("alice", 65'536), tenant("bob")});
    c.capacity_bytes = 1u << 20;
    pool_ = make_pool(c);
    // alice: an int8 arena of 8 pages of small_layout (1,024 values + 8 fp16 scales =
    // 1,040 B -> stride 1,280), 3 of them in use.
    const LayoutId layout = pool_->register_layout(small_layout(CodecId::int8));
    arena_ = pool_->open_arena("alice", layout, 8);
    ASSERT_EQ(arena_.page_stride, 1'280u);
    lease_ = pool_->attach_lease("alice", "").id;
    (void)pool_->allocate(lease_, arena_.id, 3);
  }
  std::unique_ptr<Pool> pool_;
  ArenaInfo arena_;
  LeaseId lease_ = 0;
};

TEST_F(LiveCapacity, TheTenantsArenaQuotaAndThePoolEachLimit) {
  const auto r = fits_now(*pool_, small_layout(CodecId::fp32), "alice", 1, {});
  EXPECT_EQ(r.live.tenant, "alice");
  EXPECT_EQ(r.live.free, (1u << 20) - 10'240u);
  ASSERT_TRUE(r.live.quota_free.has_value());
  EXPECT_EQ(*r.live.quota_free, 65'536u - 10'240u);
  const auto& int8 = row(r, CodecId::int8);
  EXPECT_EQ(int8.limit, planner::FitLimit::arena);
  EXPECT_EQ(int8.arena_pages, 5u);
  EXPECT_EQ(int8.new_pages, 0u);
  EXPECT_EQ(int8.requests, 5u);
  const auto& fp32 = row(r, CodecId::fp32);  // 2 x 2 x 16 x 16 x 4 B = 4,096 B pages
  EXPECT_EQ(fp32.limit, planner::FitLimit::quota);
  EXPECT_EQ(fp32.new_pages, 55'296u / 4'096u);

  // bob has no quota and no arena: the pool's free bytes are the room, for every codec.
  const auto b = fits_now(*pool_, small_layout(CodecId::fp32), "bob", 2, {});
  EXPECT_FALSE(b.live.quota_free.has_value());
  EXPECT_EQ(row(b, CodecId::int8).limit, planner::FitLimit::pool);
  EXPECT_EQ(row(b, CodecId::int8).new_pages, ((1u << 20) - 10'240u) / 1'280u);
  EXPECT_EQ(row(b, CodecId::fp32).requests, ((1u << 20) - 10'240u) / 4'096u / 2);

  // Pool-wide ("" = a new tenant): the same as bob.
  const auto all = fits_now(*pool_, small_layout(CodecId::fp32), "", 2, {});
  EXPECT_TRUE(all.live.tenant.empty());
  EXPECT_EQ(row(all, CodecId::fp32).requests, row(b, CodecId::fp32).requests);
}

TEST_F(LiveCapacity, ArenasOfAnotherShapeDoNotCount) {
  auto other = small_layout(CodecId::int6, "other");
  other.key_dim = 32;
  (void)pool_->open_arena("alice", pool_->register_layout(other), 2);
  const auto r = fits_now(*pool_, small_layout(CodecId::fp32), "alice", 1, {});
  EXPECT_NE(row(r, CodecId::int6).limit, planner::FitLimit::arena);
  EXPECT_EQ(row(r, CodecId::int6).arena_pages, 0u);
  EXPECT_EQ(row(r, CodecId::int8).arena_pages, 5u);
  EXPECT_LT(*r.live.quota_free, 65'536u - 10'240u);  // but its bytes count against the quota
}

TEST_F(LiveCapacity, UnknownTenantAndZeroSlotsAreRefused) {
  expect_status(Status::unknown_tenant,
                [&] { (void)fits_now(*pool_, small_layout(), "carol", 1, {}); });
  expect_status(Status::invalid_argument,
                [&] { (void)fits_now(*pool_, small_layout(), "alice", 0, {}); });
}

// Host memory that reports a free figure as a device does (the CUDA resource's
// cudaMemGetInfo): what other processes hold on the card is not the pool's to give.
class ReportsFreeMemory final : public ResourceAdaptor {
 public:
  using ResourceAdaptor::ResourceAdaptor;
  [[nodiscard]] std::optional<std::uint64_t> available_bytes() const override { return free; }
  std::uint64_t free = 0;

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override {
    return upstream().allocate(bytes, label, handle);
  }
};

TEST(LiveCapacityDevice, TheBackendsFreeMemoryCapsWhatFits) {
  HostMemfdResource host;
  auto memory = std::make_shared<ReportsFreeMemory>(host);
  auto c = testing::config({tenant("alice")});
  c.capacity_bytes = 1u << 20;
  Pool pool(c, memory);
  // fp32 pages of small_layout are 4,096 B.
  memory->free = 40'960;  // the engine holds the rest of the card
  auto r = fits_now(pool, small_layout(CodecId::fp32), "alice", 1, {});
  EXPECT_EQ(r.live.free, 40'960u);
  EXPECT_EQ(row(r, CodecId::fp32).limit, planner::FitLimit::pool);
  EXPECT_EQ(row(r, CodecId::fp32).requests, 10u);
  memory->free = std::uint64_t{1} << 30;  // more than the pool's capacity: that decides
  r = fits_now(pool, small_layout(CodecId::fp32), "alice", 1, {});
  EXPECT_EQ(r.live.free, 1u << 20);
  EXPECT_EQ(row(r, CodecId::fp32).requests, (1u << 20) / 4'096u);
}

TEST(LiveCapacityPlan, ReportIsThePlannersWithFitsForTheModelsState) {
  auto c = testing::config({tenant("alice", 512ull << 20), tenant("bob")});
  c.capacity_bytes = 1ull << 30;
  auto pool = make_pool(c);
  const std::string text = model_text("qwen3-next-80b-a3b-instruct.json");
  planner::PlanInputs in;
  in.context = 65'536;
  const boost::json::value v = boost::json::parse(plan_capacity_json(*pool, text, in, "bob"));
  const planner::PlanReport local = planner::plan(planner::parse_model(text), in);
  const auto& codecs = v.at("codecs").as_array();
  ASSERT_EQ(codecs.size(), local.rows.size());
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    EXPECT_EQ(codecs[i].at("page_stride").as_int64(),
              static_cast<std::int64_t>(local.rows[i].page_stride));
    EXPECT_EQ(codecs[i].at("max_concurrency").as_int64(),
              static_cast<std::int64_t>(local.rows[i].max_concurrency));
  }
  EXPECT_EQ(v.at("inputs").at("context").as_int64(), 65'536);
  // FP32 state of Qwen3-Next: 77,266,944 B pages; 1 GiB takes 13 of them.
  const auto& fits = v.at("fits_now");
  EXPECT_EQ(fits.at("pool").at("tenant").as_string(), "bob");
  EXPECT_EQ(fits.at("shape").at("layers").as_int64(), 36);
  EXPECT_EQ(fits.at("codecs").at(0).at("codec").as_string(), "fp32");
  EXPECT_EQ(fits.at("codecs").at(0).at("page_stride").as_int64(), 77'266'944);
  EXPECT_EQ(fits.at("codecs").at(0).at("requests").as_int64(), 13);
  // alice's quota of 512 MiB: 6 pages.
  const boost::json::value a = boost::json::parse(plan_capacity_json(*pool, text, in, "alice"));
  EXPECT_EQ(a.at("fits_now").at("codecs").at(0).at("requests").as_int64(), 6);
  EXPECT_EQ(a.at("fits_now").at("codecs").at(0).at("limited_by").as_string(), "quota");
}

TEST(LiveCapacityPlan, BadConfigsAndInputsAreInvalidArguments) {
  auto pool = make_pool();
  const planner::PlanInputs in;
  auto msg =
      expect_status(Status::invalid_argument, [&] { (void)plan_capacity_json(*pool, "", in, ""); });
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  msg = expect_status(Status::invalid_argument, [&] {
    (void)plan_capacity_json(*pool, R"({"model_type": "llama"})", in, "");
  });
  EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
  msg = expect_status(Status::invalid_argument, [&] {
    (void)plan_capacity_json(*pool, std::string(kMaxModelConfigBytes + 1, ' '), in, "");
  });
  EXPECT_NE(msg.find("larger than"), std::string::npos) << msg;
  planner::PlanInputs three;
  three.tp = 3;
  msg = expect_status(Status::invalid_argument, [&] {
    (void)plan_capacity_json(*pool, model_text("qwen3.5-27b.json"), three, "");
  });
  EXPECT_NE(msg.find("tp 3"), std::string::npos) << msg;
  expect_status(Status::unknown_tenant, [&] {
    (void)plan_capacity_json(*pool, model_text("qwen3.5-27b.json"), in, "carol");
  });
}

}  // namespace
}  // namespace statepool::service
