#include "statepool/kernels/page.hpp"

#include <cassert>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "codecs_internal.hpp"
#include "statepool/kernels/numeric.hpp"

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
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t in_head = n * dtype_bytes(dtype);
  for (std::size_t index = first; index < last; ++index) {
    float value = 0.0f;
    const std::size_t bad =
        detail::first_non_finite(staged.data() + index * in_head, n, dtype, value);
    if (bad != n) {
      const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
      const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
      throw NonFiniteError(layer, head, bad, value, layout_.value_dim);
    }
  }
}

void PageCodec::encode_heads(std::span<const std::byte> staged, DType dtype,
                             std::span<std::byte> page, std::size_t first, std::size_t last) const {
  check_buffers(staged, dtype, page);
  check_range(first, last);
  if (first == last) return;
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t in_head = n * dtype_bytes(dtype);
  // Codec::encode_staged_head reads each value once and checks what it encodes: the
  // staged state may be a client's memory, rewritten while this runs.
  for (std::size_t index = first; index < last; ++index) {
    const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
    const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
    float value = 0.0f;
    const std::size_t bad = codec_->encode_staged_head(
        layer, head, staged.data() + index * in_head, dtype,
        page.subspan(head_offsets_[index], head_offsets_[index + 1] - head_offsets_[index]), value);
    if (bad != n) throw NonFiniteError(layer, head, bad, value, layout_.value_dim);
  }
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
  const std::size_t n = std::size_t{layout_.key_dim} * layout_.value_dim;
  const std::size_t out_head = n * dtype_bytes(dtype);
  std::vector<float> scratch;
  const bool direct = dtype == DType::f32 && aligned_for_float(staged.data());
  if (!direct && first < last) {
    scratch.resize(n);
  }
  for (std::size_t index = first; index < last; ++index) {
    const auto layer = static_cast<std::uint32_t>(index / layout_.num_heads);
    const auto head = static_cast<std::uint32_t>(index % layout_.num_heads);
    std::byte* dst = staged.data() + index * out_head;
    const auto src =
        page.subspan(head_offsets_[index], head_offsets_[index + 1] - head_offsets_[index]);
    if (direct) {
      codec_->decode_head(layer, head, src, {reinterpret_cast<float*>(dst), n});
      continue;
    }
    codec_->decode_head(layer, head, src, scratch);
    if (dtype == DType::f32) {
      std::memcpy(dst, scratch.data(), out_head);
    } else {
      detail::encode_bf16(scratch.data(), n, dst);
    }
  }
}

void PageCodec::decode_conv(std::span<const std::byte> page, DType dtype,
                            std::span<std::byte> staged) const {
  check_buffers(staged, dtype, page);
  if (const std::size_t conv = conv_bytes(); conv != 0) {
    std::memcpy(staged.data() + staged.size() - conv, page.data() + conv_offset_, conv);
  }
}

}  // namespace statepool::kernels
