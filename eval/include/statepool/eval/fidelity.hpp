#pragma once
// The fidelity measurements of eval/README.md: a model run with its state stored through
// each codec between every token, against the same model with an FP32 state.
//
// Per codec, over the first `tokens` bytes of a text read as one sequence (teacher
// forcing), in lock-step with an FP32-state decoder:
//   nll            mean negative log-likelihood of the next byte (nats; perplexity = e^nll)
//   agreement      fraction of positions whose most likely next byte is FP32's
//   state_error    ||S_codec(t) - S_fp32(t)||_F / ||S_fp32(t)||_F over all layers and
//                  heads, after each token t = 1 .. tokens
//   output_error   mean over positions of ||p_codec - p_fp32||_1 / 2 (total variation
//                  between the next-byte distributions)
// and greedy generation from the first `prompt` bytes for `generate` bytes: the first
// generated position (1-based) where the codec's byte differs from FP32's, if any.
//
// Thread-safety: evaluate() runs the codecs on `threads` threads (and calls `progress` from
// them, one call at a time); call it from one thread.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "statepool/eval/model.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::eval {

/// One codec configuration to evaluate ("stepquant6-temporal", ...).
struct CodecCase {
  std::string name;
  kernels::CodecSpec spec;
  std::shared_ptr<const kernels::stepquant::Plan> plan;  ///< stepquant4/6 only
  kernels::StepPolicy policy;  ///< how the fused step re-encodes (the step mode)
};

struct FidelityOptions {
  std::uint64_t tokens = 4096;    ///< teacher-forced positions
  std::uint32_t prompt = 64;      ///< greedy generation: prompt bytes (from the text)
  std::uint32_t generate = 1024;  ///< greedy generation: bytes generated
  std::uint32_t threads = 1;      ///< codecs evaluated concurrently
};

struct CodecResult {
  std::string name;
  std::size_t page_bytes = 0;
  double bits_per_value = 0;  ///< page bits / recurrent values
  double nll = 0;
  double agreement = 0;
  double output_error = 0;
  std::vector<float> state_error;  ///< [t - 1] for t = 1 .. tokens
  std::optional<std::uint32_t> divergence;
  std::size_t rejected_heads = 0;
  /// Of the heads stepped while teacher forcing: the fraction that had a light fit, and
  /// the fraction whose light fit fell back to the full fit (StepMode::light).
  double light_fraction = 0;
  double fallback_fraction = 0;
  double seconds = 0;
  [[nodiscard]] double perplexity() const;
  /// Mean of state_error over t in [first, last] (1-based, clamped to what was run).
  [[nodiscard]] double mean_state_error(std::size_t first, std::size_t last) const;
};

using ProgressFn = std::function<void(const std::string& line)>;

/// Evaluates every case on `text` (bytes; at least tokens + 1 and prompt long). Throws
/// std::invalid_argument for a text that is too short or a case whose codec does not fit
/// the model.
[[nodiscard]] std::vector<CodecResult> evaluate(std::shared_ptr<const Model> model,
                                                std::span<const std::uint8_t> text,
                                                std::span<const CodecCase> cases,
                                                const FidelityOptions& options,
                                                const ProgressFn& progress = {});

/// Writes a calibration trace (calibration/trace.hpp) of the FP32-state model reading
/// `text`: `sequences` sequences of `sequence_length` bytes each, taken one after the
/// other from the start of the text, the state reset at each. `source` goes into the
/// manifest. Throws std::invalid_argument for a text that is too short and
/// calibration::TraceError for a bad directory.
void record_trace(std::shared_ptr<const Model> model, std::span<const std::uint8_t> text,
                  std::uint64_t sequences, std::uint64_t sequence_length, const std::string& dir,
                  const std::string& source);

}  // namespace statepool::eval
