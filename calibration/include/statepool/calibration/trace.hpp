#pragma once
// Calibration traces: the per-token inputs of every linear-attention layer of a model,
// as an engine (or synth-trace) dumps them. Format (docs/calibration.md):
//
//   DIR/manifest.txt           "key value" lines (see TraceManifest; '#' starts a comment)
//   DIR/layer{L}.q.npy         [tokens, heads, K]  float32 ('<f4', C order)
//   DIR/layer{L}.k.npy         [tokens, heads, K]
//   DIR/layer{L}.v.npy         [tokens, heads, V]
//   DIR/layer{L}.g.npy         [tokens, heads] (GDN) or [tokens, heads, K] (KDA): log-decay <= 0
//   DIR/layer{L}.beta.npy      [tokens, heads]: write strength in [0, 1]
//
// L runs over 0 .. layers-1 (the linear-attention layers only, in model order; no zero
// padding). q and k may be raw or already normalised: readers of a trace L2-normalise
// both and scale q by 1/sqrt(K) (normalize_qk, idempotent). Several sequences share one
// trace: `sequence_starts` lists the first token of each; the recurrent state is reset
// to zero at each start.
//
// Memory: TraceReader reads blocks of tokens of one layer (NpyReader, pread), so a trace
// of any length is processed with a buffer of a few blocks.
//
// Thread-safety: a TraceReader may be read concurrently; a TraceWriter is one thread's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/calibration/npy.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::calibration {

/// Bad trace (missing file, shape mismatch, invalid value). The message names the file.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kTraceFormat = "statepool-trace-1";
inline constexpr const char* kManifestName = "manifest.txt";

/// manifest.txt, e.g.
///   format statepool-trace-1
///   arch gdn
///   layers 36
///   heads 32
///   key_dim 128
///   value_dim 128
///   tokens 65536
///   sequence_starts 0 2048 4096 ...     (optional; default: one sequence starting at 0)
///   synthetic yes                       (optional; default no)
///   source qwen3-next-80b, wikitext-2   (optional free text, rest of the line)
struct TraceManifest {
  kernels::Arch arch = kernels::Arch::gdn;
  std::uint32_t layers = 0;
  std::uint32_t heads = 0;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::uint64_t tokens = 0;
  std::vector<std::uint64_t> sequence_starts{0};
  bool synthetic = false;
  std::string source;

  /// Empty when consistent, else a message (zero sizes, starts not increasing from 0 or
  /// past the end, dimensions above the layout limits).
  [[nodiscard]] std::string validate() const;
  /// Values per token of g: 1 (GDN) or K (KDA).
  [[nodiscard]] std::uint32_t gate_values() const noexcept;
};

/// Parses manifest text; throws TraceError("<what>: line N: ...") on unknown keys,
/// repeated keys, missing required keys, malformed numbers or an inconsistent manifest.
[[nodiscard]] TraceManifest parse_manifest(const std::string& text, const std::string& what);
[[nodiscard]] std::string format_manifest(const TraceManifest& manifest);

/// File of tensor `tensor` ("q", "k", "v", "g", "beta") of layer `layer` in `dir`.
[[nodiscard]] std::string trace_file(const std::string& dir, std::uint32_t layer,
                                     const std::string& tensor);

/// Inputs of `count` consecutive tokens of one layer (all heads), as stored:
/// q, k [count][heads][K]; v [count][heads][V]; g [count][heads][gate_values]; beta
/// [count][heads].
struct TokenBlock {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  std::vector<float> q, k, v, g, beta;
};

class TraceReader {
 public:
  /// Reads the manifest and opens every layer file, checking each shape. Throws
  /// TraceError / NpyError naming the file.
  explicit TraceReader(std::string dir);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  [[nodiscard]] const TraceManifest& manifest() const noexcept { return manifest_; }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

  /// Tokens [first, first + count) of `layer` into `out` (resized). Checks every value:
  /// finite, g <= 0, beta in [0, 1]; throws TraceError naming file, token and head.
  void read(std::uint32_t layer, std::uint64_t first, std::uint64_t count, TokenBlock& out) const;

 private:
  struct LayerFiles;
  std::string dir_;
  TraceManifest manifest_;
  std::vector<std::unique_ptr<LayerFiles>> layers_;
};

/// Writes a trace layer by layer, block by block (streaming; bounded memory).
class TraceWriter {
 public:
  /// Creates `dir` if needed; refuses a directory that already holds a manifest. Throws
  /// TraceError. Nothing is visible as a trace until finish() writes the manifest.
  TraceWriter(std::string dir, TraceManifest manifest);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  /// Starts layer `layer` (layers must be written in order 0, 1, ...).
  void begin_layer(std::uint32_t layer);
  /// Appends the next block of the current layer (block.count tokens).
  void append(const TokenBlock& block);
  /// Finishes the current layer (all tokens must have been written).
  void end_layer();
  /// Checks every layer was written, then writes manifest.txt.
  void finish();

 private:
  struct LayerWriters;
  std::string dir_;
  TraceManifest manifest_;
  std::unique_ptr<LayerWriters> current_;
  std::uint32_t next_layer_ = 0;
  bool finished_ = false;
};

}  // namespace statepool::calibration
