#pragma once
// Calibration of a whole trace: for every layer in turn, run the FP32 recurrence over all
// tokens (state reset at each sequence start), feed a LayerAccumulator, measure the
// layer's costs and drop its snapshots; then build the plan. Memory: one layer's state
// (heads x K x V floats), one layer's reservoirs (heads x reservoir x K x V floats) and a
// block of inputs, whatever the trace length.
//
// Thread-safety: calibrate_trace uses `threads` worker threads internally; call it from
// one thread.

#include <cstdint>
#include <functional>
#include <string>

#include "statepool/calibration/accumulator.hpp"
#include "statepool/calibration/plan_builder.hpp"
#include "statepool/calibration/trace.hpp"

namespace statepool::calibration {

struct CalibrateOptions {
  PlanOptions plan;
  AccumulatorOptions accumulator;
  /// Tokens read per block.
  std::uint64_t block_tokens = 256;
  /// Worker threads (heads in parallel) for the recurrence and the cost measurement.
  std::uint32_t threads = 1;
};

/// Progress lines for people ("layer 3/36: 65536 tokens, 5400 tokens/s").
using ProgressFn = std::function<void(const std::string& line)>;

/// Runs the recurrence over every token of `layer`, feeding `accumulator` (which must have
/// the trace's shape). q and k are normalised (normalize_qk) before use.
void accumulate_layer(const TraceReader& trace, std::uint32_t layer, LayerAccumulator& accumulator,
                      const CalibrateOptions& options, const ProgressFn& progress = {});

/// The whole calibration. Throws TraceError / NpyError for a bad trace and
/// std::invalid_argument for bad options.
[[nodiscard]] PlanResult calibrate_trace(const TraceReader& trace, const CalibrateOptions& options,
                                         const ProgressFn& progress = {});

}  // namespace statepool::calibration
