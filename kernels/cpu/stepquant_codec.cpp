// stepquant4 / stepquant6 (plan-driven, four variants) and dsq4 / dsq6: a head is fitted
// (stepquant/fit.hpp) and its fit written in the byte format of stepquant/format.hpp;
// decoding reconstructs the values straight from the bytes, row by row, with the
// arithmetic of reconstruct(fit), so a decoded head is exactly reconstruct(fit) of what
// encode computed (test_codec_conformance.cpp holds every codec to that).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bytes.hpp"
#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/stepquant/fit.hpp"
#include "statepool/kernels/stepquant/fit_math.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::kernels::detail {
namespace {

using stepquant::FitKind;
using stepquant::HeadFit;
using stepquant::kPivotWidth;

// Levels z as stored codes u = (z + offset) >> shift (stepquant::unit_code), and back.
// Cloned: SSE2 lacks the 32-bit packs.
STATEPOOL_SIMD_CLONES void narrow_codes(const std::int32_t* z, std::size_t n, std::int32_t offset,
                                        std::uint32_t shift, std::uint8_t* u) {
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = static_cast<std::uint8_t>(static_cast<std::uint32_t>(z[i] + offset) >> shift);
  }
}

// One row of a decoded head from its stored codes u, levels z = (u << shift) - offset
// (stepquant::unit_level): x_j = dual_axis_value(r, c_j, z_j g) (dual axis), or r z_j
// (row absmax), as stepquant::reconstruct computes them.
STATEPOOL_FORCE_INLINE void reconstruct_dual_body(const std::uint8_t* u, std::size_t n,
                                                  std::int32_t offset, std::uint32_t shift, float r,
                                                  const float* c, std::int32_t g, float* x) {
  for (std::size_t j = 0; j < n; ++j) {
    const std::int32_t z = static_cast<std::int32_t>(std::uint32_t{u[j]} << shift) - offset;
    x[j] = stepquant::dual_axis_value(r, c[j], z * g);
  }
}
STATEPOOL_SIMD_CLONES void reconstruct_dual_codes(const std::uint8_t* u, std::size_t n,
                                                  std::int32_t offset, std::uint32_t shift, float r,
                                                  const float* c, std::int32_t g, float* x) {
  if (n == 128) {  // a KDA row of the common length: a loop without a remainder
    reconstruct_dual_body(u, 128, offset, shift, r, c, g, x);
  } else {
    reconstruct_dual_body(u, n, offset, shift, r, c, g, x);
  }
}
// The same for `rows` rows of one width (a GDN head) in one call, with the common row
// length 128 compiled as a constant (stepquant_fit.cpp, "one call per block").
template <std::size_t N>
STATEPOOL_FORCE_INLINE void reconstruct_dual_rows_body(const std::uint8_t* u, std::size_t rows,
                                                       std::size_t n, std::int32_t offset,
                                                       std::uint32_t shift, const float* r,
                                                       const float* c, std::int32_t g, float* x) {
  const std::size_t len = N != 0 ? N : n;
  for (std::size_t i = 0; i < rows; ++i) {
    reconstruct_dual_body(u + i * len, len, offset, shift, r[i], c, g, x + i * len);
  }
}
STATEPOOL_SIMD_CLONES void reconstruct_dual_rows(const std::uint8_t* u, std::size_t rows,
                                                 std::size_t n, std::int32_t offset,
                                                 std::uint32_t shift, const float* r,
                                                 const float* c, std::int32_t g, float* x) {
  if (n == 128) {
    reconstruct_dual_rows_body<128>(u, rows, n, offset, shift, r, c, g, x);
  } else {
    reconstruct_dual_rows_body<0>(u, rows, n, offset, shift, r, c, g, x);
  }
}
STATEPOOL_SIMD_CLONES void reconstruct_absmax_codes(const std::uint8_t* u, std::size_t n,
                                                    std::int32_t offset, std::uint32_t shift,
                                                    float r, float* x) {
  for (std::size_t j = 0; j < n; ++j) {
    const std::int32_t z = static_cast<std::int32_t>(std::uint32_t{u[j]} << shift) - offset;
    x[j] = r * static_cast<float>(z);
  }
}

