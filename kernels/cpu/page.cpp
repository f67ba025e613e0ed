#include "statepool/kernels/page.hpp"

#include <cassert>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/numeric.hpp"

#if defined(STATEPOOL_KERNELS_AVX2)
#include <immintrin.h>
#endif

namespace statepool::kernels {
namespace {

void check_size(const char* what, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw std::invalid_argument(std::string(what) + " must be " + std::to_string(expected) +
                                " bytes for this layout, got " + std::to_string(got));
  }
}

bool aligned_for_float(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0;
}

// --- value-major heads -------------------------------------------------------------------
//
// A [V][K] head is transposed to [K][V] FP32 (and back) in tiles, so that the rows a tile
// reads and the rows it writes stay in L1: 8 x 8 values in AVX2 registers where the CPU has
// AVX2 (simd.hpp), else kTile x kTile values in plain loops. Only moves, no arithmetic (bf16
// widens exactly), so both give the same values. Each input value is read once and each
// output value written once.

constexpr std::size_t kTile = 16;

STATEPOOL_FORCE_INLINE float load_staged(const std::byte* p, DType dtype) {
  if (dtype == DType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return bf16_bits_to_float(b);  // exact
}

// One tile of `src` ([rows][cols] values in `D`, any alignment): rows [r0, r0 + rn), columns
// [c0, c0 + cn), into `dst` ([cols][rows] FP32, any alignment). Constant trip counts for
// whole tiles.
template <DType D>
STATEPOOL_FORCE_INLINE void transpose_tile(const std::byte* src, std::size_t rows, std::size_t cols,
                                           std::size_t r0, std::size_t rn, std::size_t c0,
                                           std::size_t cn, std::byte* dst) {
  constexpr std::size_t width = D == DType::f32 ? 4 : 2;
  for (std::size_t r = r0; r < r0 + rn; ++r) {
    const std::byte* row = src + (r * cols + c0) * width;
    std::byte* column = dst + (c0 * rows + r) * 4;
    for (std::size_t c = 0; c < cn; ++c) {
      const float v = load_staged(row + c * width, D);
      std::memcpy(column + c * rows * 4, &v, 4);
    }
  }
}

template <DType D>
STATEPOOL_FORCE_INLINE void transpose_portable_t(const std::byte* src, std::size_t rows,
                                                 std::size_t cols, std::byte* dst) {
  for (std::size_t r0 = 0; r0 < rows; r0 += kTile) {
    const std::size_t rn = std::min(kTile, rows - r0);
    for (std::size_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::size_t cn = std::min(kTile, cols - c0);
      if (rn == kTile && cn == kTile) {
        transpose_tile<D>(src, rows, cols, r0, kTile, c0, kTile, dst);
      } else {
        transpose_tile<D>(src, rows, cols, r0, rn, c0, cn, dst);
      }
    }
  }
}

STATEPOOL_SIMD_CLONES void transpose_portable(const std::byte* src, DType dtype, std::size_t rows,
                                              std::size_t cols, std::byte* dst) {
  if (dtype == DType::f32) {
    transpose_portable_t<DType::f32>(src, rows, cols, dst);
  } else {
    transpose_portable_t<DType::bf16>(src, rows, cols, dst);
  }
}

#if defined(STATEPOOL_KERNELS_AVX2)

// Row `r` of an 8 x 8 tile whose first value is at `p`, rows `stride` bytes apart, as FP32.
template <DType D>
[[gnu::target("avx2")]] inline __m256 load_row(const std::byte* p, std::size_t stride,
                                               std::size_t r) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p + r * stride));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r * stride));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// One 8 x 8 tile: src rows `src_stride` bytes apart (values in D) -> dst rows `dst_stride`
