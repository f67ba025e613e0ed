#include "metrics/metrics.hpp"

#include <array>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "statepool/support/version.hpp"
#include "store/tiers.hpp"

namespace statepool::service {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Request latencies span ~10 us (ping, allocate) to seconds (compressing a large state).
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0,  2.5,  5.0,    10.0};

ClientMetric sample(std::vector<ClientMetric::Label> labels, double value, MetricType type) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (type == MetricType::Counter)
    metric.counter.value = value;
  else
    metric.gauge.value = value;
  return metric;
}

// A family being filled at scrape time: add() takes any number, and the family's type.
struct Family : MetricFamily {
  template <class Number>
  void add(std::vector<ClientMetric::Label> labels, Number value) {
    metric.push_back(sample(std::move(labels), static_cast<double>(value), type));
  }
};

Family family(std::string name, std::string help, MetricType type) {
  Family f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

// Reads the pool at scrape time.
class PoolCollector final : public prometheus::Collectable {
 public:
  PoolCollector(const Pool& pool, const TrackingResource* staging, const SnapshotTiers* tiers,
                const TrackingResource* executor)
      : pool_(pool), staging_(staging), tiers_(tiers), executor_(executor) {}

  std::vector<MetricFamily> Collect() const override {
    const PoolStats stats = pool_.stats();
    const std::string backend(pool_.backend_name());
    // Device memory also says which device (one daemon per GPU, but dashboards join many).
    std::vector<ClientMetric::Label> where = {{"backend", backend}};
    if (pool_.memory().space() == MemorySpace::device) {
      where.push_back({"device", std::to_string(pool_.memory().device())});
    }
    std::vector<MetricFamily> out;

    auto capacity =
        family("statepool_pool_capacity_bytes",
               "Configured capacity of the pool (all arenas together).", MetricType::Gauge);
    capacity.add(where, stats.capacity_bytes);
    auto reserved = family("statepool_pool_reserved_bytes", "Bytes of the pool reserved by arenas.",
                           MetricType::Gauge);
    reserved.add(where, stats.reserved_bytes);
    out.push_back(std::move(capacity));
    out.push_back(std::move(reserved));
    // What the backend could still allocate (the device's free memory, which the engine's
    // weights and KV cache share); absent for host memory.
    try {
      if (const std::optional<std::uint64_t> free = pool_.memory().available_bytes()) {
        auto available =
            family("statepool_backend_available_bytes",
                   "Memory the backend could still allocate now (a device's free memory).",
                   MetricType::Gauge);
        available.add(where, *free);
        out.push_back(std::move(available));
      }
    } catch (const std::exception&) {
      // A failing device query leaves the gauge out of this scrape; the rest stands.
    }

    // What the backend's memory resource holds, through the tracking adaptors: the arenas
    // (under the pool's limits) and the connections' staging buffers.
    auto memory_bytes = family(
        "statepool_memory_bytes",
        "Bytes the memory backend holds, by use (arenas, staging, executor).", MetricType::Gauge);
    auto memory_allocations =
        family("statepool_memory_allocations",
               "Live allocations of the memory backend, by use (arenas, staging, executor).",
               MetricType::Gauge);
    auto memory_failures =
        family("statepool_memory_allocation_failures_total",
               "Allocations the memory backend refused (out of memory or descriptors), by use.",
               MetricType::Counter);
    const auto add_memory = [&](const char* use, const MemoryUsage& usage) {
      std::vector<ClientMetric::Label> labels = where;
      labels.push_back({"use", use});
      memory_bytes.add(labels, usage.live_bytes);
      memory_allocations.add(labels, usage.live_allocations);
      memory_failures.add(labels, usage.failures_total);
    };
    add_memory("arenas", stats.memory);
    if (staging_ != nullptr) add_memory("staging", staging_->usage());
    if (executor_ != nullptr) add_memory("executor", executor_->usage());
    out.push_back(std::move(memory_bytes));
    out.push_back(std::move(memory_allocations));
    out.push_back(std::move(memory_failures));

    auto arena_bytes =
        family("statepool_arena_bytes",
               "Bytes of an arena by state (used: pages holding a slot; free).", MetricType::Gauge);
    auto arena_pages = family("statepool_arena_pages", "Pages of an arena by state (used or free).",
                              MetricType::Gauge);
    auto page_bytes = family("statepool_arena_page_bytes",
                             "Exact bytes of one page (one request's whole state) in an arena.",
                             MetricType::Gauge);
    for (const auto& a : stats.arenas) {
      std::vector<ClientMetric::Label> labels = {{"arena", std::to_string(a.id)},
                                                 {"tenant", a.tenant},
                                                 {"layout", a.layout_name},
                                                 {"codec", kernels::to_string(a.codec)},
                                                 {"backend", a.backend}};
      if (where.size() > 1) labels.push_back(where.back());  // device
      auto with_state = [&](const char* state) {
        auto l = labels;
        l.push_back({"state", state});
        return l;
      };
      const double used = static_cast<double>(a.pages_used);
      const double free = static_cast<double>(a.page_count - a.pages_used);
      const double stride = static_cast<double>(a.page_stride);
      arena_bytes.add(with_state("used"), used * stride);
      arena_bytes.add(with_state("free"), free * stride);
      arena_pages.add(with_state("used"), used);
      arena_pages.add(with_state("free"), free);
      page_bytes.add(labels, a.page_bytes);
    }
    out.push_back(std::move(arena_bytes));
    out.push_back(std::move(arena_pages));
    out.push_back(std::move(page_bytes));

    // Accounting per tenant and codec, summed over the tenant's arenas of that codec.
    struct Sum {
      double pages = 0, stored = 0, fp32 = 0;
    };
    std::map<std::pair<std::string, std::string>, Sum> sums;
    for (const auto& a : stats.arenas) {
      auto& s = sums[{a.tenant, kernels::to_string(a.codec)}];
      s.pages += a.pages_used;
      s.stored += static_cast<double>(a.pages_used) * static_cast<double>(a.page_bytes);
      s.fp32 += static_cast<double>(a.pages_used) * static_cast<double>(a.fp32_page_bytes);
    }
    auto pages_used = family("statepool_pages_used", "Pages holding a slot, per tenant and codec.",
                             MetricType::Gauge);
    auto stored = family("statepool_stored_bytes",
                         "Page bytes of used pages (every byte of metadata included), per "
                         "tenant and codec.",
                         MetricType::Gauge);
    auto fp32 = family("statepool_fp32_equivalent_bytes",
                       "Bytes the same states would take with every value in FP32, per tenant "
                       "and codec.",
                       MetricType::Gauge);
    auto ratio = family("statepool_compression_ratio",
                        "Measured compression ratio: FP32-equivalent bytes / stored bytes, per "
                        "tenant and codec (absent while nothing is stored).",
                        MetricType::Gauge);
    for (const auto& [key, s] : sums) {
      std::vector<ClientMetric::Label> labels = {{"tenant", key.first}, {"codec", key.second}};
      pages_used.add(labels, s.pages);
      stored.add(labels, s.stored);
      fp32.add(labels, s.fp32);
      if (s.stored > 0) ratio.add(labels, s.fp32 / s.stored);
    }
    out.push_back(std::move(pages_used));
    out.push_back(std::move(stored));
    out.push_back(std::move(fp32));
    out.push_back(std::move(ratio));

    auto quota = family("statepool_tenant_quota_bytes",
                        "Configured quota of a tenant over reserved arena bytes (0 = unlimited).",
                        MetricType::Gauge);
    auto tenant_reserved =
        family("statepool_tenant_reserved_bytes",
               "Arena bytes reserved by a tenant (counted against its quota).", MetricType::Gauge);
    for (const auto& t : stats.tenants) {
      // The backend (and device) too: reserved bytes are that memory, and the quota carries
      // the same labels so that reserved / quota matches one to one.
      std::vector<ClientMetric::Label> labels = where;
      labels.push_back({"tenant", t.name});
      quota.add(labels, t.quota_bytes);
      tenant_reserved.add(labels, t.reserved_bytes);
    }
    out.push_back(std::move(quota));
    out.push_back(std::move(tenant_reserved));

    // Prefix-state snapshots (docs/prefix-store.md), per publishing tenant and tier; the
    // counters per tenant that looked up / published / lost them. The hit ratio is
    // rate(hits) / rate(lookups) (the recording rule in charts/prometheus).
    auto snapshots =
        family("statepool_snapshots", "Prefix-state snapshots a tenant published, per tier.",
               MetricType::Gauge);
    auto snapshot_bytes = family("statepool_snapshot_bytes",
                                 "Bytes of the snapshots a tenant published, per tier (pool: "
                                 "page bytes, inside the tenant's arenas).",
                                 MetricType::Gauge);
    auto pinned = family("statepool_snapshots_pinned",
                         "Pinned snapshots a tenant published (never evicted).", MetricType::Gauge);
    auto lookups =
        family("statepool_snapshot_lookups_total",
               "GetSnapshot lookups by a tenant, by result (hit or miss).", MetricType::Counter);
    auto puts = family("statepool_snapshot_puts_total",
                       "PutSnapshot requests by a tenant, by result (created, or existing: the "
                       "key had a snapshot for the layout already).",
                       MetricType::Counter);
    auto evictions = family("statepool_snapshot_evictions_total",
                            "Snapshots of a tenant a tier let go for room, per tier (pool: for "
                            "slots or newer snapshots, while no lower tier held them; host: "
                            "least recently used past --snapshot-host-capacity).",
                            MetricType::Counter);
    auto demotions = family("statepool_snapshot_demotions_total",
                            "Snapshots of a tenant evicted from the pool while a lower tier "
                            "held them (the host tier, or a remote write queued or done).",
                            MetricType::Counter);
    auto tier_hits = family("statepool_snapshot_tier_hits_total",
                            "GetSnapshot hits of a tenant, per tier that served them (pool, "
                            "host, remote).",
                            MetricType::Counter);
    for (const auto& t : stats.tenants) {
      snapshots.add({{"tenant", t.name}, {"tier", "pool"}}, t.snapshots);
      snapshot_bytes.add({{"tenant", t.name}, {"tier", "pool"}}, t.snapshot_bytes);
      pinned.add({{"tenant", t.name}}, t.pinned_snapshots);
      lookups.add({{"tenant", t.name}, {"result", "hit"}}, t.snapshot_hits);
      lookups.add({{"tenant", t.name}, {"result", "miss"}}, t.snapshot_misses);
      puts.add({{"tenant", t.name}, {"result", "created"}}, t.snapshot_puts_created);
      puts.add({{"tenant", t.name}, {"result", "existing"}}, t.snapshot_puts_existing);
      evictions.add({{"tenant", t.name}, {"tier", "pool"}}, t.snapshot_evictions);
      demotions.add({{"tenant", t.name}}, t.snapshot_demotions);
      const std::uint64_t below = t.snapshot_hits_host + t.snapshot_hits_remote;
      tier_hits.add({{"tenant", t.name}, {"tier", "pool"}},
                    t.snapshot_hits >= below ? t.snapshot_hits - below : 0);
      if (tiers_ != nullptr && tiers_->has_host()) {
        tier_hits.add({{"tenant", t.name}, {"tier", "host"}}, t.snapshot_hits_host);
      }
      if (tiers_ != nullptr && tiers_->has_remote()) {
        tier_hits.add({{"tenant", t.name}, {"tier", "remote"}}, t.snapshot_hits_remote);
      }
    }
    if (tiers_ != nullptr && tiers_->has_host()) {
      const auto host = tiers_->host_usage();
      for (const auto& t : stats.tenants) {
        const auto it = host.find(t.name);
        const TierUsage u = it == host.end() ? TierUsage{} : it->second;
        snapshots.add({{"tenant", t.name}, {"tier", "host"}}, u.snapshots);
        snapshot_bytes.add({{"tenant", t.name}, {"tier", "host"}}, u.bytes);
        evictions.add({{"tenant", t.name}, {"tier", "host"}}, u.evictions);
      }
    }
    out.push_back(std::move(snapshots));
    out.push_back(std::move(snapshot_bytes));
    out.push_back(std::move(pinned));
    out.push_back(std::move(lookups));
    out.push_back(std::move(puts));
    out.push_back(std::move(evictions));
    out.push_back(std::move(demotions));
    out.push_back(std::move(tier_hits));
    if (tiers_ != nullptr && tiers_->has_remote()) {
      const RemoteCounters r = tiers_->remote_counters();
      auto writes = family("statepool_remote_store_writes_total",
                           "Snapshot writes to the remote store (--snapshot-remote), by result: "
                           "ok, existing (the key had a value, which stays), failed "
                           "(unreachable or refused), dropped (queue full).",
                           MetricType::Counter);
      auto write_bytes = family("statepool_remote_store_write_bytes_total",
                                "Bytes of the snapshot values sent to the remote store by "
                                "writes that completed (ok or existing).",
                                MetricType::Counter);
      auto reads = family("statepool_remote_store_reads_total",
                          "Snapshot lookups in the remote store, by result: hit, missing, "
                          "failed (unreachable or an error reply), rejected (corrupted, "
                          "truncated, or another layout's or key's value).",
                          MetricType::Counter);
      auto pending = family("statepool_remote_store_pending_writes",
                            "Snapshot writes waiting for the remote store.", MetricType::Gauge);
      writes.add({{"result", "ok"}}, r.writes_ok);
      writes.add({{"result", "existing"}}, r.writes_existing);
      writes.add({{"result", "failed"}}, r.writes_failed);
      writes.add({{"result", "dropped"}}, r.writes_dropped);
      reads.add({{"result", "hit"}}, r.reads_hit);
      reads.add({{"result", "missing"}}, r.reads_missing);
      reads.add({{"result", "failed"}}, r.reads_failed);
      reads.add({{"result", "rejected"}}, r.reads_rejected);
      pending.add({}, r.pending);
      write_bytes.add({}, r.write_bytes);
      out.push_back(std::move(writes));
      out.push_back(std::move(write_bytes));
      out.push_back(std::move(reads));
      out.push_back(std::move(pending));
    }

    auto leases = family("statepool_leases",
                         "Client leases by state (active: attached to a connection; orphaned: "
                         "disconnected, inside the grace period).",
                         MetricType::Gauge);
    leases.add({{"state", "active"}}, stats.leases_active);
    leases.add({{"state", "orphaned"}}, stats.leases_orphaned);
    out.push_back(std::move(leases));

    auto reclaimed =
        family("statepool_reclaimed_pages_total",
               "Pages reclaimed from leases whose grace period ended.", MetricType::Counter);
    reclaimed.add({}, stats.pages_reclaimed_total);
    out.push_back(std::move(reclaimed));

    // Calibration state: the STEPQuant plans the daemon holds (at most --tenant-max-plans
    // per tenant, and those loaded at start).
    // Named "width", not "bits": promtool's lint takes "bits" for a non-base unit (it wants
    // bytes). Plans call bits per value a width (Plan::widths, Plan::average_width).
    auto plan_width = family("statepool_plan_average_width",
                             "Nominal bits per value of an installed STEPQuant plan (pivots "
                             "counted at 16), by plan digest.",
                             MetricType::Gauge);
    auto plan_pivots = family("statepool_plan_pivots",
                              "FP16 pivot units of an installed STEPQuant plan, by plan digest.",
                              MetricType::Gauge);
    for (const auto& plan : pool_.plans()) {
      plan_width.add({{"plan", plan.digest}}, plan.average_bits);
      plan_pivots.add({{"plan", plan.digest}}, plan.pivots);
    }
    out.push_back(std::move(plan_width));
    out.push_back(std::move(plan_pivots));
    return out;
  }

 private:
  const Pool& pool_;
  const TrackingResource* staging_;
  const SnapshotTiers* tiers_;
  const TrackingResource* executor_;
};

/// Reasons a connection is refused (statepool_connections_refused_total), pre-created.
constexpr const char* kRefusalReasons[] = {"uid", "connection_limit", "unattached_limit",
                                           "hello_timeout", "descriptors"};

}  // namespace

