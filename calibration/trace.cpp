#include "statepool/calibration/trace.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <utility>

#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"

namespace statepool::calibration {
namespace {

constexpr std::size_t kMaxManifestBytes = 1u << 20;

[[noreturn]] void fail(const std::string& message) {
  throw TraceError(message);
}

std::uint64_t parse_u64(const std::string& text, const std::string& where) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end) {
    fail(where + ": '" + text + "' is not a non-negative integer");
  }
  return value;
}

std::uint32_t parse_u32(const std::string& text, const std::string& where) {
  const std::uint64_t value = parse_u64(text, where);
  if (value > 0xFFFFFFFFull) {
    fail(where + ": " + text + " is too large");
  }
  return static_cast<std::uint32_t>(value);
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) {
    return {};
  }
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::uint32_t TraceManifest::gate_values() const noexcept {
  return arch == kernels::Arch::gdn ? 1u : key_dim;
}

std::string TraceManifest::validate() const {
  if (layers == 0 || layers > kernels::kMaxLayers) {
    return "layers must be between 1 and " + std::to_string(kernels::kMaxLayers);
  }
  if (heads == 0 || heads > kernels::kMaxHeads) {
    return "heads must be between 1 and " + std::to_string(kernels::kMaxHeads);
  }
  if (key_dim == 0 || key_dim > kernels::kMaxHeadDim || value_dim == 0 ||
      value_dim > kernels::kMaxHeadDim) {
    return "key_dim and value_dim must be between 1 and " + std::to_string(kernels::kMaxHeadDim);
  }
  if (tokens == 0) {
    return "tokens must be positive";
  }
  if (sequence_starts.empty() || sequence_starts.front() != 0) {
    return "sequence_starts must begin with 0";
  }
  for (std::size_t i = 1; i < sequence_starts.size(); ++i) {
    if (sequence_starts[i] <= sequence_starts[i - 1]) {
      return "sequence_starts must be strictly increasing";
    }
  }
  if (sequence_starts.back() >= tokens) {
    return "sequence_starts holds " + std::to_string(sequence_starts.back()) +
           ", past the last token " + std::to_string(tokens - 1);
  }
  return {};
}

TraceManifest parse_manifest(const std::string& text, const std::string& what) {
  TraceManifest manifest;
  std::set<std::string> seen;
  std::istringstream lines(text);
  std::string line;
  std::size_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (const auto hash = line.find('#'); hash != std::string::npos) {
      line.resize(hash);
    }
    line = trim(line);
    if (line.empty()) {
      continue;
    }
    const std::string where = what + ": line " + std::to_string(number);
    const auto space = line.find_first_of(" \t");
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? std::string() : trim(line.substr(space));
    if (!seen.insert(key).second) {
      fail(where + ": key '" + key + "' appears twice");
    }
    if (value.empty()) {
      fail(where + ": key '" + key + "' has no value");
    }
    if (key == "format") {
      if (value != kTraceFormat) {
        fail(where + ": format '" + value + "' is not supported (expected " + kTraceFormat + ")");
      }
    } else if (key == "arch") {
      if (value == "gdn") {
        manifest.arch = kernels::Arch::gdn;
      } else if (value == "kda") {
        manifest.arch = kernels::Arch::kda;
      } else {
        fail(where + ": arch must be gdn or kda, got '" + value + "'");
      }
    } else if (key == "layers") {
      manifest.layers = parse_u32(value, where);
    } else if (key == "heads") {
      manifest.heads = parse_u32(value, where);
    } else if (key == "key_dim") {
      manifest.key_dim = parse_u32(value, where);
    } else if (key == "value_dim") {
      manifest.value_dim = parse_u32(value, where);
    } else if (key == "tokens") {
      manifest.tokens = parse_u64(value, where);
    } else if (key == "sequence_starts") {
      manifest.sequence_starts.clear();
      std::istringstream items(value);
      std::string item;
      while (items >> item) {
        manifest.sequence_starts.push_back(parse_u64(item, where));
      }
    } else if (key == "synthetic") {
      if (value != "yes" && value != "no") {
        fail(where + ": synthetic must be yes or no");
      }
      manifest.synthetic = value == "yes";
    } else if (key == "source") {
      manifest.source = value;
    } else {
      fail(where + ": unknown key '" + key + "'");
    }
  }
  for (const char* required :
       {"format", "arch", "layers", "heads", "key_dim", "value_dim", "tokens"}) {
    if (seen.count(required) == 0) {
      fail(what + ": missing required key '" + required + "'");
    }
  }
  if (const std::string problem = manifest.validate(); !problem.empty()) {
    fail(what + ": " + problem);
  }
  return manifest;
}

