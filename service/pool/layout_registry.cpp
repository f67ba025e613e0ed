#include "pool/layout_registry.hpp"

#include <stdexcept>

#include "statepool/kernels/layout.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

PlanInfo describe_plan(const std::string& digest, const kernels::stepquant::Plan& plan,
                       bool created) {
  return PlanInfo{digest, static_cast<std::uint32_t>(plan.units()), plan.pivots(),
                  plan.average_width(), created};
}

}  // namespace

LayoutId LayoutRegistry::find_locked(const kernels::StateLayout& layout) const noexcept {
  for (std::size_t i = 0; i < layouts_.size(); ++i) {
    if (layouts_[i]->layout().same_shape_and_codec(layout)) return static_cast<LayoutId>(i + 1);
  }
  return 0;
}

LayoutId LayoutRegistry::register_layout(const kernels::StateLayout& layout) {
  const std::string problem = kernels::validate(layout);
  STATEPOOL_EXPECTS(problem.empty(), Status::invalid_argument, "invalid layout: " + problem);
  {
    const std::lock_guard lock(mutex_);
    if (const LayoutId id = find_locked(layout); id != 0) return id;
  }
  // Build the page format outside the lock: it may take a while for large layouts.
  std::shared_ptr<const kernels::PageCodec> codec;
  try {
    codec = std::make_shared<const kernels::PageCodec>(layout);
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, std::string("invalid layout: ") + e.what());
  }
  const std::lock_guard lock(mutex_);
  // Another thread may have registered the same layout meanwhile: look again.
  if (const LayoutId id = find_locked(layout); id != 0) return id;
  STATEPOOL_EXPECTS(
      layouts_.size() < kMaxLayouts, Status::pool_exhausted,
      "too many distinct layouts registered (limit " + std::to_string(kMaxLayouts) + ")");
  layouts_.push_back(std::move(codec));
  return static_cast<LayoutId>(layouts_.size());
}

std::shared_ptr<const kernels::PageCodec> LayoutRegistry::layout(LayoutId id) const {
  const std::lock_guard lock(mutex_);
  STATEPOOL_EXPECTS(id >= 1 && id <= layouts_.size(), Status::not_found,
                    "layout " + std::to_string(id) + " not found");
  return layouts_[id - 1];
}

PlanInfo LayoutRegistry::install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan) {
  STATEPOOL_EXPECTS(plan != nullptr, Status::invalid_argument, "install_plan without a plan");
  const std::string problem = kernels::stepquant::validate(*plan);
  STATEPOOL_EXPECTS(problem.empty(), Status::invalid_argument, "invalid plan: " + problem);
  const std::string digest = kernels::stepquant::digest(*plan);
  const std::lock_guard lock(mutex_);
  if (const auto it = plans_.find(digest); it != plans_.end()) {
    // The digest is a fast hash, not a signature: never let a different plan take the
    // name of one that layouts may already use.
    STATEPOOL_EXPECTS(
        kernels::stepquant::same_codec_fields(*it->second, *plan), Status::invalid_argument,
        "a different plan with digest " + digest + " is already installed; refusing to replace it");
    return describe_plan(digest, *it->second, false);
  }
  STATEPOOL_EXPECTS(plans_.size() < kMaxPlans, Status::pool_exhausted,
                    "too many plans installed (limit " + std::to_string(kMaxPlans) + ")");
  plans_.emplace(digest, plan);
  return describe_plan(digest, *plan, true);
}

std::shared_ptr<const kernels::stepquant::Plan> LayoutRegistry::plan(
    std::string_view digest) const {
  const std::lock_guard lock(mutex_);
  const auto it = plans_.find(digest);
  STATEPOOL_EXPECTS(it != plans_.end(), Status::not_found,
                    "no plan with digest '" + std::string(digest) +
                        "' is installed (install it with InstallPlan, or start the daemon "
                        "with --plan FILE / --plan-dir DIR)");
  return it->second;
}

std::vector<PlanInfo> LayoutRegistry::plans() const {
  const std::lock_guard lock(mutex_);
  std::vector<PlanInfo> out;
  out.reserve(plans_.size());
  for (const auto& [digest, plan] : plans_) out.push_back(describe_plan(digest, *plan, false));
  return out;
}

}  // namespace statepool::service
