// PlanCapacity, FitsNow.
#include <string>
#include <utility>
#include <vector>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::reply_codec;
using detail::str;

}  // namespace

std::string Connection::plan_capacity(const PlanRequest& request) {
  return impl().call<wire::PlanCapacity>(
      [&](auto& b) {
        const auto config = b.CreateString(request.model_config);
        const auto kv = b.CreateString(request.kv);
        const auto codecs = b.CreateVector(protocol::to_wire(request.codecs));
        wire::PlanCapacityBuilder pb(b);
        pb.add_model_config(config);
        pb.add_weight_bits(request.weight_bits);
        pb.add_kv_dtype(kv);
        pb.add_codecs(codecs);
        pb.add_slots(request.slots);
        pb.add_context(request.context);
        pb.add_gpu_memory(request.gpu_memory);
        if (request.reserved) pb.add_reserved(*request.reserved);
        pb.add_tp(request.tp);
        if (request.concurrency) pb.add_concurrency(*request.concurrency);
        return pb.Finish();
      },
      [](const wire::PlanCapacityReply* r) { return str(r->report_json()); });
}

Fits Connection::fits_now(const LayoutInfo& layout, std::uint32_t slots,
                          const std::vector<kernels::CodecId>& codecs) {
  return impl().call<wire::FitsNow>(
      [&](auto& b) {
        return wire::CreateFitsNow(b, layout.id, slots, b.CreateVector(protocol::to_wire(codecs)));
      },
      [](const wire::FitsNowReply* r) {
        Fits out;
        out.tenant = str(r->tenant());
        out.pool_capacity_bytes = r->pool_capacity_bytes();
        out.pool_free_bytes = r->pool_free_bytes();
        if (r->has_quota()) out.quota_free_bytes = r->quota_free_bytes();
        out.max_arena_pages = r->max_arena_pages();
        if (const auto* rows = r->fits()) {
          for (const auto* row : *rows) {
            CodecFit f;
            f.codec = reply_codec(row->codec());
            f.nominal_plan = row->nominal_plan();
            f.page_stride = row->page_stride();
            f.arena_free_pages = row->arena_free_pages();
            f.new_arena_pages = row->new_arena_pages();
            f.requests = row->requests();
            f.limited_by = str(row->limited_by());
            out.codecs.push_back(std::move(f));
          }
        }
        return out;
      });
}

}  // namespace statepool::client
