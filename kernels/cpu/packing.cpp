// Whole runs of codes on the host (packing.hpp's pack_run / unpack_run).
//
// The portable path is packing.hpp's templates, one quad at a time: a 6-bit quad is three
// bytes, which no compiler turns into vector code. The AVX2 path handles 32 codes (eight
// quads) per step with the same formulas on 32-bit lanes, one quad per lane:
//   unpack: two loads that cover exactly the 4b bytes of the step, a byte shuffle that
//           puts each quad's b/2 bytes at the bottom of its lane, expand_quad<b>;
//   pack:   compress_quad<b> per lane, a byte shuffle that keeps each lane's b/2 low
//           bytes, a dword permutation that closes the gap between the two 128-bit
//           halves, and stores of exactly 4b bytes.
// Nothing is read or written outside the run; the tail (fewer than 32 codes) goes through
// the templates. Tested against the templates byte for byte, both ways (test_packing.cpp,
// and kernels.portable_uniform_loops with STATEPOOL_KERNELS_PORTABLE=1).

#include <array>
#include <cstring>

#include "simd.hpp"
#include "statepool/kernels/packing.hpp"

#if defined(STATEPOOL_KERNELS_AVX2)
#include <immintrin.h>
#endif

namespace statepool::kernels {
namespace {

template <std::uint32_t Bits>
void pack_portable(const std::uint8_t* u, std::size_t count, std::uint8_t* dst) noexcept {
  if constexpr (Bits == 8) {
    if (count != 0) std::memcpy(dst, u, count);  // an 8-bit code is its own byte
  } else {
    pack_codes<Bits>(u, count, dst);
  }
}

template <std::uint32_t Bits>
void unpack_portable(const std::uint8_t* src, std::size_t count, std::uint8_t* u) noexcept {
  if constexpr (Bits == 8) {
    if (count != 0) std::memcpy(u, src, count);
  } else {
    unpack_codes<Bits>(src, count, u);
  }
}

#if defined(STATEPOOL_KERNELS_AVX2)

constexpr std::size_t kStep = 32;  // codes per AVX2 step: eight quads

// Byte shuffles and a dword order as constant tables (a quad is b/2 bytes):
//   unpack: lane k of each 128-bit half takes its quad's bytes from byte
//           first[half] + k * b/2 of that half's load (-1 zeroes a byte);
//   pack:   each half keeps the b/2 low bytes of its four lanes, at its bottom, and the
//           permutation puts the halves' b/2 dwords side by side.
template <std::uint32_t Bits>
struct Tables {
  static constexpr int quad = static_cast<int>(Bits / 2);
  // The high half's quads start 2b bytes into the step: at byte 4 of the second 6-bit
  // load ([8, 24)), at byte 2b of the broadcast 4- and 2-bit loads.
  static constexpr int high_first = Bits == 6 ? 4 : static_cast<int>(2 * Bits);

  alignas(32) static constexpr std::array<std::int8_t, 32> unpack = [] {
    std::array<std::int8_t, 32> m{};
    for (int half = 0; half < 2; ++half) {
      const int first = half == 0 ? 0 : high_first;
      for (int lane = 0; lane < 4; ++lane) {
        for (int byte = 0; byte < 4; ++byte) {
          m[16 * half + 4 * lane + byte] =
              static_cast<std::int8_t>(byte < quad ? first + lane * quad + byte : -1);
        }
      }
    }
    return m;
  }();
  alignas(32) static constexpr std::array<std::int8_t, 32> pack = [] {
    std::array<std::int8_t, 32> m{};
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < 16; ++i) {
        m[16 * half + i] = static_cast<std::int8_t>(i < 4 * quad ? 4 * (i / quad) + i % quad : -1);
      }
    }
    return m;
  }();
  alignas(32) static constexpr std::array<std::int32_t, 8> order = [] {
    std::array<std::int32_t, 8> o{};
    for (int i = 0; i < 8; ++i) o[i] = i < quad ? i : (i < 2 * quad ? 4 + i - quad : i);
    return o;
  }();
};

[[gnu::target("avx2")]] inline __m256i load32(const void* p) {
  return _mm256_load_si256(static_cast<const __m256i*>(p));
}

// The 32-bit-lane form of expand_quad<Bits> / compress_quad<Bits>.
template <std::uint32_t Bits>
[[gnu::target("avx2")]] __m256i expand_lanes(__m256i w) {
  constexpr int mask = (1 << Bits) - 1;
  constexpr int b = static_cast<int>(Bits);
  const __m256i m0 = _mm256_set1_epi32(mask);
  const __m256i m1 = _mm256_set1_epi32(mask << 8);
  const __m256i m2 = _mm256_set1_epi32(mask << 16);
  const __m256i m3 = _mm256_set1_epi32(mask << 24);
  __m256i r = _mm256_and_si256(w, m0);
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_slli_epi32(w, 8 - b), m1));
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_slli_epi32(w, 16 - 2 * b), m2));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_slli_epi32(w, 24 - 3 * b), m3));
}

