// STEPQuant calibration plans: accessors, validation, sizes, digest and the plan file
// (kernels/stepquant/plan.fbs, docs/plans.md).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "fnv1a.hpp"
#include "plan_generated.h"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/support/errno_text.hpp"
#include "statepool/support/unique_fd.hpp"
#include "validate_util.hpp"

namespace statepool::kernels::stepquant {
namespace {

using detail::range_problem;

constexpr std::array<std::uint8_t, 3> kWidths6 = {4, 6, 8};
constexpr std::array<std::uint8_t, 4> kWidths4 = {2, 4, 6, 8};

constexpr std::uint32_t kMaxDepth = 8;    // one table with vectors and a string
constexpr std::uint32_t kMaxTables = 16;  // one table (room for appended sub-tables)

bool known(Arch arch) {
  return arch == Arch::gdn || arch == Arch::kda;
}

std::uint64_t units_of(Arch arch, std::uint64_t layers, std::uint64_t heads,
                       std::uint64_t key_dim) {
  return arch == Arch::kda ? layers * heads * key_dim : layers * heads;
}

std::string float_text(float value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  // Shortest text that names the value well enough for a human ("-0.5", "1e-40").
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(value));
  return buf;
}

// "4, 6, 8 or 16 (pivot)"
std::string allowed_widths(std::uint32_t budget) {
  std::string out;
  for (const std::uint8_t w : candidate_widths(budget)) {
    out += (out.empty() ? "" : ", ") + std::to_string(w);
  }
  return out + " or 16 (pivot)";
}

// --- file I/O ----------------------------------------------------------------------

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " " + path + ": " + support::errno_text(err));
}

}  // namespace

std::uint32_t default_pivot_count(Arch arch, std::size_t units) noexcept {
  const double share = arch == Arch::gdn ? kGdnPivotShare : kKdaPivotShare;
  const double count = std::round(share * static_cast<double>(units));
  return static_cast<std::uint32_t>(std::clamp(count, 0.0, static_cast<double>(units)));
}

Plan nominal_plan(const StateLayout& layout, std::uint32_t budget_bits) {
  if (budget_bits != 4 && budget_bits != 6) {
    throw std::invalid_argument("a STEPQuant budget is 4 or 6 bits, got " +
                                std::to_string(budget_bits));
  }
  Plan plan;
  plan.arch = layout.arch;
  plan.num_layers = layout.num_layers;
  plan.num_heads = layout.num_heads;
  plan.key_dim = layout.key_dim;
  plan.value_dim = layout.value_dim;
  plan.budget_bits = budget_bits;
  const std::size_t units = plan.units();
  const std::uint32_t pivots = default_pivot_count(layout.arch, units);
  plan.widths.assign(units, static_cast<std::uint8_t>(budget_bits));
  std::fill_n(plan.widths.begin(), std::min<std::size_t>(pivots, units), kPivotWidth);
  plan.impact.assign(std::size_t{plan.num_layers} * plan.num_heads * plan.key_dim, 1.0f);
  plan.source = "statepool nominal plan";
  return plan;
}

std::span<const std::uint8_t> candidate_widths(std::uint32_t budget_bits) noexcept {
  switch (budget_bits) {
    case 6: return kWidths6;
    case 4: return kWidths4;
    default: return {};
  }
}

std::size_t Plan::units() const noexcept {
  return known(arch) ? static_cast<std::size_t>(units_of(arch, num_layers, num_heads, key_dim)) : 0;
}

std::uint32_t Plan::pivots() const noexcept {
  return static_cast<std::uint32_t>(std::count(widths.begin(), widths.end(), kPivotWidth));
}

std::uint8_t Plan::width(std::uint32_t layer, std::uint32_t head,
                         std::uint32_t row) const noexcept {
  const std::size_t h = std::size_t{layer} * num_heads + head;
  const std::size_t index = arch == Arch::kda ? h * key_dim + row : h;
  assert(index < widths.size());
  return widths[index];
}

std::span<const float> Plan::head_impact(std::uint32_t layer, std::uint32_t head) const noexcept {
  const std::size_t h = std::size_t{layer} * num_heads + head;
  assert((h + 1) * key_dim <= impact.size());
  return std::span<const float>(impact).subspan(h * key_dim, key_dim);
}

double Plan::average_width() const noexcept {
  if (widths.empty()) {
    return 0.0;
  }
  double sum = 0.0;
  for (const std::uint8_t w : widths) {
    sum += w;
  }
  return sum / static_cast<double>(widths.size());
}

