#pragma once
// What the page kernels know about a layout's pages: a plain view (PageFormatView),
// passed by value to every kernel, and the host tables behind it (PageFormatTables).
// Neither needs CUDA: the same view, pointing at host memory, drives the host emulation
// of the kernels (block_codec.hpp, host_team.hpp) that the CPU tests run;
// DevicePageFormat (codec_kernels.hpp) uploads the same tables to the device.
//
// Thread-safety: PageFormatTables is immutable after construction; a view is a value.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {
class PageCodec;
}

namespace statepool::kernels::cuda {

/// Everything the kernels need about one layout's pages with a staged recurrent part in
/// `staged_dtype`. POD; the pointers are device pointers (DevicePageFormat::view()) or
/// host pointers (PageFormatTables::view(), for the host emulation), null where the codec
/// needs no such table. Heads are numbered in page order, head = layer * num_heads + h.
struct PageFormatView {
  CodecId codec = CodecId::fp32;
  Arch arch = Arch::gdn;
  StepQuantVariant variant = StepQuantVariant::full;  ///< stepquant4/6 only
  DType staged_dtype = DType::f32;                    ///< f32 or bf16
  std::uint32_t group_size = 0;                       ///< effective group (int4/6/8), else 0
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::uint32_t head_count = 0;    ///< layers * heads
  std::uint64_t page_bytes = 0;    ///< PageCodec::page_bytes()
  std::uint64_t conv_offset = 0;   ///< PageCodec::conv_offset(): the end of the heads
  std::uint64_t conv_bytes = 0;    ///< raw conv-state bytes (after the heads; after the
                                   ///< recurrent part of a staged state)
  std::uint64_t staged_bytes = 0;  ///< PageCodec::staged_bytes(staged_dtype)
  /// [head_count + 1]: byte offset of every head in the page, then conv_offset. Always.
  const std::uint64_t* head_offsets = nullptr;
  /// [head_count][key_dim]: stored width of every row (stepquant::stored_width; GDN rows
  /// all carry the head's width). stepquant4/6 only.
  const std::uint8_t* widths = nullptr;
  /// [head_count][key_dim]: impact factors. stepquant4/6 full and spatial_only only.
  const float* impact = nullptr;
  /// [head_count][key_dim]: byte offset of row i's codes (or fp16 values) within its
  /// head. stepquant4/6 KDA only.
  const std::uint32_t* row_offsets = nullptr;
  /// [head_count][key_dim]: the rows of each head by width class (row_class_width: 2, 4,
  /// 6, 8 bits, then pivots), in increasing row index within a class, so that the ranks
  /// of a warp coding 16-value chunks take rows of one width. stepquant4/6 KDA only.
  const std::uint32_t* row_order = nullptr;
  /// [head_count][kRowClasses]: the end of each class's rows in the head's row_order.
  /// stepquant4/6 KDA only.
  const std::uint32_t* class_ends = nullptr;
};

/// The view a light step of the fused-step kernel encodes with (StepMode::light,
/// docs/codecs.md "Step modes"): a stepquant4/6 page of variant full as the no_refit
/// variant, whose heads have the same layouts (decoding is the same) and whose encode is
/// the fit without the refit; any other view as it is. The host picks it per launch, so
/// the kernel has one code path for both modes.
STATEPOOL_HD inline PageFormatView light_step_view(PageFormatView f) noexcept {
  if ((f.codec == CodecId::stepquant4 || f.codec == CodecId::stepquant6) &&
      f.variant == StepQuantVariant::full) {
    f.variant = StepQuantVariant::no_refit;
  }
  return f;
}

/// Width classes of KDA rows, in row_order's order.
inline constexpr std::uint32_t kRowClasses = 5;
STATEPOOL_HD constexpr std::uint32_t row_class_width(std::uint32_t c) noexcept {
  return c < 4 ? 2 * (c + 1) : 16u;  // 2, 4, 6, 8, then the pivot width
}

/// The host tables of a PageFormatView (no CUDA call). Throws std::invalid_argument for a
/// staged dtype other than f32 / bf16.
class PageFormatTables {
 public:
  PageFormatTables(const PageCodec& codec, DType staged_dtype);

  /// A view whose table pointers point into this object (valid while it lives and is
  /// not moved).
  [[nodiscard]] PageFormatView view() const noexcept;
  /// The view's scalar fields, with every table pointer null (DevicePageFormat fills
  /// them with device copies).
  [[nodiscard]] const PageFormatView& scalars() const noexcept { return scalars_; }

  /// Every table in one blob, each at an 8-byte boundary: what a device copy holds (one
  /// allocation of blob().size() bytes, from any allocator with 8-byte alignment).
  [[nodiscard]] std::vector<std::byte> blob() const;
  /// The view of a copy of blob() placed at `base` (a device address): its table pointers
  /// point into it.
  [[nodiscard]] PageFormatView view_at(const std::byte* base) const noexcept;

  [[nodiscard]] const std::vector<std::uint64_t>& head_offsets() const noexcept {
    return head_offsets_;
  }
  [[nodiscard]] const std::vector<std::uint8_t>& widths() const noexcept { return widths_; }
  [[nodiscard]] const std::vector<float>& impact() const noexcept { return impact_; }
  [[nodiscard]] const std::vector<std::uint32_t>& row_offsets() const noexcept {
    return row_offsets_;
  }
  [[nodiscard]] const std::vector<std::uint32_t>& row_order() const noexcept { return row_order_; }
  [[nodiscard]] const std::vector<std::uint32_t>& class_ends() const noexcept {
    return class_ends_;
  }

 private:
  PageFormatView scalars_;
  std::vector<std::uint64_t> head_offsets_;
  std::vector<std::uint8_t> widths_;  // empty when the codec needs none (so are the others)
  std::vector<float> impact_;
  std::vector<std::uint32_t> row_offsets_;
  std::vector<std::uint32_t> row_order_;
  std::vector<std::uint32_t> class_ends_;
};

/// Checks the scalar fields and the presence of the tables the codec needs (what a host
/// can check without reading device memory): nullptr when usable, else what is wrong.
/// The launchers refuse (cudaErrorInvalidValue) a view for which this is not null.
[[nodiscard]] const char* view_problem(const PageFormatView& view) noexcept;

}  // namespace statepool::kernels::cuda
