#include "statepool/planner/planner.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "internal.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/support/size.hpp"

namespace statepool::planner {
namespace {

using detail::fixed;
using detail::gib;
using detail::mib;
using kernels::CodecId;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}
std::uint64_t round_up(std::uint64_t a, std::uint64_t b) {
  return ceil_div(a, b) * b;
}

bool is_stepquant(CodecId id) {
  return id == CodecId::stepquant4 || id == CodecId::stepquant6;
}

// --- Input checks: one per input, the same sentence from every door ------------------
// "NAME must be RULE, got VALUE": VALUE is the number, or the text as given (quoted) when
// it is not one (and a size as written). The text door (set_plan_input) and the binary one
// (plan(), fits_now(), weight_bytes()) share them.

[[noreturn]] void bad_input(std::string_view name, const std::string& rule,
                            const std::string& got) {
  throw std::invalid_argument(std::string(name) + " must be " + rule + ", got " + got);
}
std::string quoted(std::string_view text) {
  return "'" + std::string(text.substr(0, 64)) + (text.size() > 64 ? "...'" : "'");
}
std::string between(std::uint64_t min, std::uint64_t max) {
  return "between " + std::to_string(min) + " and " + std::to_string(max);
}
std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

void check_range(std::string_view name, std::uint64_t value, std::uint64_t min, std::uint64_t max) {
  if (value < min || value > max) bad_input(name, between(min, max), std::to_string(value));
}
constexpr const char* kWeightBitsRule = "16, 8 or 4";
void check_weight_bits(std::uint64_t bits) {
  if (bits != 16 && bits != 8 && bits != 4)
    bad_input("weights-bits", kWeightBitsRule, std::to_string(bits));
}
std::string gpu_memory_rule() {
  return "between 1 B and " + support::format_bytes(kMaxGpuMemory) + " (" +
         std::to_string(kMaxGpuMemory) + " bytes)";
}
void check_gpu_memory(std::uint64_t bytes) {
  if (bytes == 0 || bytes > kMaxGpuMemory)
    bad_input("gpu-memory", gpu_memory_rule(), std::to_string(bytes) + " bytes");
}
constexpr const char* kReservedRule = "a fraction in [0, 1)";
void check_reserved(double f) {
  if (!(f >= 0.0 && f < 1.0)) bad_input("reserved", kReservedRule, number_text(f));
}
constexpr const char* kKvRule = "bf16, fp8, kivi2, kivi4 or flexgen4";

/// Every input of plan(), as set_plan_input() would check it.
void check_inputs(const PlanInputs& in) {
  check_weight_bits(in.weight_bits);
  if (KvDtype parsed{}; !parse_kv_dtype(to_string(in.kv), parsed))
    bad_input("kv", kKvRule, std::to_string(static_cast<unsigned>(in.kv)));
  detail::check_slots(in.slots);
  check_range("context", in.context, 1, kMaxContext);
  check_gpu_memory(in.gpu_memory);
  check_reserved(in.reserved);
  check_range("tp", in.tp, 1, kMaxTp);
  if (in.concurrency) check_range("concurrency", *in.concurrency, 0, kMaxConcurrency);
}

/// The per-GPU state shape: linear heads divided by tp.
kernels::StateLayout rank_layout(const ModelSpec& m, std::uint32_t tp) {
  kernels::StateLayout layout = m.state_layout();
  if (m.linear_value_heads % tp != 0 || m.linear_key_heads % tp != 0) {
    throw std::invalid_argument("tp " + std::to_string(tp) + " does not divide the linear heads (" +
                                std::to_string(m.linear_key_heads) + " key / " +
                                std::to_string(m.linear_value_heads) + " value)");
  }
  const std::uint32_t kh = m.linear_key_heads / tp;
  const std::uint32_t vh = m.linear_value_heads / tp;
  layout.num_heads = vh;
  if (layout.conv_width > 0) {  // none at conv kernel 1
    layout.conv_channels = m.arch == kernels::Arch::kda
                               ? 3 * vh * m.linear_value_dim
                               : 2 * kh * m.linear_key_dim + vh * m.linear_value_dim;
  }
  return layout;
}

}  // namespace

void detail::check_slots(std::uint64_t slots) {
  check_range("slots", slots, 1, kMaxSlots);
}

