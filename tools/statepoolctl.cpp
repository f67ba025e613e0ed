// statepoolctl: talk to a running statepoold (ping, stats, install-plan, close-arena, drain,
// the prefix-state snapshots), and plan capacity offline from a model's config.json (plan; no
// daemon needed).
// Exit status: 0 success; 1 (kFailureExit) the daemon refused or could not be reached, or an
// input file (--model, install-plan FILE) could not be read or is not valid; 2
// (kUsageExit) a bad command line. A bad command line is reported with the usage; every
// other problem in one line without it.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/algorithm/hex.hpp>
#include <boost/json.hpp>

#include "common.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/planner/planner.hpp"
#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::tools::UsageError;

/// Exit status of everything but a bad command line (0: success, kUsageExit: usage).
constexpr int kFailureExit = 1;

constexpr const char* kUsage = R"(usage: statepoolctl [options] <command>

Talks to a running statepoold over its Unix socket.

commands:
  ping      round trip(s) to the daemon; prints the latency
  stats     arenas (pages used/total, bytes, compression ratio) and tenants
  install-plan FILE
            send a STEPQuant plan file (statepool-quant calibrate) to the daemon;
            prints the digest that stepquant layouts name it by
  close-arena ID
            give arena ID of --tenant back (its memory leaves the quota and the pool);
            refused while pages of it are held, it holds pinned snapshots, or a connected
            client opened it (`stats` lists arenas); its other snapshots are dropped
  drain     ask the daemon to finish in-flight work and exit (needs its uid or root)
  plan      capacity plan from a model's config.json (offline, no daemon): state bytes
            per request for each state codec, KV bytes, weights, max concurrency on one
            GPU and the concurrency where the state pool passes the weights
  fits      what fits now: how many more requests of a model's state (--model, --tp,
            --slots, --state-codec) the running daemon can take for --tenant, per codec
  snapshots [PREFIX]
            the prefix-state snapshots of --tenant's namespace whose key starts with
            PREFIX (all when left out), at most --limit (docs/prefix-store.md)
  snapshot-pin KEY POSITION, snapshot-unpin KEY POSITION
            pin (never evicted) or unpin the snapshots of a key, under every layout
  snapshot-delete KEY POSITION
            delete the snapshots of a key, under every layout (pinned ones too)
  snapshot-get KEY POSITION --out FILE [--layout-digest D]
            write the key's snapshot (state page and KV blocks, checksummed) to FILE
  snapshot-put FILE
            publish a snapshot written by snapshot-get (on this daemon or another) into
            --tenant's namespace; the tenant needs an arena of the snapshot's layout
  Keys are bytes: KEY and PREFIX are taken as text, or as hex digits with --hex.
  Engines publish and fetch snapshots of their own slots (put_snapshot / get_snapshot in
  the client library, docs/client.md); snapshot-get/put move them through files
  (docs/prefix-store.md, "Moving snapshots").

plan and fits options (fits takes --model, --tp, --slots and --state-codec):
  --model CONFIG.json    Hugging Face config (Qwen3-Next, Qwen3.5/3.8, Kimi-Linear)
  --weights-bits N       16, 8 or 4 (8/4: one fp16 scale per 128 weights; default 16)
  --kv NAME              KV cache: bf16, fp8, kivi2, kivi4, flexgen4 (default bf16)
  --state-codec LIST     all (default: fp32 bf16 int8 int6 stepquant6 stepquant4) or codec
                         names, comma-separated, one row each (a repeat counts once;
                         stepquant: nominal plan, docs/capacity.md)
  --slots N              state slots per request, 1-1024 (default 1)
  --context N            tokens per request, 1-16777216 (default 32768)
  --gpu-memory SIZE      memory of one GPU, e.g. 141GiB, 80GB; at most 1PiB (default 141GiB)
  --reserved F           fraction kept back for activations and runtime, in [0, 1)
                         (default 0.1)
  --tp N                 tensor-parallel degree, 1-1024 (default 1)
  --concurrency N        breakdown at N requests, 0-1048576 (default: at each codec's
                         maximum)