// bytes apart (FP32), transposed.
template <DType D>
[[gnu::target("avx2")]] inline void transpose_8x8(const std::byte* src, std::size_t src_stride,
                                                  std::byte* dst, std::size_t dst_stride) {
  const __m256 r0 = load_row<D>(src, src_stride, 0);
  const __m256 r1 = load_row<D>(src, src_stride, 1);
  const __m256 r2 = load_row<D>(src, src_stride, 2);
  const __m256 r3 = load_row<D>(src, src_stride, 3);
  const __m256 r4 = load_row<D>(src, src_stride, 4);
  const __m256 r5 = load_row<D>(src, src_stride, 5);
  const __m256 r6 = load_row<D>(src, src_stride, 6);
  const __m256 r7 = load_row<D>(src, src_stride, 7);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1);
  const __m256 t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3);
  const __m256 t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5);
  const __m256 t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7);
  const __m256 t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44);
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44);
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44);
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44);
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  float* out[8];
  for (std::size_t r = 0; r < 8; ++r) out[r] = reinterpret_cast<float*>(dst + r * dst_stride);
  _mm256_storeu_ps(out[0], _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(out[1], _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(out[2], _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(out[3], _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(out[4], _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(out[5], _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(out[6], _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(out[7], _mm256_permute2f128_ps(u3, u7, 0x31));
}

template <DType D>
[[gnu::target("avx2")]] void transpose_avx2(const std::byte* src, std::size_t rows,
                                            std::size_t cols, std::byte* dst) {
  constexpr std::size_t width = D == DType::f32 ? 4 : 2;
  const std::size_t full_rows = rows - rows % 8;
  const std::size_t full_cols = cols - cols % 8;
  // Eight output rows at a time, each written from start to end.
  for (std::size_t c0 = 0; c0 < full_cols; c0 += 8) {
    for (std::size_t r0 = 0; r0 < full_rows; r0 += 8) {
      transpose_8x8<D>(src + (r0 * cols + c0) * width, cols * width, dst + (c0 * rows + r0) * 4,
                       rows * 4);
    }
    if (full_rows < rows) transpose_tile<D>(src, rows, cols, full_rows, rows % 8, c0, 8, dst);
  }
  if (full_cols < cols) transpose_tile<D>(src, rows, cols, 0, rows, full_cols, cols % 8, dst);
}

#endif  // STATEPOOL_KERNELS_AVX2

/// `src` ([rows][cols] values in `dtype`, f32 or bf16, any alignment) -> `dst` ([cols][rows]
/// FP32, any alignment).
void transpose_to_f32(const std::byte* src, DType dtype, std::size_t rows, std::size_t cols,
                      std::byte* dst) {
#if defined(STATEPOOL_KERNELS_AVX2)
  if (detail::use_avx2_loops()) {
    if (dtype == DType::f32) return transpose_avx2<DType::f32>(src, rows, cols, dst);
    return transpose_avx2<DType::bf16>(src, rows, cols, dst);
  }
#endif
  transpose_portable(src, dtype, rows, cols, dst);
}

/// FP32 heads of this thread's (value-major heads pass through them): `which` 0 or 1.
float* head_scratch(std::size_t n, int which = 0) {
  thread_local std::vector<float> heads[2];
  std::vector<float>& head = heads[which];
  if (head.size() < n) head.resize(n);
  return head.data();
}

}  // namespace

PageCodec::PageCodec(StateLayout layout) : layout_(std::move(layout)) {
  codec_ = make_codec(layout_);  // validates
  const std::size_t heads = std::size_t{layout_.num_layers} * layout_.num_heads;
  head_offsets_.resize(heads + 1);
  std::size_t offset = 0;
  for (std::uint32_t l = 0; l < layout_.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout_.num_heads; ++h) {
      head_offsets_[std::size_t{l} * layout_.num_heads + h] = offset;
      offset += codec_->head_bytes(l, h);
    }
  }
  head_offsets_[heads] = offset;
  conv_offset_ = offset;
  page_bytes_ = conv_offset_ + conv_bytes();
}

std::size_t PageCodec::head_offset(std::uint32_t layer, std::uint32_t head) const noexcept {
  assert(layer < layout_.num_layers && head < layout_.num_heads);
  return head_offsets_[std::size_t{layer} * layout_.num_heads + head];
}

std::size_t PageCodec::conv_bytes() const noexcept {
  return std::size_t{layout_.num_layers} * layout_.conv_channels * layout_.conv_width *
         dtype_bytes(layout_.conv_dtype);
}

std::size_t PageCodec::fp32_bytes() const noexcept {
  const std::size_t values =
      std::size_t{layout_.num_layers} * layout_.num_heads * layout_.key_dim * layout_.value_dim;
  const std::size_t conv_values =
      std::size_t{layout_.num_layers} * layout_.conv_channels * layout_.conv_width;
  return 4 * (values + conv_values);
}

std::size_t PageCodec::staged_bytes(DType dtype) const noexcept {
  const std::size_t values =
      std::size_t{layout_.num_layers} * layout_.num_heads * layout_.key_dim * layout_.value_dim;
  return values * dtype_bytes(dtype) + conv_bytes();
}

double PageCodec::compression_ratio() const noexcept {
  return static_cast<double>(fp32_bytes()) / static_cast<double>(page_bytes_);
}

void PageCodec::check_buffers(std::span<const std::byte> staged, DType dtype,
                              std::span<const std::byte> page) const {
  detail::check_staged_dtype(dtype);
  check_size("staged state", staged.size(), staged_bytes(dtype));
  check_size("page", page.size(), page_bytes_);
}

void PageCodec::check_range(std::size_t first, std::size_t last) const {
  if (first > last || last > head_count()) {
    throw std::invalid_argument("head range [" + std::to_string(first) + ", " +
                                std::to_string(last) + ") is not within the layout's " +
                                std::to_string(head_count()) + " heads");
  }
}

void PageCodec::encode(std::span<const std::byte> staged, DType dtype,
                       std::span<std::byte> page) const {
  check_buffers(staged, dtype, page);
  // Check everything before writing anything: a rejected state leaves the page as it was
  // (unless the staged values change between the check and the encode, which checks again).
  check_finite(staged, dtype, 0, head_count());
  encode_heads(staged, dtype, page, 0, head_count());
  encode_conv(staged, dtype, page);
}

void PageCodec::decode(std::span<const std::byte> page, DType dtype,
                       std::span<std::byte> staged) const {
  detail::check_staged_dtype(dtype);
  check_size("page", page.size(), page_bytes_);
  check_size("staged state", staged.size(), staged_bytes(dtype));
  decode_heads(page, dtype, staged, 0, head_count());
  decode_conv(page, dtype, staged);
}

void PageCodec::check_finite(std::span<const std::byte> staged, DType dtype, std::size_t first,
                             std::size_t last) const {
  detail::check_staged_dtype(dtype);
  check_size("staged state", staged.size(), staged_bytes(dtype));
  check_range(first, last);
  check_finite_at(staged.data(), dtype, HeadOrder::key_major, first, last);
}

void PageCodec::encode_heads(std::span<const std::byte> staged, DType dtype,
                             std::span<std::byte> page, std::size_t first, std::size_t last) const {
  check_buffers(staged, dtype, page);
  check_range(first, last);
  encode_heads_at(staged.data(), dtype, HeadOrder::key_major, page, first, last);
}

void PageCodec::encode_conv(std::span<const std::byte> staged, DType dtype,
                            std::span<std::byte> page) const {
  check_buffers(staged, dtype, page);
  if (const std::size_t conv = conv_bytes(); conv != 0) {
    std::memcpy(page.data() + conv_offset_, staged.data() + staged.size() - conv, conv);
  }
}

void PageCodec::decode_heads(std::span<const std::byte> page, DType dtype,
                             std::span<std::byte> staged, std::size_t first,
                             std::size_t last) const {
  check_buffers(staged, dtype, page);
  check_range(first, last);
  decode_heads_at(page, staged.data(), dtype, HeadOrder::key_major, first, last);
}

void PageCodec::decode_conv(std::span<const std::byte> page, DType dtype,
                            std::span<std::byte> staged) const {
  check_buffers(staged, dtype, page);
  if (const std::size_t conv = conv_bytes(); conv != 0) {
    std::memcpy(staged.data() + staged.size() - conv, page.data() + conv_offset_, conv);
  }
}

// --- staged views ---------------------------------------------------------------------

void PageCodec::check_view(const StateView& staged) const {
  detail::check_staged_dtype(staged.dtype);
  if (staged.order != HeadOrder::key_major && staged.order != HeadOrder::value_major) {
    throw std::invalid_argument("unknown head order " +
                                std::to_string(static_cast<unsigned>(staged.order)));
  }
  const std::size_t values =
      std::size_t{layout_.num_layers} * layout_.num_heads * layout_.key_dim * layout_.value_dim;
  check_size("staged recurrent state", staged.recurrent.size(), values * dtype_bytes(staged.dtype));
  check_size("staged conv state", staged.conv.size(), conv_bytes());
}

void PageCodec::encode(const StateView& staged, std::span<std::byte> page) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  // As encode(): everything checked before anything is written.
  check_finite_at(staged.recurrent.data(), staged.dtype, staged.order, 0, head_count());
  encode_heads_at(staged.recurrent.data(), staged.dtype, staged.order, page, 0, head_count());
  encode_conv(staged, page);
}

void PageCodec::decode(std::span<const std::byte> page, const StateView& staged) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  decode_heads_at(page, staged.recurrent.data(), staged.dtype, staged.order, 0, head_count());
  decode_conv(page, staged);
}

void PageCodec::check_finite(const StateView& staged, std::size_t first, std::size_t last) const {
  check_view(staged);
  check_range(first, last);
  check_finite_at(staged.recurrent.data(), staged.dtype, staged.order, first, last);
}

void PageCodec::encode_heads(const StateView& staged, std::span<std::byte> page, std::size_t first,
                             std::size_t last) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  check_range(first, last);
  encode_heads_at(staged.recurrent.data(), staged.dtype, staged.order, page, first, last);
}

void PageCodec::encode_conv(const StateView& staged, std::span<std::byte> page) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  if (!staged.conv.empty()) {
    std::memcpy(page.data() + conv_offset_, staged.conv.data(), staged.conv.size());
  }
}

