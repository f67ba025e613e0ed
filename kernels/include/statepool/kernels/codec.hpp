#pragma once
// Codec interface: how one head's K x V FP32 state becomes bytes of a page and back.
//
// A codec instance is made for one StateLayout (so that plan-driven codecs such as
// STEPQuant can give every (layer, head) its own width). Page layout, staging layout and
// whole-page operations live in page.hpp and are shared by every codec.
//
// Thread-safety: codecs are immutable after construction; encode/decode may run
// concurrently on different buffers.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/fit.hpp"

namespace statepool::kernels {

/// Thrown when a state to encode holds NaN or +-Inf. PageCodec::encode throws it before
/// writing anything; PageCodec::encode_heads says what it has written then.
class NonFiniteError : public std::invalid_argument {
 public:
  /// Message: "non-finite value nan at layer 3 head 7 index 1576".
  NonFiniteError(std::uint32_t layer, std::uint32_t head, std::size_t index, float value);
  /// Same, with the index split into row and column:
  /// "non-finite value nan at layer 3 head 7 row 12 col 40" (row = index / value_dim).
  NonFiniteError(std::uint32_t layer, std::uint32_t head, std::size_t index, float value,
                 std::uint32_t value_dim);
  [[nodiscard]] std::uint32_t layer() const noexcept { return layer_; }
  [[nodiscard]] std::uint32_t head() const noexcept { return head_; }
  /// Row-major index within the head (row = index / value_dim).
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  /// The value found there (NaN or +-Inf), as it was read.
  [[nodiscard]] float value() const noexcept { return value_; }

 private:
  std::uint32_t layer_;
  std::uint32_t head_;
  std::size_t index_;
  float value_;
};

/// How a light step (StepMode::light, fused_step.hpp) fits a STEPQuant head. Measured in
/// docs/codecs.md, "Step modes": no_refit is the one that keeps stepquant6's accuracy;
/// the others stay for eval/step-modes, which measures them all.
enum class LightFit : std::uint8_t {
  no_refit,  ///< steps 1-3 of the fit (fresh row and column scales), without the refit
  carried,   ///< the page's column scales as they are; fresh row scales by `rule`
  grown,     ///< the page's column scales grown by a bound on the step's update (StepUpdate),
             ///< so that the previous row scales would clamp nothing; absmax row scales
};

struct LightOptions {
  LightFit fit = LightFit::no_refit;
  /// carried: how the fresh row scales are chosen (grown always takes absmax).
  stepquant::RowRule rule = stepquant::RowRule::absmax;
  /// carried and grown: a head one of whose rows clamps more than this fraction of its
  /// values gets the full fit instead; 1 or more: never for clamps.
  float clamp_fraction = 1.0f;
};

/// The step's update of one head, S' = diag(a) S + k u^T (fused_step.hpp), for
/// LightFit::grown: |S'_ij| <= decay_max |S_ij| + |k_i| |u_j|.
struct StepUpdate {
  float decay_max = 1.0f;    ///< max_i a_i
  std::span<const float> k;  ///< K values
  std::span<const float> u;  ///< V values (the scaled residual)
};

/// What encode_head_light did.
enum class LightEncode : std::uint8_t {
  light,       ///< the head has the light fit
  full_fit,    ///< the codec has no light form for this head: encoded as encode_head
  fell_back,   ///< a carried or grown fit clamped or would lose values, so the full fit ran
  non_finite,  ///< `src` held a NaN or +-Inf; `dst` holds unspecified bytes
};

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  [[nodiscard]] virtual CodecId id() const noexcept = 0;
  /// key_dim * value_dim: the values of every head.
  [[nodiscard]] std::size_t head_values() const noexcept { return head_values_; }
  /// Bytes of the encoded head (layer, head), every byte of metadata included.
  /// Always a multiple of 4 (heads start 4-byte aligned in a page).
  [[nodiscard]] virtual std::size_t head_bytes(std::uint32_t layer,
                                               std::uint32_t head) const noexcept = 0;
  /// Encodes a row-major key_dim x value_dim FP32 head. `src` must be finite (the page
  /// functions check before calling); `dst.size() == head_bytes(layer, head)`.
  virtual void encode_head(std::uint32_t layer, std::uint32_t head, std::span<const float> src,
                           std::span<std::byte> dst) const = 0;
  /// Decodes a head written by encode_head into `dst` (key_dim * value_dim floats).
  virtual void decode_head(std::uint32_t layer, std::uint32_t head, std::span<const std::byte> src,
                           std::span<float> dst) const = 0;
  /// Encodes like encode_head without requiring a finite `src`: returns false when `src`
  /// holds a NaN or +-Inf, and `dst` then holds unspecified bytes (of this head only).
  /// One pass over values that are already in cache: codecs that look at every value's
  /// magnitude anyway (the uniform int codecs' absmax) check for free, and so do the
  /// STEPQuant and DSQ fits (from their row sums); the default scans `src`, then encodes. Codecs read `src` more than once (a fit's passes), so it must not
  /// change during the call: PageCodec passes a private copy of the staged head.
  [[nodiscard]] virtual bool encode_head_checked(std::uint32_t layer, std::uint32_t head,
                                                 std::span<const float> src,
                                                 std::span<std::byte> dst) const;
  /// Encodes a staged head, checking it: key_dim * value_dim values in `dtype` (f32 or
  /// bf16; little-endian, any alignment) at `src`. Returns the row-major index of the
  /// first NaN or +-Inf (its value in `bad`; `dst` then holds unspecified bytes, of this
  /// head only), or key_dim * value_dim when every value is finite (`dst` then holds
  /// encode_head's bytes for those values, converted to FP32 exactly).
  /// Each value of `src` is read once, and the check and the encoding both use that
  /// reading: `src` may be memory another process rewrites during the call (a client's
  /// staging buffer), and the result is then the encoding of values that were there. The
  /// default copies the head into memory of the calling thread, checking it on the way,
  /// and encodes the copy; the float and uniform codecs work through small copies (a block,
  /// a group) that stay in L1.
  [[nodiscard]] virtual std::size_t encode_staged_head(std::uint32_t layer, std::uint32_t head,
                                                       const std::byte* src, DType dtype,
                                                       std::span<std::byte> dst, float& bad) const;

  /// Encodes a head for a light step: like encode_head_checked, but a codec with a light
  /// form (STEPQuant's dual-axis heads) fits it as `options` say, reading what it needs
  /// of `previous` (this head's bytes before the step, head_bytes long; any bytes: they
  /// are read as scales, never as sizes or indices) and of `update`; a carried or grown
  /// fit that would clamp more than `options` allow or lose values runs the full fit
  /// instead. The default (every other codec) has no light form.
  [[nodiscard]] virtual LightEncode encode_head_light(std::uint32_t layer, std::uint32_t head,
                                                      std::span<const float> src,
                                                      std::span<const std::byte> previous,
                                                      std::span<std::byte> dst,
                                                      const LightOptions& options,
                                                      const StepUpdate& update) const;

 protected:
  explicit Codec(std::size_t head_values) noexcept : head_values_(head_values) {}

 private:
  std::size_t head_values_;
};

/// Makes the codec named by layout.codec. Throws std::invalid_argument on an invalid
/// layout or codec parameters.
[[nodiscard]] std::unique_ptr<Codec> make_codec(const StateLayout& layout);

}  // namespace statepool::kernels
