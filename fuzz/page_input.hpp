#pragma once
// The input of the page decode fuzzer: a few parameter bytes that choose a valid layout
// (any codec, arch, shape, conv state, group size, STEPQuant variant and plan) and the
// staged dtype, then the bytes of one page as a hostile client could leave them in its
// mapped arena. Pages are read-write in every client's mapping, so the daemon (Decompress)
// and other clients decode whatever bytes are there.
//
//   byte 0   codec: value % 10 (kernels::CodecId)
//   byte 1   bit 0 arch (gdn, kda); bit 1 staged dtype (f32, bf16); bits 2-3 conv dtype
//            (% 3: f32, bf16, f16); bits 4-5 STEPQuant variant (% 3)
//   byte 2   layers 1 + value % 3; heads 1 + (value / 3) % 4
//   byte 3   key_dim 1 + value % 40
//   byte 4   value_dim 1 + value % 40
//   byte 5   conv channels value & 7, conv width (value >> 3) & 3 (both 0 if either is)
//   byte 6   uniform codecs' group size: 0 (the default, 128) or 4 * value
//   byte 7   STEPQuant plan: seed of its widths (pivots included) and impact factors
//   rest     the page; shorter than a page, it is repeated to fill it (zeros if empty)
//
// Shapes stay small (a page is at most ~80 KB) so that each input decodes in well under
// a millisecond. Thread-safety: pure functions.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "statepool/kernels/format.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::fuzz {

inline constexpr std::size_t kPageParamBytes = 8;

struct PageInput {
  kernels::StateLayout layout;
  kernels::DType staged = kernels::DType::f32;
  std::span<const std::uint8_t> page;  ///< the page bytes given (may be shorter or empty)
};

namespace detail {

/// splitmix64: the plan's widths and impacts from one seed byte.
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

inline kernels::stepquant::Plan make_plan(const kernels::StateLayout& layout, std::uint8_t seed) {
  kernels::stepquant::Plan plan;
  plan.arch = layout.arch;
  plan.num_layers = layout.num_layers;
  plan.num_heads = layout.num_heads;
  plan.key_dim = layout.key_dim;
  plan.value_dim = layout.value_dim;
  plan.budget_bits = layout.codec.id == kernels::CodecId::stepquant4 ? 4 : 6;
  const auto widths = kernels::stepquant::candidate_widths(plan.budget_bits);
  SplitMix rng{seed};
  plan.widths.resize(plan.units());
  for (auto& w : plan.widths) {
    const std::size_t pick = rng.next() % (widths.size() + 1);
    w = pick == widths.size() ? kernels::stepquant::kPivotWidth : widths[pick];
  }
  plan.impact.resize(std::size_t{plan.num_layers} * plan.num_heads * plan.key_dim);
  for (auto& f : plan.impact) {
    // 2^-4 .. 2^4: finite and positive, as validate() wants.
    f = std::ldexp(1.0f + static_cast<float>(rng.next() % 256) / 256.0f,
                   static_cast<int>(rng.next() % 9) - 4);
  }
  plan.source = "fuzz";
  return plan;
}

}  // namespace detail

/// The layout and page an input stands for; nullopt when it is too short for the
/// parameters. The layout is valid by construction (PageCodec accepts it).
inline std::optional<PageInput> parse_page_input(std::span<const std::uint8_t> input) {
  if (input.size() < kPageParamBytes) return std::nullopt;
  PageInput out;
  kernels::StateLayout& l = out.layout;
  l.name = "fuzz";
  l.codec.id = static_cast<kernels::CodecId>(input[0] % 10);
  l.arch = (input[1] & 1) != 0 ? kernels::Arch::kda : kernels::Arch::gdn;
  out.staged = (input[1] & 2) != 0 ? kernels::DType::bf16 : kernels::DType::f32;
  l.conv_dtype = static_cast<kernels::DType>(((input[1] >> 2) & 3) % 3);
  l.codec.variant = static_cast<kernels::StepQuantVariant>(((input[1] >> 4) & 3) % 3);
  l.num_layers = 1 + input[2] % 3u;
  l.num_heads = 1 + (input[2] / 3u) % 4u;
  l.key_dim = 1 + input[3] % 40u;
  l.value_dim = 1 + input[4] % 40u;
  l.conv_channels = input[5] & 7u;
  l.conv_width = (input[5] >> 3) & 3u;
  if (l.conv_channels == 0 || l.conv_width == 0) l.conv_channels = l.conv_width = 0;
  l.codec.group_size = 4u * input[6];
  if (kernels::is_stepquant_codec(l.codec.id)) {
    l.plan = std::make_shared<const kernels::stepquant::Plan>(detail::make_plan(l, input[7]));
  }
  out.page = input.subspan(kPageParamBytes);
  return out;
}

/// The page bytes of `in`, `page_bytes` long: the given bytes repeated (zeros if none).
inline std::vector<std::byte> fill_page(const PageInput& in, std::size_t page_bytes) {
  std::vector<std::byte> page(page_bytes);
  if (in.page.empty()) return page;
  for (std::size_t i = 0; i < page_bytes; ++i) {
    page[i] = static_cast<std::byte>(in.page[i % in.page.size()]);
  }
  return page;
}

}  // namespace statepool::fuzz
