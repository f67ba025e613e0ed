#include "store/host_tier.hpp"

#include <utility>

namespace statepool::service {

void HostTier::erase(Lru::iterator it) {
  if (it->hold != nullptr) it->hold->host = false;
  TierUsage& u = usage_[it->tenant];
  u.snapshots -= 1;
  u.bytes -= it->value->size();
  used_ -= it->value->size();
  index_.erase(remote_key(it->name));
  lru_.erase(it);
}

bool HostTier::put(const SnapshotName& name, const std::string& tenant,
                   std::shared_ptr<const std::string> value,
                   std::shared_ptr<SnapshotTierHold> hold) {
  const std::string key = remote_key(name);
  const std::lock_guard lock(mutex_);
  if (const auto it = index_.find(key); it != index_.end()) {
    // Immutable: the first value stands. The entry now answers for the latest publication
    // (an earlier one's snapshot has left the pool, or it would not be published again).
    const Lru::iterator entry = it->second;
    lru_.splice(lru_.begin(), lru_, entry);
    if (hold != nullptr && hold != entry->hold) {
      if (entry->hold != nullptr) entry->hold->host = false;
      hold->host = true;
      entry->hold = std::move(hold);
    }
    return true;
  }
  if (value == nullptr || value->size() > capacity_) return false;
  while (used_ + value->size() > capacity_ && !lru_.empty()) {
    ++usage_[lru_.back().tenant].evictions;
    erase(std::prev(lru_.end()));
  }
  const std::uint64_t bytes = value->size();
  lru_.push_front(Entry{name, tenant, std::move(value), hold});
  try {
    index_.emplace(key, lru_.begin());
  } catch (...) {
    lru_.pop_front();
    throw;
  }
  if (hold != nullptr) hold->host = true;
  TierUsage& u = usage_[tenant];
  u.snapshots += 1;
  u.bytes += bytes;
  used_ += bytes;
  return true;
}

std::shared_ptr<const std::string> HostTier::get(const SnapshotName& name) {
  const std::string key = remote_key(name);
  const std::lock_guard lock(mutex_);
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool HostTier::contains(const SnapshotName& name) const {
  const std::string key = remote_key(name);
  const std::lock_guard lock(mutex_);
  return index_.contains(key);
}

std::vector<SnapshotName> HostTier::remove_key(const std::string& space, const std::string& prefix,
                                               std::uint64_t position) {
  std::vector<SnapshotName> out;
  const std::lock_guard lock(mutex_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    const auto next = std::next(it);
    if (it->name.space == space && it->name.prefix == prefix && it->name.position == position) {
      out.push_back(it->name);
      erase(it);
    }
    it = next;
  }
  return out;
}

std::uint64_t HostTier::used() const {
  const std::lock_guard lock(mutex_);
  return used_;
}

std::map<std::string, TierUsage> HostTier::usage() const {
  const std::lock_guard lock(mutex_);
  return usage_;
}

}  // namespace statepool::service
