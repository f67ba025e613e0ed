// int4 / int6 / int8: symmetric, absmax per group, fp16 scales (format.hpp, quantize.hpp).
//
// Fast path: per group, an integer max over |x| bits, then fixed-size chunks that are
// quantized into a byte array and packed quad by quad. The generic loops are written to
// auto-vectorize; on x86-64 CPUs with AVX2 the two hot loops (the absmax and the
// quantization) are AVX2 intrinsics performing the same IEEE operations, which GCC cannot
// produce from the portable code (it turns the clamps into compare-and-blend and the
// narrowing into masked packs). Tested against reference.cpp byte for byte.
//
// The absmax also tells whether the group is finite (the |x| bits of +-Inf and NaN are
// >= 0x7F800000), so encode_head_checked costs nothing extra. encode_staged_head (a
// client's staging buffer) copies each group out first, checking it on the way, so that
// the absmax and the codes come from one reading of the values.

#include <algorithm>
#include <cstring>
#include <vector>

#include "bytes.hpp"
#include "codecs_internal.hpp"
#include "simd.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"

#if defined(STATEPOOL_KERNELS_AVX2)
#include <immintrin.h>
#endif

namespace statepool::kernels::detail {
namespace {

constexpr std::size_t kChunk = 512;  // a multiple of 4, so chunks start on quad boundaries
constexpr std::size_t kPrefetchGroups = 8;
constexpr std::size_t kFloatsPerLine = 16;  // a 64-byte cache line

STATEPOOL_FORCE_INLINE std::uint32_t group_absmax_bits(const float* x, std::size_t count) {
  // int32 rather than uint32: |x| bits fit in 31 bits and SSE2 has signed compares only.
  std::int32_t m = 0;
  for (std::size_t i = 0; i < count; ++i) {
    m = std::max(m, static_cast<std::int32_t>(abs_bits(x[i])));
  }
  return static_cast<std::uint32_t>(m);
}

/// Smallest |x| bits of a non-finite value (+-Inf); NaNs are above.
constexpr std::uint32_t kNonFiniteAbsBits = 0x7F800000u;

// Where the encoder finds a group's values and their |x| bits maximum: in place (FP32
// values of the caller's own), or copied out of a staged head (any memory, f32 or bf16).
struct InPlace {
  const float* x;
  /// The `count` values of the group at `begin` (never nullptr); m = absmax(them).
  template <class Absmax>
  STATEPOOL_FORCE_INLINE const float* operator()(std::size_t begin, std::size_t count,
                                                 Absmax&& absmax, std::uint32_t& m) const {
    m = absmax(x + begin, count);
    return x + begin;
  }
  /// Asks for the `count` values of the group at `begin` (a later one).
  void prefetch(std::size_t begin, std::size_t count) const {
    for (std::size_t l = 0; l < count; l += kFloatsPerLine) __builtin_prefetch(x + begin + l);
  }
};

struct StagedCopy {
  const std::byte* src;
  DType dtype;
  float* group;               // room for one group
  std::size_t bad_index = 0;  // set when operator() returns nullptr
  float bad_value = 0.0f;
  /// The group's values, read once into `group` with their |x| bits maximum taken on the
  /// way (one pass: the copy costs a store per value); nullptr (bad_index and bad_value
  /// set) when one of them is NaN or +-Inf.
  template <class Absmax>
  STATEPOOL_FORCE_INLINE const float* operator()(std::size_t begin, std::size_t count, Absmax&&,
                                                 std::uint32_t& m) {
    std::int32_t max = 0;  // signed: |x| bits fit in 31 bits, SSE2 has signed compares only
    std::uint32_t* __restrict out = reinterpret_cast<std::uint32_t*>(group);
    if (dtype == DType::f32) {
      const std::byte* __restrict p = src + 4 * begin;
      for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t w;
        std::memcpy(&w, p + 4 * i, 4);
        max = std::max(max, static_cast<std::int32_t>(w & 0x7FFFFFFFu));
        out[i] = w;
      }
    } else {
      const std::byte* __restrict p = src + 2 * begin;
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;  // bf16 -> FP32, exact
        max = std::max(max, static_cast<std::int32_t>(w & 0x7FFFFFFFu));
        out[i] = w;
      }
    }
    m = static_cast<std::uint32_t>(max);
    if (m < kNonFiniteAbsBits) return group;
    // Where, in the copy (this thread's own memory): the check and the report agree.
    bad_index = begin + first_non_finite(reinterpret_cast<const std::byte*>(group), count,
                                         DType::f32, bad_value);
    return nullptr;
  }
  void prefetch(std::size_t begin, std::size_t count) const {
    const std::size_t width = dtype_bytes(dtype);
    for (std::size_t l = 0; l < count * width; l += 4 * kFloatsPerLine)
      __builtin_prefetch(src + begin * width + l);
  }
};

