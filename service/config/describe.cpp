// describe(): the effective configuration in words, printed by --print-config and logged at
// start-up.
#include "config/config.hpp"

#include "statepool/support/size.hpp"

#include <cmath>
#include <sstream>

namespace statepool::service {
namespace {

using support::format_bytes;

}  // namespace

std::string describe(const Config& config) {
  std::ostringstream out;
  out << "socket " << config.socket_path << " (mode " << std::oct << config.socket_mode << std::dec
      << (config.socket_group.empty() ? "" : ", group " + config.socket_group)
      << "), hand-over socket "
      << (config.handover_socket.empty() ? "none (--socket too long for the default)"
                                         : config.handover_socket)
      << (config.take_over_if_running ? " (taking over the running daemon's pool, if one runs)"
          : config.take_over          ? " (taking over the running daemon's pool)"
                                      : "")
      << (config.wait_after_handover ? "; after a hand-over it waits for SIGTERM" : "") << "\n"
      << "backend " << config.backend
      << (config.backend == "cuda" ? " (device " + std::to_string(config.device) + ")" : "")
      << ", pool capacity "
      << (config.capacity_fraction > 0
              ? std::to_string(static_cast<int>(std::lround(config.capacity_fraction * 100))) +
                    "% of the device's free memory"
              : format_bytes(config.pool.capacity_bytes))
      << ", arena pages " << config.pool.default_arena_pages << " (max "
      << config.pool.max_arena_pages << ")\n"
      << "grace period " << config.pool.grace_period.count() << " ms, io timeout "
      << config.io_timeout.count() << " ms, drain timeout " << config.drain_timeout.count()
      << " ms\n"
      << "limits: " << config.max_connections << " connections ("
      << config.max_unattached_connections << " per uid before Hello, which must come within "
      << config.hello_timeout.count() << " ms), frames up to "
      << format_bytes(config.max_frame_bytes) << ", staging up to "
      << format_bytes(config.max_staging_bytes) << " per connection and "
      << format_bytes(config.staging_capacity) << " in all, snapshot batches up to "
      << config.max_batch_keys << " keys and " << format_bytes(config.max_batch_bytes) << "\n"
      << "metrics " << (config.metrics_address.empty() ? "disabled" : config.metrics_address)
      << ", api " << (config.api_address.empty() ? "disabled" : config.api_address)
      << (config.api_token.empty() ? "" : " (bearer token required)") << ", threads "
      << config.threads << ", workers " << config.workers << "\n"
      << "snapshot tiers: host "
      << (config.snapshot_host_capacity == 0 ? std::string("none")
                                             : format_bytes(config.snapshot_host_capacity))
      << ", remote "
      << (config.snapshot_remote.empty() ? std::string("none") : config.snapshot_remote) << "\n";
  for (const auto& plan : config.plan_files) out << "plan " << plan << "\n";
  const auto describe_limits = [&out](const TenantLimits& l) {
    out << "; at most " << l.max_layouts << " layouts, " << l.max_plans << " plans, "
        << l.max_arenas << " arenas, " << l.max_connections << " connections, "
        << format_bytes(l.max_staging_bytes) << " staging, " << l.max_pinned_snapshots
        << " pinned snapshots";
  };
  if (config.pool.tenants.empty()) {
    out << "tenants: default (no quota";
    describe_limits(config.pool.default_limits);
    out << ")\n";
  } else {
    for (const auto& t : config.pool.tenants) {
      out << "tenant " << t.name << ": quota "
          << (t.quota_bytes == 0 ? std::string("unlimited") : format_bytes(t.quota_bytes));
      if (!t.uids.empty() || !t.gids.empty())
        out << ", " << t.uids.size() << " uids, " << t.gids.size() << " gids allowed";
      describe_limits(t.limits);
      if (!t.snapshot_namespace.empty()) out << "; snapshot namespace " << t.snapshot_namespace;
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace statepool::service
