// The CUDA page kernels' code, run on the host (kernels/cuda/block_codec.hpp with the
// host teams of host_team.hpp), against the CPU PageCodec: byte-identical pages and
// staged states for every codec, variant, arch, staged dtype and awkward shape, with
// teams of 1, 3 and 7 concurrently running ranks; batches with skipped slots; the
// non-finite scan. The GPU runs exactly these block bodies (with a CUDA thread block as
// the team), so this is the evidence that the device bytes equal the CPU bytes where no
// GPU is at hand; tests/gpu/test_codec_kernels_gpu.cpp checks the device itself.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "statepool/kernels/cuda/block_codec.hpp"
#include "statepool/kernels/cuda/host_team.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using cuda::kAllFinite;
using cuda::PageFormatTables;
using cuda::PageFormatView;
using stepquant::kPivotWidth;
using testing::first_difference;
using testing::make_plan;
using testing::plan_layout;

constexpr unsigned kTeamSizes[] = {1, 3, 7};
constexpr std::uint8_t P = kPivotWidth;

struct Case {
  std::string name;
  StateLayout layout;
};

std::string shape_name(std::uint32_t k, std::uint32_t v) {
  return std::to_string(k) + "x" + std::to_string(v);
}

StateLayout plain_layout(CodecId id, Arch arch, std::uint32_t k, std::uint32_t v,
                         std::uint32_t group, std::uint32_t conv_channels) {
  StateLayout layout;
  layout.name = "emulation";
  layout.arch = arch;
  layout.num_layers = 2;
  layout.num_heads = 3;
  layout.key_dim = k;
  layout.value_dim = v;
  layout.conv_channels = conv_channels;
  layout.conv_width = conv_channels == 0 ? 0 : 3;
  layout.conv_dtype = DType::bf16;
  layout.codec = {id, group};
  return layout;
}

