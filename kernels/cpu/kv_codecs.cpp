// KV-cache codecs on the CPU (kv.hpp): argument checks, the non-finite scan, and loops over
// tiles of the stream through kv_math.hpp's per-value functions, the ones the CUDA kernels
// run per thread.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/kv_math.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"

namespace statepool::kernels {
namespace {

bool valid_codec(KvCodecId codec) {
  return kv_code_bits(codec) != 0;
}

std::string describe(const KvStream& s) {
  return std::string(to_string(s.codec)) + " " + to_string(s.role) + " of " +
         std::to_string(s.tokens) + " tokens x " + std::to_string(s.channels) + " channels";
}

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}

/// Checks everything but the values; returns the number of values.
std::uint64_t check_stream(const char* fn, const KvStream& s, DType dtype) {
  if (!valid_codec(s.codec)) {
    fail(fn, "unknown KV codec " + std::to_string(static_cast<unsigned>(s.codec)));
  }
  if (s.role != KvRole::keys && s.role != KvRole::values) {
    fail(fn, "unknown KV role " + std::to_string(static_cast<unsigned>(s.role)));
  }
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) {
    fail(fn,
         "values are f32, bf16 or f16, got dtype " + std::to_string(static_cast<unsigned>(dtype)));
  }
  std::uint64_t values = 0;
  if (__builtin_mul_overflow(s.tokens, s.channels, &values)) {
    fail(fn, describe(s) + ": too many values");
  }
  return values;
}

void check_bytes(const char* fn, const KvStream& s, const char* what, std::uint64_t got,
                 std::uint64_t expected) {
  if (got != expected) {
    fail(fn, describe(s) + ": " + what + " must be " + std::to_string(expected) + " bytes, got " +
                 std::to_string(got));
  }
}

// --- the host loops ---------------------------------------------------------------------
//
// A stream is worked through in tiles of at most 32 tokens (one KIVI key group's worth)
// by kTileChannels channels (a multiple of 32: a tile holds whole per-token groups). The
// input of a tile is widened to FP32 in a per-thread buffer; the per-value math is
// kv_math.hpp's, in loops over plain arrays that vectorize (cloned, simd.hpp), and codes
// are packed with packing.hpp's pack_run (the quads of the record format). bf16 and fp8
// go in flat chunks. Every result equals the CUDA kernels' threads' (cuda/kv_stream.hpp,
// over kv_math.hpp's per-item functions): test_device_kv_emulation.cpp holds the two
// to the same bytes, and test_kv_codecs.cpp these loops to an independent transcription
// of the format.

constexpr std::uint64_t kTileTokens = kKvGroupSize;
constexpr std::uint64_t kTileChannels = 1024;
constexpr std::uint64_t kChunkValues = kTileTokens * kTileChannels;

struct KvScratch {
  std::vector<float> x;         // one tile or chunk of values
  std::vector<std::uint8_t> u;  // one tile's codes (per-channel groups)
};

KvScratch& kv_scratch() {
  thread_local KvScratch s;
  if (s.x.size() < kChunkValues) {
    s.x.resize(kChunkValues);
    s.u.resize(kChunkValues);
  }
  return s;
}

/// n values in `dtype` (any alignment) -> FP32 (exact).
void widen(DType dtype, const std::byte* in, std::size_t n, float* x) {
  switch (dtype) {
    case DType::f32: std::memcpy(x, in, 4 * n); return;
    case DType::bf16: detail::decode_bf16(in, n, x); return;
    case DType::f16: detail::decode_fp16(in, n, x); return;
  }
}

/// FP32 -> n values in `dtype` (round to nearest even, numeric.hpp).
void narrow(DType dtype, const float* x, std::size_t n, std::byte* out) {
  switch (dtype) {
    case DType::f32: std::memcpy(out, x, 4 * n); return;
    case DType::bf16: detail::encode_bf16(x, n, out); return;
    case DType::f16: detail::encode_fp16(x, n, out); return;
  }
}

STATEPOOL_SIMD_CLONES void encode_e4m3(const float* x, std::size_t n, std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_e4m3_bits(x[i]);
}

STATEPOOL_SIMD_CLONES void decode_e4m3(const std::uint8_t* in, std::size_t n, float* x) {
  for (std::size_t i = 0; i < n; ++i) x[i] = e4m3_bits_to_float(in[i]);
}

