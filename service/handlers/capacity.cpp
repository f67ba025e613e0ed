// PlanCapacity, FitsNow: the planner against the live pool (live_capacity.hpp).
#include <vector>

#include "handlers/handlers.hpp"
#include "handlers/live_capacity.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

/// Codecs a capacity request may list.
constexpr std::size_t kMaxCodecs = 64;

}  // namespace

void handle(Call& call, const wire::PlanCapacity& in) {
  planner::PlanInputs inputs;
  if (in.weight_bits() != 0) inputs.weight_bits = in.weight_bits();
  if (in.kv_dtype() != nullptr && in.kv_dtype()->size() > 0) {
    STATEPOOL_EXPECTS(planner::parse_kv_dtype(in.kv_dtype()->string_view(), inputs.kv),
                      Status::invalid_argument,
                      "unknown kv_dtype '" + in.kv_dtype()->str().substr(0, 32) +
                          "' (bf16, fp8, kivi2, kivi4, flexgen4)");
  }
  inputs.codecs = protocol::from_wire(in.codecs(), kMaxCodecs);
  if (in.slots() != 0) inputs.slots = in.slots();
  if (in.context() != 0) inputs.context = in.context();
  if (in.gpu_memory() != 0) inputs.gpu_memory = in.gpu_memory();
  if (in.reserved()) inputs.reserved = *in.reserved();
  if (in.tp() != 0) inputs.tp = in.tp();
  if (in.concurrency()) inputs.concurrency = *in.concurrency();
  const std::string report = plan_capacity_json(
      call.server.pool,
      in.model_config() == nullptr ? std::string_view() : in.model_config()->string_view(), inputs,
      call.connection.tenant);
  auto& b = call.builder();
  call.reply<wire::PlanCapacity>(wire::CreatePlanCapacityReply(b, b.CreateString(report)));
}

void handle(Call& call, const wire::FitsNow& in) {
  Pool& pool = call.server.pool;
  const auto layout = pool.layout(in.layout_id());  // not_found
  const planner::FitsReport fits =
      fits_now(pool, layout->layout(), call.connection.tenant, in.slots() == 0 ? 1 : in.slots(),
               protocol::from_wire(in.codecs(), kMaxCodecs));
  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::CodecFit>> rows;
  rows.reserve(fits.rows.size());
  for (const planner::FitRow& row : fits.rows) {
    rows.push_back(wire::CreateCodecFit(
        b, protocol::to_wire(row.codec), row.nominal_plan, row.page_stride, row.arena_pages,
        row.new_pages, row.requests, b.CreateString(planner::to_string(row.limit))));
  }
  call.reply<wire::FitsNow>(wire::CreateFitsNowReply(
      b, b.CreateString(fits.live.tenant), fits.live.capacity, fits.live.free,
      fits.live.quota_free.has_value(), fits.live.quota_free.value_or(0), fits.live.max_arena_pages,
      b.CreateVector(rows)));
}

}  // namespace statepool::service