options:
  --socket PATH    daemon socket (default: $STATEPOOL_SOCKET, else
                   /run/statepool/statepool.sock; '@name' = abstract socket)
  --tenant NAME    tenant to connect as (default: the daemon's "default" tenant)
  --timeout MS     per-call timeout in milliseconds (default 10000)
  --count N        ping: number of round trips (default 1)
  --limit N        snapshots: at most N entries, 1-10000 (default 1000)
  --hex            snapshot commands: KEY and PREFIX are hex digits (e.g. 9f86d081)
  --json           machine-readable output (ping, stats, install-plan, close-arena, plan,
                   fits, snapshots, snapshot-*)
  -h, --help       this text

exit status: 0 success, 1 daemon error or daemon unreachable, or an unreadable or
unsupported --model config or plan file, 2 usage error (a bad option, or a plan input the
model cannot take, such as a --tp that does not divide its heads)
)";

struct Args {
  statepool::client::Options options;
  std::string command;
  std::string plan_file;    ///< install-plan
  std::uint32_t arena = 0;  ///< close-arena
  std::uint64_t count = 1;
  // snapshots, snapshot-*
  statepool::client::SnapshotKey key;  ///< prefix only for `snapshots`
  std::uint64_t limit = 1000;
  bool hex = false;
  std::string file;           ///< snapshot-get --out, snapshot-put FILE
  std::string layout_digest;  ///< snapshot-get
  // plan
  std::string model;
  statepool::planner::PlanInputs plan;
  bool json = false;
};

/// A text option that must not be empty (an empty --socket or --tenant would silently mean
/// something else: the default).
statepool::tools::po::typed_value<std::string>* non_empty(std::string& out, const char* option,
                                                          const char* instead) {
  return statepool::tools::parsed(out, [option, instead](const std::string& text) {
    if (text.empty()) throw UsageError(std::string("--") + option + " must not be empty" + instead);
    return text;
  });
}

/// The planner inputs each planning command reads (the others have none).
bool takes_plan_input(const std::string& command, std::string_view name) {
  if (command == "plan") return true;
  if (command == "fits") return name == "tp" || name == "slots" || name == "state-codec";
  return false;
}

bool is_snapshot_command(const std::string& command) {
  return command == "snapshots" || command == "snapshot-pin" || command == "snapshot-unpin" ||
         command == "snapshot-delete" || command == "snapshot-get" || command == "snapshot-put";
}

/// A KEY or PREFIX operand: its bytes as given, or decoded from hex digits.
std::string key_bytes(const std::string& operand, bool hex, const char* what) {
  if (!hex) return operand;
  std::string out;
  try {
    boost::algorithm::unhex(operand, std::back_inserter(out));
  } catch (const boost::algorithm::hex_decode_error&) {
    throw UsageError(std::string(what) + " '" + operand +
                     "' is not an even number of hex digits (--hex)");
  }
  return out;
}

/// A key for people: as text when every byte is printable ASCII, else "hex:" and digits.
std::string printable_key(const std::string& bytes) {
  const bool text = !bytes.empty() && std::all_of(bytes.begin(), bytes.end(),
                                                  [](char c) { return c >= 0x20 && c < 0x7f; });
  if (text) return bytes;
  std::string out = "hex:";
  boost::algorithm::hex_lower(bytes, std::back_inserter(out));
  return out;
}

