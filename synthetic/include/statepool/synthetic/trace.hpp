#pragma once
// Synthetic calibration inputs: a seeded stand-in for an engine's dump, so calibration
// can be tried, tested and demonstrated without a model. NOT a model: the plans it gives
// describe the synthetic heads only.
//
// Every (layer, head) has fixed "model" parameters drawn from model_seed:
//   - a mean log-decay: GDN heads are spread log-uniformly over [-0.7, -5e-4] (rotated per
//     layer, so every layer has long-lived heads, whose errors live for thousands of
//     steps, and short-lived ones, which forget within a few); KDA heads get such a centre
//     and each key row its own rate around it (x exp(0.75 N(0,1)), clamped to
//     [1e-4, 2]); per token the gate is jittered by exp(0.25 N(0,1)) with the mean kept;
//   - key and query row biases on a few rows (row outliers, rows read more than others);
//   - value column scales with a few 4-8x larger columns (column outliers).
// Per token (token_seed): k, q Gaussian plus bias, L2-normalised (q also scaled by
// 1/sqrt(K)); v Gaussian times the column scales; beta = sigmoid(N(0, 1)).
// Deterministic for given seeds with a given standard library (PortableNormal of
// random.hpp; seeds derived with calibration/seed.hpp).
//
// Thread-safety: a SyntheticSource belongs to one thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "statepool/calibration/trace.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::synthetic {

struct SyntheticOptions {
  kernels::Arch arch = kernels::Arch::gdn;
  std::uint32_t layers = 2;
  std::uint32_t heads = 4;
  std::uint32_t key_dim = 64;
  std::uint32_t value_dim = 64;
  std::uint64_t tokens = 2048;
  /// Tokens per sequence (the state resets at each); 0 = one sequence.
  std::uint64_t sequence_length = 0;
  /// Seed of the per-token inputs (calibration and evaluation runs differ here).
  std::uint64_t token_seed = 1;
  /// Seed of the per-head parameters (the "model"; keep it to evaluate the same model).
  std::uint64_t model_seed = 7;
  /// Optional mean log-decay per head (heads values, < 0), used for every layer instead of
  /// the default spread. KDA: the centre of the head's row rates.
  std::vector<float> head_log_decay;
};

/// The manifest a synthetic trace of these options has (synthetic = yes).
[[nodiscard]] calibration::TraceManifest synthetic_manifest(const SyntheticOptions& options);

class SyntheticSource {
 public:
  /// Throws std::invalid_argument on invalid options (zero sizes, wrong head_log_decay).
  explicit SyntheticSource(SyntheticOptions options);

  [[nodiscard]] const SyntheticOptions& options() const noexcept { return options_; }
  /// Nominal mean log-decay of a unit (head for GDN, key row for KDA).
  [[nodiscard]] float nominal_log_decay(std::uint32_t layer, std::uint32_t head,
                                        std::uint32_t row = 0) const;
  /// The next `count` tokens of `layer` (each layer is its own stream, starting at token
  /// 0; calls for one layer continue where the previous one stopped).
  void generate(std::uint32_t layer, std::uint64_t count, calibration::TokenBlock& out);

 private:
  struct HeadModel {
    std::vector<float> log_decay;  // 1 (GDN) or K (KDA)
    std::vector<float> key_bias;
    std::vector<float> query_bias;
    std::vector<float> column_scale;
  };
  struct Stream;

  [[nodiscard]] const HeadModel& model(std::uint32_t layer, std::uint32_t head) const;

  SyntheticOptions options_;
  std::vector<HeadModel> models_;                 // [layer][head]
  std::vector<std::shared_ptr<Stream>> streams_;  // per layer: RNG and next token
};

/// Writes a whole synthetic trace into `dir` (calibration::TraceWriter; streaming, blocks of
/// `block_tokens`). `progress`, when set, is called after each layer.
void write_synthetic_trace(const std::string& dir, const SyntheticOptions& options,
                           const std::function<void(std::uint32_t layer)>& progress = {},
                           std::uint64_t block_tokens = 256);

}  // namespace statepool::synthetic
