#pragma once
// The capacity planner against the live pool: the glue between statepool::planner (pure
// arithmetic) and the Pool, shared by the PlanCapacity / FitsNow requests and the HTTP
// API (docs/capacity.md).
//
// Thread-safety: reads Pool::stats() (a snapshot under the pool's lock); safe from any
// thread.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pool/pool.hpp"
#include "statepool/planner/fits.hpp"
#include "statepool/planner/planner.hpp"

namespace statepool::service {

/// Largest config.json accepted by PlanCapacity and POST /v1/plan: the planner's limit
/// for model files (real ones are < 10 KiB).
using planner::kMaxModelConfigBytes;

/// What the pool has left for `tenant` (must exist; "" = pool-wide: a new tenant without
/// quota or arenas), counting the tenant's arenas whose pages have the shape of `shape`
/// (codec and name ignored). Throws StatusError(unknown_tenant).
[[nodiscard]] planner::LivePool live_pool(const Pool& pool, const kernels::StateLayout& shape,
                                          std::string_view tenant);

/// fits_now() for `shape` against the live pool. Throws StatusError(invalid_argument) for
/// bad inputs (slots 0), unknown_tenant.
[[nodiscard]] planner::FitsReport fits_now(const Pool& pool, const kernels::StateLayout& shape,
                                           std::string_view tenant, std::uint32_t slots,
                                           const std::vector<kernels::CodecId>& codecs);

/// The planner's JSON report for a model's config.json text, with "fits_now" for
/// `tenant` (the model's per-GPU state, inputs.slots per request). Throws
/// StatusError(invalid_argument) naming what is wrong with the config or the inputs.
[[nodiscard]] std::string plan_capacity_json(const Pool& pool, std::string_view config_json,
                                             const planner::PlanInputs& inputs,
                                             std::string_view tenant);

}  // namespace statepool::service