// A plan whose units cycle through `widths` (GDN: per head, KDA: per row), with random
// impact factors.
stepquant::Plan cycling_plan(Arch arch, std::uint32_t layers, std::uint32_t heads, std::uint32_t k,
                             std::uint32_t v, std::uint32_t budget,
                             std::vector<std::uint8_t> widths, std::uint64_t seed) {
  return make_plan(
      arch, layers, heads, k, v, budget,
      [widths](std::size_t u) { return widths[(u * 7 + u / 3) % widths.size()]; },
      testing::random_impact(seed));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // Float and uniform codecs: several shapes and group sizes (a group larger than the
  // head, groups that straddle rows, 4-value groups). The uniform paths by 16-value chunks
  // (block_uniform.hpp): one pass per 32-value group (128 x 128, group 32); scales, then
  // codes, for other multiples of 16 (a partial last group: 16 x 24 by 256; a last group
  // of one chunk: 16 x 16 by 48; 1 x 48 by 32), with a group cut into parts across ranks
  // where groups are fewer than ranks (128 x 128 by 4096 and 8192); an odd number of
  // scales (16 x 24 by 128) takes the per-quad path.
  struct Plain {
    std::uint32_t k, v, group;
  };
  const Plain plain[] = {{7, 5, 12},    {10, 10, 32}, {16, 24, 4}, {128, 128, 0},
                         {3, 3, 4},     {9, 7, 0},    {1, 3, 8},   {128, 128, 8192},
                         {16, 24, 256}, {16, 16, 48}, {1, 48, 32}, {128, 128, 4096},
                         {16, 24, 128}};
  for (const CodecId id :
       {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4, CodecId::int6, CodecId::int8}) {
    for (const Plain& p : plain) {
      out.push_back(
          {std::string(to_string(id)) + "_" + shape_name(p.k, p.v) + "_g" + std::to_string(p.group),
           plain_layout(id, Arch::gdn, p.k, p.v, p.group, p.k == 16 ? 12 : 0)});
    }
  }
  // DSQ: the GDN head layout for either arch.
  const Plain dsq[] = {{7, 5, 0}, {10, 10, 0}, {16, 24, 0}, {128, 128, 0}, {1, 3, 0}, {5, 40, 0}};
  for (const CodecId id : {CodecId::dsq4, CodecId::dsq6}) {
    for (const Arch arch : {Arch::gdn, Arch::kda}) {
      for (const Plain& p : dsq) {
        out.push_back(
            {std::string(to_string(id)) + "_" + to_string(arch) + "_" + shape_name(p.k, p.v),
             plain_layout(id, arch, p.k, p.v, 0, p.k == 10 ? 7 : 0)});
      }
    }
  }
  // STEPQuant plans: the fixtures' plans (every width, pivots, 128 x 128) and odd shapes.
  struct Planned {
    std::string name;
    stepquant::Plan plan;
  };
  std::vector<Planned> plans = {
      {"gdn_plan6", testing::gdn_plan6()},       {"gdn_plan4", testing::gdn_plan4()},
      {"kda_plan6", testing::kda_plan6()},       {"kda_plan4_v5", testing::kda_plan4(5)},
      {"kda_plan4_v7", testing::kda_plan4(7)},   {"kda_plan4_v20", testing::kda_plan4(20)},
      {"kda_plan4_v33", testing::kda_plan4(33)},
  };
  const std::vector<std::uint8_t> all4 = {2, 4, 6, 8, P};
  const std::vector<std::uint8_t> all6 = {4, 6, 8, P};
  struct Odd {
    std::uint32_t k, v;
  };
  // V = 32 and 48: KDA rows by 16-value chunks and width classes (write_class16) at a
  // small K, where a class's chunks do not fill the team.
  for (const Odd s :
       {Odd{7, 5}, Odd{10, 10}, Odd{16, 24}, Odd{5, 40}, Odd{3, 33}, Odd{1, 1}, Odd{10, 32}}) {
    plans.push_back({"gdn4_" + shape_name(s.k, s.v),
                     cycling_plan(Arch::gdn, 2, 3, s.k, s.v, 4, all4, s.k * 31 + s.v)});
    plans.push_back({"kda4_" + shape_name(s.k, s.v),
                     cycling_plan(Arch::kda, 1, 3, s.k, s.v, 4, all4, s.k * 17 + s.v)});
  }
  for (const Odd s : {Odd{7, 5}, Odd{10, 10}, Odd{16, 24}, Odd{9, 48}}) {
    plans.push_back({"gdn6_" + shape_name(s.k, s.v),
                     cycling_plan(Arch::gdn, 1, 4, s.k, s.v, 6, all6, s.k * 13 + s.v)});
    plans.push_back({"kda6_" + shape_name(s.k, s.v),
                     cycling_plan(Arch::kda, 1, 2, s.k, s.v, 6, all6, s.k * 11 + s.v)});
  }
  plans.push_back({"kda4_128x128", cycling_plan(Arch::kda, 1, 2, 128, 128, 4, all4, 99)});
  // A KDA head whose rows are all pivots (r and c stored as zeros), next to a mixed one.
  plans.push_back(
      {"kda6_pivot_head", make_plan(
                              Arch::kda, 1, 2, 6, 9, 6, [](std::size_t u) { return u < 6 ? P : 6; },
                              testing::random_impact(5))});
  for (const Planned& p : plans) {
    const CodecId id = p.plan.budget_bits == 4 ? CodecId::stepquant4 : CodecId::stepquant6;
    for (const StepQuantVariant variant :
         {StepQuantVariant::full, StepQuantVariant::spatial_only, StepQuantVariant::temporal_only,
          StepQuantVariant::no_refit}) {
      const std::uint32_t conv = p.plan.key_dim == 7 ? 5 : 0;
      out.push_back({p.name + "_" + to_string(variant),
                     plan_layout(p.plan, id, variant, conv, conv == 0 ? 0 : 4)});
    }
  }
  return out;
}

void set_staged(std::vector<std::byte>& staged, DType dtype, std::size_t index, float v) {
  if (dtype == DType::f32) {
    std::memcpy(staged.data() + 4 * index, &v, 4);
  } else {
    const std::uint16_t bits = float_to_bf16_bits(v);
    std::memcpy(staged.data() + 2 * index, &bits, 2);
  }
}