bool same_codec_fields(const Plan& a, const Plan& b) noexcept {
  if (a.arch != b.arch || a.num_layers != b.num_layers || a.num_heads != b.num_heads ||
      a.key_dim != b.key_dim || a.value_dim != b.value_dim || a.budget_bits != b.budget_bits ||
      a.widths != b.widths || a.impact.size() != b.impact.size()) {
    return false;
  }
  return std::equal(a.impact.begin(), a.impact.end(), b.impact.begin(),
                    [](float x, float y) { return float_bits(x) == float_bits(y); });
}

std::string page_format_note(const Plan& plan) {
  if (plan.page_format >= kPageFormat ||
      std::find(plan.widths.begin(), plan.widths.end(), std::uint8_t{2}) == plan.widths.end()) {
    return {};
  }
  return "calibrated with STEPQuant page format " + std::to_string(plan.page_format) +
         " (ternary 2-bit units); its pages are written in format " + std::to_string(kPageFormat) +
         ". It works as it is; calibrating again (statepool-quant calibrate) sizes its 2-bit "
         "units by the current format's errors";
}

std::string validate(const Plan& plan) {
  if (!known(plan.arch)) {
    return "arch must be gdn or kda, got " + std::to_string(static_cast<unsigned>(plan.arch));
  }
  for (const auto& problem : {
           range_problem("num_layers", plan.num_layers, 1, kMaxLayers),
           range_problem("num_heads", plan.num_heads, 1, kMaxHeads),
           range_problem("key_dim", plan.key_dim, 1, kMaxHeadDim),
           range_problem("value_dim", plan.value_dim, 1, kMaxHeadDim),
       }) {
    if (!problem.empty()) {
      return problem;
    }
  }
  if (plan.budget_bits != 4 && plan.budget_bits != 6) {
    return "budget_bits must be 4 or 6, got " + std::to_string(plan.budget_bits);
  }
  if (plan.page_format < 1 || plan.page_format > kPageFormat) {
    return "calibrated for STEPQuant page format " + std::to_string(plan.page_format) +
           ", this build knows formats 1 to " + std::to_string(kPageFormat) +
           " (use a build of that format or newer, or calibrate again with this one)";
  }
  const std::size_t units = plan.units();
  const char* unit_name = plan.arch == Arch::kda ? "key rows" : "heads";
  if (plan.widths.size() != units) {
    return "widths has " + std::to_string(plan.widths.size()) + " entries, expected " +
           std::to_string(units) + " (one per unit: " + unit_name + ")";
  }
  const auto allowed = candidate_widths(plan.budget_bits);
  for (std::size_t i = 0; i < units; ++i) {
    const std::uint8_t w = plan.widths[i];
    if (w != kPivotWidth && std::find(allowed.begin(), allowed.end(), w) == allowed.end()) {
      return "widths[" + std::to_string(i) + "] is " + std::to_string(w) + "; budget " +
             std::to_string(plan.budget_bits) + " allows " + allowed_widths(plan.budget_bits);
    }
  }
  const std::size_t rows = std::size_t{plan.num_layers} * plan.num_heads * plan.key_dim;
  if (plan.impact.size() != rows) {
    return "impact has " + std::to_string(plan.impact.size()) + " entries, expected " +
           std::to_string(rows) + " (one per key row)";
  }
  for (std::size_t i = 0; i < rows; ++i) {
    const float w = plan.impact[i];
    if (!(std::isfinite(w) && w > 0.0f)) {
      return "impact[" + std::to_string(i) + "] is " + float_text(w) +
             "; impact factors must be finite and > 0";
    }
  }
  if (!plan.mean_log_decay.empty()) {
    if (plan.mean_log_decay.size() != units) {
      return "mean_log_decay has " + std::to_string(plan.mean_log_decay.size()) +
             " entries, expected 0 or " + std::to_string(units) + " (one per unit)";
    }
    for (std::size_t i = 0; i < units; ++i) {
      if (!std::isfinite(plan.mean_log_decay[i])) {
        return "mean_log_decay[" + std::to_string(i) + "] is " +
               float_text(plan.mean_log_decay[i]) + "; it must be finite";
      }
    }
  }
  if (!std::isfinite(plan.gamma)) {
    return "gamma is " + float_text(plan.gamma) + "; it must be finite";
  }
  return {};
}

