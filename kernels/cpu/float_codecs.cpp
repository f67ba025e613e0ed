// fp32 / bf16 / fp16: plain element types, no metadata; and the FP32 <-> bf16 / fp16 array
// conversions that the other codecs store and load their 16-bit values with
// (codecs_internal.hpp).

#include <algorithm>
#include <cstring>

#include "bytes.hpp"
#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::detail {
namespace {

// The byte buffers are read and written through 2-byte memcpy (any alignment), which GCC
// and Clang turn into plain vector loads and stores: the loops vectorize. (A stack buffer
// in between cost a rep movs per chunk, more than the conversion itself.)
template <std::uint16_t (*Convert)(float)>
STATEPOOL_FORCE_INLINE void encode_16(const float* src, std::size_t n, std::byte* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t b = Convert(src[i]);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

template <float (*Convert)(std::uint16_t)>
STATEPOOL_FORCE_INLINE void decode_16(const std::byte* src, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    dst[i] = Convert(b);
  }
}

std::uint16_t to_bf16(float v) {
  return float_to_bf16_bits(v);
}
std::uint16_t to_half(float v) {
  return float_to_half_bits(v);
}
float from_bf16(std::uint16_t b) {
  return bf16_bits_to_float(b);
}
float from_half(std::uint16_t b) {
  return half_bits_to_float(b);
}

}  // namespace

STATEPOOL_SIMD_CLONES void encode_bf16(const float* src, std::size_t n, std::byte* dst) {
  encode_16<to_bf16>(src, n, dst);
}
STATEPOOL_SIMD_CLONES void encode_fp16(const float* src, std::size_t n, std::byte* dst) {
  encode_16<to_half>(src, n, dst);
}
STATEPOOL_SIMD_CLONES void decode_bf16(const std::byte* src, std::size_t n, float* dst) {
  decode_16<from_bf16>(src, n, dst);
}
STATEPOOL_SIMD_CLONES void decode_fp16(const std::byte* src, std::size_t n, float* dst) {
  decode_16<from_half>(src, n, dst);
}

// Block by block through a copy in L1: each value is read once, checked and converted
// from the copy (codecs_internal.hpp's copy_finite_block); memory, not the copy, is the
// limit. Returns the index of the first non-finite value, or n.
STATEPOOL_SIMD_CLONES std::size_t encode_float_staged(CodecId id, const std::byte* src, DType dtype,
                                                      std::size_t n, std::byte* dst, float& bad) {
  constexpr std::size_t kBlock = 256;
  float block[kBlock];
  const std::size_t width = float_codec_value_bytes(id);
  for (std::size_t base = 0; base < n; base += kBlock) {
    const std::size_t count = std::min(kBlock, n - base);
    const std::size_t at =
        copy_finite_block(src + base * dtype_bytes(dtype), count, dtype, block, bad);
    if (at != count) return base + at;
    std::byte* out = dst + base * width;
    switch (id) {
      case CodecId::bf16: encode_16<to_bf16>(block, count, out); break;
      case CodecId::fp16: encode_16<to_half>(block, count, out); break;
      default: std::memcpy(out, block, count * sizeof(float)); break;
    }
  }
  return n;
}

namespace {

class FloatCodec final : public Codec {
 public:
  FloatCodec(CodecId id, std::uint32_t key_dim, std::uint32_t value_dim)
      : Codec(std::size_t{key_dim} * value_dim),
        id_(id),
        values_(static_cast<std::size_t>(key_dim) * value_dim),
        head_bytes_(float_head_bytes(values_, id)) {}

  [[nodiscard]] CodecId id() const noexcept override { return id_; }
  [[nodiscard]] std::size_t head_bytes(std::uint32_t, std::uint32_t) const noexcept override {
    return head_bytes_;
  }

  void encode_head(std::uint32_t, std::uint32_t, std::span<const float> src,
                   std::span<std::byte> dst) const override {
    check_head_buffers(to_string(id_), src.size(), values_, dst.size(), head_bytes_);
    const std::size_t used = values_ * float_codec_value_bytes(id_);
    switch (id_) {
      case CodecId::bf16: encode_bf16(src.data(), values_, dst.data()); break;
      case CodecId::fp16: encode_fp16(src.data(), values_, dst.data()); break;
      default: std::memcpy(dst.data(), src.data(), used); break;
    }
    std::fill(dst.begin() + static_cast<std::ptrdiff_t>(used), dst.end(), std::byte{0});
  }

  [[nodiscard]] std::size_t encode_staged_head(std::uint32_t, std::uint32_t, const std::byte* src,
                                               DType dtype, std::span<std::byte> dst,
                                               float& bad) const override {
    check_head_buffers(to_string(id_), values_, values_, dst.size(), head_bytes_);
    check_staged_dtype(dtype);
    const std::size_t at = encode_float_staged(id_, src, dtype, values_, dst.data(), bad);
    if (at == values_) {
      const std::size_t used = values_ * float_codec_value_bytes(id_);
      std::fill(dst.begin() + static_cast<std::ptrdiff_t>(used), dst.end(), std::byte{0});
    }
    return at;
  }

  void decode_head(std::uint32_t, std::uint32_t, std::span<const std::byte> src,
                   std::span<float> dst) const override {
    check_head_buffers(to_string(id_), dst.size(), values_, src.size(), head_bytes_);
    switch (id_) {
      case CodecId::bf16: decode_bf16(src.data(), values_, dst.data()); break;
      case CodecId::fp16: decode_fp16(src.data(), values_, dst.data()); break;
      default: std::memcpy(dst.data(), src.data(), values_ * sizeof(float)); break;
    }
  }

 private:
  CodecId id_;
  std::size_t values_;
  std::size_t head_bytes_;
};

}  // namespace

std::unique_ptr<Codec> make_float_codec(const StateLayout& layout) {
  return std::make_unique<FloatCodec>(layout.codec.id, layout.key_dim, layout.value_dim);
}

}  // namespace statepool::kernels::detail