// A synthetic state with edge inputs in head 0: a zero row, a zero column, a tiny row
// (FP32 denormals), a huge value, values at the fp16 limit, and a row of one value
// repeated; head 1 (when there is one) is all zeros.
std::vector<std::byte> staged_state(const StateLayout& layout, DType dtype, std::uint64_t seed) {
  auto staged = synthetic::synthetic_staged_state(layout, 24, seed, dtype);
  const std::uint32_t K = layout.key_dim;
  const std::uint32_t V = layout.value_dim;
  const auto at = [V](std::uint32_t i, std::uint32_t j) { return std::size_t{i} * V + j; };
  if (K >= 4) {
    for (std::uint32_t j = 0; j < V; ++j) {
      set_staged(staged, dtype, at(0, j), 0.0f);
      set_staged(staged, dtype, at(1, j),
                 (j % 2 == 0 ? 1e-40f : -3e-39f) * static_cast<float>(j + 1));
      set_staged(staged, dtype, at(3, j), 0.375f);
    }
    set_staged(staged, dtype, at(2, 0), 1e30f);
    set_staged(staged, dtype, at(2, V - 1), -65520.0f);
  }
  if (V >= 3) {
    for (std::uint32_t i = 0; i < K; ++i) {
      set_staged(staged, dtype, at(i, 1), 0.0f);
    }
  }
  if (std::size_t{layout.num_layers} * layout.num_heads > 1) {
    for (std::size_t i = 0; i < std::size_t{K} * V; ++i) {
      set_staged(staged, dtype, std::size_t{K} * V + i, 0.0f);
    }
  }
  return staged;
}

// Readable parameters in failure messages (the name, not the bytes of the layout).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

using Param = std::tuple<Case, DType>;

class DeviceCodecEmulation : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceCodecEmulation, EncodeWritesTheCpuPageBytes) {
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const PageFormatTables tables(cpu, dtype);
  // The tables as the host holds them, and as one blob: what DevicePageFormat and the
  // daemon's executor upload, addressed through view_at.
  const std::vector<std::byte> blob = tables.blob();
  const auto staged = staged_state(c.layout, dtype, 7);
  std::vector<std::byte> expected(cpu.page_bytes());
  cpu.encode(staged, dtype, expected);
  for (const PageFormatView& view : {tables.view(), tables.view_at(blob.data())}) {
    ASSERT_EQ(cuda::view_problem(view), nullptr);
    for (const unsigned ranks : kTeamSizes) {
      std::vector<std::byte> page(cpu.page_bytes(), std::byte{0xA7});  // every byte is written
      const void* in = staged.data();
      void* out = page.data();
      cuda::emulate_encode_pages(view, &in, &out, 1, nullptr, ranks);
      EXPECT_EQ(first_difference(page, expected), -1)
          << ranks << " ranks" << (view.head_offsets == tables.view().head_offsets ? "" : ", blob");
    }
  }
}

TEST_P(DeviceCodecEmulation, DecodeWritesTheCpuStagedBytes) {
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const PageFormatTables tables(cpu, dtype);
  const auto source = staged_state(c.layout, DType::f32, 8);
  std::vector<std::byte> page(cpu.page_bytes());
  cpu.encode(source, DType::f32, page);
  std::vector<std::byte> expected(cpu.staged_bytes(dtype));
  cpu.decode(page, dtype, expected);
  const std::vector<std::byte> blob = tables.blob();
  for (const PageFormatView& view : {tables.view(), tables.view_at(blob.data())}) {
    for (const unsigned ranks : kTeamSizes) {
      std::vector<std::byte> staged(cpu.staged_bytes(dtype), std::byte{0x5C});
      const void* in = page.data();
      void* out = staged.data();
      cuda::emulate_decode_pages(view, &in, &out, 1, ranks);
      EXPECT_EQ(first_difference(staged, expected), -1) << ranks << " ranks";
    }
  }
}

// The vector paths need 16-byte aligned heads; a staged state at an offset of one
// element, and a page 4 bytes off (both still what the launchers accept), take the
// element-wide paths, which write the same bytes.
TEST_P(DeviceCodecEmulation, UnalignedStatesAndPagesWriteTheSameBytes) {
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const PageFormatTables tables(cpu, dtype);
  const std::size_t element = dtype == DType::f32 ? 4 : 2;
  const auto staged = staged_state(c.layout, dtype, 9);
  std::vector<std::byte> expected_page(cpu.page_bytes());
  cpu.encode(staged, dtype, expected_page);
  std::vector<std::byte> expected_staged(cpu.staged_bytes(dtype));
  cpu.decode(expected_page, dtype, expected_staged);

  std::vector<std::byte> staged_buffer(staged.size() + 16);
  std::copy(staged.begin(), staged.end(), staged_buffer.begin() + element);
  std::vector<std::byte> page_buffer(cpu.page_bytes() + 16, std::byte{0xA7});
  const void* in = staged_buffer.data() + element;
  void* out = page_buffer.data() + 4;
  cuda::emulate_encode_pages(tables.view(), &in, &out, 1, nullptr, 3);
  const std::vector<std::byte> page(page_buffer.begin() + 4,
                                    page_buffer.begin() + 4 + cpu.page_bytes());
  EXPECT_EQ(first_difference(page, expected_page), -1);

  std::vector<std::byte> decoded_buffer(expected_staged.size() + 16, std::byte{0x5C});
  const void* page_in = page_buffer.data() + 4;
  void* staged_out = decoded_buffer.data() + element;
  cuda::emulate_decode_pages(tables.view(), &page_in, &staged_out, 1, 3);
  const std::vector<std::byte> decoded(decoded_buffer.begin() + element,
                                       decoded_buffer.begin() + element + expected_staged.size());
  EXPECT_EQ(first_difference(decoded, expected_staged), -1);
}

