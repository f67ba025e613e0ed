// KV-cache codecs on the CPU (kv.hpp): argument checks, the non-finite scan, and a loop
// over the stream's work items through kv_math.hpp's functions, the same ones the CUDA
// kernels run per thread.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

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

}  // namespace statepool::kernels