// Keys of finite floats that order as the values do (-0 below +0, which gives the group
// the same scale and offset as +0 would): integer min / max reductions vectorize where
// float ones may not.
STATEPOOL_FORCE_INLINE std::int32_t order_key(float v) {
  const auto b = static_cast<std::int32_t>(float_bits(v));
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
STATEPOOL_FORCE_INLINE float from_order_key(std::int32_t k) {
  return bits_float(static_cast<std::uint32_t>(k ^ ((k >> 31) & 0x7FFFFFFF)));
}

// The scale and offset of a group into its record; returns the inverse scale and offset
// that its codes use (kv_inverse_scale, kv_group_code).
STATEPOOL_FORCE_INLINE void put_group_scale(float lo, float hi, std::uint32_t levels,
                                            std::uint8_t* record, float& inverse, float& offset) {
  const KvGroupScale g = kv_group_scale(lo, hi, levels);
  kv_put16(record, g.scale_bits);
  kv_put16(record + 2, g.offset_bits);
  inverse = kv_inverse_scale(half_bits_to_float(g.scale_bits));
  offset = half_bits_to_float(g.offset_bits);
}

// One per-token group of `count` (<= 32) values into its record (kv_encode_group).
template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void encode_token_group(const float* v, std::size_t count,
                                               std::uint8_t* record) {
  constexpr std::uint32_t levels = kv_levels(Bits);
  std::int32_t lo = order_key(v[0]);
  std::int32_t hi = lo;
  for (std::size_t i = 1; i < count; ++i) {
    const std::int32_t k = order_key(v[i]);
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
  }
  float inv = 0.0f;
  float a = 0.0f;
  put_group_scale(from_order_key(lo), from_order_key(hi), levels, record, inv, a);
  std::uint8_t u[kKvGroupSize] = {};
  for (std::size_t i = 0; i < count; ++i) {
    u[i] = static_cast<std::uint8_t>(kv_group_code(v[i], inv, a, levels));
  }
  pack_run(Bits, u, kKvGroupSize, record + 4);
}

// The per-token groups of n values of one token (whole groups but maybe the last).
template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void encode_token_groups_t(const float* x, std::size_t n,
                                                  std::uint8_t* records) {
  std::size_t g = 0;
  for (; g + kKvGroupSize <= n; g += kKvGroupSize) {
    encode_token_group<Bits>(x + g, kKvGroupSize, records);  // constant trip counts
    records += kv_group_bytes(Bits);
  }
  if (g < n) encode_token_group<Bits>(x + g, n - g, records);
}
STATEPOOL_SIMD_CLONES void encode_token_groups(std::uint32_t bits, const float* x, std::size_t n,
                                               std::uint8_t* records) {
  if (bits == 2) {
    encode_token_groups_t<2>(x, n, records);
  } else {
    encode_token_groups_t<4>(x, n, records);
  }
}

// The per-channel groups of a tile: `rows` (<= 32) tokens of `cols` channels, row-major;
// channel c's record at records + c * group bytes (kv_encode_group over a column).
template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void encode_channel_groups_t(const float* x, std::size_t rows,
                                                    std::size_t cols, std::uint8_t* u,
                                                    std::uint8_t* records) {
  constexpr std::uint32_t levels = kv_levels(Bits);
  float lo[kTileChannels];
  float hi[kTileChannels];
  float inv[kTileChannels];
  float a[kTileChannels];
  std::memcpy(lo, x, 4 * cols);
  std::memcpy(hi, x, 4 * cols);
  for (std::size_t r = 1; r < rows; ++r) {  // in token order, as kv_encode_group
    const float* v = x + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      lo[c] = v[c] < lo[c] ? v[c] : lo[c];
      hi[c] = v[c] > hi[c] ? v[c] : hi[c];
    }
  }
  for (std::size_t c = 0; c < cols; ++c) {
    put_group_scale(lo[c], hi[c], levels, records + c * kv_group_bytes(Bits), inv[c], a[c]);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const float* v = x + r * cols;
    std::uint8_t* ur = u + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      ur[c] = static_cast<std::uint8_t>(kv_group_code(v[c], inv[c], a[c], levels));
    }
  }
  for (std::size_t c = 0; c < cols; ++c) {
    std::uint8_t column[kKvGroupSize] = {};
    for (std::size_t r = 0; r < rows; ++r) column[r] = u[r * cols + c];
    pack_run(Bits, column, kKvGroupSize, records + c * kv_group_bytes(Bits) + 4);
  }
}
STATEPOOL_SIMD_CLONES void encode_channel_groups(std::uint32_t bits, const float* x,
                                                 std::size_t rows, std::size_t cols,
                                                 std::uint8_t* u, std::uint8_t* records) {
  if (bits == 2) {
    encode_channel_groups_t<2>(x, rows, cols, u, records);
  } else {
    encode_channel_groups_t<4>(x, rows, cols, u, records);
  }
}

