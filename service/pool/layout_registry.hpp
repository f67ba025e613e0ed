#pragma once
// LayoutRegistry: the layouts (each with its page format) and the STEPQuant plans the
// daemon knows. Identical layouts get the same id; a plan is named by its content digest
// and is never replaced by a different plan under the same digest. Entries are never
// removed; what each tenant may add is bounded per tenant (RegistryOwner), so one tenant
// filling the tables cannot keep another from registering.
//
// Thread-safety: every member may be called concurrently (one internal mutex, never held
// while a page format is built).

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pool/ids.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::service {

struct PlanInfo {
  std::string digest;
  std::uint32_t units = 0;
  std::uint32_t pivots = 0;
  double average_bits = 0;
  bool created = false;
};

/// Who adds an entry, and how many entries it may add: a tenant's count is charged only
/// when its call adds a layout or plan the daemon did not hold (one already known costs
/// nothing). Entries loaded by the operator at start have no owner and no limit.
struct RegistryOwner {
  std::size_t tenant = 0;   ///< the pool's tenant index
  std::string_view name;    ///< for the refusal
  std::uint32_t limit = 0;  ///< entries of this kind the tenant may add
};

class LayoutRegistry {
 public:
  /// Validates and registers; identical layouts get the same id. Throws
  /// StatusError(invalid_argument), or quota_exceeded when `owner` has added its limit of
  /// layouts already.
  LayoutId register_layout(const kernels::StateLayout& layout,
                           const std::optional<RegistryOwner>& owner = {});
  /// Throws StatusError(not_found).
  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> layout(LayoutId id) const;

  /// Keeps a calibration plan (already verified by its loader; validated again here)
  /// under its digest; the same plan twice is a no-op (created = false). quota_exceeded
  /// when `owner` has added its limit of plans already.
  PlanInfo install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan,
                        const std::optional<RegistryOwner>& owner = {});
  /// Layouts and plans `tenant` has added (what its limits are charged).
  [[nodiscard]] std::uint32_t layouts_added(std::size_t tenant) const;
  [[nodiscard]] std::uint32_t plans_added(std::size_t tenant) const;
  /// The plan with this digest. Throws not_found naming how to install one.
  [[nodiscard]] std::shared_ptr<const kernels::stepquant::Plan> plan(std::string_view digest) const;
  [[nodiscard]] std::vector<PlanInfo> plans() const;
  /// Layouts registered (ids 1..layout_count()).
  [[nodiscard]] std::size_t layout_count() const;
  /// What `tenant` had added in the process this one took over from (its limits go on
  /// being charged for them).
  void restore_added(std::size_t tenant, std::uint32_t layouts, std::uint32_t plans);

 private:
  [[nodiscard]] LayoutId find_locked(const kernels::StateLayout& layout) const noexcept;

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const kernels::PageCodec>> layouts_;  // id = index + 1
  std::map<std::string, std::shared_ptr<const kernels::stepquant::Plan>, std::less<>> plans_;
  std::map<std::size_t, std::uint32_t> layouts_added_;  // per tenant index
  std::map<std::size_t, std::uint32_t> plans_added_;
};

}  // namespace statepool::service
