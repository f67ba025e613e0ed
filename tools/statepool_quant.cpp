// statepool-quant: STEPQuant calibration and codec tool (docs/calibration.md).
//
// Exit status: 0 success, 1 bad input or failure (a message on stderr, nothing written),
// 2 bad command line.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/calibration/calibrate.hpp"
#include "statepool/calibration/npy.hpp"
#include "statepool/calibration/page_file.hpp"
#include "statepool/calibration/statistics.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"
#include "statepool/synthetic/trace.hpp"
#include "statepool/tools/cli.hpp"

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
  --cost C         output (a unit's error in its head's output over the error's life
                   through the delta rule, measured by probes on the trace; the
                   default), relative (its error relative to its head's state energy,
                   over its decay lifetime) or absolute (the paper's cost)
  --min-gain G     keep the allocation only if it lowers the expected error by at least
                   this fraction against uniform budget-width units (no pivots), else
                   write the uniform plan; 0 keeps any gain; default 0.1
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
  --variant V      stepquant: full, spatial (spatial axis only), temporal (temporal only),
                   norefit (full without the refit of the column scales)
)";

namespace po = statepool::tools::po;
using statepool::tools::bounded;
using statepool::tools::UsageError;

constexpr const char* kTool = "statepool-quant";

cal::CostModel parse_cost(const std::string& text) {
  cal::CostModel cost{};
  if (!cal::parse_cost_model(text, cost)) {
    throw UsageError("--cost must be output, relative or absolute, got '" + text + "'");
  }
  return cost;
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

int run_calibrate(int argc, const char* const* argv) {
  std::string trace_dir;
  std::string out;
  std::optional<std::string> report_file;
  cal::CalibrateOptions options;  // its defaults are the ones kCalibrateUsage names
  statepool::tools::CommandLine cli(kTool, kCalibrateUsage);
  // clang-format off
  cli.add_options()
      ("trace", po::value(&trace_dir)->required())
      ("out", po::value(&out)->required())
      ("budget", bounded(options.plan.budget_bits))
      ("pivots", bounded(options.plan.pivots))
      ("gamma", statepool::tools::finite(options.plan.gamma))
      ("horizon", bounded(options.plan.horizon, 1))
      ("cost", statepool::tools::parsed(options.plan.cost, parse_cost))
      ("min-gain", statepool::tools::finite(options.plan.min_gain))
      ("report", statepool::tools::optional_value(report_file))
      ("threads", bounded(options.threads))
      ("seed", bounded(options.accumulator.seed))
      ("snapshot-every", bounded(options.accumulator.snapshot_every, 1))
      ("reservoir", bounded(options.accumulator.reservoir, 1));
  // clang-format on
  const auto check = [&](const po::variables_map&) {
    if (options.plan.budget_bits != 6 && options.plan.budget_bits != 4) {
      throw UsageError("--budget must be 6 or 4");
    }
    if (options.plan.gamma < 0.0) {
      throw UsageError("--gamma must be >= 0");
    }
    if (options.plan.min_gain < 0.0 || options.plan.min_gain >= 1.0) {
      throw UsageError("--min-gain must be in [0, 1)");
    }
  };
  if (const auto exit_status = cli.parse(argc, argv, check)) {
    return *exit_status;
  }
  options.threads = std::max(1u, options.threads);

  // Fail before hours of work, not after: the output directories must exist.
  for (const std::string& path : {out, report_file.value_or(std::string())}) {
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
  if (report_file) {
    support::write_file_atomic(*report_file, std::as_bytes(std::span<const char>(report)));
  }
  std::cout << report << "plan written to " << out << " (digest " << sq::digest(result.plan)
            << ")\n";
  if (m.synthetic) {
    std::cout << "NOTE: calibrated on a SYNTHETIC trace\n";
  }
  return 0;
}

// --- synth-trace ------------------------------------------------------------------------

int run_synth(int argc, const char* const* argv) {
  std::string out;
  statepool::synthetic::SyntheticOptions o;  // its defaults are the ones kSynthUsage names
  statepool::tools::CommandLine cli(kTool, kSynthUsage);
  // clang-format off
  cli.add_options()
      ("out", po::value(&out)->required())
      ("arch", statepool::tools::parsed(o.arch, parse_arch)->required())
      ("layers", bounded(o.layers)->required())
      ("heads", bounded(o.heads)->required())
      ("key-dim", bounded(o.key_dim)->required())
      ("value-dim", bounded(o.value_dim)->required())
      ("tokens", bounded(o.tokens, 0, 1ull << 40)->required())
      ("seed", bounded(o.token_seed))
      ("model-seed", bounded(o.model_seed))
      ("sequence-length", bounded(o.sequence_length, 0, 1ull << 40));
  // clang-format on
  const auto check = [&](const po::variables_map&) {
    if (const std::string problem = statepool::synthetic::synthetic_manifest(o).validate();
        !problem.empty()) {
      throw UsageError(problem);
    }
  };
  if (const auto exit_status = cli.parse(argc, argv, check)) {
    return *exit_status;
  }
  std::cerr << "statepool-quant: writing a SYNTHETIC " << kn::to_string(o.arch) << " trace to "
            << out << "\n";
  statepool::synthetic::write_synthetic_trace(out, o, [&](std::uint32_t layer) {
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
  if (text == "norefit") return kn::StepQuantVariant::no_refit;
  throw UsageError("--variant must be full, spatial, temporal or norefit, got '" + text + "'");
}

kn::CodecId parse_codec_name(const std::string& text) {
  kn::CodecId id{};
  if (!kn::parse_codec(text, id)) {
    throw UsageError("unknown codec '" + text +
                     "' (fp32 bf16 fp16 int4 int6 int8 dsq4 dsq6 stepquant4 stepquant6)");
  }
  return id;
}

bool needs_plan(kn::CodecId id) {
  return id == kn::CodecId::stepquant4 || id == kn::CodecId::stepquant6;
}

// statepool-quant codec's command line; the optional ones are set when given.
struct CodecArgs {
  std::string mode;  // encode, decode, roundtrip
  std::string in;
  std::string out;
  std::optional<kn::CodecId> codec;
  std::optional<std::string> plan;  // the plan file
  std::optional<kn::Arch> arch;
  std::optional<std::uint32_t> group_size;
  std::optional<kn::StepQuantVariant> variant;
};

std::shared_ptr<const sq::Plan> load_plan(const CodecArgs& args) {
  if (!args.plan) {
    return nullptr;
  }
  return std::make_shared<const sq::Plan>(sq::load(*args.plan));
}

// Arch from --arch, checked against the plan's when both are given.
kn::Arch codec_arch(const CodecArgs& args, const sq::Plan* plan) {
  const kn::Arch arch = args.arch.value_or(kn::Arch::gdn);
  if (plan == nullptr) {
    return arch;
  }
  if (args.arch && plan->arch != arch) {
    throw std::invalid_argument("--arch " + std::string(kn::to_string(arch)) + " but plan " +
                                *args.plan + " is for " + kn::to_string(plan->arch));
  }
  return plan->arch;
}

// Completes `layout` (shape and arch already set) with codec, group size, variant, plan.
void attach_codec(const CodecArgs& args, kn::CodecId id, std::shared_ptr<const sq::Plan> plan,
                  kn::StateLayout& layout) {
  layout.codec.id = id;
  if (args.group_size) {
    if (!kn::is_uniform_codec(id)) {
      throw UsageError("--group-size applies to int4/int6/int8 only");
    }
    layout.codec.group_size = *args.group_size;
  }
  if (args.variant) {
    if (!needs_plan(id)) {
      throw UsageError("--variant applies to stepquant4/stepquant6 only");
    }
    layout.codec.variant = *args.variant;
  }
  if (needs_plan(id)) {
    if (!plan) {
      throw UsageError(std::string(kn::to_string(id)) +
                       " needs --plan (make one with 'statepool-quant calibrate')");
    }
    if (const std::string problem = sq::check_matches(*plan, layout); !problem.empty()) {
      throw std::invalid_argument("plan " + *args.plan + " does not fit this state: " + problem);
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

int run_codec(int argc, const char* const* argv) {
  CodecArgs args;
  statepool::tools::CommandLine cli(kTool, kCodecUsage);
  // clang-format off
  cli.add_options()
      ("codec", statepool::tools::parsed(args.codec, parse_codec_name))
      ("plan", statepool::tools::optional_value(args.plan))
      ("in", po::value(&args.in)->required())
      ("out", po::value(&args.out)->required())
      ("arch", statepool::tools::parsed(args.arch, parse_arch))
      ("group-size", bounded(args.group_size))
      ("variant", statepool::tools::parsed(args.variant, parse_variant));
  // clang-format on
  cli.positional("mode", args.mode);
  const auto check = [&](const po::variables_map&) {
    if (args.mode.empty()) {
      throw UsageError("codec needs exactly one of encode, decode, roundtrip");
    }
    if (args.mode != "encode" && args.mode != "decode" && args.mode != "roundtrip") {
      throw UsageError("unknown codec mode '" + args.mode + "' (encode, decode, roundtrip)");
    }
    if (!args.codec && args.mode != "decode") {
      throw UsageError("missing --codec");
    }
  };
  if (const auto exit_status = cli.parse(argc, argv, check)) {
    return *exit_status;
  }
  const std::string& mode = args.mode;
  const std::string& in = args.in;
  const std::string& out = args.out;
  const std::optional<kn::CodecId> id = args.codec;

  if (mode == "decode") {
    const std::string file = support::read_file(in, kn::kMaxPageBytes + cal::kPageFileHeaderBytes);
    const auto bytes = std::as_bytes(std::span<const char>(file));
    const cal::PageFileHeader header = cal::parse_page_file(bytes, in);
    if (id && *id != header.codec) {
      throw std::invalid_argument(in + ": the page was encoded with " +
                                  kn::to_string(header.codec) + ", not " + kn::to_string(*id));
    }
    if (args.arch && *args.arch != header.arch) {
      throw std::invalid_argument(in + ": the page holds a " + kn::to_string(header.arch) +
                                  " state, not " + kn::to_string(*args.arch));
    }
    if (args.group_size || args.variant) {
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
      if (!args.plan) {
        throw UsageError(in + " was encoded with " + kn::to_string(header.codec) + " and plan " +
                         header.plan_digest + ": pass that plan with --plan");
      }
      auto plan = load_plan(args);
      if (sq::digest(*plan) != header.plan_digest) {
        throw std::invalid_argument("plan " + *args.plan + " (digest " + sq::digest(*plan) +
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
  std::shared_ptr<const sq::Plan> plan = load_plan(args);
  kn::StateLayout layout = layout_for_state(state.shape, codec_arch(args, plan.get()), in);
  attach_codec(args, *id, std::move(plan), layout);
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

// The subcommands: each parses its own options (argv[0] is the command's name).
struct Command {
  const char* name;
  const char* usage;
  int (*run)(int argc, const char* const* argv);
};

constexpr Command kCommands[] = {{"calibrate", kCalibrateUsage, run_calibrate},
                                 {"synth-trace", kSynthUsage, run_synth},
                                 {"codec", kCodecUsage, run_codec}};

const Command* find_command(std::string_view name) {
  for (const Command& command : kCommands) {
    if (name == command.name) {
      return &command;
    }
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  using statepool::tools::report_usage_error;
  if (argc < 2) {
    return report_usage_error(kTool, "no command given", kUsage);
  }
  const std::string_view first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    const Command* command = argc > 2 ? find_command(argv[2]) : nullptr;
    if (argc > 2 && command == nullptr) {
      return report_usage_error(kTool, "unknown command '" + std::string(argv[2]) + "'", kUsage);
    }
    std::cout << (command == nullptr ? kUsage : command->usage);
    return 0;
  }
  const Command* command = find_command(first);
  if (command == nullptr) {
    return report_usage_error(kTool, "unknown command '" + std::string(first) + "'", kUsage);
  }
  try {
    // The command's name stands where program_options expects the program's.
    return command->run(argc - 1, argv + 1);
  } catch (const UsageError& e) {
    // A command line that reading the inputs showed to be wrong (a page that needs --plan).
    return report_usage_error(kTool, e.what(), command->usage);
  } catch (const std::exception& e) {
    std::cerr << "statepool-quant: error: " << e.what() << "\n";
    return 1;
  }
}
