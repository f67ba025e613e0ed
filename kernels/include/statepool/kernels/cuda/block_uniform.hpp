#pragma once
// Uniform int codecs (int4, int6, int8: format.hpp) of one head, for the block bodies of
// block_codec.hpp: fp16 scales [groups], then one packed run of K V codes.
//
// Thread-safety: pure functions of their inputs.

#include <cstdint>

#include "statepool/kernels/cuda/block_io.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"

namespace statepool::kernels::cuda {

namespace detail {

template <class Staged, class Team>
STATEPOOL_HD void encode_uniform_head(const Team& t, const PageFormatView& f,
                                      const HeadValues<Staged>& x, std::uint8_t* out,
                                      std::uint64_t head_bytes) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  const std::uint32_t qmax = code_qmax(bits);
  // 32-bit within a head: K V <= kMaxHeadDim^2 = 2^24.
  const std::uint32_t n = f.key_dim * f.value_dim;
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;  // one division per head
  for (std::uint32_t g = t.rank(); g < groups; g += t.size()) {
    const std::uint32_t begin = g * group;
    const std::uint32_t end = group < n - begin ? begin + group : n;
    std::uint32_t absmax = 0;
    // kernel-report: uniform-scales 1 io
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t a = abs_bits(x.flat(i));
      absmax = a > absmax ? a : absmax;
    }
    store_half(out + 2 * g, uniform_scale_bits(absmax, qmax));
  }
  std::uint8_t* codes = out + 2 * groups;
  zero_bytes(t, out, 2 * std::uint64_t{groups} + packed_bytes(n, bits), head_bytes);
  t.sync();
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);  // .i: the quad's group
  // kernel-report: uniform-encode 4 io
  for (std::uint32_t q = t.rank(); q < quads; q += t.size(), group_of.next()) {
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = n - first < 4 ? n - first : 4;
    const float s = load_half_float(out + 2 * group_of.i);  // a quad is in one group
    std::uint8_t u[4] = {0, 0, 0, 0};
    for (std::uint32_t k = 0; k < rest; ++k) {
      u[k] = static_cast<std::uint8_t>(uniform_code(x.flat(first + k), s, qmax));
    }
    pack_quad_at(bits, u, rest, codes + q * quad_bytes(bits));
  }
}

template <class Staged, class Team>
STATEPOOL_HD void decode_uniform_head(const Team& t, const PageFormatView& f,
                                      const std::uint8_t* in, const HeadOut<Staged>& y) noexcept {
  const std::uint32_t bits = codec_code_bits(f.codec);
  const std::uint32_t qmax = code_qmax(bits);
  const std::uint32_t n = f.key_dim * f.value_dim;  // as in encode_uniform_head
  const std::uint32_t group = f.group_size;
  const std::uint32_t groups = (n + group - 1) / group;
  const std::uint8_t* codes = in + 2 * groups;
  const std::uint32_t quads = (n + 3) / 4;
  GridCursor group_of(4 * t.rank(), 4 * t.size(), group);
  // kernel-report: uniform-decode 4 io
  for (std::uint32_t q = t.rank(); q < quads; q += t.size(), group_of.next()) {
    const std::uint32_t first = 4 * q;
    const std::uint32_t rest = n - first < 4 ? n - first : 4;
    const float s = load_half_float(in + 2 * group_of.i);
    std::uint32_t u[4];
    unpack_quad_at(bits, codes + q * quad_bytes(bits), rest, u);
    for (std::uint32_t k = 0; k < rest; ++k) {
      y.store(first + k, uniform_value(u[k], s, qmax));
    }
  }
}

}  // namespace detail

}  // namespace statepool::kernels::cuda