// Per-thread buffers: encode/decode run concurrently on different heads.
struct Scratch {
  HeadFit fit;
  std::vector<std::uint8_t> widths;
  std::vector<std::uint8_t> u;
  std::vector<float> columns;  // a light step's previous column scales (LightFit::carried)
  std::vector<float> rows;     // and row scales (LightFit::grown)
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

class Writer {
 public:
  explicit Writer(std::span<std::byte> dst) : dst_(dst) {}
  void halves(const float* v, std::size_t n) {
    encode_fp16(v, n, dst_.data() + pos_);  // fp16 scales and pivot values
    pos_ += 2 * n;
  }
  // Levels z, stored as codes u = stepquant::unit_code(z, bits).
  void codes(const std::int32_t* z, std::size_t n, std::uint32_t bits,
             std::vector<std::uint8_t>& u) {
    u.resize(n);
    const auto offset = static_cast<std::int32_t>(stepquant::level_max(bits));
    narrow_codes(z, n, offset, stepquant::level_shift(bits), u.data());
    pack_run(bits, u.data(), n, as_u8(dst_.data() + pos_));
    pos_ += packed_bytes(n, bits);
  }
  void pad() { std::memset(dst_.data() + pos_, 0, dst_.size() - pos_); }

 private:
  std::span<std::byte> dst_;
  std::size_t pos_ = 0;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> src) : src_(src) {}
  void halves(float* v, std::size_t n) {
    decode_fp16(src_.data() + pos_, n, v);
    pos_ += 2 * n;
  }
  // Stored codes u (stepquant::unit_level gives their levels).
  void codes(std::uint8_t* u, std::size_t n, std::uint32_t bits) {
    unpack_run(bits, as_u8(src_.data() + pos_), n, u);
    pos_ += packed_bytes(n, bits);
  }

 private:
  std::span<const std::byte> src_;
  std::size_t pos_ = 0;
};

// The byte layout of one head is fixed by (format arch, fit kind, row widths): GDN-style
// heads (GDN and DSQ) pack all codes as one run; KDA heads pack row by row.
void write_head(Arch arch, const HeadFit& fit, std::span<const std::uint8_t> widths,
                std::span<std::byte> dst, std::vector<std::uint8_t>& u) {
  const std::size_t K = fit.key_dim;
  const std::size_t V = fit.value_dim;
  Writer w(dst);
  if (arch == Arch::gdn) {
    const std::uint32_t bits = widths[0];
    if (bits == kPivotWidth) {
      w.halves(fit.pivot_values.data(), K * V);
    } else {
      w.halves(fit.row_scale.data(), fit.row_scale.size());
      w.halves(fit.col_scale.data(), fit.col_scale.size());  // empty unless dual axis
      w.codes(fit.codes.data(), K * V, bits, u);
    }
  } else {
    w.halves(fit.row_scale.data(), K);
    w.halves(fit.col_scale.data(), fit.col_scale.size());  // empty for row_absmax
    const float* pivot = fit.pivot_values.data();
    for (std::size_t i = 0; i < K; ++i) {
      if (widths[i] == kPivotWidth) {
        w.halves(pivot, V);
        pivot += V;
      } else {
        w.codes(fit.codes.data() + i * V, V, widths[i], u);
      }
    }
  }
  w.pad();
}

