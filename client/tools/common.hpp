#pragma once
// Shared by the client tools: argument helpers, a text table, byte formatting, and the
// human and JSON renderings of a Stats reply. Header-only, tools only (not installed).

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/client.hpp"

namespace statepool::tools {

/// Thrown for a bad command line: the tool prints it with its usage and exits 2.
struct UsageError {
  std::string message;
};

/// The command-line prologue every tool shares: `args = parse(argc, argv)`; a UsageError
/// is printed with the usage text (exit status 2), --help prints the usage (exit 0).
/// Returns the exit status to leave with now, or nullopt to go on.
template <class Args, class Parse>
std::optional<int> parse_command_line(const char* tool, const char* usage, int argc, char** argv,
                                      Parse parse, Args& args) {
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << tool << ": " << e.message << "\n\n" << usage;
    return 2;
  }
  if (args.help) {
    std::cout << usage;
    return 0;
  }
  return std::nullopt;
}

/// The value of an option that takes one ("--socket PATH" or "--socket=PATH").
/// Returns true and advances `i` when argv[i] is `name`.
inline bool take_value(int argc, char** argv, int& i, std::string_view name, std::string& out) {
  const std::string_view arg = argv[i];
  if (arg == name) {
    if (i + 1 >= argc) throw UsageError{std::string(name) + " needs a value"};
    out = argv[++i];
    return true;
  }
  if (arg.size() > name.size() + 1 && arg.substr(0, name.size()) == name &&
      arg[name.size()] == '=') {
    out = std::string(arg.substr(name.size() + 1));
    return true;
  }
  return false;
}

/// Parses an unsigned integer option value within [min, max].
inline std::uint64_t parse_uint(std::string_view name, const std::string& text, std::uint64_t min,
                                std::uint64_t max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError{std::string(name) + " expects a number, got '" + text + "'"};
  }
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0 || value < min || value > max) {
    throw UsageError{std::string(name) + " must be between " + std::to_string(min) + " and " +
                     std::to_string(max) + ", got " + text};
  }
  return value;
}

/// The socket path: --socket, else $STATEPOOL_SOCKET, else the default.
inline std::string default_socket() {
  const char* env = std::getenv("STATEPOOL_SOCKET");
  return (env != nullptr && *env != '\0') ? std::string(env)
                                          : std::string(client::kDefaultSocketPath);
}

/// "1.5 GiB", "512 B".
inline std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%.0f %s", bytes, units[unit]);
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", bytes, units[unit]);
  }
  return text;
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
  out << "uptime " << format_fixed(s.uptime_seconds, 1) << " s, " << s.clients_connected
      << " client(s) connected, leases " << s.leases_active << " active / " << s.leases_orphaned
      << " orphaned, " << s.pages_reclaimed_total << " page(s) reclaimed\n";
  const double used_pct = s.pool_capacity_bytes == 0
                              ? 0.0
                              : 100.0 * static_cast<double>(s.pool_reserved_bytes) /
                                    static_cast<double>(s.pool_capacity_bytes);
  out << "pool: " << format_bytes(static_cast<double>(s.pool_reserved_bytes)) << " reserved of "
      << format_bytes(static_cast<double>(s.pool_capacity_bytes)) << " ("
      << format_fixed(used_pct, 1) << "%)\n\n";

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
             format_bytes(static_cast<double>(a.page_bytes)),
             format_bytes(static_cast<double>(a.bytes_total)),
             format_bytes(static_cast<double>(a.stored_bytes_used())),
             format_bytes(static_cast<double>(a.fp32_bytes_used)),
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
           tenant.quota_bytes == 0 ? "unlimited"
                                   : format_bytes(static_cast<double>(tenant.quota_bytes)),
           format_bytes(static_cast<double>(tenant.reserved_bytes)),
           std::to_string(tenant.pages_used),
           format_bytes(static_cast<double>(tenant.stored_bytes)),
           format_bytes(static_cast<double>(tenant.fp32_bytes)),
           format_ratio(tenant.compression_ratio())});
  }
  out << "tenants:\n";
  t.print(out, "  ");
}

/// JSON string literal with the escapes RFC 8259 requires.
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
          out += esc;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

/// A finite double as JSON (non-finite values become null).
inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[64];
  const auto result = std::to_chars(text, text + sizeof text, value);  // shortest round trip
  return std::string(text, result.ptr);
}

/// A compression ratio as JSON: null when nothing is stored (the ratio is undefined).
inline std::string json_ratio(double ratio) {
  return ratio > 0.0 ? json_number(ratio) : "null";
}

/// Machine-readable stats: every field of the reply, names as in the wire schema, plus
/// the derived stored bytes and ratios.
inline void print_stats_json(std::ostream& out, const client::Stats& s) {
  out << "{\n  \"uptime_seconds\": " << json_number(s.uptime_seconds)
      << ",\n  \"clients_connected\": " << s.clients_connected
      << ",\n  \"leases_active\": " << s.leases_active
      << ",\n  \"leases_orphaned\": " << s.leases_orphaned
      << ",\n  \"pages_reclaimed_total\": " << s.pages_reclaimed_total
      << ",\n  \"pool_capacity_bytes\": " << s.pool_capacity_bytes
      << ",\n  \"pool_reserved_bytes\": " << s.pool_reserved_bytes << ",\n  \"arenas\": [";
  for (std::size_t i = 0; i < s.arenas.size(); ++i) {
    const auto& a = s.arenas[i];
    out << (i == 0 ? "\n" : ",\n") << "    {\"arena_id\": " << a.arena_id
        << ", \"tenant\": " << json_string(a.tenant) << ", \"layout_id\": " << a.layout_id
        << ", \"layout_name\": " << json_string(a.layout_name)
        << ", \"codec\": " << json_string(kernels::to_string(a.codec))
        << ", \"backend\": " << json_string(a.backend) << ", \"page_bytes\": " << a.page_bytes
        << ", \"page_stride\": " << a.page_stride << ", \"pages_total\": " << a.pages_total
        << ", \"pages_used\": " << a.pages_used << ", \"bytes_total\": " << a.bytes_total
        << ", \"stored_bytes_used\": " << a.stored_bytes_used()
        << ", \"fp32_bytes_used\": " << a.fp32_bytes_used
        << ", \"compression_ratio\": " << json_ratio(a.compression_ratio()) << "}";
  }
  out << (s.arenas.empty() ? "]" : "\n  ]") << ",\n  \"tenants\": [";
  for (std::size_t i = 0; i < s.tenants.size(); ++i) {
    const auto& t = s.tenants[i];
    out << (i == 0 ? "\n" : ",\n") << "    {\"tenant\": " << json_string(t.tenant)
        << ", \"quota_bytes\": " << t.quota_bytes << ", \"reserved_bytes\": " << t.reserved_bytes
        << ", \"pages_used\": " << t.pages_used << ", \"stored_bytes\": " << t.stored_bytes
        << ", \"fp32_bytes\": " << t.fp32_bytes
        << ", \"compression_ratio\": " << json_ratio(t.compression_ratio()) << "}";
  }
  out << (s.tenants.empty() ? "]" : "\n  ]") << "\n}\n";
}

}  // namespace statepool::tools
