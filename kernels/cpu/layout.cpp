#include "statepool/kernels/layout.hpp"

#include <string>
#include <string_view>

#include "fnv1a.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "validate_util.hpp"

namespace statepool::kernels {
namespace {

using detail::range_problem;

bool known(Arch arch) {
  return arch == Arch::gdn || arch == Arch::kda;
}
bool known(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}
bool known(CodecId id) {
  return is_float_codec(id) || is_uniform_codec(id) || is_stepquant_codec(id) || is_dsq_codec(id);
}
bool known(StepQuantVariant variant) {
  return variant == StepQuantVariant::full || variant == StepQuantVariant::spatial_only ||
         variant == StepQuantVariant::temporal_only || variant == StepQuantVariant::no_refit;
}

template <typename Enum>
std::string enum_value(Enum value) {
  return std::to_string(static_cast<unsigned>(value));
}

// Group size that identifies the format: irrelevant (0) for all but the uniform codecs.
std::uint32_t identity_group_size(const CodecSpec& spec) {
  return is_uniform_codec(spec.id) ? effective_group_size(spec.group_size) : 0;
}

// Variant that identifies the format: irrelevant (full) for all but the stepquant codecs.
StepQuantVariant identity_variant(const CodecSpec& spec) {
  return is_stepquant_codec(spec.id) ? spec.variant : StepQuantVariant::full;
}

// Same plan: the same object, or plans that make the same pages (equal codec fields,
// hence equal digests). Null only equals null.
bool same_plan(const std::shared_ptr<const stepquant::Plan>& a,
               const std::shared_ptr<const stepquant::Plan>& b) noexcept {
  if (a == b) {
    return true;
  }
  return a != nullptr && b != nullptr && stepquant::same_codec_fields(*a, *b);
}

}  // namespace

bool StateLayout::same_shape_and_codec(const StateLayout& other) const noexcept {
  return arch == other.arch && num_layers == other.num_layers && num_heads == other.num_heads &&
         key_dim == other.key_dim && value_dim == other.value_dim &&
         conv_channels == other.conv_channels && conv_width == other.conv_width &&
         conv_dtype == other.conv_dtype && codec.id == other.codec.id &&
         identity_group_size(codec) == identity_group_size(other.codec) &&
         identity_variant(codec) == identity_variant(other.codec) && same_plan(plan, other.plan);
}

std::string layout_digest(const StateLayout& layout) {
  Fnv1a h;
  constexpr std::string_view kTag = "statepool.layout/1";
  h.bytes(kTag.data(), kTag.size());
  h.u8(static_cast<std::uint8_t>(layout.arch));
  h.u32(layout.num_layers);
  h.u32(layout.num_heads);
  h.u32(layout.key_dim);
  h.u32(layout.value_dim);
  h.u32(layout.conv_channels);
  h.u32(layout.conv_width);
  h.u8(static_cast<std::uint8_t>(layout.conv_dtype));
  h.u8(static_cast<std::uint8_t>(layout.codec.id));
  h.u32(identity_group_size(layout.codec));
  h.u8(static_cast<std::uint8_t>(identity_variant(layout.codec)));
  h.u8(layout.plan != nullptr ? 1 : 0);
  h.u64(layout.plan != nullptr ? stepquant::digest_value(*layout.plan) : 0);
  return hex64(h.value());
}

std::size_t dtype_bytes(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
  }
  return 0;
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "unknown";
}

const char* to_string(Arch arch) noexcept {
  switch (arch) {
    case Arch::gdn: return "gdn";
    case Arch::kda: return "kda";
  }
  return "unknown";
}

const char* to_string(CodecId codec) noexcept {
  switch (codec) {
    case CodecId::fp32: return "fp32";
    case CodecId::bf16: return "bf16";
    case CodecId::fp16: return "fp16";
    case CodecId::int4: return "int4";
    case CodecId::int6: return "int6";
    case CodecId::int8: return "int8";
    case CodecId::stepquant4: return "stepquant4";
    case CodecId::stepquant6: return "stepquant6";
    case CodecId::dsq4: return "dsq4";
    case CodecId::dsq6: return "dsq6";
  }
  return "unknown";
}

const char* to_string(StepQuantVariant variant) noexcept {
  switch (variant) {
    case StepQuantVariant::full: return "full";
    case StepQuantVariant::spatial_only: return "spatial_only";
    case StepQuantVariant::temporal_only: return "temporal_only";
    case StepQuantVariant::no_refit: return "no_refit";
  }
  return "unknown";
}

const char* to_string(MemorySpace space) noexcept {
  switch (space) {
    case MemorySpace::host: return "host";
    case MemorySpace::device: return "device";
  }
  return "unknown";
}

