#pragma once
// The tiers of the prefix-state store below the pool (docs/prefix-store.md, "Tiers"):
// the host tier (host_tier.hpp) and a remote store (remote_store.hpp: Redis or a Redis
// Cluster). Publication writes through: the value goes into the host tier at once and
// into the remote store from a background thread, through a bounded queue, so that a slow
// or dead remote never blocks a client's request (writes that do not fit the queue are
// dropped and counted). Both tiers keep the first value of a name: the remote write
// stores only a key that is absent (RemoteStore::put), so a second daemon publishing the
// same key leaves the first one's value. Lookups try the host tier, then the remote store;
// a remote value that is missing, unreadable, corrupted, stale (another layout) or
// unreachable is a miss, counted, and logged as a warning (at most once per 10 s per
// kind). A publication's SnapshotTierHold (pool/snapshot_table.hpp) follows where its
// value is, for the pool to count demotions.
//
// Thread-safety: every member function may be called concurrently. find() may block on
// the remote store for its timeout: call it from a worker, never from an I/O thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "store/host_tier.hpp"
#include "store/remote_store.hpp"
#include "store/snapshot_value.hpp"

namespace statepool::service {

struct TiersConfig {
  std::uint64_t host_capacity = 0;       ///< bytes; 0 = no host tier
  std::size_t max_pending_writes = 256;  ///< remote writes queued at most
};

/// Remote-store counters since start (metrics).
struct RemoteCounters {
  std::uint64_t writes_ok = 0;        ///< the value was stored
  std::uint64_t writes_existing = 0;  ///< the key had a value already, which stays
  std::uint64_t write_bytes = 0;      ///< value bytes of the ok and existing writes
  std::uint64_t writes_failed = 0;    ///< the store refused or was unreachable
  std::uint64_t writes_dropped = 0;   ///< the queue was full
  std::uint64_t reads_hit = 0;
  std::uint64_t reads_missing = 0;    ///< no such key
  std::uint64_t reads_failed = 0;     ///< unreachable or an error reply
  std::uint64_t reads_rejected = 0;   ///< corrupted, truncated, another layout or key
  std::uint64_t lookups_present = 0;  ///< locate(): the key was there
  std::uint64_t lookups_missing = 0;  ///< locate(): no such key
  std::uint64_t lookups_failed = 0;   ///< locate(): unreachable or an error reply
  std::uint64_t pending = 0;          ///< writes waiting now
};

class SnapshotTiers {
 public:
  /// `remote` may be null (no remote tier).
  SnapshotTiers(TiersConfig config, std::unique_ptr<RemoteStore> remote);
  ~SnapshotTiers();
  SnapshotTiers(const SnapshotTiers&) = delete;
  SnapshotTiers& operator=(const SnapshotTiers&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return host_ != nullptr || remote_ != nullptr; }
  [[nodiscard]] bool has_host() const noexcept { return host_ != nullptr; }
  [[nodiscard]] bool has_remote() const noexcept { return remote_ != nullptr; }
  /// "host 1.0 GiB, remote redis 127.0.0.1:6379" (for the start-up log).
  [[nodiscard]] std::string describe() const;

  /// A publication: `value` (encode_snapshot_value) into the host tier now and into the
  /// remote store soon. Never blocks on the remote store. `hold` (may be null): the
  /// publication's, kept up to date from here on: `host` while the host tier keeps the
  /// value, `remote` while a remote write of it is queued, in flight or done, and
  /// `publishing` cleared when this returns (or throws).
  void publish(const SnapshotName& name, const std::string& tenant,
               std::shared_ptr<const std::string> value,
               std::shared_ptr<SnapshotTierHold> hold = nullptr);

  struct Found {
    std::shared_ptr<const std::string> value;  ///< keeps `page` and `kv_bytes` alive
    std::span<const std::byte> page;
    const char* tier = "";                ///< "host" or "remote"
    std::optional<kernels::KvBlocks> kv;  ///< the KV blocks beside the page; null: none
    std::span<const std::byte> kv_bytes;  ///< their encoded bytes; empty without
  };
  /// The snapshot's page (and its KV blocks, if the value has any) from the host tier,
  /// else from the remote store (a remote hit is kept in the host tier for `tenant`, the
  /// reader). May block for the remote timeout.
  [[nodiscard]] std::optional<Found> find(const SnapshotName& name, std::size_t page_bytes,
                                          const std::string& tenant);

  /// Where the snapshot's value is, without reading it: "host" (the host tier holds it),
  /// "remote" (the remote store has the key: its value is not checked until it is read),
  /// or nullptr. A remote store that cannot be asked answers nullptr (counted and warned
  /// like a failed read). May block for the remote timeout.
  [[nodiscard]] const char* locate(const SnapshotName& name);
  /// Deletes the key under every layout in `names` and every layout the host tier holds
  /// it for: the host tier now, the remote store soon.
  void remove(const std::string& space, const std::string& prefix, std::uint64_t position,
              const std::vector<SnapshotName>& names);

  /// Waits until every queued remote write has been tried (tests, drain). Bounded by
  /// `timeout`; returns false when writes were still pending.
  bool flush(std::chrono::milliseconds timeout);

  [[nodiscard]] std::map<std::string, TierUsage> host_usage() const;
  [[nodiscard]] RemoteCounters remote_counters() const;

 private:
  struct Write {
    std::string key;
    std::shared_ptr<const std::string> value;  ///< null: a delete
    std::shared_ptr<SnapshotTierHold> hold;    ///< the publication's; may be null
  };
  void run();
  void warn(const char* what, const std::string& message);

  std::unique_ptr<HostTier> host_;
  std::unique_ptr<RemoteStore> remote_;
  const std::size_t max_pending_;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Write> queue_;
  bool writing_ = false;
  bool stop_ = false;
  RemoteCounters counters_;
  std::map<std::string, std::chrono::steady_clock::time_point> warned_;
  std::thread writer_;  // last: starts after everything above exists
};

}  // namespace statepool::service