struct Metrics::Impl {
  Impl(const Pool& pool, const ProtocolLabels& protocol, const TrackingResource* staging,
       const SnapshotTiers* tiers, const TrackingResource* executor)
      : registry(std::make_shared<prometheus::Registry>()),
        collector(std::make_shared<PoolCollector>(pool, staging, tiers, executor)),
        requests(prometheus::BuildCounter()
                     .Name("statepool_requests_total")
                     .Help("Requests handled, by request type.")
                     .Register(*registry)),
        latency(prometheus::BuildHistogram()
                    .Name("statepool_request_duration_seconds")
                    .Help("Time from a request's arrival to its reply, by request type.")
                    .Register(*registry)),
        errors(prometheus::BuildCounter()
                   .Name("statepool_errors_total")
                   .Help("Error replies and refused frames, by status code.")
                   .Register(*registry)),
        refused(prometheus::BuildCounter()
                    .Name("statepool_connections_refused_total")
                    .Help("Connections closed before they became clients, by reason (uid, "
                          "connection_limit, unattached_limit, hello_timeout, descriptors).")
                    .Register(*registry)),
        connections(prometheus::BuildCounter()
                        .Name("statepool_connections_total")
                        .Help("Client connections accepted.")
                        .Register(*registry)
                        .Add({})),
        request_buffers(prometheus::BuildGauge()
                            .Name("statepool_request_buffer_bytes")
                            .Help("Memory the connections' request buffers hold now (frames "
                                  "being received and the one being handled).")
                            .Register(*registry)
                            .Add({})),
        clients(prometheus::BuildGauge()
                    .Name("statepool_clients_connected")
                    .Help("Client connections open now.")
                    .Register(*registry)
                    .Add({})),
        draining(prometheus::BuildGauge()
                     .Name("statepool_draining")
                     .Help("1 while the daemon drains before exiting, else 0.")
                     .Register(*registry)
                     .Add({})),
        generation(prometheus::BuildGauge()
                       .Name("statepool_generation")
                       .Help("Hand-overs and crash recoveries since the pool was created: 0 "
                             "for a daemon that started fresh, its predecessor's + 1 for one "
                             "that took over or recovered after a crash.")
                       .Register(*registry)
                       .Add({})),
        takeover_seconds(prometheus::BuildGauge()
                             .Name("statepool_takeover_seconds")
                             .Help("How long this daemon took to take the pool over from its "
                                   "predecessor (0: it started fresh).")
                             .Register(*registry)
                             .Add({})),
        taken(prometheus::BuildGauge()
                  .Name("statepool_taken_over")
                  .Help("What this daemon took over from its predecessor at start, by what: "
                        "arenas, bytes, pages (in use), leases, snapshots.")
                  .Register(*registry)),
        recovered_family(prometheus::BuildGauge()
                             .Name("statepool_recovered")
                             .Help("What this daemon recovered from the crash journal at start, "
                                   "by what: arenas, bytes, pages (in use), leases, snapshots, "
                                   "dropped_leases (lost with their arena, or their grace "
                                   "period ended while no daemon ran), dropped_snapshots (their "
                                   "pages changed after the journal's last write).")
                             .Register(*registry)),
        journal_writes(prometheus::BuildCounter()
                           .Name("statepool_journal_writes_total")
                           .Help("Writes of the crash journal (the pool's image, kept in "
                                 "systemd's descriptor store).")
                           .Register(*registry)
                           .Add({})),
        journal_image_bytes(prometheus::BuildGauge()
                                .Name("statepool_journal_image_bytes")
                                .Help("Size of the image the crash journal's last write held.")
                                .Register(*registry)
                                .Add({})),
        journal_write_seconds(prometheus::BuildGauge()
                                  .Name("statepool_journal_write_seconds")
                                  .Help("How long the crash journal's last write took: saving "
                                        "the pool's state, encoding it and writing it.")
                                  .Register(*registry)
                                  .Add({})) {
    for (const char* what : {"arenas", "bytes", "pages", "leases", "snapshots"}) {
      taken_by.push_back(&taken.Add({{"what", what}}));
      recovered_by.push_back(&recovered_family.Add({{"what", what}}));
    }
    recovered_by.push_back(&recovered_family.Add({{"what", "dropped_leases"}}));
    recovered_by.push_back(&recovered_family.Add({{"what", "dropped_snapshots"}}));
    prometheus::BuildGauge()
        .Name("statepool_build_info")
        .Help("Always 1; labels carry the daemon version and protocol version.")
        .Register(*registry)
        .Add({{"version", support::version()}, {"protocol", std::to_string(protocol.version)}})
        .Set(1);
    for (const char* reason : kRefusalReasons) {
      refused_counters.push_back(&refused.Add({{"reason", reason}}));
    }
    // Pre-create every request type so rates exist (at zero) before the first request.
    // Index 0 is "unknown" whatever the labels say: out-of-range types count there.
    request_counters.push_back(&requests.Add({{"type", "unknown"}}));
    request_latency.push_back(&latency.Add({{"type", "unknown"}}, kLatencyBuckets));
    for (std::size_t type = 1; type < protocol.request_types.size(); ++type) {
      const std::string& name = protocol.request_types[type];
      request_counters.push_back(&requests.Add({{"type", name}}));
      request_latency.push_back(&latency.Add({{"type", name}}, kLatencyBuckets));
    }
  }

