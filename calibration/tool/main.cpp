// statepool-quant: STEPQuant calibration and codec tool (docs/calibration.md).
//
// Exit status: 0 success, 1 bad input or failure (a message on stderr, nothing written),
// 2 bad command line.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/calibration/calibrate.hpp"
#include "statepool/calibration/files.hpp"
#include "statepool/calibration/npy.hpp"
#include "statepool/calibration/page_file.hpp"
#include "statepool/calibration/statistics.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/testing/synthetic_trace.hpp"

namespace cal = statepool::calibration;
namespace kn = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
namespace support = statepool::support;

namespace {

constexpr const char* kUsage = R"(statepool-quant: STEPQuant calibration and state codecs

usage: statepool-quant <command> [options]      (statepool-quant help <command>)

commands:
  calibrate     read a calibration trace, run the FP32 recurrence, measure per-unit
                statistics and reconstruction errors, allocate bit widths and pivots,
                save the plan (the file the daemon's stepquant4/6 layouts load)
  synth-trace   write a SYNTHETIC trace (seeded random inputs with long- and
                short-lived heads) to try calibration without a model
  codec         encode / decode / roundtrip a state .npy through any codec

docs/calibration.md describes the trace format, the statistics and the report.
)";

constexpr const char* kCalibrateUsage =
    R"(usage: statepool-quant calibrate --trace DIR --out PLAN [options]

  --trace DIR      trace directory (manifest.txt + layer{L}.{q,k,v,g,beta}.npy)
  --out PLAN       plan file to write (replaced atomically)
  --budget B       nominal bits per value: 6 (widths 4/6/8) or 4 (widths 2/4/6/8); default 6
  --pivots N       units stored as fp16; default: round(1/72 of the heads) for GDN,
                   round(0.625% of the key rows) for KDA
  --gamma G        impact exponent (0 = no spatial axis); default 0.25
  --horizon T      lifetime horizon in tokens; default 2048
  --report FILE    also write the report to FILE
  --threads N      worker threads (heads in parallel); default 1
  --seed S         seed of the snapshot reservoirs; default 24301
  --snapshot-every N, --reservoir N
                   snapshot sampling: every N-th state of a head, at most N per head;
                   defaults 8 and 64
Progress goes to stderr, the report to stdout.
)";

constexpr const char* kSynthUsage =
    R"(usage: statepool-quant synth-trace --out DIR --arch gdn|kda --layers N --heads H
                                   --key-dim K --value-dim V --tokens T [options]

Writes a SYNTHETIC calibration trace: random inputs from a fixed seeded "model" whose
heads (GDN) or key rows (KDA) decay at rates spread from -5e-4 (long-lived) to -0.7
(short-lived) per token. Not a model: plans calibrated on it fit the synthetic heads only.

  --seed S              token seed (default 1)
  --model-seed S        seed of the per-head parameters (default 7)
  --sequence-length N   tokens per sequence (state reset); default: one sequence
)";

constexpr const char* kCodecUsage =
    R"(usage: statepool-quant codec encode|decode|roundtrip --codec NAME --in FILE --out FILE [options]

  encode      --in state.npy (float32 [heads,K,V] or [layers,heads,K,V]) --out page file
              (64-byte header + the packed page; docs/calibration.md)
  decode      --in page file --out state.npy (the header gives codec and shape;
              --codec may be omitted, and must match when given)
  roundtrip   --in state.npy --out reconstruction.npy; prints the relative error per head,
              the page bytes, bits per value and the ratio against FP32 and BF16

  --codec NAME     fp32 bf16 fp16 int4 int6 int8 dsq4 dsq6 stepquant4 stepquant6
  --plan PLAN      calibration plan (required by stepquant4/6)
  --arch gdn|kda   state family when no plan says it; default gdn
  --group-size G   int codecs: values per fp16 scale; default 128
  --variant V      stepquant: full, spatial (spatial axis only), temporal (temporal only)
)";