// One encoder for the generic and the AVX2 loops, in place and staged: Values as above,
// Absmax(x, count) -> |x| bits maximum, Quantize(x, len, s, qmax, dst) -> codes of len
// values for a scale s > 0. Returns false when a group held a NaN or +-Inf (the bytes are
// then unspecified; a StagedCopy stops at that group and says where).
template <std::uint32_t Bits, class Values, class Absmax, class Quantize>
STATEPOOL_FORCE_INLINE bool encode_uniform_with(Values& values, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes,
                                                Absmax&& absmax, Quantize&& quantize) {
  constexpr std::uint32_t qmax = code_qmax(Bits);
  const std::size_t groups = uniform_group_count(n, group);
  std::uint8_t* codes = as_u8(out + 2 * groups);
  alignas(64) std::uint8_t u[kChunk];
  bool finite = true;

  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * group;
    const std::size_t count = std::min<std::size_t>(group, n - begin);
    // A state far larger than the caches streams through here once: ask for the group
    // kPrefetchGroups ahead while this one is quantized (measured in bench/RESULTS.md).
    if (const std::size_t ahead = begin + kPrefetchGroups * group; ahead + group <= n) {
      values.prefetch(ahead, group);
    }
    std::uint32_t m = 0;
    const float* xg = values(begin, count, absmax, m);
    if (xg == nullptr) return false;
    finite = finite && m < kNonFiniteAbsBits;
    const std::uint16_t scale_bits = uniform_scale_bits(m, qmax);
    store_u16_le(out + 2 * g, scale_bits);
    const float s = half_bits_to_float(scale_bits);
    std::uint8_t* cg = codes + packed_bytes(begin, Bits);  // begin is a multiple of 4

    for (std::size_t c = 0; c < count; c += kChunk) {
      const std::size_t len = std::min(kChunk, count - c);
      std::uint8_t* dst = Bits == 8 ? cg + c : u;  // 8-bit codes are their own packing
      if (s > 0.0f) {
        quantize(xg + c, len, s, qmax, dst);
      } else {
        std::memset(dst, static_cast<int>(qmax), len);
      }
      if constexpr (Bits != 8) {
        pack_run(Bits, u, len, cg + packed_bytes(c, Bits));
      }
    }
  }
  // Everything after the last code byte is padding (pack_codes already zero-fills the
  // unused slots of a final partial quad).
  const std::size_t used = 2 * groups + packed_bytes(n, Bits);
  std::memset(out + used, 0, out_bytes - used);
  return finite;
}

STATEPOOL_FORCE_INLINE void quantize_generic(const float* x, std::size_t len, float s,
                                             std::uint32_t qmax, std::uint8_t* dst) {
  for (std::size_t i = 0; i < len; ++i) {
    dst[i] = static_cast<std::uint8_t>(uniform_code_positive_scale(x[i], s, qmax));
  }
}

template <std::uint32_t Bits, class Values>
STATEPOOL_FORCE_INLINE bool encode_uniform_body(Values& values, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_with<Bits>(values, n, group, out, out_bytes, group_absmax_bits,
                                   quantize_generic);
}

#if defined(STATEPOOL_KERNELS_AVX2)

[[gnu::target("avx2")]] std::uint32_t absmax_bits_avx2(const float* x, std::size_t count) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8));
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(a, magnitude));
    m1 = _mm256_max_epi32(m1, _mm256_and_si256(b, magnitude));
  }
  m0 = _mm256_max_epi32(m0, m1);
  __m128i q = _mm_max_epi32(_mm256_castsi256_si128(m0), _mm256_extracti128_si256(m0, 1));
  q = _mm_max_epi32(q, _mm_shuffle_epi32(q, 0x4E));
  q = _mm_max_epi32(q, _mm_shuffle_epi32(q, 0xB1));
  auto m = static_cast<std::uint32_t>(_mm_cvtsi128_si32(q));
  for (; i < count; ++i) m = std::max(m, abs_bits(x[i]));
  return m;
}