  prometheus::Counter& error_counter(Status status) {
    const std::lock_guard lock(mutex);
    return errors.Add({{"code", status_name(status)}});
  }

  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<PoolCollector> collector;
  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Histogram>& latency;
  prometheus::Family<prometheus::Counter>& errors;
  prometheus::Family<prometheus::Counter>& refused;
  std::vector<prometheus::Counter*> refused_counters;  // kRefusalReasons order
  prometheus::Counter& connections;
  prometheus::Gauge& request_buffers;
  prometheus::Gauge& clients;
  prometheus::Gauge& draining;
  prometheus::Gauge& generation;
  prometheus::Gauge& takeover_seconds;
  prometheus::Family<prometheus::Gauge>& taken;
  std::vector<prometheus::Gauge*> taken_by;  // arenas, bytes, pages, leases, snapshots
  prometheus::Family<prometheus::Gauge>& recovered_family;
  std::vector<prometheus::Gauge*> recovered_by;  // as taken_by, then dropped_leases
  prometheus::Counter& journal_writes;
  prometheus::Gauge& journal_image_bytes;
  prometheus::Gauge& journal_write_seconds;
  std::vector<prometheus::Counter*> request_counters;  // by wire type number
  std::vector<prometheus::Histogram*> request_latency;
  std::mutex mutex;
};

