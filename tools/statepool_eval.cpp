// statepool-eval: the fidelity harness on the small trained models (eval/README.md).
//
// Exit status: 0 success, 1 bad input or failure (a message on stderr), 2 bad command line.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "statepool/eval/fidelity.hpp"
#include "statepool/eval/report.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"
#include "statepool/tools/cli.hpp"

namespace ev = statepool::eval;
namespace kn = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
namespace po = statepool::tools::po;
using statepool::tools::bounded;
using statepool::tools::UsageError;

namespace {

constexpr const char* kTool = "statepool-eval";
constexpr std::size_t kMaxTextBytes = 64u << 20;

constexpr const char* kUsage = R"(statepool-eval: state codecs on small trained models

usage: statepool-eval <command> [options]      (statepool-eval help <command>)

commands:
  trace   run the FP32-state model over a text and write its calibration trace (the
          format `statepool-quant calibrate` reads)
  run     run the model with its state re-encoded by every codec after every token and
          report perplexity, agreement with FP32, state error over time, the greedy
          divergence step and page bytes
  modes   compare the fused step's modes (the full fit every step, light fits between
          full fits every N steps) for stepquant6/4 on windows of a text

eval/run does both for the committed models and writes eval/RESULTS.md.
)";

constexpr const char* kTraceUsage =
    R"(usage: statepool-eval trace --model DIR --text FILE --out DIR [options]

  --model DIR            model directory (manifest.json + .npy files, eval/train.py)
  --text FILE            text to read (bytes)
  --out DIR              trace directory to create
  --sequences N          sequences taken one after the other from the text; default 8
  --sequence-length N    bytes per sequence (the state starts from zero); default 2048
)";

constexpr const char* kRunUsage =
    R"(usage: statepool-eval run --model DIR --text FILE [options]

  --model DIR          model directory
  --text FILE          held-out text (bytes)
  --plan6 PLAN         stepquant6 plan (enables stepquant6 and its ablations)
  --plan6-nopivots P   stepquant6 plan calibrated with --pivots 0
  --plan4 PLAN, --plan4-nopivots PLAN   the same at 4 bits
  --codecs LIST        comma-separated case names; default: every case the plans allow
                       (fp32 bf16 fp16 int8 int6 int4 dsq6 dsq4 stepquantB
                       stepquantB-spatial stepquantB-temporal stepquantB-norefit
                       stepquantB-nopivots)
  --tokens N           teacher-forced positions; default 4096
  --prompt N           greedy generation: prompt bytes; default 64
  --generate N         greedy generation: bytes; default 1024
  --threads N          codecs evaluated concurrently; default 2
  --title TEXT         heading of the markdown section; default: the model directory
  --markdown FILE      write the results as a markdown section (tables and claims)
  --csv FILE           write the state error over time: t, then one column per case
  --claims FILE        write the claims checked, one per line: holds|does not hold TAB claim
The table goes to stdout, progress to stderr.
)";

constexpr const char* kModesUsage =
    R"(usage: statepool-eval modes --model DIR --text FILE --plan6 PLAN --plan4 PLAN [options]

  --model DIR          model directory
  --text FILE          held-out text (bytes)
  --plan6, --plan4     the stepquant6 and stepquant4 plans (either or both)
  --offsets LIST       start of each window in the text, comma-separated; default 0
  --tokens N           teacher-forced positions per window; default 4096
  --every LIST         the light mode's full-fit periods N, 0 = never; default 2,4,16,64,0
  --clamp F            the clamp trigger of the impact-rule settings: a head one of whose
                       rows clamps more than this fraction of its values gets a full
                       fit; default 0.05
  --threads N          cases evaluated concurrently; default 2
  --variants LIST      light fits, comma-separated; default all of: absmax (the page's
                       column scales, absmax rows), impact (the page's column scales,
                       row-impact rows), impact+clamp (and the clamp trigger), grown
                       (column scales grown by a bound on the step's update, absmax
                       rows), norefit (both scales fitted afresh, no refit)
  --tsv FILE           write one line per (window, case)
Per window and codec: the full fit every step, then per N and light fit the light mode
(a full fit on the steps whose number is a multiple of N). The table goes to stdout,
progress to stderr.
)";

std::vector<std::uint8_t> read_text(const std::string& path) {
  const std::string bytes = statepool::support::read_file(path, kMaxTextBytes);
  return {bytes.begin(), bytes.end()};
}

void write_text(const std::string& path, const std::string& text) {
  statepool::support::write_file_atomic(path, std::as_bytes(std::span<const char>(text)));
}