/// Reads the command line into `args`; returns the exit status to leave with now (--help,
/// a usage error), or nullopt to go on.
std::optional<int> parse(int argc, char** argv, Args& args) {
  namespace po = statepool::tools::po;
  namespace planner = statepool::planner;
  using statepool::tools::bounded;
  args.options.socket_path = statepool::tools::default_socket();
  args.options.client_name = "statepoolctl";
  auto timeout_ms = static_cast<std::uint64_t>(args.options.timeout.count());
  std::vector<std::string> operands;

  statepool::tools::CommandLine cli("statepoolctl", kUsage);
  // clang-format off
  cli.add_options()
      ("json", po::bool_switch(&args.json))
      ("socket", non_empty(args.options.socket_path, "socket",
                           " (leave it out for $STATEPOOL_SOCKET or the default)"))
      ("tenant", non_empty(args.options.tenant, "tenant",
                           " (leave it out for the daemon's default tenant)"))
      ("timeout", bounded(timeout_ms, 1, 3600 * 1000))
      ("count", bounded(args.count, 1, 1000000))
      ("limit", bounded(args.limit, 1, 10000))
      ("hex", po::bool_switch(&args.hex))
      ("out", non_empty(args.file, "out", ""))
      ("layout-digest", non_empty(args.layout_digest, "layout-digest", ""))
      ("model", non_empty(args.model, "model", ""));
  // clang-format on
  // --NAME VALUE for every planner input, read by the planner's own parser (as the
  // daemon's HTTP API reads ?NAME=VALUE); a bad value is a usage error.
  for (const std::string_view name : planner::plan_input_names()) {
    cli.add_options()(std::string(name).c_str(),
                      po::value<std::string>()->notifier([&args, name](const std::string& value) {
                        try {
                          (void)planner::set_plan_input(args.plan, name, value);
                        } catch (const std::invalid_argument& e) {
                          throw UsageError(std::string("--") + e.what());
                        }
                      }));
  }
  cli.positional("command", args.command).positional("operand", operands, -1);

  const auto check = [&](const po::variables_map& given) {
    if (args.command.empty()) throw UsageError("no command given");
    if (args.command != "ping" && args.command != "stats" && args.command != "drain" &&
        args.command != "install-plan" && args.command != "plan" && args.command != "fits" &&
        args.command != "close-arena" && !is_snapshot_command(args.command)) {
      throw UsageError("unknown command '" + args.command + "'");
    }
    // An option the command does not read is refused rather than ignored.
    const bool planning = args.command == "plan" || args.command == "fits";
    for (const std::string_view name : planner::plan_input_names()) {
      if (given.count(std::string(name)) == 0 || takes_plan_input(args.command, name)) continue;
      throw UsageError("--" + std::string(name) +
                       (planning ? " does not apply to fits (it takes --model, --tp, --slots "
                                   "and --state-codec)"
                                 : " applies to plan and fits only"));
    }
    if (given.count("model") != 0 && !planning)
      throw UsageError("--model applies to plan and fits only");
    if (given.count("count") != 0 && args.command != "ping")
      throw UsageError("--count applies to ping only");
    if (given.count("limit") != 0 && args.command != "snapshots")
      throw UsageError("--limit applies to snapshots only");
    if (args.hex && !is_snapshot_command(args.command))
      throw UsageError("--hex applies to the snapshot commands only");
    if ((given.count("out") != 0 || given.count("layout-digest") != 0) &&
        args.command != "snapshot-get")
      throw UsageError("--out and --layout-digest apply to snapshot-get only");
    if (args.command == "snapshot-get" && args.file.empty())
      throw UsageError("snapshot-get needs --out FILE");
    auto operand = operands.begin();
    if (args.command == "install-plan") {
      if (operand == operands.end()) throw UsageError("install-plan needs a plan file");
      if (operand->empty()) throw UsageError("install-plan: the plan file name is empty");
      args.plan_file = *operand++;
    }
    if (args.command == "close-arena") {
      if (operand == operands.end()) throw UsageError("close-arena needs an arena ID");
      const std::string& id = *operand++;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), args.arena);
      if (id.empty() || ec != std::errc{} || end != id.data() + id.size() || args.arena == 0)
        throw UsageError("close-arena: ID must be an arena id (1 or more), got '" + id + "'");
    }
    if (args.command == "snapshots" && operand != operands.end()) {
      args.key.prefix = key_bytes(*operand++, args.hex, "PREFIX");
    } else if (args.command == "snapshot-put") {
      if (operand == operands.end()) throw UsageError("snapshot-put needs a FILE");
      if (operand->empty()) throw UsageError("snapshot-put: the file name is empty");
      args.file = *operand++;
    } else if (is_snapshot_command(args.command) && args.command != "snapshots") {
      if (operands.end() - operand < 2) throw UsageError(args.command + " needs KEY and POSITION");
      args.key.prefix = key_bytes(*operand++, args.hex, "KEY");
      if (args.key.prefix.empty()) throw UsageError(args.command + ": KEY must not be empty");
      const std::string& position = *operand++;
      std::size_t used = 0;
      try {
        if (position.empty() || position[0] == '-') throw std::invalid_argument(position);
        args.key.position = std::stoull(position, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != position.size()) {
        throw UsageError(args.command + ": POSITION must be a token position (0 or more), got '" +
                         position + "'");
      }
    }
    if (operand != operands.end())
      throw UsageError("unexpected argument '" + *operand + "' (one command at a time)");
    if ((args.command == "plan" || args.command == "fits") && args.model.empty())
      throw UsageError(args.command + " needs --model CONFIG.json");
  };
  const auto exit_status = cli.parse(argc, argv, check);
  args.options.timeout = std::chrono::milliseconds(timeout_ms);
  return exit_status;
}