// A page and a staged state between guard bytes, encoded and decoded by the device block
// bodies on a host team: a stray write shows in the guards (a stray read, under ASan).
struct Guarded {
  static constexpr std::size_t kGuard = 64;
  static constexpr std::byte kMark{0xC5};
  std::vector<std::byte> page;
  std::vector<std::byte> back;

  Guarded(const PageCodec& cpu, DType dtype)
      : page(cpu.page_bytes() + 2 * kGuard, kMark),
        back(cpu.staged_bytes(dtype) + 2 * kGuard, kMark) {}
  std::byte* page_bytes() { return page.data() + kGuard; }
  /// Encodes `staged` into the page, then decodes the page into `back`.
  void round_trip(const PageFormatView& view, const std::vector<std::byte>& staged,
                  unsigned ranks) {
    const void* in = staged.data();
    void* out = page_bytes();
    cuda::emulate_encode_pages(view, &in, &out, 1, nullptr, ranks);
    const void* pin = page_bytes();
    void* sout = back.data() + kGuard;
    cuda::emulate_decode_pages(view, &pin, &sout, 1, ranks);
  }
  static bool intact(const std::vector<std::byte>& b) {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (b[i] != kMark || b[b.size() - 1 - i] != kMark) return false;
    }
    return true;
  }
};

// What the device encoder meets when an engine rewrites its state after the daemon's
// non-finite scan, or its page while the encoder uses the page as scratch for scales
// (docs/architecture.md, "Memory a client can write"): NaN, +-Inf and huge values reach
// the block bodies. Every code is clamped and every index comes from the layout, so each
// block writes its own head's bytes and nothing else, and the page decodes without a read
// or write outside it.
TEST_P(DeviceCodecEmulation, AnyValuesEncodeAndDecodeWithinTheirBuffers) {
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const PageFormatTables tables(cpu, dtype);
  auto staged = staged_state(c.layout, dtype, 9);
  const std::size_t values = staged.size() / dtype_bytes(dtype);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max(),
                            -3e38f,
                            1e-45f};
  for (std::size_t i = 0; i < values; i += 5) {
    set_staged(staged, dtype, std::min(values - 1, i + i % 3), specials[(i / 5) % 6]);
  }
  for (const unsigned ranks : {1u, 3u}) {
    Guarded g(cpu, dtype);
    g.round_trip(tables.view(), staged, ranks);
    EXPECT_TRUE(Guarded::intact(g.page)) << ranks << " ranks: a write outside the page";
    EXPECT_TRUE(Guarded::intact(g.back)) << ranks << " ranks: a write outside the staged state";
  }
}

// The same while another thread rewrites the staged state and the page under the block
// bodies (a team of 3 host threads): whatever the interleaving, no stray write, no crash.
TEST_P(DeviceCodecEmulation, RewritesDuringTheWorkStayWithinTheirBuffers) {
  const auto& [c, dtype] = GetParam();
  const PageCodec cpu(c.layout);
  const PageFormatTables tables(cpu, dtype);
  auto staged = staged_state(c.layout, dtype, 10);
  Guarded g(cpu, dtype);
  std::atomic<bool> stop{false};
  std::thread mutator([&] {
    std::mt19937_64 rng(11);
    const std::uint32_t words[] = {0x7fc07fc0u, 0xff800000u, 0x7f7fffffu, 0x00000001u};
    // Volatile stores: none is merged or dropped.
    auto* state = reinterpret_cast<volatile std::uint8_t*>(staged.data());
    auto* bytes = reinterpret_cast<volatile std::uint8_t*>(g.page_bytes());
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint32_t w = words[rng() % 4];
      const std::size_t at = (rng() % (staged.size() / 4)) * 4;
      for (int b = 0; b < 4; ++b) state[at + b] = static_cast<std::uint8_t>(w >> (8 * b));
      bytes[rng() % cpu.page_bytes()] = static_cast<std::uint8_t>(rng());
    }
  });
  for (int round = 0; round < 4; ++round) g.round_trip(tables.view(), staged, 3);
  stop.store(true);
  mutator.join();
  EXPECT_TRUE(Guarded::intact(g.page)) << "a write outside the page";
  EXPECT_TRUE(Guarded::intact(g.back)) << "a write outside the staged state";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param).name + "_" + to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, DeviceCodecEmulation,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         param_name);

