#pragma once
// Float codecs (fp32, bf16, fp16) of one head, for the block bodies of block_codec.hpp.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_io.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::cuda {

namespace detail {

// A float head is K V values of 2 or 4 bytes from the head's start (4-byte aligned in the
// page). Vector path, when the staged head and the page head both start 16-byte aligned
// and K V is a multiple of 8 (every real model's shape): a rank per 8 values, 128-bit
// loads and stores on both sides. Otherwise a rank per value with element-wide accesses.

// 8 values into a float page's bytes at `out` (16-byte aligned): fp32 and bf16 pages hold
// the values as the staged kinds of the same width do.
STATEPOOL_HD inline void store_float8(CodecId codec, std::uint8_t* out, const float* v) noexcept {
  if (codec == CodecId::fp32) {
    store8<StagedF32>(out, 0, v);
  } else if (codec == CodecId::bf16) {
    store8<StagedBf16>(out, 0, v);
  } else {
    Words4 a;
    for (std::uint32_t k = 0; k < 4; ++k) {
      a.w[k] = std::uint32_t{float_to_half_bits(v[2 * k])} |
               (std::uint32_t{float_to_half_bits(v[2 * k + 1])} << 16);
    }
    store16(out, a);
  }
}

// 8 values from a float page's bytes at `in` (16-byte aligned).
STATEPOOL_HD inline void load_float8(CodecId codec, const std::uint8_t* in, float* v) noexcept {
  if (codec == CodecId::fp32) {
    load8<StagedF32>(in, 0, v);
  } else if (codec == CodecId::bf16) {
    load8<StagedBf16>(in, 0, v);
  } else {
    const Words4 a = load16(in);
    for (std::uint32_t k = 0; k < 4; ++k) {
      v[2 * k] = half_bits_to_float(static_cast<std::uint16_t>(a.w[k]));
      v[2 * k + 1] = half_bits_to_float(static_cast<std::uint16_t>(a.w[k] >> 16));
    }
  }
}

template <class Staged>
STATEPOOL_HD inline bool float_head_vectors(const PageFormatView& f, const void* base,
                                            std::uint64_t first,
                                            const std::uint8_t* page) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;
  return n % 8 == 0 && aligned16(Staged::address(base, first)) && aligned16(page);
}

template <class Staged, class Team>
STATEPOOL_HD void encode_float_head(const Team& t, const PageFormatView& f, CodecId codec,
                                    const HeadValues<Staged>& x, std::uint8_t* out,
                                    std::uint64_t head_bytes) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;  // <= kMaxHeadDim^2 = 2^24
  const std::uint32_t width = float_codec_value_bytes(codec);
  if (float_head_vectors<Staged>(f, x.base, x.first, out)) {
    // kernel-report: float-encode 8 io
    for (std::uint32_t c = t.rank(); c < n / 8; c += t.size()) {
      float v[8];
      load8<Staged>(x.base, x.first + 8 * c, v);
      store_float8(codec, out + 8 * width * c, v);
    }
  } else {
    for (std::uint32_t i = t.rank(); i < n; i += t.size()) {
      const float v = x.flat(i);
      if (codec == CodecId::fp32) {
        reinterpret_cast<std::uint32_t*>(out)[i] = float_bits(v);  // 4-byte aligned head
      } else {
        reinterpret_cast<std::uint16_t*>(out)[i] =
            codec == CodecId::bf16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
      }
    }
  }
  zero_bytes(t, out, std::uint64_t{n} * width, head_bytes);
}

template <class Staged, class Team>
STATEPOOL_HD void decode_float_head(const Team& t, const PageFormatView& f, CodecId codec,
                                    const std::uint8_t* in, const HeadOut<Staged>& y) noexcept {
  const std::uint32_t n = f.key_dim * f.value_dim;
  const std::uint32_t width = float_codec_value_bytes(codec);
  if (float_head_vectors<Staged>(f, y.base, y.first, in)) {
    // kernel-report: float-decode 8 io
    for (std::uint32_t c = t.rank(); c < n / 8; c += t.size()) {
      float v[8];
      load_float8(codec, in + 8 * width * c, v);
      store8<Staged>(y.base, y.first + 8 * c, v);
    }
    return;
  }
  for (std::uint32_t i = t.rank(); i < n; i += t.size()) {
    float v;
    if (codec == CodecId::fp32) {
      v = bits_float(reinterpret_cast<const std::uint32_t*>(in)[i]);
    } else {
      const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(in)[i];
      v = codec == CodecId::bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
    }
    y.store(i, v);
  }
}

}  // namespace detail

}  // namespace statepool::kernels::cuda
