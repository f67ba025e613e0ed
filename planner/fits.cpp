#include "statepool/planner/fits.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "internal.hpp"
#include "statepool/planner/planner.hpp"

namespace statepool::planner {

const char* to_string(FitLimit limit) noexcept {
  switch (limit) {
    case FitLimit::arena: return "arena";
    case FitLimit::pool: return "pool";
    case FitLimit::quota: return "quota";
    case FitLimit::max_arena_pages: return "max_arena_pages";
  }
  return "?";
}

FitsReport fits_now(const kernels::StateLayout& shape, const LivePool& live, std::uint32_t slots,
                    const std::vector<kernels::CodecId>& codecs) {
  detail::check_slots(slots);
  FitsReport report;
  report.shape = shape;
  report.shape.codec = {};
  report.shape.plan = nullptr;
  report.slots = slots;
  report.live = live;
  for (const kernels::CodecId codec :
       detail::distinct(codecs.empty() ? planner_codecs() : codecs)) {
    FitRow row;
    row.codec = codec;
    bool has_arena = false;
    for (const LiveArena& arena : live.arenas) {
      if (arena.codec != codec) continue;
      has_arena = true;
      row.arena_pages += arena.free_pages;
      row.page_stride = std::max(row.page_stride, arena.page_stride);
    }
    if (has_arena) {
      row.limit = FitLimit::arena;
    } else {
      row.nominal_plan =
          codec == kernels::CodecId::stepquant4 || codec == kernels::CodecId::stepquant6;
      const std::uint64_t stride = page_bytes(shape, codec);
      row.page_stride = (stride + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
      std::uint64_t room = live.free;
      row.limit = FitLimit::pool;
      if (live.quota_free && *live.quota_free < room) {
        room = *live.quota_free;
        row.limit = FitLimit::quota;
      }
      row.new_pages = room / row.page_stride;
      if (row.new_pages > live.max_arena_pages) {
        row.new_pages = live.max_arena_pages;
        row.limit = FitLimit::max_arena_pages;
      }
    }
    row.requests = (row.arena_pages + row.new_pages) / slots;
    report.rows.push_back(row);
  }
  return report;
}

boost::json::object to_json(const FitsReport& r) {
  namespace json = boost::json;
  json::object shape;
  shape["arch"] = kernels::to_string(r.shape.arch);
  shape["layers"] = r.shape.num_layers;
  shape["heads"] = r.shape.num_heads;
  shape["key_dim"] = r.shape.key_dim;
  shape["value_dim"] = r.shape.value_dim;
  shape["conv_channels"] = r.shape.conv_channels;
  shape["conv_width"] = r.shape.conv_width;

  json::object pool;
  pool["tenant"] = r.live.tenant.empty() ? json::value(nullptr) : json::value(r.live.tenant);
  pool["capacity_bytes"] = r.live.capacity;
  pool["free_bytes"] = r.live.free;
  pool["quota_free_bytes"] =
      r.live.quota_free ? json::value(*r.live.quota_free) : json::value(nullptr);
  pool["max_arena_pages"] = r.live.max_arena_pages;

  json::array rows;
  for (const FitRow& row : r.rows) {
    json::object o;
    o["codec"] = kernels::to_string(row.codec);
    o["nominal_plan"] = row.nominal_plan;
    o["page_stride"] = row.page_stride;
    o["arena_free_pages"] = row.arena_pages;
    o["new_arena_pages"] = row.new_pages;
    o["requests"] = row.requests;
    o["limited_by"] = to_string(row.limit);
    rows.push_back(std::move(o));
  }
  json::object root;
  root["shape"] = std::move(shape);
  root["slots"] = r.slots;
  root["pool"] = std::move(pool);
  root["codecs"] = std::move(rows);
  return root;
}

std::string format_json(const FitsReport& report) {
  return boost::json::serialize(to_json(report)) + "\n";
}

std::string format_text(const FitsReport& r) {
  using detail::mib;
  std::ostringstream out;
  out << "tenant     "
      << (r.live.tenant.empty() ? std::string("(pool-wide: a new tenant, no quota)")
                                : "'" + r.live.tenant + "'")
      << "\npool       " << mib(r.live.free) << " MiB free of " << mib(r.live.capacity) << " MiB";
  if (r.live.quota_free) out << "; quota left " << mib(*r.live.quota_free) << " MiB";
  out << "\nstate      " << kernels::to_string(r.shape.arch) << ' ' << r.shape.num_layers
      << " layers x " << r.shape.num_heads << " heads x " << r.shape.key_dim << " x "
      << r.shape.value_dim << ", " << r.slots << " slot(s) per request\n\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-11s %12s %12s %12s %10s  %s\n", "codec", "page MiB",
                "arena free", "new arena", "requests", "limited by");
  out << line;
  for (const FitRow& row : r.rows) {
    std::snprintf(
        line, sizeof line, "%-11s %12s %12llu %12llu %10llu  %s\n",
        (std::string(kernels::to_string(row.codec)) + (row.nominal_plan ? "+" : "")).c_str(),
        detail::fixed(static_cast<double>(row.page_stride) / (1 << 20), 2).c_str(),
        static_cast<unsigned long long>(row.arena_pages),
        static_cast<unsigned long long>(row.new_pages),
        static_cast<unsigned long long>(row.requests), to_string(row.limit));
    out << line;
  }
  out << "\narena free: free pages in the tenant's arena of that codec (arenas are sized when "
         "created); new arena: pages a new arena could take now\n";
  bool nominal = false;
  for (const FitRow& row : r.rows) nominal = nominal || row.nominal_plan;
  if (nominal)
    out << "+ stepquant: nominal plan bytes; a calibrated plan's pages differ slightly\n";
  return out.str();
}

}  // namespace statepool::planner