std::string check_matches(const Plan& plan, const StateLayout& layout) {
  const char* codec = to_string(layout.codec.id);
  std::uint32_t budget = 0;
  if (layout.codec.id == CodecId::stepquant6) {
    budget = 6;
  } else if (layout.codec.id == CodecId::stepquant4) {
    budget = 4;
  } else {
    return std::string("codec ") + codec + " does not use a calibration plan";
  }
  if (plan.arch != layout.arch) {
    return std::string("plan is for arch ") + to_string(plan.arch) + ", layout is " +
           to_string(layout.arch);
  }
  const std::pair<const char*, std::pair<std::uint32_t, std::uint32_t>> dims[] = {
      {"num_layers", {plan.num_layers, layout.num_layers}},
      {"num_heads", {plan.num_heads, layout.num_heads}},
      {"key_dim", {plan.key_dim, layout.key_dim}},
      {"value_dim", {plan.value_dim, layout.value_dim}},
  };
  for (const auto& [name, values] : dims) {
    if (values.first != values.second) {
      return std::string("plan ") + name + " is " + std::to_string(values.first) + ", layout " +
             name + " is " + std::to_string(values.second);
    }
  }
  if (plan.budget_bits != budget) {
    return "plan budget is " + std::to_string(plan.budget_bits) + " bits, codec " + codec +
           " needs a " + std::to_string(budget) + "-bit plan";
  }
  return {};
}

std::uint8_t stored_width(const Plan& plan, StepQuantVariant variant, std::uint32_t layer,
                          std::uint32_t head, std::uint32_t row) noexcept {
  const std::uint8_t w = plan.width(layer, head, row);
  if (variant == StepQuantVariant::spatial_only && w != kPivotWidth) {
    return static_cast<std::uint8_t>(plan.budget_bits);
  }
  return w;
}

std::size_t head_bytes(const Plan& plan, StepQuantVariant variant, std::uint32_t layer,
                       std::uint32_t head) noexcept {
  const bool absmax = variant == StepQuantVariant::temporal_only;
  if (plan.arch == Arch::gdn) {
    const std::uint8_t w = stored_width(plan, variant, layer, head, 0);
    return absmax ? gdn_absmax_head_bytes(plan.key_dim, plan.value_dim, w)
                  : gdn_head_bytes(plan.key_dim, plan.value_dim, w);
  }
  std::size_t bytes =
      2u * std::size_t{plan.key_dim} + (absmax ? std::size_t{0} : 2u * std::size_t{plan.value_dim});
  for (std::uint32_t row = 0; row < plan.key_dim; ++row) {
    bytes += row_bytes(plan.value_dim, stored_width(plan, variant, layer, head, row));
  }
  return round_up4(bytes);
}

std::uint64_t digest_value(const Plan& plan) noexcept {
  // Canonical encoding: a tag, the shape and budget as u8/u32 little-endian, then each
  // vector as a u64 count followed by its elements (widths as bytes, impact as binary32
  // bits). Provenance is left out: it does not change a single page byte.
  Fnv1a h;
  constexpr std::string_view kTag = "statepool.stepquant.plan/1";
  h.bytes(kTag.data(), kTag.size());
  h.u8(static_cast<std::uint8_t>(plan.arch));
  h.u32(plan.num_layers);
  h.u32(plan.num_heads);
  h.u32(plan.key_dim);
  h.u32(plan.value_dim);
  h.u32(plan.budget_bits);
  h.u64(plan.widths.size());
  h.bytes(plan.widths.data(), plan.widths.size());
  h.u64(plan.impact.size());
  for (const float w : plan.impact) {
    h.u32(float_bits(w));
  }
  return h.value();
}

std::string digest(const Plan& plan) {
  return hex64(digest_value(plan));
}

std::vector<std::byte> to_bytes(const Plan& plan) {
  if (const std::string problem = validate(plan); !problem.empty()) {
    throw std::invalid_argument("cannot serialize an invalid plan: " + problem);
  }
  flatbuffers::FlatBufferBuilder fbb(1024 + plan.widths.size() + 4 * plan.impact.size() +
                                     4 * plan.mean_log_decay.size() + plan.source.size());
  const auto widths = fbb.CreateVector(plan.widths);
  const auto impact = fbb.CreateVector(plan.impact);
  const auto decay = fbb.CreateVector(plan.mean_log_decay);
  const auto source = fbb.CreateString(plan.source);
  file::PlanBuilder b(fbb);
  b.add_format_version(Plan::kFormatVersion);
  b.add_arch(static_cast<file::Arch>(plan.arch));
  b.add_num_layers(plan.num_layers);
  b.add_num_heads(plan.num_heads);
  b.add_key_dim(plan.key_dim);
  b.add_value_dim(plan.value_dim);
  b.add_budget_bits(plan.budget_bits);
  b.add_widths(widths);
  b.add_impact(impact);
  b.add_mean_log_decay(decay);
  b.add_gamma(plan.gamma);
  b.add_horizon(plan.horizon);
  b.add_tokens(plan.tokens);
  b.add_source(source);
  b.add_page_format(plan.page_format);
  file::FinishPlanBuffer(fbb, b.Finish());
  const auto* data = reinterpret_cast<const std::byte*>(fbb.GetBufferPointer());
  return {data, data + fbb.GetSize()};
}