/// A number for --json; null when it is not finite (JSON has neither NaN nor infinity).
boost::json::value json_number(double value) {
  return std::isfinite(value) ? boost::json::value(value) : boost::json::value(nullptr);
}

/// A compression ratio for --json: null while nothing is stored (the ratio is undefined).
boost::json::value json_ratio(double ratio) {
  return ratio > 0.0 ? json_number(ratio) : boost::json::value(nullptr);
}

/// stats --json: every field of the reply, names as in the wire schema, plus the derived
/// stored bytes and ratios.
boost::json::object stats_json(const statepool::client::Stats& s) {
  boost::json::array arenas;
  for (const auto& a : s.arenas) {
    arenas.push_back(boost::json::object{{"arena_id", a.arena_id},
                                         {"tenant", a.tenant},
                                         {"layout_id", a.layout_id},
                                         {"layout_name", a.layout_name},
                                         {"codec", statepool::kernels::to_string(a.codec)},
                                         {"backend", a.backend},
                                         {"page_bytes", a.page_bytes},
                                         {"page_stride", a.page_stride},
                                         {"pages_total", a.pages_total},
                                         {"pages_used", a.pages_used},
                                         {"bytes_total", a.bytes_total},
                                         {"stored_bytes_used", a.stored_bytes_used()},
                                         {"fp32_bytes_used", a.fp32_bytes_used},
                                         {"compression_ratio", json_ratio(a.compression_ratio())}});
  }
  boost::json::array tenants;
  for (const auto& t : s.tenants) {
    tenants.push_back(
        boost::json::object{{"tenant", t.tenant},
                            {"quota_bytes", t.quota_bytes},
                            {"reserved_bytes", t.reserved_bytes},
                            {"pages_used", t.pages_used},
                            {"stored_bytes", t.stored_bytes},
                            {"fp32_bytes", t.fp32_bytes},
                            {"compression_ratio", json_ratio(t.compression_ratio())}});
  }
  return {{"uptime_seconds", json_number(s.uptime_seconds)},
          {"generation", s.generation},
          {"clients_connected", s.clients_connected},
          {"leases_active", s.leases_active},
          {"leases_orphaned", s.leases_orphaned},
          {"pages_reclaimed_total", s.pages_reclaimed_total},
          {"pool_capacity_bytes", s.pool_capacity_bytes},
          {"pool_reserved_bytes", s.pool_reserved_bytes},
          {"arenas", std::move(arenas)},
          {"tenants", std::move(tenants)}};
}

double micros(std::chrono::nanoseconds d) {
  return static_cast<double>(d.count()) / 1000.0;
}

