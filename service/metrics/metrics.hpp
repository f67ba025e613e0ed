#pragma once
// Prometheus metrics of the daemon (prometheus-cpp).
//
// Two sources:
//  - event metrics owned here and updated by the server: requests, latencies, errors,
//    connections (prometheus::Registry families);
//  - state metrics read from the pool at scrape time (a prometheus::Collectable over
//    Pool::stats()), so capacity and accounting can never drift from the pool itself.
// Names follow Prometheus practice: `statepool_` prefix, base units, `_total` counters,
// bounded label sets (request type and status code come from closed enums; arena,
// tenant and codec labels are bounded by configuration). docs/metrics.md lists them all.
//
// Thread-safety: every member function may be called concurrently.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory/tracking.hpp"
#include "pool/pool.hpp"
#include "statepool/support/status.hpp"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace statepool::service {

class SnapshotTiers;

/// What the wire protocol gives the series: the label of each request type, indexed by
/// the type's number on the wire (index 0, no type: "unknown"), and the protocol version
/// of statepool_build_info. server/ fills it in (protocol_labels()), so this folder
/// depends on no generated code.
struct ProtocolLabels {
  std::vector<std::string> request_types;
  unsigned version = 0;
};

class Metrics {
 public:
  /// `staging`, when given, is the tracking adaptor the connections' staging buffers are
  /// allocated through (statepool_memory_bytes{use="staging"}); both must outlive this.
  /// `tiers`, when given, is the prefix-state store below the pool (its tiers' series).
  /// `executor`, when given, is the tracking adaptor of the executor's own device memory
  /// (use="executor").
  Metrics(const Pool& pool, const ProtocolLabels& protocol,
          const TrackingResource* staging = nullptr, const SnapshotTiers* tiers = nullptr,
          const TrackingResource* executor = nullptr);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// One handled request: its type (the wire's number; out of range counts as "unknown"),
  /// reply status and wall time.
  void observe_request(std::size_t type, Status status, double seconds);
  /// A connection or frame refused before it became a request (bad header or FlatBuffer:
  /// protocol_error; peer not allowed: permission_denied; too_many_connections).
  void observe_refused(Status status);
  /// A connection closed before or instead of becoming a client, by reason:
  /// "uid" (--allow-uids), "connection_limit", "unattached_limit", "hello_timeout".
  void connection_refused(const char* reason);
  /// Bytes the connections' request buffers hold now changed by `delta`.
  void request_buffers_changed(std::int64_t delta);
  void client_connected();
  void client_disconnected();
  void set_draining(bool draining);
  /// The daemon's generation (0: started fresh; a successor's is its predecessor's + 1),
  /// and, for a successor, what it took over and how long that took.
  void set_generation(std::uint64_t generation);
  void taken_over(const Pool::RestoreReport& report, double seconds);
  /// What a daemon restarted after a crash recovered from the crash journal, and the
  /// leases and snapshots it dropped (server/crash_journal.hpp).
  void recovered(const Pool::RestoreReport& report, std::uint32_t dropped_leases,
                 std::uint32_t dropped_snapshots);
  /// The crash journal was written with an image of `bytes` bytes, in `seconds` (the
  /// save, the encoding and the write).
  void journal_written(std::uint64_t bytes, double seconds);

  /// The text exposition format of everything, as /metrics serves it
  /// (http/metrics_endpoint.hpp).
  [[nodiscard]] std::string render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace statepool::service