Plan from_bytes(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) {
    throw std::invalid_argument("not a STEPQuant plan: " + std::to_string(bytes.size()) +
                                " bytes is too short for a plan file");
  }
  if (bytes.size() > kMaxPlanBytes) {
    throw std::invalid_argument("plan file of " + std::to_string(bytes.size()) +
                                " bytes exceeds the limit of " + std::to_string(kMaxPlanBytes));
  }
  // The identifier sits at bytes 4..7 (after the root offset).
  if (!flatbuffers::BufferHasIdentifier(bytes.data(), file::PlanIdentifier())) {
    std::string id;
    for (std::size_t i = 4; i < 8; ++i) {
      const auto c = std::to_integer<unsigned char>(bytes[i]);
      if (c >= 0x20 && c < 0x7F && c != '\\') {
        id += static_cast<char>(c);
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        id += buf;
      }
    }
    throw std::invalid_argument("not a STEPQuant plan: file identifier '" + id +
                                "', expected 'SPQP'");
  }
  // FlatBuffers builders pad a finished buffer to its alignment (a multiple of 4): any
  // other size is a truncated file, even one cut only inside the trailing padding.
  if (bytes.size() % 4 != 0) {
    throw std::invalid_argument("corrupt STEPQuant plan: " + std::to_string(bytes.size()) +
                                " bytes is not a multiple of 4 (truncated?)");
  }
  // FlatBuffers reads scalars in place: give it an 8-byte aligned copy.
  std::vector<std::uint64_t> storage((bytes.size() + 7) / 8);
  std::memcpy(storage.data(), bytes.data(), bytes.size());
  const auto* buf = reinterpret_cast<const std::uint8_t*>(storage.data());
  flatbuffers::Verifier::Options options;
  options.max_depth = kMaxDepth;
  options.max_tables = kMaxTables;
  options.check_alignment = true;
  flatbuffers::Verifier verifier(buf, bytes.size(), options);
  if (!file::VerifyPlanBuffer(verifier)) {
    throw std::invalid_argument("corrupt STEPQuant plan: FlatBuffer verification failed");
  }
  const file::Plan* in = file::GetPlan(buf);
  if (in->format_version() != Plan::kFormatVersion) {
    throw std::invalid_argument("unsupported plan format version " +
                                std::to_string(in->format_version()) + " (this build reads " +
                                std::to_string(Plan::kFormatVersion) + ")");
  }
  Plan plan;
  plan.arch = static_cast<Arch>(in->arch());
  plan.num_layers = in->num_layers();
  plan.num_heads = in->num_heads();
  plan.key_dim = in->key_dim();
  plan.value_dim = in->value_dim();
  plan.budget_bits = in->budget_bits();
  if (const auto* v = in->widths()) {
    plan.widths.assign(v->begin(), v->end());
  }
  if (const auto* v = in->impact()) {
    plan.impact.assign(v->begin(), v->end());
  }
  if (const auto* v = in->mean_log_decay()) {
    plan.mean_log_decay.assign(v->begin(), v->end());
  }
  plan.gamma = in->gamma();
  plan.horizon = in->horizon();
  plan.tokens = in->tokens();
  if (const auto* s = in->source()) {
    plan.source = s->str();
  }
  plan.page_format = in->page_format() == 0 ? 1u : in->page_format();
  if (const std::string problem = validate(plan); !problem.empty()) {
    throw std::invalid_argument("invalid STEPQuant plan: " + problem);
  }
  return plan;
}

Plan load(const std::string& path) {
  const support::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    io_error("cannot open plan file", path, errno);
  }
  std::vector<std::byte> bytes;
  std::byte chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      io_error("cannot read plan file", path, errno);
    }
    if (n == 0) {
      break;
    }
    if (bytes.size() + static_cast<std::size_t>(n) > kMaxPlanBytes) {
      throw std::invalid_argument("plan file " + path + " is larger than the limit of " +
                                  std::to_string(kMaxPlanBytes) + " bytes");
    }
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  try {
    return from_bytes(bytes);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("plan file " + path + ": " + e.what());
  }
}

void save(const Plan& plan, const std::string& path) {
  std::vector<std::byte> bytes;
  try {
    bytes = to_bytes(plan);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("plan file " + path + ": " + e.what());
  }
  try {
    support::write_file_atomic(path, bytes);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("plan file ") + e.what());
  }
}

}  // namespace statepool::kernels::stepquant
