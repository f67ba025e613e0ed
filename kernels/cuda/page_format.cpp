// PageFormatTables: the per-head tables of the page kernels, built on the host from a
// PageCodec (no CUDA call, so this file is part of the CPU library: the host emulation
// tests use it without a GPU or nvcc).

#include "statepool/kernels/cuda/page_format.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

#include "statepool/kernels/format.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::kernels::cuda {

PageFormatTables::PageFormatTables(const PageCodec& codec, DType staged_dtype) {
  if (staged_dtype != DType::f32 && staged_dtype != DType::bf16) {
    throw std::invalid_argument(std::string("staged states are f32 or bf16, got ") +
                                to_string(staged_dtype));
  }
  const StateLayout& layout = codec.layout();
  PageFormatView& v = scalars_;
  v.codec = layout.codec.id;
  v.arch = layout.arch;
  v.variant = layout.codec.variant;
  v.staged_dtype = staged_dtype;
  v.group_size = is_uniform_codec(v.codec) ? effective_group_size(layout.codec.group_size) : 0;
  v.key_dim = layout.key_dim;
  v.value_dim = layout.value_dim;
  v.head_count = static_cast<std::uint32_t>(codec.head_count());
  v.page_bytes = codec.page_bytes();
  v.conv_offset = codec.conv_offset();
  v.conv_bytes = codec.conv_bytes();
  v.staged_bytes = codec.staged_bytes(staged_dtype);

  head_offsets_.reserve(std::size_t{v.head_count} + 1);
  for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout.num_heads; ++h) {
      head_offsets_.push_back(codec.head_offset(l, h));
    }
  }
  head_offsets_.push_back(codec.conv_offset());

  if (!is_stepquant_codec(v.codec)) {
    return;
  }
  const stepquant::Plan& plan = *layout.plan;
  const std::size_t K = layout.key_dim;
  const bool kda = layout.arch == Arch::kda;
  const bool temporal = layout.codec.variant == StepQuantVariant::temporal_only;
  widths_.reserve(v.head_count * K);
  for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
    for (std::uint32_t h = 0; h < layout.num_heads; ++h) {
      for (std::uint32_t i = 0; i < K; ++i) {
        widths_.push_back(stepquant::stored_width(plan, layout.codec.variant, l, h, kda ? i : 0));
      }
      if (!temporal) {
        const auto impact = plan.head_impact(l, h);
        impact_.insert(impact_.end(), impact.begin(), impact.end());
      }
    }
  }
  if (kda) {
    // Rows follow the scales: fp16 r[K] (and c[V] unless temporal_only), then every row
    // in order (stepquant/format.hpp).
    row_offsets_.reserve(widths_.size());
    for (std::size_t head = 0; head < v.head_count; ++head) {
      std::size_t offset = 2 * K + (temporal ? 0 : 2 * std::size_t{layout.value_dim});
      for (std::size_t i = 0; i < K; ++i) {
        row_offsets_.push_back(static_cast<std::uint32_t>(offset));
        offset += stepquant::row_bytes(layout.value_dim, widths_[head * K + i]);
      }
      for (std::uint32_t c = 0; c < kRowClasses; ++c) {
        for (std::size_t i = 0; i < K; ++i) {
          if (widths_[head * K + i] == row_class_width(c)) {
            row_order_.push_back(static_cast<std::uint32_t>(i));
          }
        }
        class_ends_.push_back(static_cast<std::uint32_t>(row_order_.size() - head * K));
      }
      if (row_order_.size() != (head + 1) * K) {
        throw std::logic_error("a KDA row has a width outside 2, 4, 6, 8, 16");
      }
    }
  }
}

PageFormatView PageFormatTables::view() const noexcept {
  PageFormatView v = scalars_;
  v.head_offsets = head_offsets_.data();
  v.widths = widths_.empty() ? nullptr : widths_.data();
  v.impact = impact_.empty() ? nullptr : impact_.data();
  v.row_offsets = row_offsets_.empty() ? nullptr : row_offsets_.data();
  v.row_order = row_order_.empty() ? nullptr : row_order_.data();
  v.class_ends = class_ends_.empty() ? nullptr : class_ends_.data();
  return v;
}