int run_trace(int argc, char** argv) {
  std::string model_dir, text_file, out;
  std::uint64_t sequences = 8, length = 2048;
  statepool::tools::CommandLine cli(kTool, kTraceUsage);
  cli.add_options()("model", po::value(&model_dir)->required())(
      "text", po::value(&text_file)->required())("out", po::value(&out)->required())(
      "sequences", bounded(sequences, 1, 1u << 20))("sequence-length",
                                                    bounded(length, 1, 1u << 24));
  if (const auto exit_status = cli.parse(argc, argv)) return *exit_status;
  const auto model = ev::Model::load(model_dir);
  const std::vector<std::uint8_t> text = read_text(text_file);
  std::cerr << kTool << ": tracing " << sequences << " x " << length << " bytes of " << text_file
            << "\n";
  ev::record_trace(model, text, sequences, length, out,
                   "statepool-eval " + model_dir + " on " + text_file);
  std::cout << "wrote trace " << out << " (" << sequences * length << " tokens)\n";
  return 0;
}

std::vector<ev::CodecCase> all_cases(
    const std::map<std::string, std::shared_ptr<const sq::Plan>>& plans) {
  std::vector<ev::CodecCase> cases;
  const auto add = [&](std::string name, kn::CodecId id,
                       kn::StepQuantVariant variant = kn::StepQuantVariant::full,
                       std::shared_ptr<const sq::Plan> plan = {}) {
    kn::CodecSpec spec;
    spec.id = id;
    spec.variant = variant;
    cases.push_back({std::move(name), spec, std::move(plan), {}});
  };
  add("fp32", kn::CodecId::fp32);
  add("bf16", kn::CodecId::bf16);
  add("fp16", kn::CodecId::fp16);
  add("int8", kn::CodecId::int8);
  add("int6", kn::CodecId::int6);
  add("int4", kn::CodecId::int4);
  add("dsq6", kn::CodecId::dsq6);
  add("dsq4", kn::CodecId::dsq4);
  for (const auto& [bits, id] :
       {std::pair{"6", kn::CodecId::stepquant6}, std::pair{"4", kn::CodecId::stepquant4}}) {
    const std::string base = std::string("stepquant") + bits;
    if (const auto it = plans.find(base); it != plans.end()) {
      add(base, id, kn::StepQuantVariant::full, it->second);
      add(base + "-spatial", id, kn::StepQuantVariant::spatial_only, it->second);
      add(base + "-temporal", id, kn::StepQuantVariant::temporal_only, it->second);
      add(base + "-norefit", id, kn::StepQuantVariant::no_refit, it->second);
    }
    if (const auto it = plans.find(base + "-nopivots"); it != plans.end()) {
      add(base + "-nopivots", id, kn::StepQuantVariant::full, it->second);
    }
  }
  return cases;
}

int run_run(int argc, char** argv) {
  std::string model_dir, text_file, codecs, title;
  std::optional<std::string> markdown, csv, claims;
  std::map<std::string, std::optional<std::string>> plan_files{{"stepquant6", {}},
                                                               {"stepquant6-nopivots", {}},
                                                               {"stepquant4", {}},
                                                               {"stepquant4-nopivots", {}}};
  ev::FidelityOptions options;
  options.threads = 2;
  statepool::tools::CommandLine cli(kTool, kRunUsage);
  cli.add_options()("model", po::value(&model_dir)->required())("text",
                                                                po::value(&text_file)->required())(
      "plan6", statepool::tools::optional_value(plan_files["stepquant6"]))(
      "plan6-nopivots", statepool::tools::optional_value(plan_files["stepquant6-nopivots"]))(
      "plan4", statepool::tools::optional_value(plan_files["stepquant4"]))(
      "plan4-nopivots", statepool::tools::optional_value(plan_files["stepquant4-nopivots"]))(
      "codecs", po::value(&codecs))("tokens", bounded(options.tokens, 1, 1u << 24))(
      "prompt", bounded(options.prompt, 1, 1u << 20))("generate",
                                                      bounded(options.generate, 1, 1u << 20))(
      "threads", bounded(options.threads, 1, 256))("title", po::value(&title))(
      "markdown", statepool::tools::optional_value(markdown))(
      "csv", statepool::tools::optional_value(csv))("claims",
                                                    statepool::tools::optional_value(claims));
  if (const auto exit_status = cli.parse(argc, argv)) return *exit_status;

  const auto model = ev::Model::load(model_dir);
  std::map<std::string, std::shared_ptr<const sq::Plan>> plans;
  for (const auto& [name, file] : plan_files) {
    if (file) plans[name] = std::make_shared<const sq::Plan>(sq::load(*file));
  }
  std::vector<ev::CodecCase> cases = all_cases(plans);
  if (!codecs.empty()) {
    std::vector<ev::CodecCase> chosen;
    std::stringstream list(codecs);
    for (std::string name; std::getline(list, name, ',');) {
      const auto it = std::find_if(cases.begin(), cases.end(),
                                   [&](const ev::CodecCase& c) { return c.name == name; });
      if (it == cases.end()) {
        throw UsageError("--codecs: unknown or unavailable case '" + name +
                         "' (stepquant cases need their --plan options)");
      }
      chosen.push_back(*it);
    }
    cases = std::move(chosen);
  }
  const std::vector<std::uint8_t> text = read_text(text_file);
  std::cerr << kTool << ": " << cases.size() << " cases, " << options.tokens << " tokens each, on "
            << options.threads << " threads\n";
  const std::vector<ev::CodecResult> results = ev::evaluate(
      model, text, cases, options, [](const std::string& line) { std::cerr << line << "\n"; });
  const ev::Report report{title.empty() ? model_dir : title, model, options, results};
  std::cout << ev::results_table(report);
  if (markdown) write_text(*markdown, ev::markdown(report));
  if (csv) write_text(*csv, ev::state_error_csv(report));
  if (claims) write_text(*claims, ev::claims_tsv(report));
  return 0;
}