void PageCodec::decode_heads(std::span<const std::byte> page, const StateView& staged,
                             std::size_t first, std::size_t last) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  check_range(first, last);
  decode_heads_at(page, staged.recurrent.data(), staged.dtype, staged.order, first, last);
}

void PageCodec::decode_conv(std::span<const std::byte> page, const StateView& staged) const {
  check_view(staged);
  check_size("page", page.size(), page_bytes_);
  if (!staged.conv.empty()) {
    std::memcpy(staged.conv.data(), page.data() + conv_offset_, staged.conv.size());
  }
}

// --- the loops, on checked buffers ------------------------------------------------------

void PageCodec::check_finite_at(const std::byte* recurrent, DType dtype, HeadOrder order,
                                std::size_t first, std::size_t last) const {
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t in_head = n * dtype_bytes(dtype);
  for (std::size_t index = first; index < last; ++index) {
    const std::byte* src = recurrent + index * in_head;
    float value = 0.0f;
    std::size_t bad = detail::first_non_finite(src, n, dtype, value);
    if (bad == n) continue;
    if (order == HeadOrder::value_major) {
      // The first in [K][V] order, as the packed layout reports it: from a transposed copy
      // of the head (one reading, so the index and the value agree). Should the values have
      // changed since the scan and the copy hold none, the one the scan read is reported.
      float* head = head_scratch(n);
      transpose_to_f32(src, dtype, layout_.value_dim, layout_.key_dim,
                       reinterpret_cast<std::byte*>(head));
      float copied = 0.0f;
      const std::size_t at =
          detail::first_non_finite(reinterpret_cast<const std::byte*>(head), n, DType::f32, copied);
      if (at != n) {
        bad = at;
        value = copied;
      } else {
        bad = (bad % layout_.key_dim) * layout_.value_dim + bad / layout_.key_dim;
      }
    }
    const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
    const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
    throw NonFiniteError(layer, head, bad, value, layout_.value_dim);
  }
}