// --- batches -------------------------------------------------------------------------------

// Several slots of one layout: slot s holds its own state; encode with slot 1 skipped
// leaves that page as it was; the scan finds the first non-finite value of each slot;
// scan then encode with the scan's result as the skip array (what the daemon does on
// the device) writes only the finite slots.
void check_batch(const StateLayout& layout, DType dtype) {
  const PageCodec cpu(layout);
  const PageFormatTables tables(cpu, dtype);
  const PageFormatView view = tables.view();
  constexpr std::uint32_t kSlots = 4;
  std::vector<std::vector<std::byte>> staged;
  std::vector<std::vector<std::byte>> expected;
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    staged.push_back(staged_state(layout, dtype, 100 + s));
    expected.emplace_back(cpu.page_bytes());
    cpu.encode(staged.back(), dtype, expected.back());
  }
  const std::vector<std::byte> untouched(cpu.page_bytes(), std::byte{0x3D});
  const auto run_encode = [&](const unsigned long long* skip, unsigned ranks) {
    std::vector<std::vector<std::byte>> pages(kSlots, untouched);
    std::vector<const void*> in;
    std::vector<void*> out;
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      in.push_back(staged[s].data());
      out.push_back(pages[s].data());
    }
    cuda::emulate_encode_pages(view, in.data(), out.data(), kSlots, skip, ranks);
    return pages;
  };
  const unsigned long long skip[kSlots] = {kAllFinite, 5, kAllFinite, kAllFinite};
  for (const unsigned ranks : {1u, 3u}) {
    const auto pages = run_encode(skip, ranks);
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      EXPECT_EQ(first_difference(pages[s], s == 1 ? untouched : expected[s]), -1)
          << "slot " << s << ", " << ranks << " ranks";
    }
  }

  // Decode of the batch.
  {
    std::vector<std::vector<std::byte>> out_staged(
        kSlots, std::vector<std::byte>(cpu.staged_bytes(dtype), std::byte{1}));
    std::vector<const void*> in;
    std::vector<void*> out;
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      in.push_back(expected[s].data());
      out.push_back(out_staged[s].data());
    }
    cuda::emulate_decode_pages(view, in.data(), out.data(), kSlots, 3);
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      std::vector<std::byte> want(cpu.staged_bytes(dtype));
      cpu.decode(expected[s], dtype, want);
      EXPECT_EQ(first_difference(out_staged[s], want), -1) << "slot " << s;
    }
  }

  // Non-finite values: slot 1 an Inf then (later) a NaN, slot 3 a NaN in its last head.
  const std::size_t n = std::size_t{layout.key_dim} * layout.value_dim;
  const std::size_t values = n * cpu.head_count();
  const std::size_t first1 = values / 3;
  set_staged(staged[1], dtype, values - 1, std::numeric_limits<float>::quiet_NaN());
  set_staged(staged[1], dtype, first1, -std::numeric_limits<float>::infinity());
  set_staged(staged[3], dtype, values - n / 2 - 1, std::numeric_limits<float>::quiet_NaN());
  std::vector<const void*> in;
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    in.push_back(staged[s].data());
  }
  for (const unsigned ranks : {1u, 7u}) {
    unsigned long long first[kSlots] = {1, 2, 3, 4};
    cuda::emulate_find_non_finite_pages(view, in.data(), kSlots, first, ranks);
    EXPECT_EQ(first[0], kAllFinite);
    EXPECT_EQ(first[1], first1);
    EXPECT_EQ(first[2], kAllFinite);
    EXPECT_EQ(first[3], values - n / 2 - 1);
    const auto pages = run_encode(first, ranks);
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      const bool rejected = s == 1 || s == 3;
      EXPECT_EQ(first_difference(pages[s], rejected ? untouched : expected[s]), -1)
          << "slot " << s << ", " << ranks << " ranks";
    }
  }
}