// The inverse of write_head: the values of the head whose bytes are `src`, as
// reconstruct(fit) gives them for the fit that write_head wrote.
void read_head(Arch arch, FitKind kind, std::uint32_t key_dim, std::uint32_t value_dim,
               std::span<const std::uint8_t> widths, std::span<const std::byte> src,
               std::span<float> dst, Scratch& s) {
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  const bool dual = kind == FitKind::dual_axis || kind == FitKind::dual_axis_grid8;
  Reader r(src);
  if (arch == Arch::gdn && widths[0] == kPivotWidth) {
    r.halves(dst.data(), K * V);  // an all-pivot head stores only its values
    return;
  }
  s.fit.row_scale.resize(K);
  s.fit.col_scale.resize(dual ? V : 0);
  r.halves(s.fit.row_scale.data(), K);
  r.halves(s.fit.col_scale.data(), s.fit.col_scale.size());
  const auto row = [&](std::size_t i, const std::uint8_t* u) {
    const std::uint32_t bits = widths[i];
    const auto offset = static_cast<std::int32_t>(stepquant::level_max(bits));
    const std::uint32_t shift = stepquant::level_shift(bits);
    float* x = dst.data() + i * V;
    if (dual) {
      const auto g = static_cast<std::int32_t>(
          kind == FitKind::dual_axis_grid8 ? stepquant::grid_factor(bits) : 1u);
      reconstruct_dual_codes(u, V, offset, shift, s.fit.row_scale[i], s.fit.col_scale.data(), g, x);
    } else {
      reconstruct_absmax_codes(u, V, offset, shift, s.fit.row_scale[i], x);
    }
  };
  if (arch == Arch::gdn) {  // one width, one run of codes
    s.u.resize(K * V);
    r.codes(s.u.data(), K * V, widths[0]);
    if (kind == FitKind::dual_axis) {
      const std::uint32_t bits = widths[0];
      reconstruct_dual_rows(s.u.data(), K, V, static_cast<std::int32_t>(stepquant::level_max(bits)),
                            stepquant::level_shift(bits), s.fit.row_scale.data(),
                            s.fit.col_scale.data(), 1, dst.data());
      return;
    }
    for (std::size_t i = 0; i < K; ++i) row(i, s.u.data() + i * V);
    return;
  }
  s.u.resize(V);
  for (std::size_t i = 0; i < K; ++i) {
    if (widths[i] == kPivotWidth) {
      r.halves(dst.data() + i * V, V);
    } else {
      r.codes(s.u.data(), V, widths[i]);
      row(i, s.u.data());
    }
  }
}

