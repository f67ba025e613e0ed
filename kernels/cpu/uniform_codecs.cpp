// int4 / int6 / int8: symmetric, absmax per group, fp16 scales (format.hpp, quantize.hpp).
//
// Fast path: per group, an integer max over |x| bits, then fixed-size chunks that are
// quantized into a byte array (vectorizable) and packed quad by quad. Tested against
// reference.cpp byte for byte.

#include <algorithm>
#include <cstring>

#include "bytes.hpp"
#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"

namespace statepool::kernels::detail {
namespace {

constexpr std::size_t kChunk = 512;  // a multiple of 4, so chunks start on quad boundaries

STATEPOOL_FORCE_INLINE std::uint32_t group_absmax_bits(const float* x, std::size_t count) {
  // int32 rather than uint32: |x| bits fit in 31 bits and SSE2 has signed compares only.
  std::int32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    m = std::max(m, static_cast<std::int32_t>(abs_bits(x[i])));
  }
  return static_cast<std::uint32_t>(m);
}

template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void encode_uniform_body(const float* x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  constexpr std::uint32_t qmax = code_qmax(Bits);
  const std::size_t groups = uniform_group_count(n, group);
  std::uint8_t* codes = as_u8(out + 2 * groups);
  alignas(64) std::uint8_t u[kChunk];

  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * group;
    const std::size_t count = std::min<std::size_t>(group, n - begin);
    const float* xg = x + begin;
    const std::uint16_t scale_bits = uniform_scale_bits(group_absmax_bits(xg, count), qmax);
    store_u16_le(out + 2 * g, scale_bits);
    const float s = half_bits_to_float(scale_bits);
    std::uint8_t* cg = codes + packed_bytes(begin, Bits);  // begin is a multiple of 4

    for (std::size_t c = 0; c < count; c += kChunk) {
      const std::size_t len = std::min(kChunk, count - c);
      std::uint8_t* dst = Bits == 8 ? cg + c : u;  // 8-bit codes are their own packing
      if (s > 0.0f) {
        for (std::size_t i = 0; i < len; ++i) {
          dst[i] = static_cast<std::uint8_t>(uniform_code_positive_scale(xg[c + i], s, qmax));
        }
      } else {
        std::memset(dst, static_cast<int>(qmax), len);
      }
      if constexpr (Bits != 8) {
        pack_codes<Bits>(u, len, cg + packed_bytes(c, Bits));
      }
    }
  }
  // Everything after the last code byte is padding (pack_codes already zero-fills the
  // unused slots of a final partial quad).
  const std::size_t used = 2 * groups + packed_bytes(n, Bits);
  std::memset(out + used, 0, out_bytes - used);
}

template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void decode_uniform_body(const std::byte* in, std::size_t n,
                                                std::uint32_t group, float* x) {
  constexpr std::uint32_t qmax = code_qmax(Bits);
  const std::size_t groups = uniform_group_count(n, group);
  const std::uint8_t* codes = as_u8(in + 2 * groups);
  alignas(64) std::uint8_t u[kChunk];

  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * group;
    const std::size_t count = std::min<std::size_t>(group, n - begin);
    const float s = half_bits_to_float(load_u16_le(in + 2 * g));
    const std::uint8_t* cg = codes + packed_bytes(begin, Bits);
    float* xg = x + begin;

    for (std::size_t c = 0; c < count; c += kChunk) {
      const std::size_t len = std::min(kChunk, count - c);
      const std::uint8_t* src = u;
      if constexpr (Bits == 8) {
        src = cg + c;
      } else {
        unpack_codes<Bits>(cg + packed_bytes(c, Bits), len, u);
      }
      for (std::size_t i = 0; i < len; ++i) {
        xg[c + i] = uniform_value(src[i], s, qmax);
      }
    }
  }
}

// Cloned (simd.hpp) entry points, one per width.
STATEPOOL_SIMD_CLONES void encode_int4(const float* x, std::size_t n, std::uint32_t group,
                                       std::byte* out, std::size_t out_bytes) {
  encode_uniform_body<4>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES void encode_int6(const float* x, std::size_t n, std::uint32_t group,
                                       std::byte* out, std::size_t out_bytes) {
  encode_uniform_body<6>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES void encode_int8(const float* x, std::size_t n, std::uint32_t group,
                                       std::byte* out, std::size_t out_bytes) {
  encode_uniform_body<8>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES void decode_int4(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<4>(in, n, group, x);
}
STATEPOOL_SIMD_CLONES void decode_int6(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<6>(in, n, group, x);
}
STATEPOOL_SIMD_CLONES void decode_int8(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<8>(in, n, group, x);
}

template <std::uint32_t Bits>
void encode_uniform(const float* x, std::size_t n, std::uint32_t group, std::byte* out,
                    std::size_t out_bytes) {
  if constexpr (Bits == 4) {
    encode_int4(x, n, group, out, out_bytes);
  } else if constexpr (Bits == 6) {
    encode_int6(x, n, group, out, out_bytes);
  } else {
    encode_int8(x, n, group, out, out_bytes);
  }
}

template <std::uint32_t Bits>
void decode_uniform(const std::byte* in, std::size_t n, std::uint32_t group, float* x) {
  if constexpr (Bits == 4) {
    decode_int4(in, n, group, x);
  } else if constexpr (Bits == 6) {
    decode_int6(in, n, group, x);
  } else {
    decode_int8(in, n, group, x);
  }
}

template <std::uint32_t Bits>
class UniformCodec final : public Codec {
 public:
  UniformCodec(CodecId id, std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t group)
      : id_(id),
        group_(group),
        values_(static_cast<std::size_t>(key_dim) * value_dim),
        head_bytes_(uniform_head_bytes(values_, group, Bits)) {}

  [[nodiscard]] CodecId id() const noexcept override { return id_; }
  [[nodiscard]] std::size_t head_bytes(std::uint32_t, std::uint32_t) const noexcept override {
    return head_bytes_;
  }

  void encode_head(std::uint32_t, std::uint32_t, std::span<const float> src,
                   std::span<std::byte> dst) const override {
    check_head_buffers(to_string(id_), src.size(), values_, dst.size(), head_bytes_);
    encode_uniform<Bits>(src.data(), values_, group_, dst.data(), dst.size());
  }

  void decode_head(std::uint32_t, std::uint32_t, std::span<const std::byte> src,
                   std::span<float> dst) const override {
    check_head_buffers(to_string(id_), dst.size(), values_, src.size(), head_bytes_);
    decode_uniform<Bits>(src.data(), values_, group_, dst.data());
  }

 private:
  CodecId id_;
  std::uint32_t group_;
  std::size_t values_;
  std::size_t head_bytes_;
};

}  // namespace

std::unique_ptr<Codec> make_uniform_codec(const StateLayout& layout) {
  const std::uint32_t group = effective_group_size(layout.codec.group_size);
  const CodecId id = layout.codec.id;
  switch (codec_code_bits(id)) {
    case 4: return std::make_unique<UniformCodec<4>>(id, layout.key_dim, layout.value_dim, group);
    case 6: return std::make_unique<UniformCodec<6>>(id, layout.key_dim, layout.value_dim, group);
    default: return std::make_unique<UniformCodec<8>>(id, layout.key_dim, layout.value_dim, group);
  }
}

}  // namespace statepool::kernels::detail
