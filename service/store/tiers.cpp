#include "store/tiers.hpp"

#include <utility>

#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"

namespace statepool::service {
namespace {

constexpr auto kWarnEvery = std::chrono::seconds(10);

}  // namespace

SnapshotTiers::SnapshotTiers(TiersConfig config, std::unique_ptr<RemoteStore> remote)
    : host_(config.host_capacity > 0 ? std::make_unique<HostTier>(config.host_capacity) : nullptr),
      remote_(std::move(remote)),
      max_pending_(config.max_pending_writes) {
  if (remote_ != nullptr) writer_ = std::thread([this] { run(); });
}

SnapshotTiers::~SnapshotTiers() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string SnapshotTiers::describe() const {
  std::string out;
  if (host_ != nullptr) out = "host " + support::format_bytes(host_->capacity());
  if (remote_ != nullptr)
    out += (out.empty() ? "" : ", ") + std::string("remote ") + remote_->describe();
  return out.empty() ? "none" : out;
}

void SnapshotTiers::warn(const char* what, const std::string& message) {
  const auto now = std::chrono::steady_clock::now();
  {
    const std::lock_guard lock(mutex_);
    auto& last = warned_[what];
    if (last != std::chrono::steady_clock::time_point{} && now - last < kWarnEvery) return;
    last = now;
  }
  LOG_WARN("store", message);
}

void SnapshotTiers::publish(const SnapshotName& name, const std::string& tenant,
                            std::shared_ptr<const std::string> value,
                            std::shared_ptr<SnapshotTierHold> hold) {
  // Whatever happens below, the value is no longer on its way once this returns: its
  // tiers have said (in `host` and `remote`) whether they took it.
  struct Published {
    SnapshotTierHold* hold;
    ~Published() {
      if (hold != nullptr) hold->publishing = false;
    }
  } const published{hold.get()};
  if (host_ != nullptr) (void)host_->put(name, tenant, value, hold);
  if (remote_ == nullptr) return;
  {
    const std::lock_guard lock(mutex_);
    if (queue_.size() >= max_pending_) {
      ++counters_.writes_dropped;
    } else {
      queue_.push_back(Write{remote_key(name), std::move(value), hold});
      // Set under the lock: the writer, which clears it on a failure, cannot have taken
      // the write yet.
      if (hold != nullptr) hold->remote = true;
      wake_.notify_one();
      return;
    }
  }
  warn("dropped", "remote snapshot writes dropped: " + std::to_string(max_pending_) +
                      " are waiting already (is " + remote_->describe() + " slow or down?)");
}

const char* SnapshotTiers::locate(const SnapshotName& name) {
  if (host_ != nullptr && host_->contains(name)) return "host";
  if (remote_ == nullptr) return nullptr;
  bool present = false;
  try {
    present = remote_->exists(remote_key(name));
  } catch (const std::exception& e) {
    {
      const std::lock_guard lock(mutex_);
      ++counters_.lookups_failed;
    }
    warn("read", std::string("remote snapshot lookup failed, answered as a miss: ") + e.what());
    return nullptr;
  }
  const std::lock_guard lock(mutex_);
  ++(present ? counters_.lookups_present : counters_.lookups_missing);
  return present ? "remote" : nullptr;
}

std::optional<SnapshotTiers::Found> SnapshotTiers::find(const SnapshotName& name,
                                                        std::size_t page_bytes,
                                                        const std::string& tenant) {
  std::string why;
  if (host_ != nullptr) {
    if (auto value = host_->get(name)) {
      // Written by this process: the header is checked, the checksum is not.
      if (const auto got = decode_snapshot_value(*value, name, page_bytes, why, false)) {
        return Found{std::move(value), got->page, "host", got->kv, got->kv_bytes};
      }
      warn("host", "host-tier snapshot refused: " + why);  // a bug: it was written here
    }
  }
  if (remote_ == nullptr) return std::nullopt;
  std::optional<std::string> got;
  try {
    got = remote_->get(remote_key(name));
  } catch (const std::exception& e) {
    {
      const std::lock_guard lock(mutex_);
      ++counters_.reads_failed;
    }
    warn("read", std::string("remote snapshot lookup failed, answered as a miss: ") + e.what());
    return std::nullopt;
  }
  if (!got) {
    const std::lock_guard lock(mutex_);
    ++counters_.reads_missing;
    return std::nullopt;
  }
  auto value = std::make_shared<const std::string>(std::move(*got));
  const auto decoded = decode_snapshot_value(*value, name, page_bytes, why);
  if (!decoded) {
    {
      const std::lock_guard lock(mutex_);
      ++counters_.reads_rejected;
    }
    warn("rejected",
         "remote snapshot " + remote_key(name) + " refused, answered as a miss: " + why);
    return std::nullopt;
  }
  {
    const std::lock_guard lock(mutex_);
    ++counters_.reads_hit;
  }
  if (host_ != nullptr) (void)host_->put(name, tenant, value);
  return Found{std::move(value), decoded->page, "remote", decoded->kv, decoded->kv_bytes};
}

void SnapshotTiers::remove(const std::string& space, const std::string& prefix,
                           std::uint64_t position, const std::vector<SnapshotName>& names) {
  std::vector<SnapshotName> all = names;
  if (host_ != nullptr) {
    for (SnapshotName& n : host_->remove_key(space, prefix, position)) all.push_back(std::move(n));
  }
  if (remote_ == nullptr) return;
  const std::lock_guard lock(mutex_);
  for (const SnapshotName& n : all) {
    if (queue_.size() >= max_pending_) {
      ++counters_.writes_dropped;
      continue;
    }
    queue_.push_back(Write{remote_key(n), nullptr, nullptr});
  }
  wake_.notify_one();
}

bool SnapshotTiers::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return queue_.empty() && !writing_; });
}

void SnapshotTiers::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // pending writes are dropped: the remote is a cache
    Write write = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    bool ok = true;
    bool stored = true;  // false: SET NX found the key (the first value stands)
    std::string error;
    try {
      if (write.value != nullptr) {
        stored = remote_->put(write.key, *write.value);
      } else {
        remote_->remove(write.key);
      }
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
    if (!ok) {
      if (write.hold != nullptr) write.hold->remote = false;
      warn("write", "remote snapshot write failed (the snapshot stays local): " + error);
    }
    lock.lock();
    writing_ = false;
    if (!ok) {
      ++counters_.writes_failed;
    } else if (stored) {
      ++counters_.writes_ok;
    } else {
      ++counters_.writes_existing;
    }
    if (ok && write.value != nullptr) counters_.write_bytes += write.value->size();
    if (queue_.empty()) idle_.notify_all();
  }
}

std::map<std::string, TierUsage> SnapshotTiers::host_usage() const {
  return host_ != nullptr ? host_->usage() : std::map<std::string, TierUsage>{};
}

RemoteCounters SnapshotTiers::remote_counters() const {
  const std::lock_guard lock(mutex_);
  RemoteCounters out = counters_;
  out.pending = queue_.size() + (writing_ ? 1 : 0);
  return out;
}

}  // namespace statepool::service