class StepQuantCodec final : public Codec {
 public:
  explicit StepQuantCodec(const StateLayout& layout)
      : Codec(std::size_t{layout.key_dim} * layout.value_dim),
        id_(layout.codec.id),
        arch_(layout.arch),
        variant_(layout.codec.variant),
        plan_(layout.plan),
        key_dim_(layout.key_dim),
        value_dim_(layout.value_dim),
        num_heads_(layout.num_heads) {
    head_bytes_.reserve(std::size_t{layout.num_layers} * layout.num_heads);
    widths_.reserve(std::size_t{layout.num_layers} * layout.num_heads * key_dim_);
    for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
      for (std::uint32_t h = 0; h < layout.num_heads; ++h) {
        head_bytes_.push_back(stepquant::head_bytes(*plan_, variant_, l, h));
        for (std::uint32_t i = 0; i < key_dim_; ++i) {
          widths_.push_back(
              stepquant::stored_width(*plan_, variant_, l, h, arch_ == Arch::kda ? i : 0));
        }
      }
    }
  }

  [[nodiscard]] CodecId id() const noexcept override { return id_; }
  [[nodiscard]] std::size_t head_bytes(std::uint32_t layer,
                                       std::uint32_t head) const noexcept override {
    return head_bytes_[std::size_t{layer} * num_heads_ + head];
  }

  void encode_head(std::uint32_t layer, std::uint32_t head, std::span<const float> src,
                   std::span<std::byte> dst) const override {
    (void)encode(layer, head, src, dst, false);
  }

  // The fit finds a non-finite value without a pass of its own (HeadFit::finite).
  [[nodiscard]] bool encode_head_checked(std::uint32_t layer, std::uint32_t head,
                                         std::span<const float> src,
                                         std::span<std::byte> dst) const override {
    return encode(layer, head, src, dst, true);
  }

  // The full variant has a light form, except a GDN head of pivots (no scales); the
  // ablation variants encode as always (the device picks the no_refit variant for a
  // light step of a full-variant page, cuda::light_step_view: the same bytes).
  [[nodiscard]] LightEncode encode_head_light(std::uint32_t layer, std::uint32_t head,
                                              std::span<const float> src,
                                              std::span<const std::byte> previous,
                                              std::span<std::byte> dst, const LightOptions& options,
                                              const StepUpdate& update) const override {
    check(layer, head, src.size(), dst.size());
    check(layer, head, src.size(), previous.size());
    const auto widths = row_widths(layer, head);
    const auto full = [&](LightEncode how) {
      return encode(layer, head, src, dst, true) ? how : LightEncode::non_finite;
    };
    if (variant_ != StepQuantVariant::full || (arch_ == Arch::gdn && widths[0] == kPivotWidth)) {
      return full(LightEncode::full_fit);
    }
    Scratch& s = scratch();
    if (options.fit == LightFit::no_refit) {
      stepquant::fit_head(arch_, src, key_dim_, value_dim_, widths,
                          plan_->head_impact(layer, head), s.fit, stepquant::Refit::off);
      if (!s.fit.finite) return LightEncode::non_finite;
      write_head(arch_, s.fit, widths, dst, s.u);
      return LightEncode::light;
    }
    // The column scales follow the K row scales (stepquant/format.hpp).
    s.columns.resize(value_dim_);
    decode_fp16(previous.data() + 2 * std::size_t{key_dim_}, value_dim_, s.columns.data());
    const bool grown = options.fit == LightFit::grown;
    if (grown && !grow_columns(widths, previous, update, s)) {
      return full(LightEncode::fell_back);
    }
    const stepquant::CarriedStats stats =
        stepquant::fit_head_carried(arch_, src, key_dim_, value_dim_, widths,
                                    plan_->head_impact(layer, head), s.columns,
                                    grown ? stepquant::RowRule::absmax : options.rule, s.fit);
    if (!s.fit.finite) return LightEncode::non_finite;
    const bool clamps = options.clamp_fraction < 1.0f &&
                        static_cast<float>(stats.worst_row_clamps) >
                            options.clamp_fraction * static_cast<float>(value_dim_);
    if (stats.lost_values > 0 || clamps) return full(LightEncode::fell_back);
    write_head(arch_, s.fit, widths, dst, s.u);
    return LightEncode::light;
  }

  void decode_head(std::uint32_t layer, std::uint32_t head, std::span<const std::byte> src,
                   std::span<float> dst) const override {
    check(layer, head, dst.size(), src.size());
    read_head(arch_, kind(), key_dim_, value_dim_, row_widths(layer, head), src, dst, scratch());
  }

 private:
  // Fits and writes the head; with `checked`, a fit that saw a non-finite value writes
  // nothing and returns false.
  bool encode(std::uint32_t layer, std::uint32_t head, std::span<const float> src,
              std::span<std::byte> dst, bool checked) const {
    check(layer, head, src.size(), dst.size());
    Scratch& s = scratch();
    const auto widths = row_widths(layer, head);
    if (variant_ == StepQuantVariant::temporal_only) {
      stepquant::fit_head_absmax(arch_, src, key_dim_, value_dim_, widths, s.fit);
    } else {
      stepquant::fit_head(
          arch_, src, key_dim_, value_dim_, widths, plan_->head_impact(layer, head), s.fit,
          variant_ == StepQuantVariant::no_refit ? stepquant::Refit::off : stepquant::Refit::on);
    }
    if (checked && !s.fit.finite) return false;
    write_head(arch_, s.fit, widths, dst, s.u);
    return true;
  }

  // LightFit::grown: c'_j = fp16(a c_j + m |u_j|), m = max_i |k_i| / (r_i q_i) over the
  // non-pivot rows, from the previous row scales r_i: every |S'_ij| <= r_i q_i c'_j, so the
  // previous row scales would code the new state without a clamp. False when m is not
  // finite (a row scale of 0 under a non-zero k_i, or garbage scales).
  bool grow_columns(std::span<const std::uint8_t> widths, std::span<const std::byte> previous,
                    const StepUpdate& update, Scratch& s) const {
    if (update.k.size() != key_dim_ || update.u.size() != value_dim_) return false;
    const bool grid8 = arch_ == Arch::kda;
    std::vector<float>& rows = s.rows;
    rows.resize(key_dim_);
    decode_fp16(previous.data(), key_dim_, rows.data());
    float m = 0.0f;
    for (std::uint32_t i = 0; i < key_dim_; ++i) {
      if (widths[i] == kPivotWidth) continue;
      const float limit = rows[i] * static_cast<float>(stepquant::row_code_limit(grid8, widths[i]));
      const float ki = std::fabs(update.k[i]);
      if (ki == 0.0f) continue;
      const float ratio = ki / limit;
      if (!(ratio <= std::numeric_limits<float>::max())) return false;
      m = std::max(m, ratio);
    }
    for (std::uint32_t j = 0; j < value_dim_; ++j) {
      const float c = std::isfinite(s.columns[j]) && s.columns[j] > 0.0f ? s.columns[j] : 0.0f;
      s.columns[j] = stepquant::fp16_sat(update.decay_max * c + m * std::fabs(update.u[j]));
    }
    return true;
  }

  void check(std::uint32_t layer, std::uint32_t head, std::size_t values, std::size_t bytes) const {
    if (std::size_t{layer} * num_heads_ + head >= head_bytes_.size() || head >= num_heads_) {
      throw std::invalid_argument(std::string(to_string(id_)) + " codec: no head " +
                                  std::to_string(head) + " in layer " + std::to_string(layer));
    }
    check_head_buffers(to_string(id_), values, std::size_t{key_dim_} * value_dim_, bytes,
                       head_bytes(layer, head));
  }

  // The stored width of every row of a head (one per row for GDN heads too).
  [[nodiscard]] std::span<const std::uint8_t> row_widths(std::uint32_t layer,
                                                         std::uint32_t head) const {
    return {widths_.data() + (std::size_t{layer} * num_heads_ + head) * key_dim_, key_dim_};
  }

  [[nodiscard]] FitKind kind() const noexcept {
    if (variant_ == StepQuantVariant::temporal_only) {
      return FitKind::row_absmax;
    }
    if (arch_ == Arch::kda) {
      return FitKind::dual_axis_grid8;
    }
    return FitKind::dual_axis;
  }

  CodecId id_;
  Arch arch_;
  StepQuantVariant variant_;
  std::shared_ptr<const stepquant::Plan> plan_;
  std::uint32_t key_dim_;
  std::uint32_t value_dim_;
  std::uint32_t num_heads_;
  std::vector<std::size_t> head_bytes_;  // [layer][head]
  std::vector<std::uint8_t> widths_;     // [layer][head][row]
};