std::string format_manifest(const TraceManifest& manifest) {
  std::ostringstream out;
  out << "# statepool calibration trace (docs/calibration.md)\n"
      << "format " << kTraceFormat << "\n"
      << "arch " << kernels::to_string(manifest.arch) << "\n"
      << "layers " << manifest.layers << "\n"
      << "heads " << manifest.heads << "\n"
      << "key_dim " << manifest.key_dim << "\n"
      << "value_dim " << manifest.value_dim << "\n"
      << "tokens " << manifest.tokens << "\n"
      << "sequence_starts";
  for (const std::uint64_t start : manifest.sequence_starts) {
    out << ' ' << start;
  }
  out << "\nsynthetic " << (manifest.synthetic ? "yes" : "no") << "\n";
  if (!manifest.source.empty()) {
    std::string source = manifest.source;
    for (char& c : source) {
      if (c == '\n' || c == '#') {
        c = ' ';
      }
    }
    out << "source " << source << "\n";
  }
  return out.str();
}

std::string trace_file(const std::string& dir, std::uint32_t layer, const std::string& tensor) {
  return (std::filesystem::path(dir) / ("layer" + std::to_string(layer) + "." + tensor + ".npy"))
      .string();
}

// --- TraceReader -------------------------------------------------------------------------

struct TraceReader::LayerFiles {
  NpyReader q, k, v, g, beta;
};

TraceReader::TraceReader(std::string dir) : dir_(std::move(dir)) {
  const std::string manifest_path = (std::filesystem::path(dir_) / kManifestName).string();
  std::string text;
  try {
    text = support::read_file(manifest_path, kMaxManifestBytes);
  } catch (const std::runtime_error& e) {
    fail(std::string(e.what()) + " (a trace directory holds " + kManifestName +
         " and layer{L}.{q,k,v,g,beta}.npy; see docs/calibration.md)");
  }
  manifest_ = parse_manifest(text, manifest_path);
  const TraceManifest& m = manifest_;
  const auto open = [&](std::uint32_t layer, const char* tensor, std::vector<std::uint64_t> shape) {
    NpyReader reader(trace_file(dir_, layer, tensor));
    if (reader.shape() != shape) {
      fail(reader.path() + ": shape " + shape_text(reader.shape()) + " does not match the " +
           "manifest, expected " + shape_text(shape));
    }
    return reader;
  };
  std::vector<std::uint64_t> gate_shape{m.tokens, m.heads};
  if (m.arch == kernels::Arch::kda) {
    gate_shape.push_back(m.key_dim);
  }
  for (std::uint32_t layer = 0; layer < m.layers; ++layer) {
    layers_.push_back(std::make_unique<LayerFiles>(
        LayerFiles{open(layer, "q", {m.tokens, m.heads, m.key_dim}),
                   open(layer, "k", {m.tokens, m.heads, m.key_dim}),
                   open(layer, "v", {m.tokens, m.heads, m.value_dim}), open(layer, "g", gate_shape),
                   open(layer, "beta", {m.tokens, m.heads})}));
  }
}

TraceReader::~TraceReader() = default;

void TraceReader::read(std::uint32_t layer, std::uint64_t first, std::uint64_t count,
                       TokenBlock& out) const {
  const TraceManifest& m = manifest_;
  if (layer >= m.layers) {
    fail(dir_ + ": layer " + std::to_string(layer) + " of " + std::to_string(m.layers));
  }
  const LayerFiles& files = *layers_[layer];
  out.first = first;
  out.count = count;
  const std::size_t n = static_cast<std::size_t>(count) * m.heads;
  out.q.resize(n * m.key_dim);
  out.k.resize(n * m.key_dim);
  out.v.resize(n * m.value_dim);
  out.g.resize(n * m.gate_values());
  out.beta.resize(n);
  files.q.read_rows(first, count, out.q);
  files.k.read_rows(first, count, out.k);
  files.v.read_rows(first, count, out.v);
  files.g.read_rows(first, count, out.g);
  files.beta.read_rows(first, count, out.beta);

  const auto where = [&](const NpyReader& file, std::size_t index, std::size_t per_token) {
    const std::size_t per_head = per_token / m.heads;
    return file.path() + ": token " + std::to_string(first + index / per_token) + " head " +
           std::to_string((index % per_token) / per_head);
  };
  const auto check_finite = [&](const NpyReader& file, const std::vector<float>& values,
                                std::size_t per_token) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        fail(where(file, i, per_token) + ": non-finite value " + std::to_string(values[i]));
      }
    }
  };
  check_finite(files.q, out.q, std::size_t{m.heads} * m.key_dim);
  check_finite(files.k, out.k, std::size_t{m.heads} * m.key_dim);
  check_finite(files.v, out.v, std::size_t{m.heads} * m.value_dim);
  const std::size_t gate_per_token = std::size_t{m.heads} * m.gate_values();
  for (std::size_t i = 0; i < out.g.size(); ++i) {
    // -inf is a valid gate (full reset); NaN, +inf and positive values are not.
    if (std::isnan(out.g[i]) || out.g[i] > 0.0f) {
      fail(where(files.g, i, gate_per_token) + ": log-decay " + std::to_string(out.g[i]) +
           " must be <= 0 (g = log of the decay factor; pass log-space gates, not exp(g))");
    }
  }
  for (std::size_t i = 0; i < out.beta.size(); ++i) {
    if (!(out.beta[i] >= 0.0f && out.beta[i] <= 1.0f)) {
      fail(where(files.beta, i, m.heads) + ": beta " + std::to_string(out.beta[i]) +
           " is outside [0, 1] (pass sigmoid(b), not the logit)");
    }
  }
}

