// Tenants: `--tenant NAME[:QUOTA]` flags, `[tenant.NAME]` sections of the config file, and
// each tenant's limits (its section's max-* keys over the --tenant-max-* defaults).
#include "config/config.hpp"
#include "config/config_internal.hpp"

#include <algorithm>
#include <cctype>

namespace statepool::service::config_detail {

namespace {

bool valid_tenant_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

TenantConfig& tenant_entry(std::vector<TenantConfig>& tenants, const std::string& name,
                           const std::string& where) {
  if (!valid_tenant_name(name)) {
    throw ConfigError("invalid tenant name '" + name + "' in " + where +
                      ": use 1-64 letters, digits, '_', '-' or '.'");
  }
  for (auto& t : tenants)
    if (t.name == name) return t;
  tenants.push_back(TenantConfig{name, 0, {}, {}, {}, {}});
  return tenants.back();
}

void parse_tenant_flag(const std::string& text, std::vector<TenantConfig>& tenants) {
  const auto colon = text.find(':');
  const std::string name = trim(text.substr(0, colon));
  auto& tenant = tenant_entry(tenants, name, "--tenant");
  if (colon != std::string::npos)
    tenant.quota_bytes = parse_size(text.substr(colon + 1), "--tenant " + name + " quota");
}

void parse_tenant_key(const std::string& key, const std::string& value,
                      std::vector<TenantConfig>& tenants, Overrides& overrides,
                      const std::string& file) {
  // key is "tenant.NAME.FIELD"
  const auto last = key.rfind('.');
  const std::string name = key.substr(7, last - 7);
  const std::string field = key.substr(last + 1);
  auto& tenant = tenant_entry(tenants, name, file);
  const std::string what = "[tenant." + name + "] " + field;
  if (field == "quota") {
    tenant.quota_bytes = parse_size(value, what);
  } else if (field == "uids") {
    for (auto id : parse_id_list(value, what)) tenant.uids.push_back(static_cast<uid_t>(id));
  } else if (field == "gids") {
    for (auto id : parse_id_list(value, what)) tenant.gids.push_back(static_cast<gid_t>(id));
  } else if (field == "max-layouts") {
    overrides[name].layouts = parse_count(value, what);
  } else if (field == "max-plans") {
    overrides[name].plans = parse_count(value, what);
  } else if (field == "max-arenas") {
    overrides[name].arenas = parse_count(value, what);
  } else if (field == "max-connections") {
    overrides[name].connections = parse_count(value, what);
  } else if (field == "max-staging-bytes") {
    overrides[name].staging = parse_size(value, what);
  } else if (field == "max-pinned-snapshots") {
    overrides[name].pinned = parse_count(value, what);
  } else if (field == "snapshot-namespace") {
    if (!valid_tenant_name(value)) {
      throw ConfigError(what + " must be 1-64 letters, digits, '_', '-' or '.', got '" + value +
                        "'");
    }
    tenant.snapshot_namespace = value;
  } else {
    throw ConfigError("unknown key '" + field + "' in section [tenant." + name + "] of " + file +
                      " (known: quota, uids, gids, max-layouts, max-plans, max-arenas, "
                      "max-connections, max-staging-bytes, max-pinned-snapshots, "
                      "snapshot-namespace)");
  }
}

/// Every tenant's limits: its section's max-* keys, else the --tenant-max-* defaults.
void resolve_limits(const TenantLimits& defaults, const Overrides& overrides,
                    std::vector<TenantConfig>& tenants) {
  for (TenantConfig& t : tenants) {
    t.limits = defaults;
    const auto it = overrides.find(t.name);
    if (it == overrides.end()) continue;
    const LimitOverrides& o = it->second;
    const std::string section = "[tenant." + t.name + "] ";
    if (o.layouts) t.limits.max_layouts = count_limit(*o.layouts, 65536, section + "max-layouts");
    if (o.plans) t.limits.max_plans = count_limit(*o.plans, 4096, section + "max-plans");
    if (o.arenas) t.limits.max_arenas = count_limit(*o.arenas, 65536, section + "max-arenas");
    if (o.connections)
      t.limits.max_connections = count_limit(*o.connections, 65536, section + "max-connections");
    if (o.pinned) {
      t.limits.max_pinned_snapshots =
          count_limit(*o.pinned, 1u << 20, section + "max-pinned-snapshots");
    }
    if (o.staging) {
      if (*o.staging == 0) throw ConfigError(section + "max-staging-bytes must be positive");
      t.limits.max_staging_bytes = *o.staging;
    }
  }
}

}  // namespace statepool::service::config_detail
