// RegisterLayout, InstallPlan.
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::Impl;
using detail::str;

}  // namespace

LayoutInfo Connection::register_layout(const kernels::StateLayout& layout) {
  const std::string invalid = kernels::validate(layout);
  if (!invalid.empty()) throw Error(Status::invalid_argument, "invalid layout: " + invalid);
  std::shared_ptr<const kernels::PageCodec> codec;
  try {
    codec = std::make_shared<const kernels::PageCodec>(layout);
  } catch (const std::invalid_argument& e) {
    throw Error(Status::invalid_argument, std::string("invalid layout: ") + e.what());
  }

  Impl& i = impl();
  const std::string plan_digest =
      layout.plan != nullptr ? kernels::stepquant::digest(*layout.plan) : std::string();
  auto send = [&] {
    return i.call<wire::RegisterLayout>(
        [&](auto& b) {
          return wire::CreateRegisterLayout(b, protocol::to_wire(b, layout, plan_digest));
        },
        [](const wire::RegisterLayoutReply* r) {
          LayoutInfo info;
          info.id = r->layout_id();
          info.page_bytes = r->page_bytes();
          info.fp32_bytes = r->fp32_bytes();
          info.state_bytes_f32 = r->state_bytes_f32();
          info.state_bytes_bf16 = r->state_bytes_bf16();
          return info;
        });
  };
  LayoutInfo info;
  try {
    info = send();
  } catch (const ConnectionError&) {
    throw;
  } catch (const Error& e) {
    // The daemon does not know the plan yet: install it from here, then register again.
    if (e.status() != Status::not_found || layout.plan == nullptr) throw;
    (void)install_plan(*layout.plan);
    info = send();
  }
  info.layout = layout;
  if (info.page_bytes != codec->page_bytes() ||
      info.state_bytes_f32 != codec->staged_bytes(kernels::DType::f32)) {
    throw Error(Status::internal, "page format mismatch for layout '" + layout.name +
                                      "': statepoold says " + std::to_string(info.page_bytes) +
                                      " page bytes and " + std::to_string(info.state_bytes_f32) +
                                      " staged bytes, this client computes " +
                                      std::to_string(codec->page_bytes()) + " and " +
                                      std::to_string(codec->staged_bytes(kernels::DType::f32)) +
                                      "; client and daemon were built from different kernels");
  }
  {
    const std::lock_guard lock(i.codecs_mutex);
    i.codecs[info.id] = std::move(codec);
  }
  return info;
}

PlanInfo Connection::install_plan(const kernels::stepquant::Plan& plan) {
  const std::vector<std::byte> bytes = kernels::stepquant::to_bytes(plan);
  return impl().call<wire::InstallPlan>(
      [&](auto& b) {
        return wire::CreateInstallPlan(
            b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
      },
      [](const wire::InstallPlanReply* r) {
        PlanInfo info;
        info.digest = str(r->digest());
        info.units = r->units();
        info.pivots = r->pivots();
        info.average_bits = r->average_bits();
        info.created = r->created();
        return info;
      });
}

double LayoutInfo::compression_ratio() const noexcept {
  return page_bytes == 0 ? 0.0 : static_cast<double>(fp32_bytes) / static_cast<double>(page_bytes);
}

std::uint64_t LayoutInfo::state_bytes(kernels::DType dtype) const noexcept {
  switch (dtype) {
    case kernels::DType::f32: return state_bytes_f32;
    case kernels::DType::bf16: return state_bytes_bf16;
    case kernels::DType::f16: return 0;
  }
  return 0;
}

}  // namespace statepool::client
