// RegisterLayout, InstallPlan. Both run on a worker: building a page format and verifying
// a plan take time proportional to the model (a KDA plan has one unit per key row).
#include <memory>
#include <stdexcept>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/handlers.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {

Handled handle(Call& call, const wire::RegisterLayout& in) {
  STATEPOOL_EXPECTS(in.layout() != nullptr, Status::invalid_argument,
                    "register_layout without a layout");
  protocol::LayoutMessage message = protocol::from_wire(*in.layout());
  Pool& pool = call.server.pool;
  if (!message.plan_digest.empty()) {
    message.layout.plan = pool.plan(message.plan_digest);  // not_found says how to install
  }
  LayoutId id = 0;
  std::shared_ptr<const kernels::PageCodec> codec;
  co_await async_run(
      call.server.workers,
      [&] {
        id = pool.register_layout(call.connection.tenant, message.layout);
        codec = pool.layout(id);
      },
      boost::asio::use_awaitable);
  call.reply<wire::RegisterLayout>(wire::CreateRegisterLayoutReply(
      call.builder(), id, codec->page_bytes(), codec->fp32_bytes(),
      codec->staged_bytes(kernels::DType::f32), codec->staged_bytes(kernels::DType::bf16)));
}

Handled handle(Call& call, const wire::InstallPlan& in) {
  STATEPOOL_EXPECTS(in.plan() != nullptr && in.plan()->size() > 0, Status::invalid_argument,
                    "install_plan without plan bytes");
  const std::span<const std::byte> bytes{reinterpret_cast<const std::byte*>(in.plan()->data()),
                                         in.plan()->size()};
  Pool& pool = call.server.pool;
  std::shared_ptr<const kernels::stepquant::Plan> plan;
  PlanInfo info;
  co_await async_run(
      call.server.workers,
      [&] {
        try {
          plan = std::make_shared<const kernels::stepquant::Plan>(
              kernels::stepquant::from_bytes(bytes));
        } catch (const std::invalid_argument& e) {
          throw StatusError(Status::invalid_argument, support::cat("invalid plan: ", e.what()));
        }
        info = pool.install_plan(call.connection.tenant, plan);
      },
      boost::asio::use_awaitable);
  if (info.created) {
    LOG_INFO("pool", "plan ", info.digest, " installed by connection ", call.connection.id, ": ",
             kernels::to_string(plan->arch), " ", plan->num_layers, "x", plan->num_heads, "x",
             plan->key_dim, "x", plan->value_dim, ", ", info.units, " units, ", info.pivots,
             " pivots, ", info.average_bits, " bits on average");
    if (const std::string note = kernels::stepquant::page_format_note(*plan); !note.empty()) {
      LOG_WARN("pool", "plan ", info.digest, ": ", note);
    }
  }
  auto& b = call.builder();
  call.reply<wire::InstallPlan>(wire::CreateInstallPlanReply(
      b, b.CreateString(info.digest), info.units, info.pivots, info.average_bits, info.created));
}

}  // namespace statepool::service
