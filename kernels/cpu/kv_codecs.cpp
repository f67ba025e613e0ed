// KV-cache codecs on the CPU (kv.hpp): argument checks, the non-finite scan, and a loop
// over the stream's work items through kv_math.hpp's functions, the same ones the CUDA
// kernels run per thread.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/kv_math.hpp"
#include "statepool/kernels/numeric.hpp"

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

struct LoadF32 {
  const std::byte* base;
  float operator()(std::uint64_t i) const noexcept {
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
};
struct LoadBf16 {
  const std::byte* base;
  float operator()(std::uint64_t i) const noexcept {
    std::uint16_t b;
    std::memcpy(&b, base + 2 * i, 2);
    return bf16_bits_to_float(b);
  }
};
struct LoadF16 {
  const std::byte* base;
  float operator()(std::uint64_t i) const noexcept {
    std::uint16_t b;
    std::memcpy(&b, base + 2 * i, 2);
    return half_bits_to_float(b);
  }
};

struct StoreF32 {
  std::byte* base;
  void operator()(std::uint64_t i, float v) const noexcept { std::memcpy(base + 4 * i, &v, 4); }
};
struct StoreBf16 {
  std::byte* base;
  void operator()(std::uint64_t i, float v) const noexcept {
    const std::uint16_t b = float_to_bf16_bits(v);
    std::memcpy(base + 2 * i, &b, 2);
  }
};
struct StoreF16 {
  std::byte* base;
  void operator()(std::uint64_t i, float v) const noexcept {
    const std::uint16_t b = float_to_half_bits(v);
    std::memcpy(base + 2 * i, &b, 2);
  }
};

/// Index of the first NaN / +-Inf among n values, or n.
template <class Load>
std::uint64_t first_non_finite(const Load& load, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (is_non_finite_bits(float_bits(load(i)))) {
      return i;
    }
  }
  return n;
}

template <class Load>
void encode_with(const KvStream& s, const Load& load, std::uint64_t values,
                 std::span<std::byte> out) {
  if (const std::uint64_t bad = first_non_finite(load, values); bad != values) {
    throw KvNonFiniteError(s, bad / s.channels, bad % s.channels, load(bad));
  }
  const KvGeometry g = kv_geometry(s);
  auto* dst = reinterpret_cast<std::uint8_t*>(out.data());
  const std::uint64_t items = kv_work_items(g);
  for (std::uint64_t item = 0; item < items; ++item) {
    kv_encode_item(s.codec, g, item, load, dst);
  }
}

template <class Store>
void decode_with(const KvStream& s, std::span<const std::byte> in, const Store& store) {
  const KvGeometry g = kv_geometry(s);
  const auto* src = reinterpret_cast<const std::uint8_t*>(in.data());
  const std::uint64_t items = kv_work_items(g);
  for (std::uint64_t item = 0; item < items; ++item) {
    kv_decode_item(s.codec, g, item, src, store);
  }
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
      channel_(channel) {}

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
  switch (in_dtype) {
    case DType::f32: encode_with(s, LoadF32{in.data()}, values, out); break;
    case DType::bf16: encode_with(s, LoadBf16{in.data()}, values, out); break;
    case DType::f16: encode_with(s, LoadF16{in.data()}, values, out); break;
  }
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
  switch (out_dtype) {
    case DType::f32: decode_with(s, in, StoreF32{out.data()}); break;
    case DType::bf16: decode_with(s, in, StoreBf16{out.data()}); break;
    case DType::f16: decode_with(s, in, StoreF16{out.data()}); break;
  }
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

}  // namespace statepool::kernels