const char* to_string(HandleKind kind) noexcept {
  switch (kind) {
    case HandleKind::memfd: return "memfd";
    case HandleKind::cuda_vmm_fd: return "cuda_vmm_fd";
    case HandleKind::cuda_ipc: return "cuda_ipc";
  }
  return "unknown";
}

bool parse_codec(std::string_view text, CodecId& out) noexcept {
  constexpr CodecId all[] = {CodecId::fp32, CodecId::bf16, CodecId::fp16,       CodecId::int4,
                             CodecId::int6, CodecId::int8, CodecId::stepquant4, CodecId::stepquant6,
                             CodecId::dsq4, CodecId::dsq6};
  for (const CodecId id : all) {
    if (text == to_string(id)) {
      out = id;
      return true;
    }
  }
  return false;
}

std::string validate(const StateLayout& layout) {
  if (!known(layout.arch)) {
    return "arch must be gdn or kda, got " + enum_value(layout.arch);
  }
  for (const auto& problem : {
           range_problem("num_layers", layout.num_layers, 1, kMaxLayers),
           range_problem("num_heads", layout.num_heads, 1, kMaxHeads),
           range_problem("key_dim", layout.key_dim, 1, kMaxHeadDim),
           range_problem("value_dim", layout.value_dim, 1, kMaxHeadDim),
           range_problem("conv_channels", layout.conv_channels, 0, kMaxConvChannels),
           range_problem("conv_width", layout.conv_width, 0, kMaxConvWidth),
       }) {
    if (!problem.empty()) {
      return problem;
    }
  }
  if ((layout.conv_channels == 0) != (layout.conv_width == 0)) {
    return "conv_channels and conv_width must both be 0 (no conv state) or both be non-zero, "
           "got conv_channels " +
           std::to_string(layout.conv_channels) + " and conv_width " +
           std::to_string(layout.conv_width);
  }
  if (!known(layout.conv_dtype)) {
    return "conv_dtype must be f32, bf16 or f16, got " + enum_value(layout.conv_dtype);
  }
  if (!known(layout.codec.id)) {
    return "codec must be one of fp32, bf16, fp16, int4, int6, int8, stepquant4, stepquant6, "
           "dsq4, dsq6, got " +
           enum_value(layout.codec.id);
  }
  if (!known(layout.codec.variant)) {
    return "codec.variant must be full, spatial_only, temporal_only or no_refit, got " +
           enum_value(layout.codec.variant);
  }
  if (is_uniform_codec(layout.codec.id) &&
      !is_valid_group_size(effective_group_size(layout.codec.group_size))) {
    return "codec.group_size must be 0 (default " + std::to_string(kDefaultGroupSize) +
           ") or a multiple of 4 between " + std::to_string(kMinGroupSize) + " and " +
           std::to_string(kMaxGroupSize) + ", got " + std::to_string(layout.codec.group_size);
  }
  const bool stepquant = is_stepquant_codec(layout.codec.id);
  if (stepquant && layout.plan == nullptr) {
    return std::string("codec ") + to_string(layout.codec.id) + " needs a calibration plan";
  }
  if (!stepquant && layout.plan != nullptr) {
    return std::string("codec ") + to_string(layout.codec.id) +
           " does not use a calibration plan; plan must be null";
  }
  if (stepquant) {
    if (std::string problem = stepquant::validate(*layout.plan); !problem.empty()) {
      return "plan: " + problem;
    }
    if (std::string problem = stepquant::check_matches(*layout.plan, layout); !problem.empty()) {
      return problem;
    }
  }
  // Every factor is bounded above, so these products fit in 64 bits.
  std::uint64_t recurrent = 0;
  if (stepquant) {
    for (std::uint32_t l = 0; l < layout.num_layers; ++l) {
      for (std::uint32_t h = 0; h < layout.num_heads; ++h) {
        recurrent += stepquant::head_bytes(*layout.plan, layout.codec.variant, l, h);
      }
    }
  } else {
    recurrent = std::uint64_t{layout.num_layers} * layout.num_heads *
                head_bytes_for(layout.codec, layout.key_dim, layout.value_dim);
  }
  const std::uint64_t page = recurrent + std::uint64_t{layout.num_layers} * layout.conv_channels *
                                             layout.conv_width * dtype_bytes(layout.conv_dtype);
  if (page > kMaxPageBytes) {
    return "page size must be at most " + std::to_string(kMaxPageBytes) + " bytes, got " +
           std::to_string(page) + " bytes";
  }
  return {};
}

}  // namespace statepool::kernels