// The inverse of encode_token_groups: x for n values of one token.
template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void decode_token_groups_t(const std::uint8_t* records, std::size_t n,
                                                  float* x) {
  for (std::size_t g = 0; g < n; g += kKvGroupSize, records += kv_group_bytes(Bits)) {
    const float s = half_bits_to_float(kv_get16(records));
    const float a = half_bits_to_float(kv_get16(records + 2));
    std::uint8_t u[kKvGroupSize];
    unpack_run(Bits, records + 4, kKvGroupSize, u);
    const std::size_t count = n - g < kKvGroupSize ? n - g : kKvGroupSize;
    for (std::size_t i = 0; i < count; ++i) x[g + i] = kv_value(u[i], s, a);
  }
}
STATEPOOL_SIMD_CLONES void decode_token_groups(std::uint32_t bits, const std::uint8_t* records,
                                               std::size_t n, float* x) {
  if (bits == 2) {
    decode_token_groups_t<2>(records, n, x);
  } else {
    decode_token_groups_t<4>(records, n, x);
  }
}

// The inverse of encode_channel_groups.
template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void decode_channel_groups_t(const std::uint8_t* records, std::size_t rows,
                                                    std::size_t cols, std::uint8_t* u, float* x) {
  float s[kTileChannels];
  float a[kTileChannels];
  for (std::size_t c = 0; c < cols; ++c) {
    const std::uint8_t* record = records + c * kv_group_bytes(Bits);
    s[c] = half_bits_to_float(kv_get16(record));
    a[c] = half_bits_to_float(kv_get16(record + 2));
    std::uint8_t column[kKvGroupSize];
    unpack_run(Bits, record + 4, kKvGroupSize, column);
    for (std::size_t r = 0; r < rows; ++r) u[r * cols + c] = column[r];
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) x[r * cols + c] = kv_value(u[r * cols + c], s[c], a[c]);
  }
}
STATEPOOL_SIMD_CLONES void decode_channel_groups(std::uint32_t bits, const std::uint8_t* records,
                                                 std::size_t rows, std::size_t cols,
                                                 std::uint8_t* u, float* x) {
  if (bits == 2) {
    decode_channel_groups_t<2>(records, rows, cols, u, x);
  } else {
    decode_channel_groups_t<4>(records, rows, cols, u, x);
  }
}

/// A tile: tokens [t0, t0 + rows) x channels [c0, c0 + cols).
struct Tile {
  std::uint64_t t0 = 0;
  std::uint64_t rows = 0;
  std::uint64_t c0 = 0;
  std::uint64_t cols = 0;
};

template <class F>
void for_each_tile(const KvGeometry& g, F&& f) {
  for (std::uint64_t t0 = 0; t0 < g.tokens; t0 += kTileTokens) {
    for (std::uint64_t c0 = 0; c0 < g.channels; c0 += kTileChannels) {
      f(Tile{t0, std::min(kTileTokens, g.tokens - t0), c0,
             std::min(kTileChannels, g.channels - c0)});
    }
  }
}