void ping(statepool::client::Connection& conn, const Args& args) {
  std::vector<double> us;
  us.reserve(args.count);
  for (std::uint64_t i = 0; i < args.count; ++i) us.push_back(micros(conn.ping()));
  double min = us.front();
  double max = us.front();
  double sum = 0.0;
  for (const double v : us) {
    min = std::min(min, v);
    max = std::max(max, v);
    sum += v;
  }
  const double mean = sum / static_cast<double>(us.size());
  using statepool::tools::format_fixed;
  if (args.json) {
    const boost::json::object out{
        {"server", conn.server()},      {"protocol_version", conn.protocol_version()},
        {"count", us.size()},           {"min_us", json_number(min)},
        {"mean_us", json_number(mean)}, {"max_us", json_number(max)}};
    std::cout << boost::json::serialize(out) << '\n';
    return;
  }
  if (us.size() == 1) {
    std::cout << "pong from " << conn.server() << " (protocol " << conn.protocol_version()
              << "): " << format_fixed(mean, 1) << " us\n";
  } else {
    std::cout << us.size() << " pongs from " << conn.server() << " (protocol "
              << conn.protocol_version() << "): min " << format_fixed(min, 1) << " us, mean "
              << format_fixed(mean, 1) << " us, max " << format_fixed(max, 1) << " us\n";
  }
}

/// The plan of --model under the plan inputs (plan and fits, before any daemon is asked).
/// nullopt after reporting, in one line, why not: kFailureExit for a config that cannot be
/// read or is not supported (the message names the path and the config.json key),
/// kUsageExit for inputs the model cannot take (a --tp that does not divide its heads).
std::optional<statepool::planner::PlanReport> plan_model(const Args& args, int& exit_status) {
  namespace planner = statepool::planner;
  planner::ModelSpec model;
  try {
    model = planner::load_model(args.model);
  } catch (const std::exception& e) {
    std::cerr << "statepoolctl: " << e.what() << '\n';
    exit_status = kFailureExit;
    return std::nullopt;
  }
  try {
    return planner::plan(model, args.plan);
  } catch (const std::invalid_argument& e) {
    std::cerr << "statepoolctl: " << args.command << ": " << e.what() << '\n';
    exit_status = statepool::tools::kUsageExit;
    return std::nullopt;
  } catch (const std::exception& e) {
    std::cerr << "statepoolctl: " << args.command << ": " << e.what() << '\n';
    exit_status = kFailureExit;
    return std::nullopt;
  }
}

/// statepoolctl fits: registers the model's per-GPU state shape and asks the daemon
/// (FitsNow); printed by the planner's own formatters, so it reads like POST /v1/plan.
void fits_command(statepool::client::Connection& conn, const Args& args,
                  const statepool::planner::PlanReport& report) {
  namespace planner = statepool::planner;
  statepool::kernels::StateLayout layout = report.layout;
  layout.name = report.model.model_type + "-tp" + std::to_string(args.plan.tp);
  const auto info = conn.register_layout(layout);
  const auto fits = conn.fits_now(info, args.plan.slots, args.plan.codecs);
  planner::FitsReport out;
  out.shape = report.layout;
  out.slots = args.plan.slots;
  out.live.tenant = fits.tenant;
  out.live.capacity = fits.pool_capacity_bytes;
  out.live.free = fits.pool_free_bytes;
  out.live.quota_free = fits.quota_free_bytes;
  out.live.max_arena_pages = fits.max_arena_pages;
  for (const auto& f : fits.codecs) {
    planner::FitRow row;
    row.codec = f.codec;
    row.nominal_plan = f.nominal_plan;
    row.page_stride = f.page_stride;
    row.arena_pages = f.arena_free_pages;
    row.new_pages = f.new_arena_pages;
    row.requests = f.requests;
    for (const auto limit : {planner::FitLimit::arena, planner::FitLimit::pool,
                             planner::FitLimit::quota, planner::FitLimit::max_arena_pages}) {
      if (f.limited_by == planner::to_string(limit)) row.limit = limit;
    }
    out.rows.push_back(row);
  }
  std::cout << (args.json ? planner::format_json(out) : planner::format_text(out));
}

