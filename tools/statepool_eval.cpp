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
    cases.push_back({std::move(name), spec, std::move(plan)});
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

struct Command {
  const char* name;
  const char* usage;
  int (*run)(int, char**);
};
constexpr Command kCommands[] = {{"trace", kTraceUsage, run_trace}, {"run", kRunUsage, run_run}};

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