/// Throws KvNonFiniteError for the first NaN / +-Inf among `n` FP32 values at `x`, values
/// [at, at + n) of the stream in row-major order, spread over rows of `cols` values of
/// which the first starts at channel `c0` (a tile's rows, or a flat chunk: cols = channels).
void check_finite(const KvStream& s, const float* x, std::size_t n, std::uint64_t t0,
                  std::uint64_t c0, std::uint64_t cols) {
  float value = 0.0f;
  const std::size_t bad =
      detail::first_non_finite(reinterpret_cast<const std::byte*>(x), n, DType::f32, value);
  if (bad == n) return;
  const std::uint64_t at = (t0 * s.channels + c0) + (bad / cols) * s.channels + bad % cols;
  throw KvNonFiniteError(s, at / s.channels, at % s.channels, value);
}

// Every input value is read once, into a buffer of this thread's (a block, a tile), and
// checked and encoded from there: memory that another process rewrites meanwhile (a
// client's staging buffer) is never checked in one reading and encoded in another.
void encode_stream(const KvStream& s, DType dtype, const std::byte* in, std::uint64_t values,
                   std::uint8_t* out) {
  if (values == 0) return;  // empty spans may have null data
  KvScratch& scratch = kv_scratch();
  float* x = scratch.x.data();
  const std::size_t width = dtype_bytes(dtype);
  if (!is_kv_group_codec(s.codec)) {
    if (s.codec == KvCodecId::bf16 && dtype == DType::bf16) {
      float value = 0.0f;
      const std::size_t bad =
          detail::copy_bf16_checked(in, values, reinterpret_cast<std::byte*>(out), value);
      if (bad != values) throw KvNonFiniteError(s, bad / s.channels, bad % s.channels, value);
      return;
    }
    constexpr std::uint64_t kBlockValues = 2048;  // 8 KB of FP32: in L1 while it is encoded
    for (std::uint64_t base = 0; base < values; base += kBlockValues) {
      const std::size_t n = std::min(kBlockValues, values - base);
      widen(dtype, in + base * width, n, x);
      check_finite(s, x, n, base / s.channels, base % s.channels, s.channels);
      if (s.codec == KvCodecId::bf16) {
        detail::encode_bf16(x, n, reinterpret_cast<std::byte*>(out + 2 * base));
      } else {
        encode_e4m3(x, n, out + base);
      }
    }
    return;
  }
  const KvGeometry g = kv_geometry(s);
  for_each_tile(g, [&](const Tile& t) {
    for (std::uint64_t r = 0; r < t.rows; ++r) {
      widen(dtype, in + ((t.t0 + r) * g.channels + t.c0) * width, t.cols, x + r * t.cols);
    }
    check_finite(s, x, t.rows * t.cols, t.t0, t.c0, t.cols);
    const std::uint64_t quantized = t.t0 < g.quantized ? std::min(t.rows, g.quantized - t.t0) : 0;
    if (g.per_channel) {
      if (quantized > 0) {
        const std::uint64_t record = t.t0 / kKvGroupSize * g.channels + t.c0;
        encode_channel_groups(g.bits, x, quantized, t.cols, scratch.u.data(),
                              out + record * g.group_bytes);
      }
    } else {
      for (std::uint64_t r = 0; r < quantized; ++r) {
        const std::uint64_t record = (t.t0 + r) * g.groups_per_row + t.c0 / kKvGroupSize;
        encode_token_groups(g.bits, x + r * t.cols, t.cols, out + record * g.group_bytes);
      }
    }
    for (std::uint64_t r = quantized; r < t.rows; ++r) {  // the FP16 residual window
      const std::uint64_t at = (t.t0 + r - g.quantized) * g.channels + t.c0;
      detail::encode_fp16(x + r * t.cols, t.cols,
                          reinterpret_cast<std::byte*>(out + g.residual_offset + 2 * at));
    }
  });
}