class DsqCodec final : public Codec {
 public:
  DsqCodec(CodecId id, std::uint32_t key_dim, std::uint32_t value_dim)
      : Codec(std::size_t{key_dim} * value_dim),
        id_(id),
        bits_(id == CodecId::dsq4 ? 4u : 6u),
        key_dim_(key_dim),
        value_dim_(value_dim),
        head_bytes_(stepquant::dsq_head_bytes(key_dim, value_dim, bits_)) {}

  [[nodiscard]] CodecId id() const noexcept override { return id_; }
  [[nodiscard]] std::size_t head_bytes(std::uint32_t, std::uint32_t) const noexcept override {
    return head_bytes_;
  }

  void encode_head(std::uint32_t, std::uint32_t, std::span<const float> src,
                   std::span<std::byte> dst) const override {
    (void)encode(src, dst, false);
  }

  // As StepQuantCodec's: the fit finds a non-finite value.
  [[nodiscard]] bool encode_head_checked(std::uint32_t, std::uint32_t, std::span<const float> src,
                                         std::span<std::byte> dst) const override {
    return encode(src, dst, true);
  }

  void decode_head(std::uint32_t, std::uint32_t, std::span<const std::byte> src,
                   std::span<float> dst) const override {
    check_head_buffers(to_string(id_), dst.size(), std::size_t{key_dim_} * value_dim_, src.size(),
                       head_bytes_);
    Scratch& s = scratch();
    s.widths.assign(key_dim_, static_cast<std::uint8_t>(bits_));
    read_head(Arch::gdn, FitKind::dual_axis, key_dim_, value_dim_, s.widths, src, dst, s);
  }

 private:
  bool encode(std::span<const float> src, std::span<std::byte> dst, bool checked) const {
    check_head_buffers(to_string(id_), src.size(), std::size_t{key_dim_} * value_dim_, dst.size(),
                       head_bytes_);
    Scratch& s = scratch();
    s.widths.assign(key_dim_, static_cast<std::uint8_t>(bits_));
    stepquant::fit_head_dsq(src, key_dim_, value_dim_, bits_, s.fit);
    if (checked && !s.fit.finite) return false;
    write_head(Arch::gdn, s.fit, s.widths, dst, s.u);
    return true;
  }

  CodecId id_;
  std::uint32_t bits_;
  std::uint32_t key_dim_;
  std::uint32_t value_dim_;
  std::size_t head_bytes_;
};

}  // namespace

std::unique_ptr<Codec> make_stepquant_codec(const StateLayout& layout) {
  return std::make_unique<StepQuantCodec>(layout);
}

std::unique_ptr<Codec> make_dsq_codec(const StateLayout& layout) {
  return std::make_unique<DsqCodec>(layout.codec.id, layout.key_dim, layout.value_dim);
}

}  // namespace statepool::kernels::detail