Metrics::Metrics(const Pool& pool, const ProtocolLabels& protocol, const TrackingResource* staging,
                 const SnapshotTiers* tiers, const TrackingResource* executor)
    : impl_(std::make_unique<Impl>(pool, protocol, staging, tiers, executor)) {}
Metrics::~Metrics() = default;

void Metrics::observe_request(std::size_t type, Status status, double seconds) {
  const std::size_t index = type < impl_->request_counters.size() ? type : 0;
  impl_->request_counters[index]->Increment();
  impl_->request_latency[index]->Observe(seconds);
  if (status != Status::ok) impl_->error_counter(status).Increment();
}

void Metrics::observe_refused(Status status) {
  impl_->error_counter(status).Increment();
}

void Metrics::connection_refused(const char* reason) {
  for (std::size_t i = 0; i < std::size(kRefusalReasons); ++i) {
    if (std::string_view(kRefusalReasons[i]) == reason) impl_->refused_counters[i]->Increment();
  }
}

void Metrics::request_buffers_changed(std::int64_t delta) {
  impl_->request_buffers.Increment(static_cast<double>(delta));
}

void Metrics::client_connected() {
  impl_->connections.Increment();
  impl_->clients.Increment();
}
void Metrics::client_disconnected() {
  impl_->clients.Decrement();
}
void Metrics::set_draining(bool draining) {
  impl_->draining.Set(draining ? 1.0 : 0.0);
}

