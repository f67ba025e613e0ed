#include "pool/layout_registry.hpp"

#include <stdexcept>

#include "statepool/kernels/layout.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

PlanInfo describe_plan(const std::string& digest, const kernels::stepquant::Plan& plan,
                       bool created) {
  return PlanInfo{digest, static_cast<std::uint32_t>(plan.units()), plan.pivots(),
                  plan.average_width(), created};
}

/// Refuses when the owner has added its limit of entries (`count` of them) already.
void check_owner(const std::optional<RegistryOwner>& owner, std::uint32_t count, const char* what,
                 const char* key) {
  if (!owner || count < owner->limit) return;
  throw StatusError(Status::quota_exceeded,
                    "tenant '" + std::string(owner->name) + "' has added " + std::to_string(count) +
                        " " + what + ", its limit (" + key +
                        " in its [tenant] section, default --tenant-" + key + ")");
}

std::uint32_t count_of(const std::map<std::size_t, std::uint32_t>& counts, std::size_t tenant) {
  const auto it = counts.find(tenant);
  return it == counts.end() ? 0 : it->second;
}

}  // namespace

std::uint32_t LayoutRegistry::layouts_added(std::size_t tenant) const {
  const std::lock_guard lock(mutex_);
  return count_of(layouts_added_, tenant);
}

std::uint32_t LayoutRegistry::plans_added(std::size_t tenant) const {
  const std::lock_guard lock(mutex_);
  return count_of(plans_added_, tenant);
}

LayoutId LayoutRegistry::find_locked(const kernels::StateLayout& layout) const noexcept {
  for (std::size_t i = 0; i < layouts_.size(); ++i) {
    if (layouts_[i]->layout().same_shape_and_codec(layout)) return static_cast<LayoutId>(i + 1);
  }
  return 0;
}

LayoutId LayoutRegistry::register_layout(const kernels::StateLayout& layout,
                                         const std::optional<RegistryOwner>& owner) {
  const std::string problem = kernels::validate(layout);
  STATEPOOL_EXPECTS(problem.empty(), Status::invalid_argument, "invalid layout: " + problem);
  {
    const std::lock_guard lock(mutex_);
    if (const LayoutId id = find_locked(layout); id != 0) return id;
    // Refuse before building the page format: a tenant at its limit costs no work.
    if (owner)
      check_owner(owner, count_of(layouts_added_, owner->tenant), "layouts", "max-layouts");
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
  if (owner) {
    std::uint32_t& added = layouts_added_[owner->tenant];
    check_owner(owner, added, "layouts", "max-layouts");
    layouts_.push_back(std::move(codec));
    ++added;
  } else {
    layouts_.push_back(std::move(codec));
  }
  return static_cast<LayoutId>(layouts_.size());
}

std::shared_ptr<const kernels::PageCodec> LayoutRegistry::layout(LayoutId id) const {
  const std::lock_guard lock(mutex_);
  STATEPOOL_EXPECTS(id >= 1 && id <= layouts_.size(), Status::not_found,
                    "layout " + std::to_string(id) + " not found");
  return layouts_[id - 1];
}

PlanInfo LayoutRegistry::install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan,
                                      const std::optional<RegistryOwner>& owner) {
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
  if (owner) {
    std::uint32_t& added = plans_added_[owner->tenant];
    check_owner(owner, added, "plans", "max-plans");
    plans_.emplace(digest, plan);
    ++added;
  } else {
    plans_.emplace(digest, plan);
  }
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

std::size_t LayoutRegistry::layout_count() const {
  const std::lock_guard lock(mutex_);
  return layouts_.size();
}

void LayoutRegistry::restore_added(std::size_t tenant, std::uint32_t layouts, std::uint32_t plans) {
  const std::lock_guard lock(mutex_);
  if (layouts != 0) layouts_added_[tenant] = layouts;
  if (plans != 0) plans_added_[tenant] = plans;
}

std::vector<PlanInfo> LayoutRegistry::plans() const {
  const std::lock_guard lock(mutex_);
  std::vector<PlanInfo> out;
  out.reserve(plans_.size());
  for (const auto& [digest, plan] : plans_) out.push_back(describe_plan(digest, *plan, false));
  return out;
}

}  // namespace statepool::service
