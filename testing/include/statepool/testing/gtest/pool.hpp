#pragma once
// Helpers shared by the pool tests (tests/service, tests/planner): a small layout, pool
// configurations, and a StatusError expectation.
//
// GoogleTest only (header-only), and above service/ in the dependency order: it includes
// the pool's own headers, so only tests that link statepool::pool include it.

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memory/host_memfd.hpp"
#include "pool/pool.hpp"
#include "statepool/support/status.hpp"

namespace statepool::testing {

/// A small GDN layout (2 layers x 2 heads x 16x16): pages of a few KiB.
inline kernels::StateLayout small_layout(kernels::CodecId codec = kernels::CodecId::int8,
                                         std::string name = "demo") {
  kernels::StateLayout layout;
  layout.name = std::move(name);
  layout.arch = kernels::Arch::gdn;
  layout.num_layers = 2;
  layout.num_heads = 2;
  layout.key_dim = 16;
  layout.value_dim = 16;
  layout.codec.id = codec;
  return layout;
}

inline service::TenantConfig tenant(std::string name, std::uint64_t quota = 0) {
  service::TenantConfig t;
  t.name = std::move(name);
  t.quota_bytes = quota;
  return t;
}

inline service::PoolConfig config(std::vector<service::TenantConfig> tenants = {}) {
  service::PoolConfig c;
  c.capacity_bytes = 64ull << 20;
  c.default_arena_pages = 8;
  c.max_arena_pages = 1024;
  c.grace_period = std::chrono::milliseconds(10000);
  c.tenants = std::move(tenants);
  return c;
}

inline std::unique_ptr<service::Pool> make_pool(service::PoolConfig c = config()) {
  return std::make_unique<service::Pool>(std::move(c),
                                         std::make_shared<service::HostMemfdResource>());
}

/// Runs `fn`, expects StatusError with `status`; returns its message ("" if none thrown).
inline std::string expect_status(Status status, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), status) << "message: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected StatusError(" << status_name(status)
                  << "), got std::exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected StatusError(" << status_name(status) << "), nothing thrown";
  return {};
}

inline bool same_stats(const service::PoolStats& a, const service::PoolStats& b) {
  if (a.capacity_bytes != b.capacity_bytes || a.reserved_bytes != b.reserved_bytes ||
      a.leases_active != b.leases_active || a.leases_orphaned != b.leases_orphaned ||
      a.pages_reclaimed_total != b.pages_reclaimed_total || a.arenas.size() != b.arenas.size() ||
      a.tenants.size() != b.tenants.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.arenas.size(); ++i) {
    const service::ArenaInfo& x = a.arenas[i];
    const service::ArenaInfo& y = b.arenas[i];
    if (x.id != y.id || x.tenant != y.tenant || x.layout != y.layout ||
        x.page_count != y.page_count || x.pages_used != y.pages_used || x.bytes != y.bytes ||
        x.fd != y.fd || x.snapshot_pages != y.snapshot_pages) {
      return false;
    }
  }
  for (std::size_t i = 0; i < a.tenants.size(); ++i) {
    const service::TenantUsage& x = a.tenants[i];
    const service::TenantUsage& y = b.tenants[i];
    if (x.name != y.name || x.reserved_bytes != y.reserved_bytes || x.pages_used != y.pages_used ||
        x.stored_bytes != y.stored_bytes || x.fp32_bytes != y.fp32_bytes ||
        x.snapshots != y.snapshots || x.snapshot_bytes != y.snapshot_bytes ||
        x.pinned_snapshots != y.pinned_snapshots || x.snapshot_evictions != y.snapshot_evictions) {
      return false;
    }
  }
  return true;
}

inline std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

}  // namespace statepool::testing