// A command-line error: usage text and exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Flags {
  std::map<std::string, std::string> values;
  std::vector<std::string> positional;

  [[nodiscard]] bool has(const std::string& name) const { return values.count(name) != 0; }
  [[nodiscard]] std::string get(const std::string& name, const std::string& fallback = {}) const {
    const auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  [[nodiscard]] std::string required(const std::string& name) const {
    if (!has(name)) {
      throw UsageError("missing --" + name);
    }
    return values.at(name);
  }
};

// --name value or --name=value; every flag takes a value.
Flags parse_flags(const std::vector<std::string>& args, const std::set<std::string>& allowed) {
  Flags flags;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      flags.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      if (allowed.count(name) == 0) {
        throw UsageError("unknown option --" + name);
      }
      if (i + 1 >= args.size()) {
        throw UsageError("--" + name + " needs a value");
      }
      value = args[++i];
    }
    if (allowed.count(name) == 0) {
      throw UsageError("unknown option --" + name);
    }
    if (flags.values.count(name) != 0) {
      throw UsageError("--" + name + " given twice");
    }
    flags.values[name] = value;
  }
  return flags;
}

std::uint64_t parse_uint(const std::string& name, const std::string& text, std::uint64_t max) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end || value > max) {
    throw UsageError("--" + name + " must be an integer between 0 and " + std::to_string(max) +
                     ", got '" + text + "'");
  }
  return value;
}

std::uint32_t parse_u32(const std::string& name, const std::string& text) {
  return static_cast<std::uint32_t>(parse_uint(name, text, 0xFFFFFFFFull));
}

double parse_double(const std::string& name, const std::string& text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end || !std::isfinite(value)) {
    throw UsageError("--" + name + " must be a number, got '" + text + "'");
  }
  return value;
}

kn::Arch parse_arch(const std::string& text) {
  if (text == "gdn") return kn::Arch::gdn;
  if (text == "kda") return kn::Arch::kda;
  throw UsageError("--arch must be gdn or kda, got '" + text + "'");
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string sci(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3e", value);
  return buf;
}

// --- calibrate --------------------------------------------------------------------------

int run_calibrate(const std::vector<std::string>& args) {
  const Flags flags =
      parse_flags(args, {"trace", "out", "budget", "pivots", "gamma", "horizon", "report",
                         "threads", "seed", "snapshot-every", "reservoir"});
  if (!flags.positional.empty()) {
    throw UsageError("unexpected argument '" + flags.positional.front() + "'");
  }
  const std::string trace_dir = flags.required("trace");
  const std::string out = flags.required("out");
  cal::CalibrateOptions options;
  options.plan.budget_bits = parse_u32("budget", flags.get("budget", "6"));
  if (options.plan.budget_bits != 6 && options.plan.budget_bits != 4) {
    throw UsageError("--budget must be 6 or 4");
  }
  if (flags.has("pivots")) {
    options.plan.pivots = parse_u32("pivots", flags.get("pivots"));
  }
  options.plan.gamma = parse_double("gamma", flags.get("gamma", "0.25"));
  if (options.plan.gamma < 0.0) {
    throw UsageError("--gamma must be >= 0");
  }
  options.plan.horizon = parse_u32("horizon", flags.get("horizon", "2048"));
  if (options.plan.horizon == 0) {
    throw UsageError("--horizon must be positive");
  }
  options.threads = std::max(1u, parse_u32("threads", flags.get("threads", "1")));
  options.accumulator.seed = parse_uint("seed", flags.get("seed", "24301"), ~0ull);
  options.accumulator.snapshot_every =
      parse_u32("snapshot-every", flags.get("snapshot-every", "8"));
  options.accumulator.reservoir = parse_u32("reservoir", flags.get("reservoir", "64"));
  if (options.accumulator.snapshot_every == 0 || options.accumulator.reservoir == 0) {
    throw UsageError("--snapshot-every and --reservoir must be positive");
  }

  // Fail before hours of work, not after: the output directories must exist.
  for (const std::string& path : {out, flags.get("report")}) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!path.empty() && !parent.empty() && !std::filesystem::is_directory(parent)) {
      throw std::invalid_argument(path + ": directory " + parent.string() + " does not exist");
    }
  }
  const cal::TraceReader trace(trace_dir);
  const cal::TraceManifest& m = trace.manifest();
  std::cerr << "statepool-quant: calibrating " << kn::to_string(m.arch) << " trace " << trace_dir
            << ": " << m.layers << " layers x " << m.heads << " heads, K=" << m.key_dim
            << " V=" << m.value_dim << ", " << m.tokens << " tokens in " << m.sequence_starts.size()
            << " sequence(s)\n";
  if (m.synthetic) {
    std::cerr << "statepool-quant: NOTE: this trace is SYNTHETIC (" << m.source
              << "); the plan fits the synthetic heads, not a model\n";
  }
  const cal::PlanResult result = cal::calibrate_trace(
      trace, options, [](const std::string& line) { std::cerr << line << "\n"; });
  const std::string report = cal::format_report(result.report);
  sq::save(result.plan, out);
  if (flags.has("report")) {
    support::write_file_atomic(flags.get("report"), std::as_bytes(std::span<const char>(report)));
  }
  std::cout << report << "plan written to " << out << " (digest " << sq::digest(result.plan)
            << ")\n";
  if (m.synthetic) {
    std::cout << "NOTE: calibrated on a SYNTHETIC trace\n";
  }
  return 0;
}

