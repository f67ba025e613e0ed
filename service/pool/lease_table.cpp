#include "pool/lease_table.hpp"

#include "statepool/support/status.hpp"

namespace statepool::service {

Lease& LeaseTable::create(std::size_t tenant, std::string token) {
  Lease lease;
  lease.id = next_id_;
  lease.tenant = tenant;
  lease.token = token;
  const auto [tok, inserted] = tokens_.emplace(std::move(token), lease.id);
  if (!inserted) throw StatusError(Status::internal, "lease token already in use");
  try {
    attached_.try_emplace(tenant, 0);  // may throw; the increment below cannot
    auto [it, ok] = leases_.emplace(lease.id, std::move(lease));
    ++next_id_;
    ++attached_[tenant];
    return it->second;
  } catch (...) {
    tokens_.erase(tok);
    throw;
  }
}

Lease& LeaseTable::restore(LeaseId id, std::size_t tenant, std::string token,
                           Clock::time_point deadline) {
  STATEPOOL_EXPECTS(id != 0 && id < next_id_ && !leases_.contains(id), Status::internal,
                    "lease table: restored id in use or out of range");
  Lease lease;
  lease.id = id;
  lease.tenant = tenant;
  lease.token = token;
  lease.attached = false;
  lease.deadline = deadline;
  const auto [tok, inserted] = tokens_.emplace(std::move(token), id);
  if (!inserted) throw StatusError(Status::internal, "lease token already in use");
  try {
    attached_.try_emplace(tenant, 0);
    const auto [due, fresh] = deadlines_.emplace(deadline, id);
    try {
      return leases_.emplace(id, std::move(lease)).first->second;
    } catch (...) {
      deadlines_.erase(due);
      throw;
    }
  } catch (...) {
    tokens_.erase(tok);
    throw;
  }
}

Lease* LeaseTable::find(LeaseId id) noexcept {
  const auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

const Lease* LeaseTable::find(LeaseId id) const noexcept {
  const auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

Lease* LeaseTable::find_token(std::string_view token) noexcept {
  const auto it = tokens_.find(std::string(token));
  return it == tokens_.end() ? nullptr : find(it->second);
}

bool LeaseTable::token_in_use(std::string_view token) const {
  return tokens_.contains(std::string(token));
}

Lease& LeaseTable::attached(LeaseId id) {
  Lease* lease = find(id);
  STATEPOOL_EXPECTS(lease != nullptr, Status::not_found,
                    "lease " + std::to_string(id) + " not found");
  STATEPOOL_EXPECTS(lease->attached, Status::not_found,
                    "lease " + std::to_string(id) + " is detached");
  return *lease;
}

const Lease& LeaseTable::attached(LeaseId id) const {
  return const_cast<LeaseTable*>(this)->attached(id);  // NOLINT: same lookup, const view
}

void LeaseTable::orphan(Lease& lease, Clock::time_point deadline) {
  deadlines_.emplace(deadline, lease.id);
  lease.attached = false;
  lease.deadline = deadline;
  --attached_[lease.tenant];
}

void LeaseTable::reattach(Lease& lease) noexcept {
  deadlines_.erase({lease.deadline, lease.id});
  lease.attached = true;
  lease.deadline = {};
  ++attached_[lease.tenant];  // the tenant's entry exists since its first lease
}

std::uint32_t LeaseTable::attached_count(std::size_t tenant) const noexcept {
  const auto it = attached_.find(tenant);
  return it == attached_.end() ? 0 : it->second;
}

void LeaseTable::erase(LeaseId id) noexcept {
  const auto it = leases_.find(id);
  if (it == leases_.end()) return;
  if (it->second.attached) --attached_[it->second.tenant];
  if (!it->second.attached) deadlines_.erase({it->second.deadline, id});
  tokens_.erase(it->second.token);
  leases_.erase(it);
}

std::optional<LeaseId> LeaseTable::first_expired(Clock::time_point now) const noexcept {
  if (deadlines_.empty() || deadlines_.begin()->first > now) return std::nullopt;
  return deadlines_.begin()->second;
}

std::optional<Clock::time_point> LeaseTable::next_deadline() const noexcept {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::vector<std::string> LeaseTable::check() const {
  std::vector<std::string> problems;
  std::size_t orphaned = 0;
  std::unordered_map<std::size_t, std::uint32_t> attached;
  for (const auto& [id, lease] : leases_) {
    if (lease.attached) ++attached[lease.tenant];
    const std::string name = "lease " + std::to_string(id);
    if (lease.id != id) problems.push_back(name + ": stored under the wrong id");
    const auto tok = tokens_.find(lease.token);
    if (tok == tokens_.end() || tok->second != id) problems.push_back(name + ": token not indexed");
    if (!lease.attached) {
      ++orphaned;
      if (!deadlines_.contains({lease.deadline, id})) {
        problems.push_back(name + ": orphaned without a deadline entry");
      }
      if (lease.slots.empty())
        problems.push_back(name + ": orphaned with no slots (should be dropped)");
    }
  }
  if (tokens_.size() != leases_.size()) {
    problems.push_back(std::to_string(tokens_.size()) + " tokens for " +
                       std::to_string(leases_.size()) + " leases");
  }
  for (const auto& [tenant, count] : attached_) {
    const auto it = attached.find(tenant);
    if (count != (it == attached.end() ? 0 : it->second)) {
      problems.push_back("tenant " + std::to_string(tenant) + ": " + std::to_string(count) +
                         " attached leases counted, " +
                         std::to_string(it == attached.end() ? 0 : it->second) + " found");
    }
  }
  if (deadlines_.size() != orphaned) {
    problems.push_back(std::to_string(deadlines_.size()) + " deadlines for " +
                       std::to_string(orphaned) + " orphaned leases");
  }
  return problems;
}

}  // namespace statepool::service