TEST(DeviceCodecEmulationBatch, SlotsSkipsAndNonFiniteScan) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(to_string(dtype));
    check_batch(plain_layout(CodecId::int6, Arch::gdn, 16, 24, 32, 12), dtype);
    check_batch(plain_layout(CodecId::bf16, Arch::gdn, 7, 5, 0, 3), dtype);
    check_batch(plain_layout(CodecId::dsq4, Arch::kda, 10, 10, 0, 0), dtype);
    check_batch(
        plan_layout(testing::kda_plan4(7), CodecId::stepquant4, StepQuantVariant::full, 6, 3),
        dtype);
    check_batch(plan_layout(testing::gdn_plan4(), CodecId::stepquant4,
                            StepQuantVariant::temporal_only, 0, 0),
                dtype);
  }
}

// A conv state larger than one block's chunk is split over several blocks.
TEST(DeviceCodecEmulationBatch, LargeConvStateSpansSeveralBlocks) {
  const StateLayout layout = plain_layout(CodecId::int4, Arch::gdn, 8, 8, 0, 6000);
  const PageCodec cpu(layout);
  ASSERT_GT(cpu.conv_bytes(), 2 * cuda::kConvChunkBytes);
  const PageFormatTables tables(cpu, DType::bf16);
  EXPECT_EQ(
      cuda::page_blocks(tables.view()),
      cpu.head_count() + (cpu.conv_bytes() + cuda::kConvChunkBytes - 1) / cuda::kConvChunkBytes);
  const auto staged = staged_state(layout, DType::bf16, 3);
  std::vector<std::byte> expected(cpu.page_bytes());
  cpu.encode(staged, DType::bf16, expected);
  std::vector<std::byte> page(cpu.page_bytes(), std::byte{0xEE});
  const void* in = staged.data();
  void* out = page.data();
  cuda::emulate_encode_pages(tables.view(), &in, &out, 1, nullptr, 3);
  EXPECT_EQ(first_difference(page, expected), -1);
  std::vector<std::byte> back(staged.size(), std::byte{0});
  std::vector<std::byte> want(staged.size());
  cpu.decode(expected, DType::bf16, want);
  const void* pin = page.data();
  void* sout = back.data();
  cuda::emulate_decode_pages(tables.view(), &pin, &sout, 1, 3);
  EXPECT_EQ(first_difference(back, want), -1);
}

// The CPU's decode of `page` (f32), checked equal to the emulated device's.
std::vector<std::byte> decoded_on_both_sides(const PageCodec& cpu,
                                             const std::vector<std::byte>& page) {
  const PageFormatTables tables(cpu, DType::f32);
  std::vector<std::byte> want(cpu.staged_bytes(DType::f32));
  cpu.decode(page, DType::f32, want);
  std::vector<std::byte> back(want.size(), std::byte{0x3C});
  const void* in = page.data();
  void* out = back.data();
  cuda::emulate_decode_pages(tables.view(), &in, &out, 1, 3);
  EXPECT_EQ(first_difference(back, want), -1);
  return want;
}

// Hostile page bytes whose row and column scales are both NaN, with different payloads:
// which payload a product keeps depends on the order the compiler gives its operands, so
// the dual-axis reconstruction writes the one quiet NaN 0x7FC00000 on both sides (found
// by fuzz_page_decode: the CPU's vector loop and the emulated device body differed).
TEST(DeviceCodecEmulationBatch, NaNScalesDecodeToOneNaNOnBothSides) {
  for (const CodecId id : {CodecId::stepquant4, CodecId::stepquant6, CodecId::dsq4}) {
    const StateLayout layout =
        id == CodecId::dsq4
            ? plain_layout(id, Arch::gdn, 16, 12, 0, 0)
            : plan_layout(id == CodecId::stepquant4 ? testing::gdn_plan4() : testing::gdn_plan6(),
                          id);
    SCOPED_TRACE(layout.name + " " + std::string(to_string(id)));
    const PageCodec cpu(layout);
    std::vector<std::byte> page(cpu.page_bytes());
    std::mt19937 rng(3);
    for (std::byte& b : page) b = static_cast<std::byte>(rng());
    // Every 16-bit word of the page an fp16 NaN of a random sign and payload (quiet and
    // signalling): row and column scales alike.
    for (std::size_t at = 0; at + 1 < page.size(); at += 2) {
      const auto nan = static_cast<std::uint16_t>(0x7C00u | (rng() & 0x83FFu) | 1u);
      std::memcpy(page.data() + at, &nan, 2);
    }
    const std::vector<std::byte> want = decoded_on_both_sides(cpu, page);
    std::size_t canonical = 0;
    for (std::size_t k = 0; k + 3 < want.size(); k += 4) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, want.data() + k, 4);
      canonical += bits == 0x7FC00000u;
    }
    EXPECT_GT(canonical, want.size() / 8) << "the NaN products are the canonical quiet NaN";
  }
}