void decode_stream(const KvStream& s, const std::uint8_t* in, std::uint64_t values, DType dtype,
                   std::byte* out) {
  if (values == 0) return;
  KvScratch& scratch = kv_scratch();
  float* x = scratch.x.data();
  const std::size_t width = dtype_bytes(dtype);
  if (!is_kv_group_codec(s.codec)) {
    if (s.codec == KvCodecId::bf16 && dtype == DType::bf16) {  // the same bits (NaNs quieted)
      detail::copy_bf16_quieting(reinterpret_cast<const std::byte*>(in), values, out);
      return;
    }
    for (std::uint64_t base = 0; base < values; base += kChunkValues) {
      const std::size_t n = std::min(kChunkValues, values - base);
      if (s.codec == KvCodecId::bf16) {
        detail::decode_bf16(reinterpret_cast<const std::byte*>(in + 2 * base), n, x);
      } else {
        decode_e4m3(in + base, n, x);
      }
      narrow(dtype, x, n, out + base * width);
    }
    return;
  }
  const KvGeometry g = kv_geometry(s);
  for_each_tile(g, [&](const Tile& t) {
    const std::uint64_t quantized = t.t0 < g.quantized ? std::min(t.rows, g.quantized - t.t0) : 0;
    if (g.per_channel) {
      if (quantized > 0) {
        const std::uint64_t record = t.t0 / kKvGroupSize * g.channels + t.c0;
        decode_channel_groups(g.bits, in + record * g.group_bytes, quantized, t.cols,
                              scratch.u.data(), x);
      }
    } else {
      for (std::uint64_t r = 0; r < quantized; ++r) {
        const std::uint64_t record = (t.t0 + r) * g.groups_per_row + t.c0 / kKvGroupSize;
        decode_token_groups(g.bits, in + record * g.group_bytes, t.cols, x + r * t.cols);
      }
    }
    for (std::uint64_t r = quantized; r < t.rows; ++r) {
      const std::uint64_t at = (t.t0 + r - g.quantized) * g.channels + t.c0;
      detail::decode_fp16(reinterpret_cast<const std::byte*>(in + g.residual_offset + 2 * at),
                          t.cols, x + r * t.cols);
    }
    for (std::uint64_t r = 0; r < t.rows; ++r) {
      narrow(dtype, x + r * t.cols, t.cols, out + ((t.t0 + r) * g.channels + t.c0) * width);
    }
  });
}

}  // namespace

const char* to_string(KvCodecId codec) noexcept {
  switch (codec) {
    case KvCodecId::bf16: return "bf16";
    case KvCodecId::fp8: return "fp8";
    case KvCodecId::kivi2: return "kivi2";
    case KvCodecId::kivi4: return "kivi4";
    case KvCodecId::flexgen4: return "flexgen4";
  }
  return "?";
}

const char* to_string(KvRole role) noexcept {
  switch (role) {
    case KvRole::keys: return "keys";
    case KvRole::values: return "values";
  }
  return "?";
}

bool parse_kv_codec(std::string_view text, KvCodecId& out) noexcept {
  for (const KvCodecId codec :
       {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2, KvCodecId::kivi4, KvCodecId::flexgen4}) {
    if (text == to_string(codec)) {
      out = codec;
      return true;
    }
  }
  return false;
}

namespace {
std::string non_finite_message(const KvStream& s, std::uint64_t token, std::uint64_t channel,
                               float value) {
  char number[32];
  std::snprintf(number, sizeof number, "%g", static_cast<double>(value));
  return "kv_encode: non-finite value " + std::string(number) + " at token " +
         std::to_string(token) + " channel " + std::to_string(channel) + " (" + to_string(s.codec) +
         " " + to_string(s.role) + ")";
}
}  // namespace

KvNonFiniteError::KvNonFiniteError(const KvStream& stream, std::uint64_t token,
                                   std::uint64_t channel, float value)
    : std::invalid_argument(non_finite_message(stream, token, channel, value)),
      token_(token),
      channel_(channel),
      value_(value) {}

void kv_encode(const KvStream& s, DType in_dtype, std::span<const std::byte> in,
               std::span<std::byte> out) {
  constexpr const char* fn = "kv_encode";
  const std::uint64_t values = check_stream(fn, s, in_dtype);
  // Input first: a span of that many values bounds tokens and channels, so the encoded
  // size below cannot overflow.
  if (in.size() / dtype_bytes(in_dtype) != values || in.size() % dtype_bytes(in_dtype) != 0) {
    fail(fn, describe(s) + ": input must be " + std::to_string(values) + " " + to_string(in_dtype) +
                 " values, got " + std::to_string(in.size()) + " bytes");
  }
  check_bytes(fn, s, "output", out.size(), kv_encoded_bytes(s));
  encode_stream(s, in_dtype, in.data(), values, reinterpret_cast<std::uint8_t*>(out.data()));
}

void kv_encode(const KvStream& s, std::span<const float> in, std::span<std::byte> out) {
  kv_encode(s, DType::f32, std::as_bytes(in), out);
}