/// A snapshot's KV blocks as JSON (null when it has none).
boost::json::value kv_json(const statepool::client::SnapshotInfo& s) {
  if (!s.kv) return nullptr;
  return boost::json::object{{"codec", statepool::kernels::to_string(s.kv->codec)},
                             {"layers", s.kv->layers},
                             {"key_channels", s.kv->key_channels},
                             {"value_channels", s.kv->value_channels},
                             {"tokens", s.kv->tokens},
                             {"bytes", s.kv_bytes}};
}

/// statepoolctl snapshots: one line per snapshot (or the reply as JSON).
void snapshots_command(statepool::client::Connection& conn, const Args& args) {
  using statepool::support::format_bytes;
  const auto list = conn.list_snapshots(args.key.prefix, static_cast<std::uint32_t>(args.limit));
  if (args.json) {
    boost::json::array rows;
    for (const auto& s : list.snapshots) {
      std::string hex;
      boost::algorithm::hex_lower(s.key.prefix, std::back_inserter(hex));
      rows.push_back(boost::json::object{{"key", printable_key(s.key.prefix)},
                                         {"key_hex", hex},
                                         {"position", s.key.position},
                                         {"layout_id", s.layout_id},
                                         {"layout_name", s.layout_name},
                                         {"codec", statepool::kernels::to_string(s.codec)},
                                         {"tenant", s.tenant},
                                         {"arena_id", s.arena_id},
                                         {"page_bytes", s.page_bytes},
                                         {"fp32_bytes", s.fp32_bytes},
                                         {"pinned", s.pinned},
                                         {"hits", s.hits},
                                         {"age_seconds", json_number(s.age_seconds)},
                                         {"idle_seconds", json_number(s.idle_seconds)},
                                         {"pages", s.pages},
                                         {"layout_digest", s.layout_digest},
                                         {"kv", kv_json(s)}});
    }
    const boost::json::object out{{"snapshot_namespace", list.snapshot_namespace},
                                  {"truncated", list.truncated},
                                  {"snapshots", std::move(rows)}};
    std::cout << boost::json::serialize(out) << '\n';
    return;
  }
  using statepool::tools::format_fixed;
  std::cout << list.snapshots.size() << (list.truncated ? "+" : "") << " snapshots in namespace '"
            << list.snapshot_namespace << "'"
            << (list.truncated ? " (more match: raise --limit or give a longer PREFIX)" : "")
            << "\n";
  if (list.snapshots.empty()) return;
  statepool::tools::Table table({"key", "position", "layout", "codec", "tenant", "page",
                                 "kv blocks", "pinned", "hits", "idle"},
                                {false, true, false, false, false, true, false, false, true, true});
  for (const auto& s : list.snapshots) {
    // "kivi2 12x1024 tok 1.2 MiB": codec, layers x tokens, encoded bytes.
    const std::string kv = !s.kv ? "-"
                                 : std::string(statepool::kernels::to_string(s.kv->codec)) + " " +
                                       std::to_string(s.kv->layers) + "x" +
                                       std::to_string(s.kv->tokens) + " tok " +
                                       format_bytes(s.kv_bytes);
    table.add({printable_key(s.key.prefix), std::to_string(s.key.position), s.layout_name,
               statepool::kernels::to_string(s.codec), s.tenant, format_bytes(s.page_bytes), kv,
               s.pinned ? "yes" : "no", std::to_string(s.hits),
               format_fixed(s.idle_seconds, 1) + " s"});
  }
  table.print(std::cout, "  ");
}

/// The host bytes of a staging buffer; snapshot-get/put need them.
std::span<std::byte> host_staging(const statepool::client::Staging& staging) {
  if (staging.bytes().empty()) {
    throw std::runtime_error(
        "this daemon's staging buffers are device memory (cuda backend): snapshot-get and "
        "snapshot-put need host staging, not supported there yet");
  }
  return staging.bytes();
}