// --- synth-trace ------------------------------------------------------------------------

int run_synth(const std::vector<std::string>& args) {
  const Flags flags = parse_flags(args, {"out", "arch", "layers", "heads", "key-dim", "value-dim",
                                         "tokens", "seed", "model-seed", "sequence-length"});
  if (!flags.positional.empty()) {
    throw UsageError("unexpected argument '" + flags.positional.front() + "'");
  }
  statepool::testing::SyntheticOptions o;
  const std::string out = flags.required("out");
  o.arch = parse_arch(flags.required("arch"));
  o.layers = parse_u32("layers", flags.required("layers"));
  o.heads = parse_u32("heads", flags.required("heads"));
  o.key_dim = parse_u32("key-dim", flags.required("key-dim"));
  o.value_dim = parse_u32("value-dim", flags.required("value-dim"));
  o.tokens = parse_uint("tokens", flags.required("tokens"), 1ull << 40);
  o.token_seed = parse_uint("seed", flags.get("seed", "1"), ~0ull);
  o.model_seed = parse_uint("model-seed", flags.get("model-seed", "7"), ~0ull);
  o.sequence_length = parse_uint("sequence-length", flags.get("sequence-length", "0"), 1ull << 40);
  if (const std::string problem = statepool::testing::synthetic_manifest(o).validate();
      !problem.empty()) {
    throw UsageError(problem);
  }
  std::cerr << "statepool-quant: writing a SYNTHETIC " << kn::to_string(o.arch) << " trace to "
            << out << "\n";
  statepool::testing::write_synthetic_trace(out, o, [&](std::uint32_t layer) {
    std::cerr << "layer " << layer + 1 << "/" << o.layers << " written\n";
  });
  std::cout << "SYNTHETIC trace written to " << out << ": " << kn::to_string(o.arch) << ", "
            << o.layers << " layers x " << o.heads << " heads, K=" << o.key_dim
            << " V=" << o.value_dim << ", " << o.tokens
            << " tokens (seeded random inputs, not a model: for trying calibration only)\n";
  return 0;
}

// --- codec ------------------------------------------------------------------------------

kn::StepQuantVariant parse_variant(const std::string& text) {
  if (text == "full") return kn::StepQuantVariant::full;
  if (text == "spatial") return kn::StepQuantVariant::spatial_only;
  if (text == "temporal") return kn::StepQuantVariant::temporal_only;
  throw UsageError("--variant must be full, spatial or temporal, got '" + text + "'");
}

bool needs_plan(kn::CodecId id) {
  return id == kn::CodecId::stepquant4 || id == kn::CodecId::stepquant6;
}

std::shared_ptr<const sq::Plan> load_plan(const Flags& flags) {
  if (!flags.has("plan")) {
    return nullptr;
  }
  return std::make_shared<const sq::Plan>(sq::load(flags.get("plan")));
}