void kv_decode(const KvStream& s, std::span<const std::byte> in, DType out_dtype,
               std::span<std::byte> out) {
  constexpr const char* fn = "kv_decode";
  const std::uint64_t values = check_stream(fn, s, out_dtype);
  if (out.size() / dtype_bytes(out_dtype) != values || out.size() % dtype_bytes(out_dtype) != 0) {
    fail(fn, describe(s) + ": output must be " + std::to_string(values) + " " +
                 to_string(out_dtype) + " values, got " + std::to_string(out.size()) + " bytes");
  }
  check_bytes(fn, s, "input", in.size(), kv_encoded_bytes(s));
  decode_stream(s, reinterpret_cast<const std::uint8_t*>(in.data()), values, out_dtype, out.data());
}

void kv_decode(const KvStream& s, std::span<const std::byte> in, std::span<float> out) {
  kv_decode(s, in, DType::f32, std::as_writable_bytes(out));
}

// --- KV blocks ---------------------------------------------------------------------

const char* kv_blocks_problem(const KvBlocks& b) noexcept {
  if (!valid_codec(b.codec)) return "unknown KV codec";
  if (b.layers == 0) return "KV blocks need at least 1 layer";
  if (b.layers > kKvMaxLayers) return "KV blocks have at most 1024 layers";
  if (b.key_channels == 0) return "KV blocks need at least 1 key channel";
  if (b.key_channels > kKvMaxChannels || b.value_channels > kKvMaxChannels) {
    return "KV blocks have at most 1048576 channels per stream";
  }
  if (b.tokens == 0) return "KV blocks need at least 1 token";
  if (b.tokens > kKvMaxTokens) return "KV blocks have at most 2^32 tokens";
  // At most 2^10 * 2^32 * 2^21 = 2^63 values: no overflow; as FP32, at most 2^48 bytes.
  const std::uint64_t values =
      std::uint64_t{b.layers} * b.tokens * (std::uint64_t{b.key_channels} + b.value_channels);
  if (values > (std::uint64_t{1} << (kKvMaxBytesLog2 - 2))) {
    return "KV blocks hold at most 2^48 bytes of FP32 values";
  }
  return nullptr;
}

std::vector<KvBlockStream> kv_block_streams(const KvBlocks& b, DType plain) {
  if (const char* problem = kv_blocks_problem(b)) fail("kv_block_streams", problem);
  const std::uint64_t width = dtype_bytes(plain);
  if (width == 0) fail("kv_block_streams", "plain values are f32, bf16 or f16");
  std::vector<KvBlockStream> out;
  out.reserve(std::size_t{b.layers} * kv_streams_per_layer(b));
  std::uint64_t plain_at = 0;
  std::uint64_t encoded_at = 0;
  for (std::uint32_t layer = 0; layer < b.layers; ++layer) {
    for (std::uint32_t r = 0; r < kv_streams_per_layer(b); ++r) {
      KvBlockStream s;
      s.layer = layer;
      s.stream.codec = b.codec;
      s.stream.role = r == 0 ? KvRole::keys : KvRole::values;
      s.stream.tokens = b.tokens;
      s.stream.channels = r == 0 ? b.key_channels : b.value_channels;
      // Bounded by the limits above: 2^10 layers * 2^32 tokens * 2^20 channels * 4 B.
      s.plain_offset = plain_at;
      s.plain_bytes = s.stream.tokens * s.stream.channels * width;
      s.encoded_offset = encoded_at;
      s.encoded_bytes = kv_encoded_bytes(s.stream);
      plain_at += s.plain_bytes;
      encoded_at += s.encoded_bytes;
      out.push_back(s);
    }
  }
  return out;
}

std::uint64_t kv_blocks_encoded_bytes(const KvBlocks& b) noexcept {
  if (kv_blocks_problem(b) != nullptr) return 0;
  std::uint64_t total = kv_encoded_bytes(b.codec, KvRole::keys, b.tokens, b.key_channels);
  if (b.value_channels != 0) {
    total += kv_encoded_bytes(b.codec, KvRole::values, b.tokens, b.value_channels);
  }
  return total * b.layers;
}

