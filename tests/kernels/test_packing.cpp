// Code packing (packing.hpp): golden bytes computed by hand, and round trips of every
// code value at every position for every width.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "statepool/kernels/packing.hpp"

namespace statepool::kernels {
namespace {

template <std::uint32_t Bits>
std::vector<std::uint8_t> pack(const std::vector<int>& signed_codes) {
  std::vector<std::uint8_t> u;
  for (const int z : signed_codes) {
    u.push_back(static_cast<std::uint8_t>(z + static_cast<int>(code_qmax(Bits))));
  }
  std::vector<std::uint8_t> out(packed_bytes(u.size(), Bits), 0xEE);
  pack_codes<Bits>(u.data(), u.size(), out.data());
  return out;
}

using Bytes = std::vector<std::uint8_t>;

TEST(Packing, QmaxAndSizes) {
  EXPECT_EQ(code_qmax(2), 1u);
  EXPECT_EQ(code_qmax(4), 7u);
  EXPECT_EQ(code_qmax(6), 31u);
  EXPECT_EQ(code_qmax(8), 127u);
  EXPECT_EQ(packed_bytes(16384, 6), 12288u);
  EXPECT_EQ(packed_bytes(16384, 4), 8192u);
  EXPECT_EQ(packed_bytes(16384, 8), 16384u);
  EXPECT_EQ(packed_bytes(16384, 2), 4096u);
  // Partial quads: 6-bit keeps whole 3-byte quads, the others end at the last code byte.
  EXPECT_EQ(packed_bytes(1, 6), 3u);
  EXPECT_EQ(packed_bytes(5, 6), 6u);
  EXPECT_EQ(packed_bytes(1, 4), 1u);
  EXPECT_EQ(packed_bytes(3, 4), 2u);
  EXPECT_EQ(packed_bytes(5, 2), 2u);
  EXPECT_EQ(packed_bytes(9, 8), 9u);
  EXPECT_EQ(packed_bytes(0, 6), 0u);
}

TEST(Packing, SixBitGolden) {
  // z = -31, 0, 31, 5 -> u = 0, 31, 62, 36 -> word = 0 | 31<<6 | 62<<12 | 36<<18
  //   = 0x0007C0 + 0x03E000 + 0x900000 = 0x93E7C0 -> bytes C0 E7 93 (little-endian).
  EXPECT_EQ(pack<6>({-31, 0, 31, 5}), (Bytes{0xC0, 0xE7, 0x93}));
  // u = 1, 2, 3, 4 (z = -30, -29, -28, -27) -> 1 | 2<<6 | 3<<12 | 4<<18 = 0x103081.
  EXPECT_EQ(pack<6>({-30, -29, -28, -27}), (Bytes{0x81, 0x30, 0x10}));
  // Two quads back to back, then a partial quad of one code (u = 63 is never produced by
  // the codecs but the packing itself is width-exact): 63 -> 3F 00 00.
  EXPECT_EQ(pack<6>({-31, 0, 31, 5, -30, -29, -28, -27, 32}),
            (Bytes{0xC0, 0xE7, 0x93, 0x81, 0x30, 0x10, 0x3F, 0x00, 0x00}));
}

TEST(Packing, FourBitGolden) {
  // z = -7, 7 -> u = 0, 14 -> low nibble first: 0xE0. z = 3, -2 -> u = 10, 5 -> 0x5A.
  EXPECT_EQ(pack<4>({-7, 7, 3, -2}), (Bytes{0xE0, 0x5A}));
  // Odd count: the last byte holds one code in its low nibble, high nibble zero.
  EXPECT_EQ(pack<4>({0, 1, -7}), (Bytes{0x87, 0x00}));
  EXPECT_EQ(pack<4>({0}), (Bytes{0x07}));
}

TEST(Packing, TwoAndEightBitGolden) {
  // 2-bit: z = 1, -1, 0, 1 -> u = 2, 0, 1, 2 -> 2 | 0<<2 | 1<<4 | 2<<6 = 0x92.
  EXPECT_EQ(pack<2>({1, -1, 0, 1}), (Bytes{0x92}));
  EXPECT_EQ(pack<2>({1, 1}), (Bytes{0x0A}));
  // 8-bit: u = z + 127, one per byte.
  EXPECT_EQ(pack<8>({-127, 0, 127, -1, 5}), (Bytes{0x00, 0x7F, 0xFE, 0x7E, 0x84}));
}

template <std::uint32_t Bits>
void check_round_trip_every_code() {
  std::mt19937 rng(Bits);
  const std::uint32_t max_code = (1u << Bits) - 1u;  // beyond 2 * qmax too: width-exact
  for (std::uint32_t code = 0; code <= max_code; ++code) {
    for (std::size_t count = 1; count <= 9; ++count) {
      for (std::size_t pos = 0; pos < count; ++pos) {
        std::vector<std::uint8_t> u(count);
        for (auto& c : u) {
          c = static_cast<std::uint8_t>(rng() & max_code);
        }
        u[pos] = static_cast<std::uint8_t>(code);
        std::vector<std::uint8_t> packed(packed_bytes(count, Bits) + 4, 0xA5);
        pack_codes<Bits>(u.data(), count, packed.data());
        // Nothing written past the run.
        for (std::size_t i = packed_bytes(count, Bits); i < packed.size(); ++i) {
          ASSERT_EQ(packed[i], 0xA5) << "bits " << Bits << " count " << count;
        }
        std::vector<std::uint8_t> back(count);
        unpack_codes<Bits>(packed.data(), count, back.data());
        ASSERT_EQ(back, u) << "bits " << Bits << " code " << code << " pos " << pos;
        ASSERT_EQ(get_code(packed.data(), pos, Bits), code);
        // set_code on a zeroed run reproduces pack_codes exactly.
        std::vector<std::uint8_t> rebuilt(packed_bytes(count, Bits), 0);
        for (std::size_t i = 0; i < count; ++i) {
          set_code(rebuilt.data(), i, Bits, u[i]);
        }
        ASSERT_TRUE(std::equal(rebuilt.begin(), rebuilt.end(), packed.begin()));
      }
    }
  }
}

TEST(Packing, RoundTripEveryCodeAtEveryPosition) {
  check_round_trip_every_code<2>();
  check_round_trip_every_code<4>();
  check_round_trip_every_code<6>();
  check_round_trip_every_code<8>();
}

TEST(Packing, SetCodeLeavesNeighboursAlone) {
  std::vector<std::uint8_t> packed(packed_bytes(8, 6), 0xFF);
  set_code(packed.data(), 5, 6, 0);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(get_code(packed.data(), i, 6), i == 5 ? 0u : 63u) << i;
  }
}

// pack_run / unpack_run (the host codecs' path: AVX2 steps of 32 codes where the CPU has
// AVX2, the templates otherwise, and under STATEPOOL_KERNELS_PORTABLE=1 in
// kernels.portable_uniform_loops) against the templates: every length up to a few steps,
// so that runs end inside, at and past a step, and guard bytes on both sides.
template <std::uint32_t Bits>
void check_runs_match_templates() {
  std::mt19937 rng(100 + Bits);
  constexpr std::size_t guard = 32;
  for (std::size_t count = 0; count <= 200; ++count) {
    std::vector<std::uint8_t> u(count);
    for (auto& c : u) c = static_cast<std::uint8_t>(rng() & ((1u << Bits) - 1u));
    const std::size_t bytes = packed_bytes(count, Bits);
    std::vector<std::uint8_t> expected(bytes);
    pack_codes<Bits>(u.data(), count, expected.data());

    std::vector<std::uint8_t> packed(bytes + 2 * guard, 0xA5);
    pack_run(Bits, u.data(), count, packed.data() + guard);
    for (std::size_t i = 0; i < guard; ++i) {
      ASSERT_EQ(packed[i], 0xA5) << "bits " << Bits << " count " << count << " wrote before";
      ASSERT_EQ(packed[guard + bytes + i], 0xA5)
          << "bits " << Bits << " count " << count << " wrote past the run";
    }
    ASSERT_TRUE(std::equal(expected.begin(), expected.end(), packed.begin() + guard))
        << "bits " << Bits << " count " << count;

    std::vector<std::uint8_t> back(count + 2 * guard, 0x5A);
    unpack_run(Bits, packed.data() + guard, count, back.data() + guard);
    ASSERT_TRUE(std::equal(u.begin(), u.end(), back.begin() + guard))
        << "bits " << Bits << " count " << count;
    for (std::size_t i = 0; i < guard; ++i) {
      ASSERT_EQ(back[i], 0x5A);
      ASSERT_EQ(back[guard + count + i], 0x5A) << "bits " << Bits << " count " << count;
    }
  }
}

TEST(Packing, HostRunsMatchTheTemplates) {
  check_runs_match_templates<2>();
  check_runs_match_templates<4>();
  check_runs_match_templates<6>();
  check_runs_match_templates<8>();
}

TEST(Packing, HostRunsReadNothingPastTheRun) {
  // The run ends at the end of an allocation: a read past it is caught by ASan.
  for (const std::uint32_t bits : {2u, 4u, 6u, 8u}) {
    for (const std::size_t count : {32u, 64u, 96u, 128u, 131u}) {
      const std::size_t bytes = packed_bytes(count, bits);
      auto packed = std::make_unique<std::uint8_t[]>(bytes);
      std::vector<std::uint8_t> u(count, 1);
      pack_run(bits, u.data(), count, packed.get());
      auto back = std::make_unique<std::uint8_t[]>(count);
      unpack_run(bits, packed.get(), count, back.get());
      EXPECT_TRUE(std::equal(u.begin(), u.end(), back.get())) << bits << " " << count;
    }
  }
}

}  // namespace
}  // namespace statepool::kernels