std::string kv_text(const std::optional<statepool::kernels::KvBlocks>& kv) {
  if (!kv) return "no KV blocks";
  return statepool::kernels::describe(*kv);
}

/// snapshot-get: the key's snapshot as a file.
void snapshot_get_command(statepool::client::Connection& conn, const Args& args) {
  const std::string name =
      printable_key(args.key.prefix) + " at position " + std::to_string(args.key.position);
  const auto size = conn.export_snapshot(args.key, nullptr, 0, args.layout_digest);
  if (!size) {
    throw std::runtime_error(
        "no snapshot of " + name +
        (args.layout_digest.empty() ? std::string() : " for layout " + args.layout_digest) +
        " in the pool (statepoolctl snapshots lists them)");
  }
  statepool::client::Staging staging = conn.open_staging(size.value_bytes);
  const auto got = conn.export_snapshot(args.key, &staging, 0, size.layout_digest);
  if (!got) throw std::runtime_error("the snapshot of " + name + " was deleted meanwhile");
  statepool::support::write_file_atomic(args.file, host_staging(staging).first(got.value_bytes));
  if (args.json) {
    const boost::json::object out{
        {"file", args.file},
        {"bytes", got.value_bytes},
        {"layout_digest", got.layout_digest},
        {"kv", got.kv ? boost::json::value(statepool::kernels::describe(*got.kv))
                      : boost::json::value(nullptr)}};
    std::cout << boost::json::serialize(out) << '\n';
    return;
  }
  std::cout << "snapshot of " << name << " (layout " << got.layout_digest << ", " << kv_text(got.kv)
            << "): " << got.value_bytes << " bytes written to " << args.file << '\n';
}

/// snapshot-put: a file from snapshot-get published again.
void snapshot_put_command(statepool::client::Connection& conn, const Args& args) {
  // At most 64 GiB: far above any state plus its KV blocks, and a bound on a wrong file.
  const std::string value = statepool::support::read_file(args.file, std::size_t{64} << 30);
  if (value.empty()) throw std::runtime_error(args.file + ": empty file");
  statepool::client::Staging staging = conn.open_staging(value.size());
  std::memcpy(host_staging(staging).data(), value.data(), value.size());
  const auto put = conn.import_snapshot(staging, 0, value.size());
  const std::string name =
      printable_key(put.key.prefix) + " at position " + std::to_string(put.key.position);
  if (args.json) {
    const boost::json::object out{{"key", printable_key(put.key.prefix)},
                                  {"position", put.key.position},
                                  {"created", put.created},
                                  {"evicted", put.evicted},
                                  {"arena_id", put.arena_id},
                                  {"pages", put.pages}};
    std::cout << boost::json::serialize(out) << '\n';
    return;
  }
  std::cout << "snapshot of " << name
            << (put.created ? " published in arena " : " already there, in arena ") << put.arena_id
            << " (" << put.pages << " pages, " << kv_text(put.kv) << ")"
            << (put.evicted > 0 ? ", " + std::to_string(put.evicted) + " evicted for it" : "")
            << '\n';
}

