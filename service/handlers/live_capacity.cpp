#include "handlers/live_capacity.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "statepool/planner/model.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

bool same_shape(const kernels::StateLayout& a, const kernels::StateLayout& b) {
  return a.arch == b.arch && a.num_layers == b.num_layers && a.num_heads == b.num_heads &&
         a.key_dim == b.key_dim && a.value_dim == b.value_dim &&
         a.conv_channels == b.conv_channels && a.conv_width == b.conv_width &&
         a.conv_dtype == b.conv_dtype;
}

}  // namespace

planner::LivePool live_pool(const Pool& pool, const kernels::StateLayout& shape,
                            std::string_view tenant) {
  if (!tenant.empty()) (void)pool.tenant(tenant);  // unknown_tenant
  const PoolStats stats = pool.stats();
  planner::LivePool live;
  live.tenant = std::string(tenant);
  live.capacity = stats.capacity_bytes;
  live.free = stats.capacity_bytes - std::min(stats.reserved_bytes, stats.capacity_bytes);
  // A device shared with other processes (the engine's weights and KV cache) may have less
  // free memory than the pool's unused capacity: answer against what is really there.
  if (const std::optional<std::uint64_t> device_free = pool.memory().available_bytes()) {
    live.free = std::min(live.free, *device_free);
  }
  live.max_arena_pages = pool.config().max_arena_pages;
  if (tenant.empty()) return live;
  for (const TenantUsage& t : stats.tenants) {
    if (t.name == tenant && t.quota_bytes != 0)
      live.quota_free = t.quota_bytes - std::min(t.reserved_bytes, t.quota_bytes);
  }
  for (const ArenaInfo& a : stats.arenas) {
    if (a.tenant != tenant || !same_shape(pool.layout(a.layout)->layout(), shape)) continue;
    live.arenas.push_back({a.id, a.codec, a.page_stride, a.page_count - a.pages_used});
  }
  return live;
}

planner::FitsReport fits_now(const Pool& pool, const kernels::StateLayout& shape,
                             std::string_view tenant, std::uint32_t slots,
                             const std::vector<kernels::CodecId>& codecs) {
  const planner::LivePool live = live_pool(pool, shape, tenant);
  try {
    return planner::fits_now(shape, live, slots, codecs);
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, e.what());
  }
}

std::string plan_capacity_json(const Pool& pool, std::string_view config_json,
                               const planner::PlanInputs& inputs, std::string_view tenant) {
  STATEPOOL_EXPECTS(!config_json.empty(), Status::invalid_argument,
                    "no model config: send the text of the model's config.json");
  STATEPOOL_EXPECTS(config_json.size() <= kMaxModelConfigBytes, Status::invalid_argument,
                    support::cat("model config of ", config_json.size(), " bytes is larger than ",
                                 kMaxModelConfigBytes, " bytes"));
  planner::PlanReport report;
  try {
    report = planner::plan(planner::parse_model(config_json), inputs);
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, e.what());
  }
  const planner::FitsReport fits =
      fits_now(pool, report.layout, tenant, report.inputs.slots, report.inputs.codecs);
  return planner::format_json(report, fits);
}

}  // namespace statepool::service