// Arch from --arch, checked against the plan's when both are given.
kn::Arch codec_arch(const Flags& flags, const sq::Plan* plan) {
  const kn::Arch arch = flags.has("arch") ? parse_arch(flags.get("arch")) : kn::Arch::gdn;
  if (plan == nullptr) {
    return arch;
  }
  if (flags.has("arch") && plan->arch != arch) {
    throw std::invalid_argument("--arch " + flags.get("arch") + " but plan " + flags.get("plan") +
                                " is for " + kn::to_string(plan->arch));
  }
  return plan->arch;
}

// Completes `layout` (shape and arch already set) with codec, group size, variant, plan.
void attach_codec(const Flags& flags, kn::CodecId id, std::shared_ptr<const sq::Plan> plan,
                  kn::StateLayout& layout) {
  layout.codec.id = id;
  if (flags.has("group-size")) {
    if (!kn::is_uniform_codec(id)) {
      throw UsageError("--group-size applies to int4/int6/int8 only");
    }
    layout.codec.group_size = parse_u32("group-size", flags.get("group-size"));
  }
  if (flags.has("variant")) {
    if (!needs_plan(id)) {
      throw UsageError("--variant applies to stepquant4/stepquant6 only");
    }
    layout.codec.variant = parse_variant(flags.get("variant"));
  }
  if (needs_plan(id)) {
    if (!plan) {
      throw UsageError(std::string(kn::to_string(id)) +
                       " needs --plan (make one with 'statepool-quant calibrate')");
    }
    if (const std::string problem = sq::check_matches(*plan, layout); !problem.empty()) {
      throw std::invalid_argument("plan " + flags.get("plan") +
                                  " does not fit this state: " + problem);
    }
    layout.plan = std::move(plan);
  } else if (plan) {
    std::cerr << "statepool-quant: note: " << kn::to_string(id) << " does not use --plan\n";
  }
}

kn::StateLayout layout_for_state(const std::vector<std::uint64_t>& shape, kn::Arch arch,
                                 const std::string& what) {
  if (shape.size() != 3 && shape.size() != 4) {
    throw std::invalid_argument(
        what + ": a state is float32 [heads, K, V] or [layers, heads, K, V], got shape " +
        cal::shape_text(shape));
  }
  const std::size_t o = shape.size() - 3;
  for (const std::uint64_t extent : shape) {
    if (extent == 0 || extent > kn::kMaxHeadDim * 1024ull) {
      throw std::invalid_argument(what + ": shape " + cal::shape_text(shape) + " is out of range");
    }
  }
  kn::StateLayout layout;
  layout.name = "statepool-quant";
  layout.arch = arch;
  layout.num_layers = o == 1 ? static_cast<std::uint32_t>(shape[0]) : 1;
  layout.num_heads = static_cast<std::uint32_t>(shape[o]);
  layout.key_dim = static_cast<std::uint32_t>(shape[o + 1]);
  layout.value_dim = static_cast<std::uint32_t>(shape[o + 2]);
  return layout;
}

std::vector<std::byte> encode_state(const kn::PageCodec& codec, std::span<const float> values) {
  std::vector<std::byte> page(codec.page_bytes());
  codec.encode(std::as_bytes(values), kn::DType::f32, page);
  return page;
}

std::vector<float> decode_page(const kn::PageCodec& codec, std::span<const std::byte> page) {
  std::vector<float> values(codec.staged_bytes(kn::DType::f32) / sizeof(float));
  codec.decode(page, kn::DType::f32, std::as_writable_bytes(std::span<float>(values)));
  return values;
}

void print_sizes(const kn::PageCodec& codec, std::size_t values) {
  const auto page = static_cast<double>(codec.page_bytes());
  std::cout << "page " << codec.page_bytes() << " bytes for " << values
            << " values: " << fixed(8.0 * page / static_cast<double>(values), 3) << " bits/value, "
            << fixed(4.0 * static_cast<double>(values) / page, 3) << "x smaller than FP32, "
            << fixed(2.0 * static_cast<double>(values) / page, 3) << "x than BF16\n";
}

