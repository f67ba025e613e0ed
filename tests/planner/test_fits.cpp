// "What fits now" arithmetic by hand, and the one input parser the CLI and the daemon share.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <stdexcept>
#include <string>

#include "statepool/planner/fits.hpp"
#include "statepool/planner/planner.hpp"

namespace statepool::planner {
namespace {

using kernels::CodecId;

// 2 layers x 2 heads x 64 x 64, no conv: 16,384 values; FP32 pages of 65,536 B.
kernels::StateLayout shape() {
  kernels::StateLayout s;
  s.arch = kernels::Arch::gdn;
  s.num_layers = 2;
  s.num_heads = 2;
  s.key_dim = 64;
  s.value_dim = 64;
  return s;
}

LivePool pool_wide(std::uint64_t free) {
  LivePool live;
  live.capacity = 1u << 20;
  live.free = free;
  live.max_arena_pages = 1u << 20;
  return live;
}

const FitRow& row(const FitsReport& r, CodecId id) {
  for (const FitRow& x : r.rows)
    if (x.codec == id) return x;
  throw std::logic_error("codec not in report");
}

TEST(FitsNow, PoolWideCountsWholePagesPerRequest) {
  const FitsReport r = fits_now(shape(), pool_wide(1u << 20), 2);
  ASSERT_EQ(r.rows.size(), planner_codecs().size());
  const FitRow& fp32 = row(r, CodecId::fp32);
  EXPECT_EQ(fp32.page_stride, 65'536u);
  EXPECT_EQ(fp32.new_pages, 16u);  // 1 MiB / 64 KiB
  EXPECT_EQ(fp32.arena_pages, 0u);
  EXPECT_EQ(fp32.requests, 8u);  // two slots per request
  EXPECT_EQ(fp32.limit, FitLimit::pool);
  EXPECT_FALSE(fp32.nominal_plan);
  const FitRow& bf16 = row(r, CodecId::bf16);
  EXPECT_EQ(bf16.page_stride, 32'768u);
  EXPECT_EQ(bf16.requests, 16u);
  // int8: one byte per value plus an fp16 scale per 128 values: 16,384 + 256 = 16,640 B,
  // a multiple of 256. 1,048,576 / 16,640 = 63 pages -> 31 requests of two slots.
  const FitRow& int8 = row(r, CodecId::int8);
  EXPECT_EQ(int8.page_stride, 16'640u);
  EXPECT_EQ(int8.new_pages, 63u);
  EXPECT_EQ(int8.requests, 31u);
  const FitRow& sq6 = row(r, CodecId::stepquant6);
  EXPECT_TRUE(sq6.nominal_plan);
  EXPECT_EQ(sq6.page_stride, (page_bytes(shape(), CodecId::stepquant6) + 255) / 256 * 256);
  EXPECT_EQ(sq6.new_pages, (1u << 20) / sq6.page_stride);
}

TEST(FitsNow, TheSmallerOfPoolAndQuotaLimits) {
  LivePool live = pool_wide(1u << 20);
  live.tenant = "alice";
  live.quota_free = 200'000;
  FitsReport r = fits_now(shape(), live, 1, {CodecId::fp32});
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].new_pages, 3u);  // 200,000 / 65,536
  EXPECT_EQ(r.rows[0].limit, FitLimit::quota);
  live.quota_free = 5u << 20;  // quota larger than what the pool has left
  r = fits_now(shape(), live, 1, {CodecId::fp32});
  EXPECT_EQ(r.rows[0].new_pages, 16u);
  EXPECT_EQ(r.rows[0].limit, FitLimit::pool);
  live.quota_free = 0;  // at its quota
  r = fits_now(shape(), live, 1, {CodecId::fp32});
  EXPECT_EQ(r.rows[0].requests, 0u);
  EXPECT_EQ(r.rows[0].limit, FitLimit::quota);
}

TEST(FitsNow, AnExistingArenaIsTheOnlyRoomForItsCodec) {
  LivePool live = pool_wide(1u << 20);
  live.tenant = "alice";
  live.arenas.push_back({7, CodecId::int8, 16'640, 5});
  const FitsReport r = fits_now(shape(), live, 2, {CodecId::int8, CodecId::fp32});
  const FitRow& int8 = row(r, CodecId::int8);
  EXPECT_EQ(int8.arena_pages, 5u);
  EXPECT_EQ(int8.new_pages, 0u);
  EXPECT_EQ(int8.requests, 2u);  // 5 free pages, two per request
  EXPECT_EQ(int8.limit, FitLimit::arena);
  EXPECT_EQ(int8.page_stride, 16'640u);
  EXPECT_EQ(row(r, CodecId::fp32).new_pages, 16u);  // other codecs: a new arena
}

TEST(FitsNow, OneArenaHoldsAtMostMaxArenaPages) {
  LivePool live = pool_wide(1u << 30);
  live.max_arena_pages = 100;
  const FitsReport r = fits_now(shape(), live, 1, {CodecId::bf16});
  EXPECT_EQ(r.rows[0].new_pages, 100u);
  EXPECT_EQ(r.rows[0].limit, FitLimit::max_arena_pages);
}

TEST(FitsNow, ZeroSlotsIsRefused) {
  EXPECT_THROW((void)fits_now(shape(), pool_wide(1u << 20), 0), std::invalid_argument);
  // The bound of every door (docs/capacity.md), in the planner's sentence.
  try {
    (void)fits_now(shape(), pool_wide(1u << 20), kMaxSlots + 1);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "slots must be between 1 and 1024, got 1025");
  }
}

TEST(FitsNow, ACodecNamedTwiceGetsOneRow) {
  const FitsReport r =
      fits_now(shape(), pool_wide(1u << 20), 1, {CodecId::int6, CodecId::fp32, CodecId::int6});
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].codec, CodecId::int6);
  EXPECT_EQ(r.rows[1].codec, CodecId::fp32);
}

TEST(FitsNow, JsonCarriesEveryRowAndNullsForNoTenantAndNoQuota) {
  const FitsReport r = fits_now(shape(), pool_wide(1u << 20), 2, {CodecId::fp32});
  const boost::json::value v = boost::json::parse(format_json(r));
  EXPECT_TRUE(v.at("pool").at("tenant").is_null());
  EXPECT_TRUE(v.at("pool").at("quota_free_bytes").is_null());
  EXPECT_EQ(v.at("pool").at("free_bytes").as_int64(), 1 << 20);
  EXPECT_EQ(v.at("slots").as_int64(), 2);
  EXPECT_EQ(v.at("shape").at("heads").as_int64(), 2);
  const auto& rows = v.at("codecs").as_array();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("codec").as_string(), "fp32");
  EXPECT_EQ(rows[0].at("requests").as_int64(), 8);
  EXPECT_EQ(rows[0].at("limited_by").as_string(), "pool");
  const std::string text = format_text(r);
  EXPECT_NE(text.find("pool-wide"), std::string::npos) << text;
}

TEST(PlanInputs, EveryNameParsesAndBadValuesChangeNothing) {
  PlanInputs in;
  EXPECT_TRUE(set_plan_input(in, "weights-bits", "8"));
  EXPECT_TRUE(set_plan_input(in, "kv", "kivi2"));
  EXPECT_TRUE(set_plan_input(in, "state-codec", "int6,stepquant6"));
  EXPECT_TRUE(set_plan_input(in, "slots", "3"));
  EXPECT_TRUE(set_plan_input(in, "context", "65536"));
  EXPECT_TRUE(set_plan_input(in, "gpu-memory", "80GB"));
  EXPECT_TRUE(set_plan_input(in, "reserved", "0.25"));
  EXPECT_TRUE(set_plan_input(in, "tp", "2"));
  EXPECT_TRUE(set_plan_input(in, "concurrency", "0"));
  EXPECT_EQ(in.weight_bits, 8u);
  EXPECT_EQ(in.kv, KvDtype::kivi2);
  EXPECT_EQ(in.codecs, (std::vector<CodecId>{CodecId::int6, CodecId::stepquant6}));
  EXPECT_EQ(in.slots, 3u);
  EXPECT_EQ(in.context, 65'536u);
  EXPECT_EQ(in.gpu_memory, 80'000'000'000u);
  EXPECT_DOUBLE_EQ(in.reserved, 0.25);
  EXPECT_EQ(in.tp, 2u);
  EXPECT_EQ(in.concurrency, 0u);
  EXPECT_EQ(plan_input_names().size(), 9u);
  for (const auto name : plan_input_names())
    EXPECT_THROW(set_plan_input(in, name, ""), std::invalid_argument) << name;

  const PlanInputs before = in;
  const auto refuses = [&](std::string_view name, std::string_view value, std::string_view says) {
    try {
      (void)set_plan_input(in, name, value);
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refuses("weights-bits", "6", "16, 8 or 4");
  refuses("kv", "fp4", "kv must be");
  refuses("state-codec", "int6,,int8", "state-codec: empty codec name in 'int6,,int8'");
  refuses("state-codec", "int6,", "empty codec name");
  refuses("state-codec", "", "state-codec must be all or a comma-separated list of fp32,");
  refuses("state-codec", "zip", "unknown codec 'zip' (all or a comma-separated list of");
  refuses("slots", "0", "slots must be");
  refuses("slots", "2x", "got '2x'");
  refuses("context", "-1", "context must be");
  refuses("context", "16777217", "between 1 and 16777216");
  refuses("gpu-memory", "80XB", "gpu-memory: unknown size unit");
  refuses("reserved", "1", "fraction in [0, 1)");
  refuses("reserved", "0.1.2", "fraction");
  refuses("tp", "99999", "tp must be");
  EXPECT_EQ(in.codecs, before.codecs);
  EXPECT_EQ(in.slots, before.slots);
  EXPECT_DOUBLE_EQ(in.reserved, before.reserved);
  EXPECT_FALSE(set_plan_input(in, "gpu_memory", "80GB"));  // unknown name: not ours
  EXPECT_TRUE(set_plan_input(in, "state-codec", "all"));
  EXPECT_TRUE(in.codecs.empty());
}

}  // namespace
}  // namespace statepool::planner