template <std::uint32_t Bits>
[[gnu::target("avx2")]] __m256i compress_lanes(__m256i w) {
  constexpr int mask = (1 << Bits) - 1;
  constexpr int b = static_cast<int>(Bits);
  const __m256i m0 = _mm256_set1_epi32(mask);
  const __m256i m1 = _mm256_set1_epi32(mask << b);
  const __m256i m2 = _mm256_set1_epi32(mask << (2 * b));
  const __m256i m3 = _mm256_set1_epi32(mask << (3 * b));
  __m256i r = _mm256_and_si256(w, m0);
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(w, 8 - b), m1));
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(w, 16 - 2 * b), m2));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(w, 24 - 3 * b), m3));
}

// The 4b bytes of one step, in both 128-bit halves as unpack_shuffle expects them.
template <std::uint32_t Bits>
[[gnu::target("avx2")]] __m256i load_step(const std::uint8_t* s) {
  if constexpr (Bits == 6) {  // 24 bytes: [0, 16) and [8, 24)
    const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
  } else if constexpr (Bits == 4) {  // 16 bytes
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  } else {  // 8 bytes
    return _mm256_broadcastsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
  }
}

template <std::uint32_t Bits>
[[gnu::target("avx2")]] void unpack_avx2(const std::uint8_t* src, std::size_t count,
                                         std::uint8_t* u) {
  constexpr std::size_t step_bytes = 4 * Bits;
  const __m256i shuffle = load32(Tables<Bits>::unpack.data());
  std::size_t c = 0;
  for (; c + kStep <= count; c += kStep) {
    const __m256i w = _mm256_shuffle_epi8(load_step<Bits>(src + c / kStep * step_bytes), shuffle);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + c), expand_lanes<Bits>(w));
  }
  unpack_codes<Bits>(src + c / kStep * step_bytes, count - c, u + c);
}

template <std::uint32_t Bits>
[[gnu::target("avx2")]] void pack_avx2(const std::uint8_t* u, std::size_t count,
                                       std::uint8_t* dst) {
  constexpr std::size_t step_bytes = 4 * Bits;
  const __m256i shuffle = load32(Tables<Bits>::pack.data());
  const __m256i permute = load32(Tables<Bits>::order.data());
  std::size_t c = 0;
  for (; c + kStep <= count; c += kStep) {
    const __m256i w = compress_lanes<Bits>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + c)));
    const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(w, shuffle), permute);
    std::uint8_t* d = dst + c / kStep * step_bytes;
    const __m128i low = _mm256_castsi256_si128(packed);
    if constexpr (Bits == 2) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(d), low);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), low);
      if constexpr (Bits == 6) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(d + 16), _mm256_extracti128_si256(packed, 1));
      }
    }
  }
  pack_codes<Bits>(u + c, count - c, dst + c / kStep * step_bytes);
}

#endif  // STATEPOOL_KERNELS_AVX2

template <std::uint32_t Bits>
void pack_width(const std::uint8_t* u, std::size_t count, std::uint8_t* dst) noexcept {
#if defined(STATEPOOL_KERNELS_AVX2)
  if constexpr (Bits != 8) {
    if (detail::use_avx2_loops()) return pack_avx2<Bits>(u, count, dst);
  }
#endif
  pack_portable<Bits>(u, count, dst);
}

template <std::uint32_t Bits>
void unpack_width(const std::uint8_t* src, std::size_t count, std::uint8_t* u) noexcept {
#if defined(STATEPOOL_KERNELS_AVX2)
  if constexpr (Bits != 8) {
    if (detail::use_avx2_loops()) return unpack_avx2<Bits>(src, count, u);
  }
#endif
  unpack_portable<Bits>(src, count, u);
}

}  // namespace

void pack_run(std::uint32_t bits, const std::uint8_t* u, std::size_t count,
              std::uint8_t* dst) noexcept {
  switch (bits) {
    case 2: pack_width<2>(u, count, dst); break;
    case 4: pack_width<4>(u, count, dst); break;
    case 6: pack_width<6>(u, count, dst); break;
    default: pack_width<8>(u, count, dst); break;
  }
}

void unpack_run(std::uint32_t bits, const std::uint8_t* src, std::size_t count,
                std::uint8_t* u) noexcept {
  switch (bits) {
    case 2: unpack_width<2>(src, count, u); break;
    case 4: unpack_width<4>(src, count, u); break;
    case 6: unpack_width<6>(src, count, u); break;
    default: unpack_width<8>(src, count, u); break;
  }
}

}  // namespace statepool::kernels