int run_codec(const std::vector<std::string>& args) {
  const Flags flags =
      parse_flags(args, {"codec", "plan", "in", "out", "arch", "group-size", "variant"});
  if (flags.positional.size() != 1) {
    throw UsageError("codec needs exactly one of encode, decode, roundtrip");
  }
  const std::string mode = flags.positional.front();
  if (mode != "encode" && mode != "decode" && mode != "roundtrip") {
    throw UsageError("unknown codec mode '" + mode + "' (encode, decode, roundtrip)");
  }
  const std::string in = flags.required("in");
  const std::string out = flags.required("out");
  std::optional<kn::CodecId> id;
  if (flags.has("codec")) {
    kn::CodecId parsed{};
    if (!kn::parse_codec(flags.get("codec"), parsed)) {
      throw UsageError("unknown codec '" + flags.get("codec") +
                       "' (fp32 bf16 fp16 int4 int6 int8 dsq4 dsq6 stepquant4 stepquant6)");
    }
    id = parsed;
  } else if (mode != "decode") {
    throw UsageError("missing --codec");
  }

  if (mode == "decode") {
    const std::string file = cal::read_file(in, kn::kMaxPageBytes + cal::kPageFileHeaderBytes);
    const auto bytes = std::as_bytes(std::span<const char>(file));
    const cal::PageFileHeader header = cal::parse_page_file(bytes, in);
    if (id && *id != header.codec) {
      throw std::invalid_argument(in + ": the page was encoded with " +
                                  kn::to_string(header.codec) + ", not " + flags.get("codec"));
    }
    if (flags.has("arch") && parse_arch(flags.get("arch")) != header.arch) {
      throw std::invalid_argument(in + ": the page holds a " + kn::to_string(header.arch) +
                                  " state, not " + flags.get("arch"));
    }
    if (flags.has("group-size") || flags.has("variant")) {
      throw UsageError("decode takes the group size and variant from the page header");
    }
    kn::StateLayout layout;
    layout.name = "statepool-quant";
    layout.arch = header.arch;
    layout.num_layers = header.layers;
    layout.num_heads = header.heads;
    layout.key_dim = header.key_dim;
    layout.value_dim = header.value_dim;
    layout.codec.id = header.codec;
    layout.codec.group_size = header.group_size;
    layout.codec.variant = header.variant;
    if (needs_plan(header.codec)) {
      if (!flags.has("plan")) {
        throw UsageError(in + " was encoded with " + kn::to_string(header.codec) + " and plan " +
                         header.plan_digest + ": pass that plan with --plan");
      }
      auto plan = std::make_shared<const sq::Plan>(sq::load(flags.get("plan")));
      if (sq::digest(*plan) != header.plan_digest) {
        throw std::invalid_argument("plan " + flags.get("plan") + " (digest " + sq::digest(*plan) +
                                    ") is not the plan " + in + " was encoded with (digest " +
                                    header.plan_digest + ")");
      }
      layout.plan = std::move(plan);
    }
    const kn::PageCodec codec(layout);
    if (codec.page_bytes() != header.page_bytes) {
      throw std::invalid_argument(in + ": page of " + std::to_string(header.page_bytes) +
                                  " bytes, the layout in its header takes " +
                                  std::to_string(codec.page_bytes()));
    }
    const std::vector<float> values = decode_page(codec, bytes.subspan(cal::kPageFileHeaderBytes));
    std::vector<std::uint64_t> shape{header.heads, header.key_dim, header.value_dim};
    if (header.rank == 4) {
      shape.insert(shape.begin(), header.layers);
    }
    cal::write_npy(out, shape, values);
    std::cout << "decoded " << in << " (" << kn::to_string(header.codec) << ") into " << out << " "
              << cal::shape_text(shape) << "\n";
    return 0;
  }

  const cal::NpyArray state = cal::read_npy(in);
  std::shared_ptr<const sq::Plan> plan = load_plan(flags);
  kn::StateLayout layout = layout_for_state(state.shape, codec_arch(flags, plan.get()), in);
  attach_codec(flags, *id, std::move(plan), layout);
  const kn::PageCodec codec(layout);
  const std::vector<std::byte> page = encode_state(codec, state.data);

  if (mode == "encode") {
    cal::PageFileHeader header;
    header.codec = layout.codec.id;
    header.arch = layout.arch;
    header.variant = layout.codec.variant;
    header.rank = static_cast<std::uint8_t>(state.shape.size());
    header.group_size = layout.codec.group_size;
    header.layers = layout.num_layers;
    header.heads = layout.num_heads;
    header.key_dim = layout.key_dim;
    header.value_dim = layout.value_dim;
    header.page_bytes = page.size();
    header.plan_digest = layout.plan ? sq::digest(*layout.plan) : std::string();
    const std::vector<std::byte> file = cal::make_page_file(header, page);
    support::write_file_atomic(out, file);
    std::cout << "encoded " << in << " " << cal::shape_text(state.shape) << " with "
              << kn::to_string(*id) << " into " << out << "\n";
    print_sizes(codec, state.data.size());
    return 0;
  }

  // roundtrip
  const std::vector<float> recon = decode_page(codec, page);
  const std::size_t per_head = std::size_t{layout.key_dim} * layout.value_dim;
  const std::size_t heads = std::size_t{layout.num_layers} * layout.num_heads;
  std::vector<double> relative(heads);
  double err_all = 0.0;
  double ref_all = 0.0;
  for (std::size_t h = 0; h < heads; ++h) {
    double err = 0.0;
    double ref = 0.0;
    for (std::size_t i = h * per_head; i < (h + 1) * per_head; ++i) {
      const double d = static_cast<double>(state.data[i]) - recon[i];
      err += d * d;
      ref += static_cast<double>(state.data[i]) * state.data[i];
    }
    relative[h] = ref > 0.0 ? std::sqrt(err / ref) : std::sqrt(err);
    err_all += err;
    ref_all += ref;
  }
  cal::write_npy(out, state.shape, recon);
  std::cout << "roundtrip of " << in << " " << cal::shape_text(state.shape) << " through "
            << kn::to_string(*id) << " -> " << out << "\n";
  std::cout << "relative error |x - x^|/|x| per head:\n";
  if (heads <= 64) {
    for (std::size_t h = 0; h < heads; ++h) {
      std::cout << "  layer " << h / layout.num_heads << " head " << h % layout.num_heads << ": "
                << sci(relative[h]) << "\n";
    }
  } else {
    std::vector<double> sorted = relative;
    std::sort(sorted.begin(), sorted.end());
    std::cout << "  " << heads << " heads: min " << sci(sorted.front()) << ", median "
              << sci(sorted[heads / 2]) << ", max " << sci(sorted.back()) << "\n";
  }
  std::cout << "overall relative error " << sci(ref_all > 0.0 ? std::sqrt(err_all / ref_all) : 0.0)
            << "\n";
  print_sizes(codec, state.data.size());
  return 0;
}

int usage_for(const std::string& command) {
  if (command == "calibrate") {
    std::cout << kCalibrateUsage;
  } else if (command == "synth-trace") {
    std::cout << kSynthUsage;
  } else if (command == "codec") {
    std::cout << kCodecUsage;
  } else {
    std::cout << kUsage;
    return command.empty() ? 0 : 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "--help" || command == "-h" || command == "help") {
    return usage_for(args.empty() ? std::string() : args.front());
  }
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    return usage_for(command);
  }
  try {
    if (command == "calibrate") {
      return run_calibrate(args);
    }
    if (command == "synth-trace") {
      return run_synth(args);
    }
    if (command == "codec") {
      return run_codec(args);
    }
    throw UsageError("unknown command '" + command + "'");
  } catch (const UsageError& e) {
    std::cerr << "statepool-quant: " << e.what() << "\n(statepool-quant help";
    if (command == "calibrate" || command == "synth-trace" || command == "codec") {
      std::cerr << " " << command;
    }
    std::cerr << " shows the usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "statepool-quant: error: " << e.what() << "\n";
    return 1;
  }
}