/// snapshot-pin, snapshot-unpin, snapshot-delete.
void snapshot_change_command(statepool::client::Connection& conn, const Args& args) {
  const bool remove = args.command == "snapshot-delete";
  const std::uint32_t count = remove ? conn.delete_snapshot(args.key)
                                     : conn.pin_snapshot(args.key, args.command == "snapshot-pin");
  if (args.json) {
    std::cout << boost::json::serialize(
                     boost::json::object{{remove ? "deleted" : "changed", count}})
              << '\n';
    return;
  }
  const char* verb = remove ? "deleted" : args.command == "snapshot-pin" ? "pinned" : "unpinned";
  std::cout << count << " snapshot" << (count == 1 ? "" : "s") << " of "
            << printable_key(args.key.prefix) << " at position " << args.key.position << " " << verb
            << (count == 0 && !remove ? " (none found, or all were already)" : "") << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const auto exit_status = parse(argc, argv, args)) return *exit_status;
  // Local inputs first: a bad model config or plan file is reported as such, with or
  // without a daemon, and never reaches one.
  std::optional<statepool::planner::PlanReport> report;
  if (args.command == "plan" || args.command == "fits") {
    int exit_status = 0;
    report = plan_model(args, exit_status);
    if (!report) return exit_status;
  }
  if (args.command == "plan") {
    try {
      std::cout << (args.json ? statepool::planner::format_json(*report)
                              : statepool::planner::format_text(*report));
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "statepoolctl: " << e.what() << '\n';
      return kFailureExit;
    }
  }
  std::optional<statepool::kernels::stepquant::Plan> plan_file;
  if (args.command == "install-plan") {
    try {
      plan_file = statepool::kernels::stepquant::load(args.plan_file);
    } catch (const std::exception& e) {
      std::cerr << "statepoolctl: " << e.what() << '\n';
      return kFailureExit;
    }
  }
  try {
    auto conn = statepool::client::Connection::connect(args.options);
    if (args.command == "ping") {
      ping(conn, args);
    } else if (args.command == "stats") {
      const auto stats = conn.stats();
      if (args.json) {
        std::cout << boost::json::serialize(stats_json(stats)) << '\n';
      } else {
        std::cout << conn.server() << " at " << args.options.socket_path << "\n";
        statepool::tools::print_stats(std::cout, stats);
      }
    } else if (args.command == "install-plan") {
      const auto info = conn.install_plan(*plan_file);  // loaded and validated above
      if (args.json) {
        const boost::json::object out{{"digest", info.digest},
                                      {"units", info.units},
                                      {"pivots", info.pivots},
                                      {"average_bits", json_number(info.average_bits)},
                                      {"created", info.created}};
        std::cout << boost::json::serialize(out) << '\n';
      } else {
        std::cout << "plan " << info.digest << (info.created ? " installed" : " already installed")
                  << ": " << info.units << " units, " << info.pivots << " pivots, "
                  << statepool::tools::format_fixed(info.average_bits, 2)
                  << " bits per value on average\n";
      }
    } else if (args.command == "close-arena") {
      const auto closed = conn.close_arena(args.arena);
      if (args.json) {
        const boost::json::object out{{"arena_id", args.arena},
                                      {"bytes", closed.bytes},
                                      {"snapshots_dropped", closed.snapshots_dropped}};
        std::cout << boost::json::serialize(out) << '\n';
      } else {
        std::cout << "arena " << args.arena
                  << " closed: " << statepool::support::format_bytes(closed.bytes) << " given back"
                  << (closed.snapshots_dropped > 0
                          ? ", " + std::to_string(closed.snapshots_dropped) + " snapshots dropped"
                          : "")
                  << '\n';
      }
    } else if (args.command == "fits") {
      fits_command(conn, args, *report);
    } else if (args.command == "snapshots") {
      snapshots_command(conn, args);
    } else if (args.command == "snapshot-get") {
      snapshot_get_command(conn, args);
    } else if (args.command == "snapshot-put") {
      snapshot_put_command(conn, args);
    } else if (is_snapshot_command(args.command)) {
      snapshot_change_command(conn, args);
    } else {
      conn.drain();
      if (!args.json) std::cout << "statepoold at " << args.options.socket_path << " is draining\n";
    }
    return 0;
  } catch (const statepool::client::ConnectionError& e) {
    std::cerr << "statepoolctl: " << e.what() << '\n';
    return kFailureExit;
  } catch (const statepool::client::Error& e) {
    std::cerr << "statepoolctl: " << args.command << " failed ("
              << statepool::status_name(e.status()) << "): " << e.what() << '\n';
    return kFailureExit;
  } catch (const std::exception& e) {
    std::cerr << "statepoolctl: " << e.what() << '\n';
    return kFailureExit;
  }
}
