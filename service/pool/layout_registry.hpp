#pragma once
// LayoutRegistry: the layouts (each with its page format) and the STEPQuant plans the
// daemon knows. Identical layouts get the same id; a plan is named by its content digest
// and is never replaced by a different plan under the same digest.
//
// Thread-safety: every member may be called concurrently (one internal mutex, never held
// while a page format is built).

#include <map>
#include <memory>
#include <mutex>
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

class LayoutRegistry {
 public:
  /// Validates and registers; identical layouts get the same id. Throws
  /// StatusError(invalid_argument), or pool_exhausted beyond kMaxLayouts.
  LayoutId register_layout(const kernels::StateLayout& layout);
  /// Throws StatusError(not_found).
  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> layout(LayoutId id) const;

  /// Keeps a calibration plan (already verified by its loader; validated again here)
  /// under its digest; the same plan twice is a no-op (created = false). At most
  /// kMaxPlans plans (pool_exhausted beyond).
  PlanInfo install_plan(std::shared_ptr<const kernels::stepquant::Plan> plan);
  /// The plan with this digest. Throws not_found naming how to install one.
  [[nodiscard]] std::shared_ptr<const kernels::stepquant::Plan> plan(std::string_view digest) const;
  [[nodiscard]] std::vector<PlanInfo> plans() const;

 private:
  [[nodiscard]] LayoutId find_locked(const kernels::StateLayout& layout) const noexcept;

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const kernels::PageCodec>> layouts_;  // id = index + 1
  std::map<std::string, std::shared_ptr<const kernels::stepquant::Plan>, std::less<>> plans_;
};

}  // namespace statepool::service
