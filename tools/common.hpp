#pragma once
// Shared by the client tools: the default socket, a text table, number formatting and
// the human rendering of a Stats reply (sizes by support::format_bytes, as everywhere).
// Header-only, tools only (not installed). The command-line prologue is
// statepool/tools/cli.hpp.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/support/size.hpp"

namespace statepool::tools {

/// The socket path: --socket, else $STATEPOOL_SOCKET, else the default.
inline std::string default_socket() {
  const char* env = std::getenv("STATEPOOL_SOCKET");
  return (env != nullptr && *env != '\0') ? std::string(env)
                                          : std::string(client::kDefaultSocketPath);
}

inline std::string format_fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

inline std::string format_ratio(double ratio) {
  return ratio > 0.0 ? format_fixed(ratio, 2) + "x" : std::string("-");
}

/// Left-aligned text columns separated by two spaces; numbers right-aligned when
/// `right[i]` is set.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> right = {})
      : right_(std::move(right)) {
    right_.resize(header.size(), false);
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) {
    row.resize(rows_.front().size());
    rows_.push_back(std::move(row));
  }
  void print(std::ostream& out, const std::string& indent = "") const {
    std::vector<std::size_t> width(rows_.front().size(), 0);
    for (const auto& row : rows_) {
      for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
      std::string line = indent;
      for (std::size_t c = 0; c < row.size(); ++c) {
        const std::size_t pad = width[c] - row[c].size();
        if (right_[c]) line.append(pad, ' ');
        line += row[c];
        if (c + 1 < row.size()) {
          if (!right_[c]) line.append(pad, ' ');
          line += "  ";
        }
      }
      out << line << '\n';
    }
  }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

/// Human-readable stats: a summary, then one table of arenas and one of tenants.
inline void print_stats(std::ostream& out, const client::Stats& s) {
  out << "generation " << s.generation << ", uptime " << format_fixed(s.uptime_seconds, 1)
      << " s, " << s.clients_connected
      << " client(s) connected, leases " << s.leases_active << " active / " << s.leases_orphaned
      << " orphaned, " << s.pages_reclaimed_total << " page(s) reclaimed\n";
  const double used_pct = s.pool_capacity_bytes == 0
                              ? 0.0
                              : 100.0 * static_cast<double>(s.pool_reserved_bytes) /
                                    static_cast<double>(s.pool_capacity_bytes);
  out << "pool: " << support::format_bytes(s.pool_reserved_bytes) << " reserved of "
      << support::format_bytes(s.pool_capacity_bytes) << " (" << format_fixed(used_pct, 1)
      << "%)\n\n";

  if (s.arenas.empty()) {
    out << "arenas: none\n";
  } else {
    Table t({"ARENA", "TENANT", "LAYOUT", "CODEC", "BACKEND", "PAGES USED/TOTAL", "PAGE",
             "ARENA BYTES", "STORED", "FP32 EQUIV", "RATIO"},
            {true, false, false, false, false, true, true, true, true, true, true});
    for (const auto& a : s.arenas) {
      t.add({std::to_string(a.arena_id), a.tenant,
             a.layout_name.empty() ? "#" + std::to_string(a.layout_id) : a.layout_name,
             kernels::to_string(a.codec), a.backend,
             std::to_string(a.pages_used) + "/" + std::to_string(a.pages_total),
             support::format_bytes(a.page_bytes), support::format_bytes(a.bytes_total),
             support::format_bytes(a.stored_bytes_used()), support::format_bytes(a.fp32_bytes_used),
             format_ratio(a.compression_ratio())});
    }
    out << "arenas:\n";
    t.print(out, "  ");
  }
  out << '\n';
  if (s.tenants.empty()) {
    out << "tenants: none\n";
    return;
  }
  Table t({"TENANT", "QUOTA", "RESERVED", "PAGES USED", "STORED", "FP32 EQUIV", "RATIO"},
          {false, true, true, true, true, true, true});
  for (const auto& tenant : s.tenants) {
    t.add({tenant.tenant,
           tenant.quota_bytes == 0 ? "unlimited" : support::format_bytes(tenant.quota_bytes),
           support::format_bytes(tenant.reserved_bytes), std::to_string(tenant.pages_used),
           support::format_bytes(tenant.stored_bytes), support::format_bytes(tenant.fp32_bytes),
           format_ratio(tenant.compression_ratio())});
  }
  out << "tenants:\n";
  t.print(out, "  ");
}

}  // namespace statepool::tools