void Metrics::set_generation(std::uint64_t generation) {
  impl_->generation.Set(static_cast<double>(generation));
}

void Metrics::taken_over(const Pool::RestoreReport& report, double seconds) {
  impl_->takeover_seconds.Set(seconds);
  const double values[] = {static_cast<double>(report.arenas), static_cast<double>(report.bytes),
                           static_cast<double>(report.pages), static_cast<double>(report.leases),
                           static_cast<double>(report.snapshots)};
  for (std::size_t i = 0; i < std::size(values); ++i) impl_->taken_by[i]->Set(values[i]);
}

void Metrics::recovered(const Pool::RestoreReport& report, std::uint32_t dropped_leases,
                        std::uint32_t dropped_snapshots) {
  const double values[] = {
      static_cast<double>(report.arenas),    static_cast<double>(report.bytes),
      static_cast<double>(report.pages),     static_cast<double>(report.leases),
      static_cast<double>(report.snapshots), static_cast<double>(dropped_leases),
      static_cast<double>(dropped_snapshots)};
  for (std::size_t i = 0; i < std::size(values); ++i) impl_->recovered_by[i]->Set(values[i]);
}

void Metrics::journal_written(std::uint64_t bytes, double seconds) {
  impl_->journal_writes.Increment();
  impl_->journal_image_bytes.Set(static_cast<double>(bytes));
  impl_->journal_write_seconds.Set(seconds);
}

std::string Metrics::render() const {
  auto families = impl_->registry->Collect();
  auto pool_families = impl_->collector->Collect();
  families.insert(families.end(), pool_families.begin(), pool_families.end());
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace statepool::service