std::uint64_t kv_blocks_plain_bytes(const KvBlocks& b, DType plain) noexcept {
  if (kv_blocks_problem(b) != nullptr) return 0;
  const std::uint64_t width = dtype_bytes(plain);
  return std::uint64_t{b.layers} * b.tokens * (std::uint64_t{b.key_channels} + b.value_channels) *
         width;
}

std::string describe(const KvBlocks& b) {
  std::string out = std::string(to_string(b.codec)) + " KV blocks: " + std::to_string(b.layers) +
                    " layers x " + std::to_string(b.tokens) + " tokens, keys " +
                    std::to_string(b.key_channels);
  if (b.value_channels == 0) return out + " channels, no values";
  return out + " / values " + std::to_string(b.value_channels) + " channels";
}

namespace {

void check_blocks(const char* fn, const KvBlocks& b, DType plain, std::uint64_t plain_size,
                  std::uint64_t encoded_size) {
  if (const char* problem = kv_blocks_problem(b)) fail(fn, problem);
  const std::uint64_t want_plain = kv_blocks_plain_bytes(b, plain);
  if (want_plain == 0) fail(fn, "plain values are f32, bf16 or f16");
  if (plain_size != want_plain) {
    fail(fn, describe(b) + ": the values must be " + std::to_string(want_plain) + " bytes, got " +
                 std::to_string(plain_size));
  }
  const std::uint64_t want_encoded = kv_blocks_encoded_bytes(b);
  if (encoded_size != want_encoded) {
    fail(fn, describe(b) + ": the encoded blocks must be " + std::to_string(want_encoded) +
                 " bytes, got " + std::to_string(encoded_size));
  }
}

}  // namespace

void kv_encode_blocks(const KvBlocks& b, DType in_dtype, std::span<const std::byte> in,
                      std::span<std::byte> out) {
  check_blocks("kv_encode_blocks", b, in_dtype, in.size(), out.size());
  for (const KvBlockStream& s : kv_block_streams(b, in_dtype)) {
    kv_encode(s.stream, in_dtype, in.subspan(s.plain_offset, s.plain_bytes),
              out.subspan(s.encoded_offset, s.encoded_bytes));
  }
}

void kv_decode_blocks(const KvBlocks& b, std::span<const std::byte> in, DType out_dtype,
                      std::span<std::byte> out) {
  check_blocks("kv_decode_blocks", b, out_dtype, out.size(), in.size());
  for (const KvBlockStream& s : kv_block_streams(b, out_dtype)) {
    kv_decode(s.stream, in.subspan(s.encoded_offset, s.encoded_bytes), out_dtype,
              out.subspan(s.plain_offset, s.plain_bytes));
  }
}

namespace detail {

STATEPOOL_SIMD_CLONES std::size_t copy_bf16_checked(const std::byte* in, std::size_t n,
                                                    std::byte* out, float& value) noexcept {
  // Each value is loaded once, tested and stored (a vectorized loop); a block with a bad
  // value is searched in `out`, the caller's memory, so the check and the report agree
  // whoever rewrites `in` meanwhile.
  constexpr std::size_t kBlock = 2048;
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t count = std::min(kBlock, n - base);
    std::uint32_t any = 0;
    for (std::size_t j = 0; j < count; ++j) {
      std::uint16_t v;
      std::memcpy(&v, in + 2 * (base + j), 2);
      any |= static_cast<std::uint32_t>(is_non_finite_bf16(v));
      std::memcpy(out + 2 * (base + j), &v, 2);
    }
    if (any != 0) return base + first_non_finite(out + 2 * base, count, DType::bf16, value);
  }
  return n;
}

STATEPOOL_SIMD_CLONES void copy_bf16_quieting(const std::byte* in, std::size_t n,
                                              std::byte* out) noexcept {
  // Each value is loaded once and its result stored once (a page rewritten meanwhile
  // gives values that were there), straight from `in` to `out`: a vectorized loop.
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);
    const bool nan = (v & 0x7F80u) == 0x7F80u && (v & 0x007Fu) != 0;
    v = static_cast<std::uint16_t>(v | (nan ? 0x0040u : 0u));
    std::memcpy(out + 2 * i, &v, 2);
  }
}

}  // namespace detail

}  // namespace statepool::kernels