// The other half of the decoder's NaN rule (docs/codecs.md, "NaN and the decoder"): a
// stored fp16 value, a pivot row's, is widened exactly, sign, payload and quiet bit kept,
// on both sides; a signalling fp16 NaN stays signalling.
TEST(DeviceCodecEmulationBatch, PivotNaNsWidenExactlyOnBothSides) {
  const StateLayout layout = plan_layout(testing::kda_plan4(20), CodecId::stepquant4);
  const PageCodec cpu(layout);
  ASSERT_EQ(cpu.head_offset(0, 0), 0u);
  std::vector<std::byte> page(cpu.page_bytes());
  {
    std::vector<float> state(cpu.staged_bytes(DType::f32) / sizeof(float), 0.25f);
    cpu.encode(std::as_bytes(std::span(state)), DType::f32, page);
  }
  // Head 0 rows 2 4 6 8 P 6 4 2 at V = 20: the pivot row 4 starts at byte 106.
  const std::uint16_t halves[] = {0x7D00, 0x7E00, 0xFD01, 0xFFFF, 0x7C01};
  const std::uint32_t widened[] = {0x7FA00000u, 0x7FC00000u, 0xFFA02000u, 0xFFFFE000u,
                                   0x7F802000u};
  for (std::size_t n = 0; n < 5; ++n) std::memcpy(page.data() + 106 + 2 * n, &halves[n], 2);
  const std::vector<std::byte> want = decoded_on_both_sides(cpu, page);
  for (std::size_t n = 0; n < 5; ++n) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, want.data() + 4 * (4 * 20 + n), 4);
    EXPECT_EQ(bits, widened[n]) << "half " << std::hex << halves[n];
  }
}

// --- the tables and the view checks --------------------------------------------------------

TEST(DeviceCodecEmulationTables, TablesFollowThePageCodec) {
  const StateLayout layout = plan_layout(testing::kda_plan4(20), CodecId::stepquant4);
  const PageCodec cpu(layout);
  const PageFormatTables tables(cpu, DType::f32);
  const PageFormatView v = tables.view();
  ASSERT_EQ(v.head_count, 2u);
  EXPECT_EQ(v.head_offsets[0], 0u);
  EXPECT_EQ(v.head_offsets[1], cpu.head_offset(0, 1));
  EXPECT_EQ(v.head_offsets[2], cpu.conv_offset());
  EXPECT_EQ(v.page_bytes, cpu.page_bytes());
  EXPECT_EQ(v.staged_bytes, cpu.staged_bytes(DType::f32));
  // Head 0 rows 2 4 6 8 P 6 4 2 at V = 20 (docs/codecs.md's example): 16 + 40 bytes of
  // scales, then 5 10 15 20 40 15 10 5 bytes of rows.
  const std::uint32_t expected_rows[] = {56, 61, 71, 86, 106, 146, 161, 171};
  for (std::uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(v.row_offsets[i], expected_rows[i]) << "row " << i;
  }
  EXPECT_NE(v.impact, nullptr);
  EXPECT_EQ(v.widths[4], P);
  // The same rows by width class: 2-bit rows 0 and 7, 4-bit 1 and 6, 6-bit 2 and 5,
  // 8-bit 3, the pivot 4.
  const std::uint32_t expected_order[] = {0, 7, 1, 6, 2, 5, 3, 4};
  const std::uint32_t expected_ends[] = {2, 4, 6, 7, 8};
  for (std::uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(v.row_order[i], expected_order[i]) << "slot " << i;
  }
  for (std::uint32_t c = 0; c < cuda::kRowClasses; ++c) {
    EXPECT_EQ(v.class_ends[c], expected_ends[c]) << "class " << c;
  }
  // The blob's view holds the same tables.
  const std::vector<std::byte> blob = tables.blob();
  const PageFormatView b = tables.view_at(blob.data());
  for (std::uint32_t i = 0; i < 2 * 8; ++i) {
    EXPECT_EQ(b.row_order[i], v.row_order[i]) << "slot " << i;
  }
  for (std::uint32_t c = 0; c < 2 * cuda::kRowClasses; ++c) {
    EXPECT_EQ(b.class_ends[c], v.class_ends[c]) << "class " << c;
  }

  const PageCodec temporal(
      plan_layout(testing::kda_plan4(20), CodecId::stepquant4, StepQuantVariant::temporal_only));
  const PageFormatTables t2(temporal, DType::bf16);
  EXPECT_EQ(t2.view().impact, nullptr);
  EXPECT_EQ(t2.view().row_offsets[0], 16u);  // s[K] only

  const PageCodec int6(plain_layout(CodecId::int6, Arch::gdn, 7, 5, 12, 0));
  const PageFormatTables t3(int6, DType::f32);
  EXPECT_EQ(t3.view().widths, nullptr);
  EXPECT_EQ(t3.view().group_size, 12u);
  EXPECT_THROW(PageFormatTables(int6, DType::f16), std::invalid_argument);
}