// --- TraceWriter -------------------------------------------------------------------------

struct TraceWriter::LayerWriters {
  LayerWriters(const std::string& dir, std::uint32_t layer, const TraceManifest& m,
               const std::vector<std::uint64_t>& gate_shape)
      : q(trace_file(dir, layer, "q"), {m.tokens, m.heads, m.key_dim}),
        k(trace_file(dir, layer, "k"), {m.tokens, m.heads, m.key_dim}),
        v(trace_file(dir, layer, "v"), {m.tokens, m.heads, m.value_dim}),
        g(trace_file(dir, layer, "g"), gate_shape),
        beta(trace_file(dir, layer, "beta"), {m.tokens, m.heads}) {}

  std::uint64_t written = 0;
  NpyWriter q, k, v, g, beta;
};

TraceWriter::TraceWriter(std::string dir, TraceManifest manifest)
    : dir_(std::move(dir)), manifest_(std::move(manifest)) {
  if (const std::string problem = manifest_.validate(); !problem.empty()) {
    fail("trace " + dir_ + ": " + problem);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    fail(dir_ + ": cannot create the trace directory: " + ec.message());
  }
  if (std::filesystem::exists(std::filesystem::path(dir_) / kManifestName)) {
    fail(dir_ + ": already holds a trace (" + kManifestName + "); choose a new directory");
  }
}

TraceWriter::~TraceWriter() {
  current_.reset();  // removes the partial files of an unfinished layer
  if (!finished_) {
    // No manifest was written: remove the complete layer files too, so that nothing looks
    // like part of a trace.
    for (std::uint32_t layer = 0; layer <= next_layer_ && layer < manifest_.layers; ++layer) {
      for (const char* tensor : {"q", "k", "v", "g", "beta"}) {
        ::unlink(trace_file(dir_, layer, tensor).c_str());
      }
    }
  }
}

void TraceWriter::begin_layer(std::uint32_t layer) {
  const TraceManifest& m = manifest_;
  if (current_ || layer != next_layer_ || layer >= m.layers || finished_) {
    fail(dir_ + ": layers must be written once each, in order (expected layer " +
         std::to_string(next_layer_) + ")");
  }
  std::vector<std::uint64_t> gate_shape{m.tokens, m.heads};
  if (m.arch == kernels::Arch::kda) {
    gate_shape.push_back(m.key_dim);
  }
  current_ = std::make_unique<LayerWriters>(dir_, layer, m, gate_shape);
}

void TraceWriter::append(const TokenBlock& block) {
  const TraceManifest& m = manifest_;
  if (!current_) {
    fail(dir_ + ": append() outside begin_layer() / end_layer()");
  }
  const std::size_t n = static_cast<std::size_t>(block.count) * m.heads;
  if (block.first != current_->written || block.q.size() != n * m.key_dim ||
      block.k.size() != n * m.key_dim || block.v.size() != n * m.value_dim ||
      block.g.size() != n * m.gate_values() || block.beta.size() != n) {
    fail(dir_ + ": token block does not match the manifest or does not continue the layer");
  }
  current_->q.append(block.q);
  current_->k.append(block.k);
  current_->v.append(block.v);
  current_->g.append(block.g);
  current_->beta.append(block.beta);
  current_->written += block.count;
}

void TraceWriter::end_layer() {
  if (!current_) {
    fail(dir_ + ": end_layer() without begin_layer()");
  }
  current_->q.finish();
  current_->k.finish();
  current_->v.finish();
  current_->g.finish();
  current_->beta.finish();
  current_.reset();
  ++next_layer_;
}

void TraceWriter::finish() {
  if (current_ || next_layer_ != manifest_.layers) {
    fail(dir_ + ": finish() before every layer was written");
  }
  const std::string text = format_manifest(manifest_);
  support::write_file_atomic((std::filesystem::path(dir_) / kManifestName).string(),
                             std::as_bytes(std::span<const char>(text)));
  finished_ = true;
}

}  // namespace statepool::calibration