// KvDtype and kernels::KvCodecId list the same codecs in the same order (kv.hpp); the
// names are the kernels'.
static_assert(static_cast<int>(KvDtype::bf16) == static_cast<int>(kernels::KvCodecId::bf16) &&
              static_cast<int>(KvDtype::fp8) == static_cast<int>(kernels::KvCodecId::fp8) &&
              static_cast<int>(KvDtype::kivi2) == static_cast<int>(kernels::KvCodecId::kivi2) &&
              static_cast<int>(KvDtype::kivi4) == static_cast<int>(kernels::KvCodecId::kivi4) &&
              static_cast<int>(KvDtype::flexgen4) ==
                  static_cast<int>(kernels::KvCodecId::flexgen4));

const char* to_string(KvDtype kv) noexcept {
  return kernels::to_string(kv_codec(kv));
}

bool parse_kv_dtype(std::string_view text, KvDtype& out) noexcept {
  kernels::KvCodecId codec{};
  if (!kernels::parse_kv_codec(text, codec)) return false;
  out = static_cast<KvDtype>(codec);
  return true;
}

kernels::KvCodecId kv_codec(KvDtype kv) noexcept {
  return static_cast<kernels::KvCodecId>(kv);  // kv_encoded_bytes: 0 bytes outside the enum
}

std::uint64_t kv_stream_bytes(KvDtype kv, std::uint64_t channels, std::uint64_t tokens,
                              bool per_channel) noexcept {
  return kernels::kv_encoded_bytes(kv_codec(kv),
                                   per_channel ? kernels::KvRole::keys : kernels::KvRole::values,
                                   tokens, channels);
}

const std::vector<CodecId>& planner_codecs() {
  static const std::vector<CodecId> codecs = {CodecId::fp32,       CodecId::bf16,
                                              CodecId::int8,       CodecId::int6,
                                              CodecId::stepquant6, CodecId::stepquant4};
  return codecs;
}

std::uint64_t page_bytes(const kernels::StateLayout& shape, CodecId codec, std::uint32_t* pivots) {
  kernels::StateLayout layout = shape;
  layout.codec = {};
  layout.codec.id = codec;
  layout.plan = nullptr;
  if (is_stepquant(codec)) {
    auto plan = std::make_shared<kernels::stepquant::Plan>(
        kernels::stepquant::nominal_plan(layout, codec == CodecId::stepquant6 ? 6 : 4));
    if (pivots != nullptr) *pivots = plan->pivots();
    layout.plan = std::move(plan);
  }
  const kernels::PageCodec page_codec(std::move(layout));
  return page_codec.page_bytes();
}

std::uint64_t weight_bytes(std::uint64_t parameters, std::uint32_t bits) {
  switch (bits) {
    case 16: return parameters * 2;
    case 8: return parameters + 2 * ceil_div(parameters, 128);
    case 4: return ceil_div(parameters, 2) + 2 * ceil_div(parameters, 128);
    default: check_weight_bits(bits);  // throws
  }
  return 0;
}

std::uint64_t kv_request_bytes(const ModelSpec& m, KvDtype kv, std::uint64_t context,
                               std::uint32_t tp) {
  if (m.attention == AttentionKind::mla) {
    // The latent is shared by all heads: every rank holds all of it.
    const std::uint64_t channels = std::uint64_t{m.kv_lora_rank} + m.qk_rope_head_dim;
    return m.full_layers * kv_stream_bytes(kv, channels, context, true);
  }
  const std::uint64_t heads = ceil_div(m.kv_heads, tp);  // replicated when tp > kv heads
  const std::uint64_t channels = heads * m.head_dim;
  return m.full_layers * (kv_stream_bytes(kv, channels, context, true) +
                          kv_stream_bytes(kv, channels, context, false));
}