std::string mode_name(const kn::StepPolicy& p) {
  if (p.mode == kn::StepMode::full) return "full";
  std::string name = "light N=" + (p.full_every == 0 ? std::string("inf")
                                                      : std::to_string(p.full_every));
  if (p.light.fit == kn::LightFit::no_refit) return name + " norefit";
  if (p.light.fit == kn::LightFit::grown) return name + " grown";
  name += p.light.rule == sq::RowRule::absmax ? " absmax" : " impact";
  if (p.light.clamp_fraction < 1.0f) name += "+clamp";
  return name;
}

// The light fits `modes` knows, by name.
struct Variant {
  const char* name;
  sq::RowRule rule;
  bool trigger;
  kn::LightFit fit;
};
constexpr Variant kVariants[] = {
    {"absmax", sq::RowRule::absmax, false, kn::LightFit::carried},
    {"impact", sq::RowRule::impact, false, kn::LightFit::carried},
    {"impact+clamp", sq::RowRule::impact, true, kn::LightFit::carried},
    {"grown", sq::RowRule::absmax, false, kn::LightFit::grown},
    {"norefit", sq::RowRule::absmax, false, kn::LightFit::no_refit},
};

int run_modes(int argc, char** argv) {
  std::string model_dir, text_file, offsets_list = "0", every_list = "2,4,16,64,0", tsv;
  std::string variant_list = "absmax,impact,impact+clamp,grown,norefit";
  std::optional<std::string> plan6, plan4;
  float clamp = 0.05f;
  ev::FidelityOptions options;
  options.threads = 2;
  options.prompt = 1;
  options.generate = 1;
  statepool::tools::CommandLine cli(kTool, kModesUsage);
  cli.add_options()("model", po::value(&model_dir)->required())(
      "text", po::value(&text_file)->required())("plan6", statepool::tools::optional_value(plan6))(
      "plan4", statepool::tools::optional_value(plan4))("offsets", po::value(&offsets_list))(
      "tokens", bounded(options.tokens, 1, 1u << 24))("every", po::value(&every_list))(
      "clamp", po::value(&clamp))("threads", bounded(options.threads, 1, 256))(
      "tsv", po::value(&tsv))("variants", po::value(&variant_list));
  if (const auto exit_status = cli.parse(argc, argv)) return *exit_status;
  std::vector<Variant> variants;
  {
    std::stringstream in(variant_list);
    for (std::string item; std::getline(in, item, ',');) {
      const auto* found = std::find_if(std::begin(kVariants), std::end(kVariants),
                                       [&](const Variant& v) { return item == v.name; });
      if (found == std::end(kVariants)) {
        throw UsageError("--variants: unknown '" + item +
                         "' (absmax, impact, impact+clamp, grown, norefit)");
      }
      variants.push_back(*found);
    }
  }
  if (!(clamp > 0.0f && clamp < 1.0f)) throw UsageError("--clamp must be in (0, 1)");
  if (!plan6 && !plan4) throw UsageError("give --plan6, --plan4 or both");
  const auto numbers = [](const std::string& list, const char* what) {
    std::vector<std::uint64_t> out;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
      std::size_t used = 0;
      std::uint64_t value = 0;
      try {
        value = std::stoull(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || value > (1u << 30)) {
        throw UsageError(std::string(what) + ": '" + item + "' is not a number up to 2^30");
      }
      out.push_back(value);
    }
    if (out.empty()) throw UsageError(std::string(what) + " is empty");
    return out;
  };
  const std::vector<std::uint64_t> offsets = numbers(offsets_list, "--offsets");
  const std::vector<std::uint64_t> periods = numbers(every_list, "--every");

  const auto model = ev::Model::load(model_dir);
  std::vector<ev::CodecCase> cases;
  cases.push_back({"fp32", kn::CodecSpec{kn::CodecId::fp32}, {}, {}});
  for (const auto& [file, id] : {std::pair{plan6, kn::CodecId::stepquant6},
                                 std::pair{plan4, kn::CodecId::stepquant4}}) {
    if (!file) continue;
    const auto plan = std::make_shared<const sq::Plan>(sq::load(*file));
    const std::string codec = std::string(kn::to_string(id));
    ev::CodecCase c{codec, kn::CodecSpec{id}, plan, {}};
    cases.push_back(c);
    for (const std::uint64_t n : periods) {
      for (const Variant& v : variants) {
        c.policy.mode = kn::StepMode::light;
        c.policy.full_every = static_cast<std::uint32_t>(n);
        c.policy.light.rule = v.rule;
        c.policy.light.clamp_fraction = v.trigger ? clamp : 1.0f;
        c.policy.light.fit = v.fit;
        c.name = codec + " " + mode_name(c.policy);
        cases.push_back(c);
      }
    }
  }
  const std::vector<std::uint8_t> text = read_text(text_file);
  std::ostringstream table, lines;
  table << "| window | case | perplexity vs FP32 | agreement | output TV | mean state error | "
           "state error at the end | light | fell back |\n|---|---|---|---|---|---|---|---|---|\n";
  lines << "window\tcase\tppl_delta_pct\tagreement\ttv\tmean_state_error\tfinal_state_error\t"
           "light_fraction\tfallback_fraction\n";
  for (const std::uint64_t offset : offsets) {
    if (offset >= text.size()) {
      throw UsageError("--offsets: " + std::to_string(offset) + " is beyond the text (" +
                       std::to_string(text.size()) + " bytes)");
    }
    std::cerr << kTool << ": window at " << offset << ", " << cases.size() << " cases\n";
    const std::vector<ev::CodecResult> results = ev::evaluate(
        model, std::span(text).subspan(offset), cases, options,
        [](const std::string& line) { std::cerr << line << "\n"; });
    const ev::CodecResult& fp32 = results.front();
    for (std::size_t i = 1; i < results.size(); ++i) {
      const ev::CodecResult& r = results[i];
      const double delta = 100.0 * (r.perplexity() / fp32.perplexity() - 1.0);
      char row[512];
      std::snprintf(row, sizeof row, "%llu\t%s\t%+.4f\t%.5f\t%.6f\t%.5f\t%.5f\t%.4f\t%.4f\n",
                    static_cast<unsigned long long>(offset), r.name.c_str(), delta, r.agreement,
                    r.output_error, r.mean_state_error(1, r.state_error.size()),
                    r.state_error.back(), r.light_fraction, r.fallback_fraction);
      lines << row;
      std::snprintf(row, sizeof row, "| %llu | %s | %+.3f%% | %.2f%% | %.5f | %.4f | %.4f | %.1f%% | %.2f%% |\n",
                    static_cast<unsigned long long>(offset), r.name.c_str(), delta,
                    100.0 * r.agreement, r.output_error, r.mean_state_error(1, r.state_error.size()),
                    r.state_error.back(), 100.0 * r.light_fraction, 100.0 * r.fallback_fraction);
      table << row;
    }
  }
  std::cout << table.str();
  if (!tsv.empty()) write_text(tsv, lines.str());
  return 0;
}

struct Command {
  const char* name;
  const char* usage;
  int (*run)(int, char**);
};
constexpr Command kCommands[] = {{"trace", kTraceUsage, run_trace},
                                 {"run", kRunUsage, run_run},
                                 {"modes", kModesUsage, run_modes}};

const Command* find_command(std::string_view name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  using statepool::tools::report_usage_error;
  if (argc < 2) return report_usage_error(kTool, "no command given", kUsage);
  const std::string_view first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    const Command* command = argc > 2 ? find_command(argv[2]) : nullptr;
    if (argc > 2 && command == nullptr)
      return report_usage_error(kTool, "unknown command '" + std::string(argv[2]) + "'", kUsage);
    std::cout << (command == nullptr ? kUsage : command->usage);
    return 0;
  }
  const Command* command = find_command(first);
  if (command == nullptr)
    return report_usage_error(kTool, "unknown command '" + std::string(first) + "'", kUsage);
  try {
    return command->run(argc - 1, argv + 1);
  } catch (const UsageError& e) {
    return report_usage_error(kTool, e.what(), command->usage);
  } catch (const std::exception& e) {
    std::cerr << kTool << ": error: " << e.what() << "\n";
    return 1;
  }
}
