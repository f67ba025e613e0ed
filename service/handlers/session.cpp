// Hello, Ping, Drain, Stats.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "handlers/handlers.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/version.hpp"

namespace statepool::service {
namespace {

std::string str(const flatbuffers::String* s) {
  return s == nullptr ? std::string() : s->str();
}

/// Operators (root and the daemon's own uid) may see every tenant and drain the daemon.
bool is_operator(const ConnectionState& c) noexcept {
  return c.uid == 0 || c.uid == ::geteuid();
}

}  // namespace

void handle(Call& call, const wire::Hello& in) {
  ServerContext& s = call.server;
  ConnectionState& c = call.connection;
  STATEPOOL_EXPECTS(!c.hello_done, Status::invalid_argument,
                    "hello was already done on this connection");
  if (in.max_version() < protocol::kMinProtocolVersion ||
      in.min_version() > protocol::kMaxProtocolVersion || in.min_version() > in.max_version()) {
    throw StatusError(
        Status::unsupported_version,
        support::cat("client speaks protocol versions ", in.min_version(), "..", in.max_version(),
                     ", daemon speaks ", protocol::kMinProtocolVersion, "..",
                     protocol::kMaxProtocolVersion));
  }
  const std::string tenant = in.tenant() == nullptr || in.tenant()->size() == 0
                                 ? std::string("default")
                                 : in.tenant()->str();
  s.pool.check_peer(tenant, c.uid, c.gid);  // unknown_tenant / permission_denied
  auto staging = std::make_unique<LimitingResource>(
      s.tenant_staging(s.pool.tenant(tenant).name), s.config.max_staging_bytes,
      Status::quota_exceeded,
      LimitText{"staging limit of this connection", "held", " (--max-staging-bytes)"});
  const LeaseGrant grant = s.pool.attach_lease(tenant, str(in.lease_token()));
  c.staging_limit = std::move(staging);
  c.hello_done = true;
  c.tenant = tenant;
  c.lease = grant.id;
  c.client_name = str(in.client_name()).substr(0, 128);
  c.version = std::min(in.max_version(), protocol::kMaxProtocolVersion);
  LOG_INFO(
      "session", "connection ", c.id, ": client '", c.client_name, "' (pid ", c.pid, ", uid ",
      c.uid, ") tenant '", tenant, "', lease ", grant.token.substr(0, 8), "… ",
      grant.resumed ? support::cat("resumed with ", grant.slots, " slots") : std::string("new"));
  auto& b = call.builder();
  call.reply<wire::Hello>(wire::CreateHelloReply(
      b, c.version, b.CreateString(grant.token), grant.resumed, grant.slots,
      b.CreateString(std::string("statepoold ") + support::version()),
      static_cast<std::uint32_t>(s.config.pool.grace_period.count()), s.config.max_frame_bytes,
      c.version >= 2 ? s.config.max_batch_keys : 0, c.version >= 2 ? s.config.max_batch_bytes : 0));
}

void handle(Call& call, const wire::Ping& /*in*/) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  call.reply<wire::Ping>(wire::CreatePingReply(
      call.builder(), static_cast<std::uint64_t>(
                          std::chrono::duration_cast<std::chrono::nanoseconds>(now).count())));
}

void handle(Call& call, const wire::Drain& /*in*/) {
  const ConnectionState& c = call.connection;
  STATEPOOL_EXPECTS(
      is_operator(c), Status::permission_denied,
      support::cat("drain needs uid 0 or the daemon's uid ", ::geteuid(), "; peer uid is ", c.uid));
  call.server.request_drain(
      support::cat("drain request from connection ", c.id, " (pid ", c.pid, ")"));
  call.reply<wire::Drain>(wire::CreateDrainReply(call.builder()));
}

void handle(Call& call, const wire::Stats& /*in*/) {
  ServerContext& s = call.server;
  const ConnectionState& c = call.connection;
  PoolStats stats = s.pool.stats();
  // Tenants see only themselves; operators see all.
  if (!is_operator(c)) {
    std::erase_if(stats.arenas, [&](const ArenaInfo& a) { return a.tenant != c.tenant; });
    std::erase_if(stats.tenants, [&](const TenantUsage& t) { return t.name != c.tenant; });
  }
  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::ArenaStats>> arenas;
  arenas.reserve(stats.arenas.size());
  for (const auto& a : stats.arenas) {
    arenas.push_back(wire::CreateArenaStats(
        b, a.id, b.CreateString(a.tenant), a.layout, b.CreateString(a.layout_name),
        protocol::to_wire(a.codec), b.CreateString(a.backend), a.page_bytes, a.page_stride,
        a.page_count, a.pages_used, a.bytes,
        static_cast<std::uint64_t>(a.pages_used) * a.fp32_page_bytes, a.snapshot_pages));
  }
  std::vector<flatbuffers::Offset<wire::TenantStats>> tenants;
  tenants.reserve(stats.tenants.size());
  for (const auto& t : stats.tenants) {
    tenants.push_back(wire::CreateTenantStats(
        b, b.CreateString(t.name), t.quota_bytes, t.reserved_bytes, t.pages_used, t.stored_bytes,
        t.fp32_bytes, t.snapshots, t.snapshot_bytes, t.pinned_snapshots, t.snapshot_hits,
        t.snapshot_misses, t.snapshot_evictions, t.snapshot_demotions, t.snapshot_hits_host,
        t.snapshot_hits_remote));
  }
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
  call.reply<wire::Stats>(wire::CreateStatsReply(
      b, b.CreateVector(arenas), b.CreateVector(tenants), s.clients_connected(),
      stats.leases_active, stats.leases_orphaned, stats.pages_reclaimed_total, stats.capacity_bytes,
      stats.reserved_bytes, uptime, s.generation));
}

}  // namespace statepool::service