PlanReport plan(const ModelSpec& model, const PlanInputs& in) {
  // Bounded so that no product below can overflow 64 bits, whichever door the inputs
  // came through (the CLI and HTTP parse with the same checks; the protocol does not).
  check_inputs(in);
  PlanReport r;
  r.model = model;
  r.inputs = in;
  r.inputs.codecs = detail::distinct(in.codecs.empty() ? planner_codecs() : in.codecs);
  r.layout = rank_layout(model, in.tp);
  r.weights = ceil_div(weight_bytes(model.parameters, in.weight_bits), in.tp);
  r.kv_per_request = kv_request_bytes(model, in.kv, in.context, in.tp);
  if (in.kv == KvDtype::kivi2 || in.kv == KvDtype::kivi4) {
    // Steady rate: the cost of 32 more quantized tokens past the FP16 residual.
    const std::uint64_t t0 = kKiviResidualTokens;
    r.kv_per_token = static_cast<double>(kv_request_bytes(model, in.kv, t0 + kKvGroup, in.tp) -
                                         kv_request_bytes(model, in.kv, t0, in.tp)) /
                     kKvGroup;
  } else {
    r.kv_per_token = static_cast<double>(kv_request_bytes(model, in.kv, 1, in.tp));
  }
  r.usable = static_cast<std::uint64_t>(
      std::floor(static_cast<double>(in.gpu_memory) * (1.0 - in.reserved)));
  const std::uint64_t fp32 =
      in.slots * round_up(page_bytes(r.layout, CodecId::fp32, nullptr), kPageAlignment);
  const std::uint64_t bf16 =
      in.slots * round_up(page_bytes(r.layout, CodecId::bf16, nullptr), kPageAlignment);
  for (const CodecId id : r.inputs.codecs) {
    CodecRow row;
    row.codec = id;
    row.nominal_plan = is_stepquant(id);
    row.page_bytes = page_bytes(r.layout, id, &row.pivots);
    row.page_stride = round_up(row.page_bytes, kPageAlignment);
    row.state_per_request = in.slots * row.page_stride;
    const double s = static_cast<double>(row.state_per_request);
    row.ratio_vs_fp32 = static_cast<double>(fp32) / s;
    row.ratio_vs_bf16 = static_cast<double>(bf16) / s;
    row.saving_vs_fp32 = 1.0 - s / static_cast<double>(fp32);
    row.saving_vs_bf16 = 1.0 - s / static_cast<double>(bf16);
    row.per_request = row.state_per_request + r.kv_per_request;
    row.max_concurrency = r.usable > r.weights ? (r.usable - r.weights) / row.per_request : 0;
    row.crossover = r.weights / row.state_per_request + 1;
    row.crossover_fits = row.crossover <= row.max_concurrency;
    Breakdown& b = row.breakdown;
    b.concurrency = in.concurrency.value_or(row.max_concurrency);
    b.weights = r.weights;
    b.state = b.concurrency * row.state_per_request;
    b.kv = b.concurrency * r.kv_per_request;
    b.total = b.weights + b.state + b.kv;
    // total < 2^64 (model.hpp bounds: weights < 2^61, state <= 2^62, KV <= 2^63) but may
    // pass 2^63 at an explicit concurrency: a shortfall beyond int64 is clamped.
    constexpr auto kMaxShort = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    b.free = b.total <= r.usable
                 ? static_cast<std::int64_t>(r.usable - b.total)
                 : -static_cast<std::int64_t>(std::min(b.total - r.usable, kMaxShort));
    r.rows.push_back(row);
  }
  return r;
}

std::string format_text(const PlanReport& r) {
  const ModelSpec& m = r.model;
  const PlanInputs& in = r.inputs;
  std::ostringstream out;
  out << "model      " << m.model_type << " (" << to_string(m.family) << "): " << m.num_layers
      << " layers = " << m.linear_layers << ' ' << kernels::to_string(m.arch) << " + "
      << m.full_layers << " full (" << to_string(m.attention) << "), "
      << fixed(static_cast<double>(m.parameters) / 1e9, 2) << "B parameters\n";
  out << "state      per GPU: " << r.layout.num_layers << " layers x " << r.layout.num_heads
      << " heads x " << r.layout.key_dim << " x " << r.layout.value_dim << ", "
      << (r.layout.conv_width == 0 ? std::string("no conv state (conv kernel 1)")
                                   : "conv " + std::to_string(r.layout.conv_channels) + " ch x " +
                                         std::to_string(r.layout.conv_width) + " (bf16)")
      << "; " << in.slots << " slot(s) per request; model state dtype "
      << (m.state_dtype == kernels::DType::f32 ? "fp32" : "bf16")
      << (m.state_dtype_declared ? " (declared)" : " (not declared: engine default)") << '\n';
  out << "deployment " << in.weight_bits << "-bit weights, KV " << to_string(in.kv) << ", context "
      << in.context << ", tp " << in.tp << ", GPU " << gib(static_cast<double>(in.gpu_memory))
      << " GiB, reserved " << fixed(in.reserved * 100, 1) << "% -> usable "
      << gib(static_cast<double>(r.usable)) << " GiB\n";
  out << "weights    " << gib(static_cast<double>(r.weights)) << " GiB per GPU"
      << (r.weights >= r.usable ? "  (do not fit: more tp, fewer weight bits or a larger GPU)" : "")
      << '\n';
  out << "KV cache   " << fixed(r.kv_per_token, 1) << " B/token, " << mib(r.kv_per_request)
      << " MiB/request at " << in.context << " tokens\n\n";

  char line[256];
  std::snprintf(line, sizeof line, "%-11s %12s %8s %8s %13s %9s %10s %s\n", "codec",
                "state MiB/req", "vs FP32", "vs BF16", "req MiB(+KV)", "max conc", "crossover",
                (in.concurrency ? "  breakdown at " + std::to_string(*in.concurrency) +
                                      ": weights + state + KV GiB"
                                : std::string("  breakdown at max: weights + state + KV GiB"))
                    .c_str());
  out << line;
  for (const CodecRow& row : r.rows) {
    const std::string cross = std::to_string(row.crossover) + (row.crossover_fits ? "" : "*");
    const std::string breakdown = gib(static_cast<double>(row.breakdown.weights)) + " + " +
                                  gib(static_cast<double>(row.breakdown.state)) + " + " +
                                  gib(static_cast<double>(row.breakdown.kv));
    std::snprintf(
        line, sizeof line, "%-11s %12s %7sx %7sx %13s %9llu %10s   %s\n",
        (std::string(kernels::to_string(row.codec)) + (row.nominal_plan ? "+" : "")).c_str(),
        mib(row.state_per_request).c_str(), fixed(row.ratio_vs_fp32, 2).c_str(),
        fixed(row.ratio_vs_bf16, 2).c_str(), mib(row.per_request).c_str(),
        static_cast<unsigned long long>(row.max_concurrency), cross.c_str(), breakdown.c_str());
    out << line;
  }
  out << "\ncrossover: concurrency at which the state pool passes the weights; * = beyond max "
         "concurrency (weights stay larger)\n";
  bool nominal = false;
  for (const CodecRow& row : r.rows) nominal = nominal || row.nominal_plan;
  if (nominal) {
    out << "+ stepquant: nominal plan (every unit at the budget width, default pivot count as "
           "FP16 pivots); a calibrated plan's pages differ slightly\n";
  }
  out << "state sizes are exact page bytes rounded to the pool's " << kPageAlignment
      << "-byte page stride\n";
  return out.str();
}