TEST(DeviceCodecEmulationTables, ViewProblemsAreNamed) {
  const PageCodec cpu(plan_layout(testing::gdn_plan6(), CodecId::stepquant6));
  const PageFormatTables tables(cpu, DType::f32);
  const PageFormatView good = tables.view();
  EXPECT_EQ(cuda::view_problem(good), nullptr);
  PageFormatView bad = good;
  bad.widths = nullptr;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = good;
  bad.impact = nullptr;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad.variant = StepQuantVariant::temporal_only;  // temporal_only needs no impact
  EXPECT_EQ(cuda::view_problem(bad), nullptr);
  bad = good;
  bad.staged_dtype = DType::f16;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = good;
  bad.head_offsets = nullptr;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = good;
  bad.page_bytes += 4;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = good;
  bad.arch = Arch::kda;  // KDA needs row offsets
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  const PageCodec kda(plan_layout(testing::kda_plan4(20), CodecId::stepquant4));
  const PageFormatTables kda_tables(kda, DType::f32);
  EXPECT_EQ(cuda::view_problem(kda_tables.view()), nullptr);
  bad = kda_tables.view();
  bad.row_order = nullptr;  // and the row order
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = kda_tables.view();
  bad.class_ends = nullptr;
  EXPECT_NE(cuda::view_problem(bad), nullptr);

  const PageCodec int4(plain_layout(CodecId::int4, Arch::gdn, 16, 24, 0, 0));
  const PageFormatTables t2(int4, DType::bf16);
  bad = t2.view();
  EXPECT_EQ(cuda::view_problem(bad), nullptr);
  bad.group_size = 6;
  EXPECT_NE(cuda::view_problem(bad), nullptr);
  bad = t2.view();
  bad.codec = static_cast<CodecId>(200);
  EXPECT_NE(cuda::view_problem(bad), nullptr);
}

// Random values over a wide dynamic range, one head per codec family, many seeds: the
// kind of input where a single differently rounded operation would show.
TEST(DeviceCodecEmulationRandom, WideRangeValuesAcrossSeeds) {
  std::vector<StateLayout> layouts = {
      plain_layout(CodecId::int8, Arch::gdn, 9, 13, 8, 0),
      plain_layout(CodecId::dsq6, Arch::gdn, 9, 13, 0, 0),
      plan_layout(cycling_plan(Arch::gdn, 1, 5, 9, 13, 4, {2, 4, 6, 8, P}, 1), CodecId::stepquant4),
      plan_layout(cycling_plan(Arch::kda, 1, 2, 9, 13, 4, {2, 4, 6, 8, P}, 2), CodecId::stepquant4),
      plan_layout(cycling_plan(Arch::kda, 1, 2, 9, 13, 6, {4, 6, 8}, 3), CodecId::stepquant6,
                  StepQuantVariant::spatial_only),
  };
  for (const StateLayout& layout : layouts) {
    const PageCodec cpu(layout);
    const PageFormatTables tables(cpu, DType::f32);
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
      std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
      std::vector<std::byte> staged(cpu.staged_bytes(DType::f32));
      for (std::size_t i = 0; i < staged.size() / 4; ++i) {
        set_staged(staged, DType::f32, i, mantissa(rng) * std::exp2(exponent(rng)));
      }
      std::vector<std::byte> expected(cpu.page_bytes());
      cpu.encode(staged, DType::f32, expected);
      std::vector<std::byte> page(cpu.page_bytes(), std::byte{0x11});
      const void* in = staged.data();
      void* out = page.data();
      cuda::emulate_encode_pages(tables.view(), &in, &out, 1, nullptr, seed % 2 == 0 ? 1 : 3);
      ASSERT_EQ(first_difference(page, expected), -1)
          << to_string(layout.codec.id) << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace statepool::kernels