void PageCodec::encode_heads_at(const std::byte* recurrent, DType dtype, HeadOrder order,
                                std::span<std::byte> page, std::size_t first,
                                std::size_t last) const {
  if (first == last) return;
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t in_head = n * dtype_bytes(dtype);
  // Each staged value is read once, into memory of this thread's, and checked and encoded
  // from there: the staged state may be a client's memory, rewritten while this runs.
  // Key-major heads: Codec::encode_staged_head does that. Value-major heads: the transpose
  // is that reading, and the codec checks the transposed head as it encodes it.
  float* transposed = order == HeadOrder::value_major ? head_scratch(n) : nullptr;
  for (std::size_t index = first; index < last; ++index) {
    const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
    const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
    const std::byte* src = recurrent + index * in_head;
    const auto dst =
        page.subspan(head_offsets_[index], head_offsets_[index + 1] - head_offsets_[index]);
    float value = 0.0f;
    std::size_t bad = n;
    if (transposed == nullptr) {
      bad = codec_->encode_staged_head(layer, head, src, dtype, dst, value);
    } else {
      transpose_to_f32(src, dtype, layout_.value_dim, layout_.key_dim,
                       reinterpret_cast<std::byte*>(transposed));
      if (!codec_->encode_head_checked(layer, head, {transposed, n}, dst)) {
        bad = detail::first_non_finite(reinterpret_cast<const std::byte*>(transposed), n,
                                       DType::f32, value);
      }
    }
    if (bad != n) throw NonFiniteError(layer, head, bad, value, layout_.value_dim);
  }
}