boost::json::object to_json(const PlanReport& r) {
  namespace json = boost::json;
  const ModelSpec& m = r.model;
  const PlanInputs& in = r.inputs;
  json::object model;
  model["model_type"] = m.model_type;
  model["family"] = to_string(m.family);
  model["arch"] = kernels::to_string(m.arch);
  model["layers"] = m.num_layers;
  model["linear_layers"] = m.linear_layers;
  model["full_layers"] = m.full_layers;
  model["linear_key_heads"] = m.linear_key_heads;
  model["linear_value_heads"] = m.linear_value_heads;
  model["linear_key_dim"] = m.linear_key_dim;
  model["linear_value_dim"] = m.linear_value_dim;
  model["conv_kernel"] = m.conv_kernel;
  model["conv_channels"] = m.conv_channels;
  model["state_dtype"] = m.state_dtype == kernels::DType::f32 ? "fp32" : "bf16";
  model["state_dtype_declared"] = m.state_dtype_declared;
  model["attention"] = to_string(m.attention);
  if (m.attention == AttentionKind::gqa) {
    model["kv_heads"] = m.kv_heads;
    model["head_dim"] = m.head_dim;
  } else {
    model["kv_lora_rank"] = m.kv_lora_rank;
    model["qk_rope_head_dim"] = m.qk_rope_head_dim;
  }
  model["parameters"] = m.parameters;

  json::object inputs;
  inputs["weight_bits"] = in.weight_bits;
  inputs["kv"] = to_string(in.kv);
  inputs["slots"] = in.slots;
  inputs["context"] = in.context;
  inputs["gpu_memory"] = in.gpu_memory;
  inputs["reserved"] = in.reserved;
  inputs["tp"] = in.tp;
  if (in.concurrency) inputs["concurrency"] = *in.concurrency;

  json::array rows;
  for (const CodecRow& row : r.rows) {
    json::object o;
    o["codec"] = kernels::to_string(row.codec);
    o["nominal_plan"] = row.nominal_plan;
    if (row.nominal_plan) o["pivots"] = row.pivots;
    o["page_bytes"] = row.page_bytes;
    o["page_stride"] = row.page_stride;
    o["state_bytes_per_request"] = row.state_per_request;
    o["ratio_vs_fp32"] = row.ratio_vs_fp32;
    o["ratio_vs_bf16"] = row.ratio_vs_bf16;
    o["saving_vs_fp32"] = row.saving_vs_fp32;
    o["saving_vs_bf16"] = row.saving_vs_bf16;
    o["bytes_per_request"] = row.per_request;
    o["max_concurrency"] = row.max_concurrency;
    o["crossover"] = row.crossover;
    o["crossover_fits"] = row.crossover_fits;
    json::object b;
    b["concurrency"] = row.breakdown.concurrency;
    b["weights"] = row.breakdown.weights;
    b["state"] = row.breakdown.state;
    b["kv"] = row.breakdown.kv;
    b["total"] = row.breakdown.total;
    b["free"] = row.breakdown.free;
    o["breakdown"] = std::move(b);
    rows.push_back(std::move(o));
  }
  json::object root;
  root["model"] = std::move(model);
  root["inputs"] = std::move(inputs);
  root["page_alignment"] = kPageAlignment;
  root["weights_bytes"] = r.weights;
  root["kv_bytes_per_token"] = r.kv_per_token;
  root["kv_bytes_per_request"] = r.kv_per_request;
  root["usable_bytes"] = r.usable;
  root["codecs"] = std::move(rows);
  return root;
}

