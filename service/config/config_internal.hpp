#pragma once
// Internals shared by the config sources (not part of config.hpp's interface):
//
//   options.cpp    the option table (flags and the --config INI file, Boost.ProgramOptions)
//                  and parse_args()
//   validate.cpp   RawOptions::validate(): every value checked and turned into the Config;
//                  available_backends()
//   tenants.cpp    --tenant flags, [tenant.NAME] sections, per-tenant limits
//   values.cpp     value parsers: sizes, durations, fractions, counts, listen addresses
//   describe.cpp   describe(): the summary --print-config prints and start-up logs

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace statepool::service::config_detail {

// --- values.cpp ------------------------------------------------------------------------

std::string lower(std::string text);
std::string trim(const std::string& text);
// "0.8" (a decimal point and no unit) or "80%": a fraction; anything else is not one
// (a plain "1" is one byte, as parse_size reads it).
std::optional<double> parse_fraction(const std::string& text);
std::uint32_t to_u32(std::uint64_t value, const std::string& what);
std::uint64_t parse_count(const std::string& text, const std::string& what);
std::vector<std::uint32_t> parse_id_list(const std::string& text, const std::string& what);
/// A count limit from `value`, which must lie in [1, max]; `what` names where it came from.
std::uint32_t count_limit(std::uint64_t value, std::uint64_t max, const std::string& what);

// --- tenants.cpp -----------------------------------------------------------------------

/// A [tenant.NAME] section's max-* keys; unset ones take the --tenant-max-* defaults.
struct LimitOverrides {
  std::optional<std::uint64_t> layouts, plans, arenas, connections, staging, pinned;
};
using Overrides = std::map<std::string, LimitOverrides>;

TenantConfig& tenant_entry(std::vector<TenantConfig>& tenants, const std::string& name,
                           const std::string& where);
void parse_tenant_flag(const std::string& text, std::vector<TenantConfig>& tenants);
void parse_tenant_key(const std::string& key, const std::string& value,
                      std::vector<TenantConfig>& tenants, Overrides& overrides,
                      const std::string& file);
/// Every tenant's limits: its section's max-* keys, else the --tenant-max-* defaults.
void resolve_limits(const TenantLimits& defaults, const Overrides& overrides,
                    std::vector<TenantConfig>& tenants);

// --- options.cpp / validate.cpp --------------------------------------------------------

/// The options' values as given (flags, then the --config file), where the Config does not
/// take them as they are. options.cpp binds them to the option table; validate() checks
/// them and fills the Config.
struct RawOptions {
  std::string socket_mode, pool_capacity, grace, max_frame, max_staging, io_timeout, drain_timeout,
      log_level, allow_uids, hello_timeout, staging_capacity, tenant_staging, snapshot_host,
      snapshot_timeout, snapshot_ttl, max_batch_bytes, crash_journal_interval, take_over,
      after_handover;
  std::vector<std::string> tenant_flags;
  std::uint64_t arena_pages = 0, max_arena_pages = 0, max_connections = 0, threads = 0, workers = 0,
                max_unattached = 0, tenant_layouts = 0, tenant_plans = 0, tenant_arenas = 0,
                tenant_connections = 0, tenant_pinned = 0, max_batch_keys = 0;
  Overrides overrides;

  /// Validation: everything before anything is created. Fills `config` (whose tenants are
  /// already parsed); throws ConfigError naming the option and the value.
  void validate(Config& config) const;
};

}  // namespace statepool::service::config_detail