void PageCodec::decode_heads_at(std::span<const std::byte> page, std::byte* recurrent, DType dtype,
                                HeadOrder order, std::size_t first, std::size_t last) const {
  if (first == last) return;
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t out_head = n * dtype_bytes(dtype);
  const bool direct =
      order == HeadOrder::key_major && dtype == DType::f32 && aligned_for_float(recurrent);
  float* scratch = direct ? nullptr : head_scratch(n);
  for (std::size_t index = first; index < last; ++index) {
    const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
    const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
    std::byte* dst = recurrent + index * out_head;
    const auto src =
        page.subspan(head_offsets_[index], head_offsets_[index + 1] - head_offsets_[index]);
    if (direct) {
      codec_->decode_head(layer, head, src, {reinterpret_cast<float*>(dst), n});
      continue;
    }
    codec_->decode_head(layer, head, src, {scratch, n});
    if (order == HeadOrder::value_major) {
      const auto* decoded = reinterpret_cast<const std::byte*>(scratch);
      if (dtype == DType::f32) {
        transpose_to_f32(decoded, DType::f32, layout_.key_dim, layout_.value_dim, dst);
      } else {  // transposed in FP32, then converted as decode() converts
        float* transposed = head_scratch(n, 1);
        transpose_to_f32(decoded, DType::f32, layout_.key_dim, layout_.value_dim,
                         reinterpret_cast<std::byte*>(transposed));
        detail::encode_bf16(transposed, n, dst);
      }
    } else if (dtype == DType::f32) {
      std::memcpy(dst, scratch, out_head);
    } else {
      detail::encode_bf16(scratch, n, dst);
    }
  }
}

}  // namespace statepool::kernels