std::string format_json(const PlanReport& report) {
  return boost::json::serialize(to_json(report)) + "\n";
}

std::string format_json(const PlanReport& report, const FitsReport& fits) {
  boost::json::object root = to_json(report);
  root["fits_now"] = to_json(fits);
  return boost::json::serialize(root) + "\n";
}

namespace {

/// Decimal digits only ("-1", "2x", "" are not numbers); nullopt otherwise, or when the
/// number does not fit 64 bits.
std::optional<std::uint64_t> whole_number(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::uint64_t input_uint(std::string_view name, std::string_view text, std::uint64_t min,
                         std::uint64_t max) {
  const auto value = whole_number(text);
  if (!value) bad_input(name, between(min, max), quoted(text));
  check_range(name, *value, min, max);
  return *value;
}

/// "all", or codec names separated by commas; a codec named twice counts once.
std::vector<CodecId> parse_codec_list(std::string_view value) {
  constexpr const char* kRule =
      "all or a comma-separated list of fp32, bf16, fp16, int8, int6, int4, stepquant6, "
      "stepquant4, dsq6, dsq4";
  std::vector<CodecId> codecs;
  if (value == "all") return codecs;
  if (value.empty()) bad_input("state-codec", kRule, "''");
  std::size_t start = 0;
  while (start <= value.size()) {
    const std::size_t comma = std::min(value.find(',', start), value.size());
    const std::string_view item = value.substr(start, comma - start);
    CodecId id{};
    if (item.empty()) {
      throw std::invalid_argument("state-codec: empty codec name in " + quoted(value) + " (" +
                                  kRule + ")");
    }
    if (!kernels::parse_codec(item, id)) {
      throw std::invalid_argument("state-codec: unknown codec " + quoted(item) + " (" + kRule +
                                  ")");
    }
    codecs.push_back(id);
    start = comma + 1;
  }
  return detail::distinct(codecs);
}

}  // namespace

const std::vector<std::string_view>& plan_input_names() {
  static const std::vector<std::string_view> names = {"weights-bits", "kv",      "state-codec",
                                                      "slots",        "context", "gpu-memory",
                                                      "reserved",     "tp",      "concurrency"};
  return names;
}

bool set_plan_input(PlanInputs& in, std::string_view name, std::string_view value) {
  if (name == "weights-bits") {
    const auto bits = whole_number(value);
    if (!bits) bad_input(name, kWeightBitsRule, quoted(value));
    check_weight_bits(*bits);
    in.weight_bits = static_cast<std::uint32_t>(*bits);
  } else if (name == "kv") {
    if (!parse_kv_dtype(value, in.kv)) bad_input(name, kKvRule, quoted(value));
  } else if (name == "state-codec") {
    in.codecs = parse_codec_list(value);
  } else if (name == "slots") {
    in.slots = static_cast<std::uint32_t>(input_uint(name, value, 1, kMaxSlots));
  } else if (name == "context") {
    in.context = input_uint(name, value, 1, kMaxContext);
  } else if (name == "gpu-memory") {
    std::uint64_t bytes = 0;
    try {
      bytes = support::parse_size(value);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("gpu-memory: " + std::string(e.what()));
    }
    if (bytes == 0 || bytes > kMaxGpuMemory) bad_input(name, gpu_memory_rule(), quoted(value));
    in.gpu_memory = bytes;
  } else if (name == "reserved") {
    double f = -1;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), f);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size())
      bad_input(name, kReservedRule, quoted(value));
    check_reserved(f);
    in.reserved = f;
  } else if (name == "tp") {
    in.tp = static_cast<std::uint32_t>(input_uint(name, value, 1, kMaxTp));
  } else if (name == "concurrency") {
    in.concurrency = input_uint(name, value, 0, kMaxConcurrency);
  } else {
    return false;
  }
  return true;
}

}  // namespace statepool::planner
