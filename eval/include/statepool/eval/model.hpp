#pragma once
// The small trained fidelity models (eval/README.md) and their C++ inference, with the
// recurrent state stored in a statepool page between every token.
//
// A model directory (written by eval/train.py) holds manifest.json and one float32 .npy
// file per tensor. Model::load validates everything before any value is used: the
// manifest's format and configuration, the set of tensors (none missing, none unknown),
// each tensor's dtype and shape against what the configuration implies, each file's
// CRC-32 against the manifest, the .npy header against the manifest's shape, and every
// value finite. Each failure is a ModelError naming the file and what is wrong.
//
// Decoder runs one sequence token by token. Per layer: q, k, v, gate and beta from the
// layer's projections (q, k normalised with kernels::normalize_qk), then
// kernels::fused_step on the sequence's page (decode the layer's heads, run the gated
// delta rule, encode them again: the code path of the pool), then the per-head output
// norm and the output projection, then the MLP. With the fp32 codec this is the model of
// eval/train.py (tests/eval/test_model.cpp compares it with PyTorch's logits).
//
// Thread-safety: a loaded Model is immutable and may be shared; a Decoder is one
// thread's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/page.hpp"

namespace statepool::eval {

/// A model directory that cannot be used. The message names the file.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kModelFormat = "statepool-eval-model-1";

struct ModelConfig {
  kernels::Arch arch = kernels::Arch::gdn;
  std::uint32_t vocab = 0;  ///< 256: byte-level
  std::uint32_t d_model = 0;
  std::uint32_t layers = 0;  ///< all layers are linear-attention layers
  std::uint32_t heads = 0;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::uint32_t mlp_hidden = 0;
  std::uint32_t gate_rank = 0;  ///< KDA: rank of the gate projection; GDN: 0
  float rms_eps = 1e-6f;
};

/// One tensor as the manifest lists it.
struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> shape;
};

class Model {
 public:
  /// Loads and validates `dir` (see above). Throws ModelError.
  static std::shared_ptr<const Model> load(const std::string& dir);

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  /// Free text of the manifest's "training" record (corpus, steps, losses).
  [[nodiscard]] const std::string& training() const noexcept { return training_; }
  /// The model's calibration and evaluation texts, as paths relative to eval/
  /// ("data/....txt"): the manifest's "calibration_text" and "reference"."text",
  /// by default the KJV's data/calibration.txt and data/heldout.txt.
  [[nodiscard]] const std::string& calibration_text() const noexcept { return calibration_text_; }
  [[nodiscard]] const std::string& heldout_text() const noexcept { return heldout_text_; }
  /// The state layout of one sequence with `codec` (and `plan` for stepquant4/6).
  [[nodiscard]] kernels::StateLayout layout(
      kernels::CodecSpec codec, std::shared_ptr<const kernels::stepquant::Plan> plan = {}) const;
  /// The tensors a model of `config` has, in manifest order (names as train.py writes them).
  [[nodiscard]] static std::vector<TensorInfo> expected_tensors(const ModelConfig& config);

  struct Layer {
    std::vector<float> attn_norm, q, k, v, b, b_bias, A_log, a, a_down, dt_bias, o_norm, o,
        mlp_norm, up, down;
  };
  [[nodiscard]] const std::vector<float>& embed() const noexcept { return embed_; }
  [[nodiscard]] const std::vector<Layer>& layers() const noexcept { return layers_; }
  [[nodiscard]] const std::vector<float>& final_norm() const noexcept { return final_norm_; }

 private:
  Model() = default;
  std::string dir_;
  std::string training_;
  std::string calibration_text_ = "data/calibration.txt";
  std::string heldout_text_ = "data/heldout.txt";
  ModelConfig config_;
  std::vector<float> embed_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
};

/// Reads a float32 .npy file listed in `dir`/manifest.json under "reference" (the
/// PyTorch logits of eval/train.py), checking its CRC-32 and shape [tokens, vocab].
struct Reference {
  std::uint64_t tokens = 0;
  std::vector<float> logits;  ///< [tokens][vocab]
};
[[nodiscard]] Reference load_reference(const Model& model);

/// The inputs one layer's recurrence received at the last token, as a trace stores them
/// (calibration/trace.hpp): q, k normalised [heads][K]; v [heads][V]; g [heads] (GDN) or
/// [heads][K] (KDA); beta [heads].
struct LayerInputs {
  std::vector<float> q, k, v, g, beta;
};

class Decoder {
 public:
  /// A decoder of `model` whose state lives in a page of `codec`, which must have the
  /// model's state shape (Model::layout). Starts from the zero state. Throws
  /// std::invalid_argument on a shape mismatch.
  Decoder(std::shared_ptr<const Model> model, const kernels::PageCodec& codec,
          const kernels::StepPolicy& policy = {});

  /// Back to the zero state (encoded into the page; the page's step count starts again).
  void reset();
  /// Feeds `token` (< vocab); returns the next-token logits (valid until the next call).
  std::span<const float> step(std::uint32_t token);
  /// Decodes the page's recurrent state into `out` (layers * heads * K * V floats).
  void state(std::span<float> out) const;
  [[nodiscard]] std::size_t state_values() const noexcept;
  /// Per layer, the recurrence inputs of the last step().
  [[nodiscard]] const std::vector<LayerInputs>& inputs() const noexcept { return inputs_; }
  /// Heads whose new state was not finite, over all steps (the fused step kept their old
  /// bytes); 0 for a healthy run.
  [[nodiscard]] std::size_t rejected_heads() const noexcept { return rejected_; }
  /// Over all steps: heads stepped, and of those the heads that had a light fit and those
  /// whose light fit fell back to the full fit (StepMode::light).
  [[nodiscard]] std::size_t stepped_heads() const noexcept { return stepped_; }
  [[nodiscard]] std::size_t light_heads() const noexcept { return light_; }
  [[nodiscard]] std::size_t fallback_heads() const noexcept { return fallback_; }
  [[nodiscard]] const kernels::PageCodec& codec() const noexcept { return codec_; }

 private:
  std::shared_ptr<const Model> model_;
  const kernels::PageCodec& codec_;
  std::vector<std::byte> page_;
  std::vector<LayerInputs> inputs_;
  std::vector<float> x_, h_, out_, o_, hidden_, rank_, gate_, logits_;
  kernels::StepPolicy policy_;
  std::uint64_t steps_ = 0;
  std::size_t rejected_ = 0;
  std::size_t stepped_ = 0;
  std::size_t light_ = 0;
  std::size_t fallback_ = 0;
};

}  // namespace statepool::eval