// uniform_code_positive_scale, 32 values at a time: the same division, the same magic
// rounding, max/min with exactly the clamps' semantics (a NaN quotient gives -qmax), and
// saturating packs that are exact because every code is already in [0, 2 qmax].
[[gnu::target("avx2")]] void quantize_avx2(const float* x, std::size_t len, float s,
                                           std::uint32_t qmax, std::uint8_t* dst) {
  const __m256 scale = _mm256_set1_ps(s);
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // round_half_even_small's 1.5 * 2^23
  const __m256 low = _mm256_set1_ps(-static_cast<float>(qmax));
  const __m256 high = _mm256_set1_ps(static_cast<float>(qmax));
  const __m256i offset = _mm256_set1_epi32(static_cast<int>(qmax));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i code[4];
    for (int k = 0; k < 4; ++k) {
      __m256 q = _mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), scale);
      q = _mm256_sub_ps(_mm256_add_ps(q, magic), magic);
      q = _mm256_min_ps(_mm256_max_ps(q, low), high);
      code[k] = _mm256_add_epi32(_mm256_cvttps_epi32(q), offset);
    }
    const __m256i words = _mm256_packus_epi16(_mm256_packus_epi32(code[0], code[1]),
                                              _mm256_packus_epi32(code[2], code[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permutevar8x32_epi32(words, order));
  }
  for (; i < len; ++i) {
    dst[i] = static_cast<std::uint8_t>(uniform_code_positive_scale(x[i], s, qmax));
  }
}

template <std::uint32_t Bits, class Values>
[[gnu::target("avx2")]] bool encode_uniform_avx2(Values& values, std::size_t n, std::uint32_t group,
                                                 std::byte* out, std::size_t out_bytes) {
  return encode_uniform_with<Bits>(values, n, group, out, out_bytes, absmax_bits_avx2,
                                   quantize_avx2);
}

#endif  // STATEPOOL_KERNELS_AVX2

template <std::uint32_t Bits>
STATEPOOL_FORCE_INLINE void decode_uniform_body(const std::byte* in, std::size_t n,
                                                std::uint32_t group, float* x) {
  constexpr std::uint32_t qmax = code_qmax(Bits);
  const std::size_t groups = uniform_group_count(n, group);
  const std::uint8_t* codes = as_u8(in + 2 * groups);
  alignas(64) std::uint8_t u[kChunk];

  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * group;
    const std::size_t count = std::min<std::size_t>(group, n - begin);
    const float s = half_bits_to_float(load_u16_le(in + 2 * g));
    const std::uint8_t* cg = codes + packed_bytes(begin, Bits);
    float* xg = x + begin;

    for (std::size_t c = 0; c < count; c += kChunk) {
      const std::size_t len = std::min(kChunk, count - c);
      const std::uint8_t* src = u;
      if constexpr (Bits == 8) {
        src = cg + c;
      } else {
        unpack_run(Bits, cg + packed_bytes(c, Bits), len, u);
      }
      for (std::size_t i = 0; i < len; ++i) {
        xg[c + i] = uniform_value(src[i], s, qmax);
      }
    }
  }
}