namespace {

std::size_t round_up8(std::size_t bytes) {
  return (bytes + 7) & ~std::size_t{7};
}

/// Where each table of a blob starts, and its size.
struct BlobOffsets {
  std::size_t head_offsets = 0;
  std::size_t impact = 0;
  std::size_t row_offsets = 0;
  std::size_t row_order = 0;
  std::size_t class_ends = 0;
  std::size_t widths = 0;
  std::size_t size = 0;
};

BlobOffsets blob_offsets(const PageFormatTables& t) {
  BlobOffsets o;
  o.impact = round_up8(o.head_offsets + t.head_offsets().size() * sizeof(std::uint64_t));
  o.row_offsets = round_up8(o.impact + t.impact().size() * sizeof(float));
  o.row_order = round_up8(o.row_offsets + t.row_offsets().size() * sizeof(std::uint32_t));
  o.class_ends = round_up8(o.row_order + t.row_order().size() * sizeof(std::uint32_t));
  o.widths = round_up8(o.class_ends + t.class_ends().size() * sizeof(std::uint32_t));
  o.size = o.widths + t.widths().size();
  return o;
}

template <class T>
void put(std::vector<std::byte>& blob, std::size_t offset, const std::vector<T>& table) {
  if (!table.empty()) std::memcpy(blob.data() + offset, table.data(), table.size() * sizeof(T));
}

}  // namespace

std::vector<std::byte> PageFormatTables::blob() const {
  const BlobOffsets o = blob_offsets(*this);
  std::vector<std::byte> out(o.size);
  put(out, o.head_offsets, head_offsets_);
  put(out, o.impact, impact_);
  put(out, o.row_offsets, row_offsets_);
  put(out, o.row_order, row_order_);
  put(out, o.class_ends, class_ends_);
  put(out, o.widths, widths_);
  return out;
}

PageFormatView PageFormatTables::view_at(const std::byte* base) const noexcept {
  const BlobOffsets o = blob_offsets(*this);
  PageFormatView v = scalars_;
  // The blob holds each table at an 8-byte boundary of an 8-byte aligned base.
  v.head_offsets = reinterpret_cast<const std::uint64_t*>(base + o.head_offsets);
  if (!impact_.empty()) v.impact = reinterpret_cast<const float*>(base + o.impact);
  if (!row_offsets_.empty()) {
    v.row_offsets = reinterpret_cast<const std::uint32_t*>(base + o.row_offsets);
  }
  if (!row_order_.empty()) {
    v.row_order = reinterpret_cast<const std::uint32_t*>(base + o.row_order);
    v.class_ends = reinterpret_cast<const std::uint32_t*>(base + o.class_ends);
  }
  if (!widths_.empty()) v.widths = reinterpret_cast<const std::uint8_t*>(base + o.widths);
  return v;
}

const char* view_problem(const PageFormatView& v) noexcept {
  if (v.staged_dtype != DType::f32 && v.staged_dtype != DType::bf16) {
    return "staged dtype is not f32 or bf16";
  }
  if (v.key_dim == 0 || v.value_dim == 0 || v.head_count == 0) {
    return "key_dim, value_dim and head_count must be positive";
  }
  if (v.key_dim > kMaxHeadDim || v.value_dim > kMaxHeadDim) {
    return "key_dim or value_dim above kMaxHeadDim";
  }
  if (v.head_offsets == nullptr) {
    return "no head offset table";
  }
  if (v.conv_offset + v.conv_bytes != v.page_bytes) {
    return "page_bytes is not conv_offset + conv_bytes";
  }
  const std::uint64_t values = std::uint64_t{v.key_dim} * v.value_dim * v.head_count;
  if (v.staged_bytes != values * dtype_bytes(v.staged_dtype) + v.conv_bytes) {
    return "staged_bytes does not match the shape and staged dtype";
  }
  if (is_uniform_codec(v.codec)) {
    return is_valid_group_size(v.group_size) ? nullptr : "invalid group size";
  }
  if (is_float_codec(v.codec) || is_dsq_codec(v.codec)) {
    return nullptr;
  }
  if (!is_stepquant_codec(v.codec)) {
    return "unknown codec";
  }
  if (v.arch != Arch::gdn && v.arch != Arch::kda) {
    return "unknown arch";
  }
  if (v.variant != StepQuantVariant::full && v.variant != StepQuantVariant::spatial_only &&
      v.variant != StepQuantVariant::temporal_only && v.variant != StepQuantVariant::no_refit) {
    return "unknown stepquant variant";
  }
  if (v.widths == nullptr) {
    return "stepquant needs the width table";
  }
  if (v.variant != StepQuantVariant::temporal_only && v.impact == nullptr) {
    return "stepquant full / spatial_only / no_refit needs the impact table";
  }
  if (v.arch == Arch::kda &&
      (v.row_offsets == nullptr || v.row_order == nullptr || v.class_ends == nullptr)) {
    return "stepquant KDA needs the row offset, row order and class tables";
  }
  return nullptr;
}

}  // namespace statepool::kernels::cuda