// Entry points, one per width and source: AVX2 intrinsics where the CPU has them (encode),
// the cloned (simd.hpp) portable loops otherwise (and for decode, which GCC vectorizes
// well).
STATEPOOL_SIMD_CLONES bool encode_int4_portable(InPlace& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<4>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES bool encode_int6_portable(InPlace& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<6>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES bool encode_int8_portable(InPlace& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<8>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES bool encode_int4_portable(StagedCopy& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<4>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES bool encode_int6_portable(StagedCopy& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<6>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES bool encode_int8_portable(StagedCopy& x, std::size_t n, std::uint32_t group,
                                                std::byte* out, std::size_t out_bytes) {
  return encode_uniform_body<8>(x, n, group, out, out_bytes);
}
STATEPOOL_SIMD_CLONES void decode_int4(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<4>(in, n, group, x);
}
STATEPOOL_SIMD_CLONES void decode_int6(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<6>(in, n, group, x);
}
STATEPOOL_SIMD_CLONES void decode_int8(const std::byte* in, std::size_t n, std::uint32_t group,
                                       float* x) {
  decode_uniform_body<8>(in, n, group, x);
}

template <std::uint32_t Bits, class Values>
bool encode_uniform(Values& x, std::size_t n, std::uint32_t group, std::byte* out,
                    std::size_t out_bytes) {
#if defined(STATEPOOL_KERNELS_AVX2)
  if (use_avx2_loops()) return encode_uniform_avx2<Bits>(x, n, group, out, out_bytes);
#endif
  if constexpr (Bits == 4) {
    return encode_int4_portable(x, n, group, out, out_bytes);
  } else if constexpr (Bits == 6) {
    return encode_int6_portable(x, n, group, out, out_bytes);
  } else {
    return encode_int8_portable(x, n, group, out, out_bytes);
  }
}

template <std::uint32_t Bits>
void decode_uniform(const std::byte* in, std::size_t n, std::uint32_t group, float* x) {
  if constexpr (Bits == 4) {
    decode_int4(in, n, group, x);
  } else if constexpr (Bits == 6) {
    decode_int6(in, n, group, x);
  } else {
    decode_int8(in, n, group, x);
  }
}

template <std::uint32_t Bits>
class UniformCodec final : public Codec {
 public:
  UniformCodec(CodecId id, std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t group)
      : Codec(std::size_t{key_dim} * value_dim),
        id_(id),
        group_(group),
        values_(static_cast<std::size_t>(key_dim) * value_dim),
        head_bytes_(uniform_head_bytes(values_, group, Bits)) {}

  [[nodiscard]] CodecId id() const noexcept override { return id_; }
  [[nodiscard]] std::size_t head_bytes(std::uint32_t, std::uint32_t) const noexcept override {
    return head_bytes_;
  }

  void encode_head(std::uint32_t, std::uint32_t, std::span<const float> src,
                   std::span<std::byte> dst) const override {
    check_head_buffers(to_string(id_), src.size(), values_, dst.size(), head_bytes_);
    InPlace x{src.data()};
    (void)encode_uniform<Bits>(x, values_, group_, dst.data(), dst.size());
  }

  [[nodiscard]] bool encode_head_checked(std::uint32_t, std::uint32_t, std::span<const float> src,
                                         std::span<std::byte> dst) const override {
    check_head_buffers(to_string(id_), src.size(), values_, dst.size(), head_bytes_);
    InPlace x{src.data()};
    return encode_uniform<Bits>(x, values_, group_, dst.data(), dst.size());
  }

  // Group by group through a copy (in L1 at the default group size): each value is read
  // once, into the copy, whose absmax says whether the group is finite and gives its
  // scale; the codes come from the copy too.
  [[nodiscard]] std::size_t encode_staged_head(std::uint32_t, std::uint32_t, const std::byte* src,
                                               DType dtype, std::span<std::byte> dst,
                                               float& bad) const override {
    check_head_buffers(to_string(id_), values_, values_, dst.size(), head_bytes_);
    check_staged_dtype(dtype);
    thread_local std::vector<float> group;
    const std::size_t room = std::min<std::size_t>(group_, values_);
    if (group.size() < room) group.resize(room);
    StagedCopy x{src, dtype, group.data()};
    if (encode_uniform<Bits>(x, values_, group_, dst.data(), dst.size())) return values_;
    bad = x.bad_value;
    return x.bad_index;
  }

  void decode_head(std::uint32_t, std::uint32_t, std::span<const std::byte> src,
                   std::span<float> dst) const override {
    check_head_buffers(to_string(id_), dst.size(), values_, src.size(), head_bytes_);
    decode_uniform<Bits>(src.data(), values_, group_, dst.data());
  }

 private:
  CodecId id_;
  std::uint32_t group_;
  std::size_t values_;
  std::size_t head_bytes_;
};

}  // namespace

std::unique_ptr<Codec> make_uniform_codec(const StateLayout& layout) {
  const std::uint32_t group = effective_group_size(layout.codec.group_size);
  const CodecId id = layout.codec.id;
  switch (codec_code_bits(id)) {
    case 4: return std::make_unique<UniformCodec<4>>(id, layout.key_dim, layout.value_dim, group);
    case 6: return std::make_unique<UniformCodec<6>>(id, layout.key_dim, layout.value_dim, group);
    default: return std::make_unique<UniformCodec<8>>(id, layout.key_dim, layout.value_dim, group);
  }
}

}  // namespace statepool::kernels::detail
