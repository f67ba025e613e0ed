// KV-cache codecs (kernels/kv.hpp, kv_math.hpp) against an independent transcription of
// docs/codecs.md, "KV-cache codecs": a naive encoder that builds the documented byte
// layout record by record from table look-ups of every finite fp16 / E4M3 value (no code
// shared with the library), and the documented error bound checked per value against the
// scale and offset the library actually stored. Also: the STEPQUANT.md worked example,
// the FP16 residual window, sizes, the benchmark ratios from real buffers, and rejection
// of non-finite input and wrong sizes without writing anything.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "statepool/kernels/kv.hpp"

namespace statepool::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// Oracles: sorted tables of every finite non-negative value of a format.

struct Grid {
  std::vector<double> values;  // ascending, +0 first
  std::vector<std::uint32_t> bits;
};

Grid half_grid() {
  Grid g;
  for (std::uint32_t b = 0; b < 0x7C00; ++b) {  // +0 .. 65504
    const std::uint32_t e = b >> 10;
    const std::uint32_t m = b & 0x3FF;
    g.values.push_back(e == 0 ? std::ldexp(static_cast<double>(m), -24)
                              : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15));
    g.bits.push_back(b);
  }
  return g;
}

Grid e4m3_grid() {
  Grid g;
  for (std::uint32_t b = 0; b <= 0x7E; ++b) {  // +0 .. 448
    const std::uint32_t e = b >> 3;
    const std::uint32_t m = b & 7;
    g.values.push_back(e == 0 ? std::ldexp(static_cast<double>(m), -9)
                              : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7));
    g.bits.push_back(b);
  }
  return g;
}

const Grid& halves() {
  static const Grid g = half_grid();
  return g;
}
const Grid& e4m3s() {
  static const Grid g = e4m3_grid();
  return g;
}

// Nearest grid value to |x|, ties to the even bit pattern, beyond the top saturating.
std::uint32_t nearest_magnitude(const Grid& g, double ax) {
  const auto it = std::lower_bound(g.values.begin(), g.values.end(), ax);
  if (it == g.values.end()) {
    return g.bits.back();
  }
  const auto i = static_cast<std::size_t>(it - g.values.begin());
  if (*it == ax || i == 0) {
    return g.bits[i];
  }
  const double below = ax - g.values[i - 1];
  const double above = g.values[i] - ax;
  if (below < above) return g.bits[i - 1];
  if (above < below) return g.bits[i];
  return (g.bits[i] & 1u) == 0 ? g.bits[i] : g.bits[i - 1];
}

std::uint16_t ref_half(float x) {
  const auto sign = static_cast<std::uint16_t>(std::signbit(x) ? 0x8000 : 0);
  return static_cast<std::uint16_t>(sign | nearest_magnitude(halves(), std::fabs(double{x})));
}
double half_value(std::uint16_t h) {
  const double v = halves().values[h & 0x7FFF];
  return (h & 0x8000) != 0 ? -v : v;
}
std::uint8_t ref_e4m3(float x) {
  const auto sign = static_cast<std::uint8_t>(std::signbit(x) ? 0x80 : 0);
  return static_cast<std::uint8_t>(sign | nearest_magnitude(e4m3s(), std::fabs(double{x})));
}

// Largest finite fp16 <= x (+0 for zeros), saturating at -65504.
std::uint16_t ref_half_down(float x) {
  const double v = x;
  if (v >= 0) {
    const auto it = std::upper_bound(halves().values.begin(), halves().values.end(), v);
    return static_cast<std::uint16_t>(
        halves().bits[static_cast<std::size_t>(it - halves().values.begin()) - 1]);
  }
  // Negative: the smallest magnitude >= |x|.
  const auto it = std::lower_bound(halves().values.begin(), halves().values.end(), -v);
  if (it == halves().values.end()) return 0xFBFF;
  return static_cast<std::uint16_t>(
      0x8000 | halves().bits[static_cast<std::size_t>(it - halves().values.begin())]);
}

// bf16 round to nearest even of a finite float, saturating at the largest finite bf16.
std::uint16_t ref_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t lower = bits & 0xFFFF0000u;
  const std::uint32_t upper = lower + 0x10000u;  // next magnitude up, same sign
  const double below = std::fabs(double{x} - double{std::bit_cast<float>(lower)});
  if ((upper & 0x7F800000u) == 0x7F800000u) {  // above the largest finite: saturate
    return static_cast<std::uint16_t>(lower >> 16);
  }
  const double above = std::fabs(double{std::bit_cast<float>(upper)} - double{x});
  std::uint32_t pick = below < above ? lower : upper;
  if (below == above) pick = ((lower >> 16) & 1u) == 0 ? lower : upper;
  return static_cast<std::uint16_t>(pick >> 16);
}
float bf16_value(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// ---------------------------------------------------------------------------------------
// The naive encoder: the documented layout, built record by record.

struct RefGroup {
  std::size_t offset = 0;              // of the record in the buffer
  std::vector<std::uint64_t> members;  // row-major value indices
};

struct Ref {
  std::vector<std::uint8_t> bytes;
  std::vector<float> decoded;  // what kv_decode must give (FP32)
  std::vector<RefGroup> groups;
  std::uint32_t levels = 0;
  std::size_t residual_offset = 0;
  std::uint64_t residual_first = 0;  // row-major index of the first residual value
};

void put16(std::vector<std::uint8_t>& out, std::uint32_t v) {
  out.push_back(static_cast<std::uint8_t>(v));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}

// A group's code of x (scale s > 0, offset a), as documented: the group's one division,
// 1 / s, then x - a and the product, each rounded to binary32 once. (The product of two
// floats is exact in binary64, so the cast is its one rounding whatever the compiler's
// contraction setting.)
float ref_code(float x, float a, float s, std::uint32_t levels) {
  const float inv = 1.0f / s;
  const float d = x - a;
  const auto y = static_cast<float>(double{d} * double{inv});
  return std::clamp(std::nearbyint(y), 0.0f, static_cast<float>(levels));
}

// The code the earlier encoder gave: a division per value, round_half_even((x - a) / s).
// Only to find the values where the two differ (KvGroupCodes below).
float quotient_code(float x, float a, float s, std::uint32_t levels) {
  const float d = x - a;
  return std::clamp(std::nearbyint(d / s), 0.0f, static_cast<float>(levels));
}

void ref_group(const std::vector<float>& x, RefGroup group, std::uint32_t bits, Ref& ref) {
  const auto levels = static_cast<std::uint32_t>((1u << bits) - 1u);
  float lo = x[group.members[0]];
  float hi = lo;
  for (const std::uint64_t i : group.members) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const std::uint16_t a_bits = ref_half_down(lo);
  const auto a = static_cast<float>(half_value(a_bits));
  const float t = (hi - a) / static_cast<float>(levels);  // binary32
  const std::uint16_t s_bits = t > 0 ? ref_half(t) : std::uint16_t{0};
  const auto s = static_cast<float>(half_value(s_bits));
  group.offset = ref.bytes.size();
  put16(ref.bytes, s_bits);
  put16(ref.bytes, a_bits);
  std::array<std::uint32_t, 32> q{};
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const float xv = x[group.members[k]];
    q[k] = s > 0 ? static_cast<std::uint32_t>(ref_code(xv, a, s, levels)) : 0u;
    ref.decoded[group.members[k]] = static_cast<float>(q[k]) * s + a;
  }
  const std::uint32_t per_byte = 8 / bits;
  for (std::uint32_t b = 0; b < 32 / per_byte; ++b) {
    std::uint32_t byte = 0;
    for (std::uint32_t k = 0; k < per_byte; ++k) byte |= q[b * per_byte + k] << (k * bits);
    ref.bytes.push_back(static_cast<std::uint8_t>(byte));
  }
  ref.groups.push_back(std::move(group));
}

Ref ref_encode(const KvStream& s, const std::vector<float>& x) {
  Ref ref;
  const std::uint64_t T = s.tokens;
  const std::uint64_t C = s.channels;
  ref.decoded.assign(T * C, 0.0f);
  if (s.codec == KvCodecId::bf16) {
    for (std::uint64_t i = 0; i < T * C; ++i) {
      put16(ref.bytes, ref_bf16(x[i]));
      ref.decoded[i] = bf16_value(ref_bf16(x[i]));
    }
    return ref;
  }
  if (s.codec == KvCodecId::fp8) {
    for (std::uint64_t i = 0; i < T * C; ++i) {
      const std::uint8_t b = ref_e4m3(x[i]);
      ref.bytes.push_back(b);
      const double v = e4m3s().values[b & 0x7F];
      ref.decoded[i] = static_cast<float>((b & 0x80) != 0 ? -v : v);
    }
    return ref;
  }
  const std::uint32_t bits = s.codec == KvCodecId::kivi2 ? 2 : 4;
  ref.levels = (1u << bits) - 1u;
  const bool kivi = s.codec != KvCodecId::flexgen4;
  const std::uint64_t R = kivi ? std::min<std::uint64_t>(T, 128) : 0;
  const std::uint64_t Q = T - R;
  if (kivi && s.role == KvRole::keys) {
    for (std::uint64_t t0 = 0; t0 < Q; t0 += 32) {
      for (std::uint64_t c = 0; c < C; ++c) {
        RefGroup g;
        for (std::uint64_t t = t0; t < std::min(Q, t0 + 32); ++t) g.members.push_back(t * C + c);
        ref_group(x, g, bits, ref);
      }
    }
  } else {
    for (std::uint64_t t = 0; t < Q; ++t) {
      for (std::uint64_t c0 = 0; c0 < C; c0 += 32) {
        RefGroup g;
        for (std::uint64_t c = c0; c < std::min(C, c0 + 32); ++c) g.members.push_back(t * C + c);
        ref_group(x, g, bits, ref);
      }
    }
  }
  ref.residual_offset = ref.bytes.size();
  ref.residual_first = Q * C;
  for (std::uint64_t i = Q * C; i < T * C; ++i) {
    put16(ref.bytes, ref_half(x[i]));
    ref.decoded[i] = static_cast<float>(half_value(ref_half(x[i])));
  }
  return ref;
}

// The documented sizes, written out (not kv_encoded_bytes).
std::uint64_t formula_bytes(KvCodecId codec, KvRole role, std::uint64_t T, std::uint64_t C) {
  const auto groups = [](std::uint64_t n) { return (n + 31) / 32; };
  switch (codec) {
    case KvCodecId::bf16: return 2 * T * C;
    case KvCodecId::fp8: return T * C;
    case KvCodecId::flexgen4: return T * groups(C) * 20;
    case KvCodecId::kivi2:
    case KvCodecId::kivi4: {
      const std::uint64_t record = codec == KvCodecId::kivi2 ? 12 : 20;
      const std::uint64_t R = std::min<std::uint64_t>(T, 128);
      const std::uint64_t quantized =
          role == KvRole::keys ? C * groups(T - R) * record : (T - R) * groups(C) * record;
      return quantized + 2 * R * C;
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Data

enum class Data {
  gaussian,    // N(0, 1) with per-channel scales 0.1 .. 10 and outlier channels
  constant16,  // every value 1.5 (an fp16 value)
  constant,    // every value 0.1f (not an fp16 value)
  outlier,     // N(0, 1) and one 1000 every 37 values
  huge,        // uniform +-60000
  tiny,        // uniform +-1e-6
  denormal,    // FP32 denormals and signed zeros
  negative,    // -5 - 3 |N(0, 1)|
  narrow,      // 1000 + 1e-3 U(0, 1): a narrow group far from zero
  beyond,      // uniform +-1e6: beyond the fp16 range (clipped)
};

constexpr Data kAllData[] = {Data::gaussian, Data::constant16, Data::constant, Data::outlier,
                             Data::huge,     Data::tiny,       Data::denormal, Data::negative,
                             Data::narrow,   Data::beyond};

const char* name(Data d) {
  switch (d) {
    case Data::gaussian: return "gaussian";
    case Data::constant16: return "constant16";
    case Data::constant: return "constant";
    case Data::outlier: return "outlier";
    case Data::huge: return "huge";
    case Data::tiny: return "tiny";
    case Data::denormal: return "denormal";
    case Data::negative: return "negative";
    case Data::narrow: return "narrow";
    case Data::beyond: return "beyond";
  }
  return "?";
}

std::vector<float> make_values(Data d, std::uint64_t T, std::uint64_t C, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> channel_scale(C);
  for (auto& cs : channel_scale) cs = std::exp2(unit(rng) * 6.6f - 3.3f);
  if (C > 3) channel_scale[C / 3] = 40.0f;  // an outlier channel, as keys have
  std::vector<float> x(T * C);
  for (std::uint64_t i = 0; i < x.size(); ++i) {
    const float u = unit(rng);
    switch (d) {
      case Data::gaussian: x[i] = normal(rng) * channel_scale[i % C] + 0.3f; break;
      case Data::constant16: x[i] = 1.5f; break;
      case Data::constant: x[i] = 0.1f; break;
      case Data::outlier: x[i] = i % 37 == 5 ? 1000.0f : normal(rng); break;
      case Data::huge: x[i] = (u * 2 - 1) * 60000.0f; break;
      case Data::tiny: x[i] = (u * 2 - 1) * 1e-6f; break;
      case Data::denormal:
        x[i] = i % 5 == 0 ? (i % 2 == 0 ? 0.0f : -0.0f) : (u * 2 - 1) * 1e-39f;
        break;
      case Data::negative: x[i] = -5.0f - 3.0f * std::fabs(normal(rng)); break;
      case Data::narrow: x[i] = 1000.0f + 1e-3f * u; break;
      case Data::beyond: x[i] = (u * 2 - 1) * 1e6f; break;
    }
  }
  return x;
}

// The values as they reach the codec through `dtype` (rounded by the test's own oracles).
std::vector<float> through(DType dtype, const std::vector<float>& x, std::vector<std::byte>& raw) {
  std::vector<float> seen(x.size());
  raw.resize(x.size() * (dtype == DType::f32 ? 4 : 2));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::f32) {
      seen[i] = x[i];
      std::memcpy(raw.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t b = dtype == DType::bf16 ? ref_bf16(x[i]) : ref_half(x[i]);
      seen[i] = dtype == DType::bf16 ? bf16_value(b) : static_cast<float>(half_value(b));
      std::memcpy(raw.data() + 2 * i, &b, 2);
    }
  }
  return seen;
}

std::uint16_t get16(std::span<const std::byte> b, std::size_t at) {
  return static_cast<std::uint16_t>(std::to_integer<std::uint32_t>(b[at]) |
                                    (std::to_integer<std::uint32_t>(b[at + 1]) << 8));
}

std::ptrdiff_t first_difference(std::span<const std::byte> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) return static_cast<std::ptrdiff_t>(std::min(a.size(), b.size()));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::to_integer<std::uint8_t>(a[i]) != b[i]) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

constexpr std::uint64_t kTokens[] = {0, 1, 31, 33, 127, 128, 129, 200, 1000};
constexpr std::uint64_t kChannels[] = {1, 31, 33, 128};
constexpr KvCodecId kCodecs[] = {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2,
                                 KvCodecId::kivi4, KvCodecId::flexgen4};

// The documented per-value bound of a group value (docs/codecs.md): L levels, stored
// scale s. (The offset enters only through s: x - a is rounded relative to itself.)
double group_bound(double x, double s, std::uint32_t levels) {
  return 0.5 * s + std::ldexp(1.0, -22) * levels * s + levels * std::ldexp(1.0, -24) +
         std::ldexp(1.0, -24) * std::fabs(x);
}

// ---------------------------------------------------------------------------------------

using Param = std::tuple<KvCodecId, KvRole>;
class KvCodec : public ::testing::TestWithParam<Param> {};

// Every shape and data kind, f32 input: the library's bytes are the documented bytes, its
// decode the documented reconstruction, and every value is within the documented bound
// of the scale and offset stored in the library's own buffer.
TEST_P(KvCodec, BytesDecodeAndErrorBoundMatchTheDocumentedFormat) {
  const auto [codec, role] = GetParam();
  std::uint64_t seed = 1;
  double worst_ratio = 0;  // max error / (s / 2) over in-range gaussian groups
  for (const std::uint64_t T : kTokens) {
    for (const std::uint64_t C : kChannels) {
      for (const Data d : kAllData) {
        if (T * C > 40000 && d != Data::gaussian && d != Data::outlier) continue;
        const KvStream s{codec, role, T, C};
        SCOPED_TRACE(std::string(to_string(codec)) + " " + to_string(role) + " " +
                     std::to_string(T) + "x" + std::to_string(C) + " " + name(d));
        const std::vector<float> x = make_values(d, T, C, seed++);
        const Ref ref = ref_encode(s, x);
        ASSERT_EQ(kv_encoded_bytes(s), ref.bytes.size());
        ASSERT_EQ(kv_encoded_bytes(s), formula_bytes(codec, role, T, C));

        std::vector<std::byte> enc(kv_encoded_bytes(s), std::byte{0xA5});
        kv_encode(s, x, enc);
        ASSERT_EQ(first_difference(enc, ref.bytes), -1);

        std::vector<float> y(T * C, -7.0f);
        kv_decode(s, enc, y);
        for (std::size_t i = 0; i < y.size(); ++i) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(y[i]),
                    std::bit_cast<std::uint32_t>(ref.decoded[i]))
              << "value " << i << ": " << y[i] << " vs " << ref.decoded[i];
        }

        // The bound, from the library's stored scale and offset.
        for (const RefGroup& g : ref.groups) {
          const double sc = half_value(get16(enc, g.offset));
          const double off = half_value(get16(enc, g.offset + 2));
          double lo = x[g.members[0]];
          double hi = lo;
          for (const std::uint64_t i : g.members) {
            lo = std::min(lo, double{x[i]});
            hi = std::max(hi, double{x[i]});
          }
          ASSERT_LE(off, std::max(lo, -65504.0)) << "offset above the group's minimum";
          const bool in_range = lo >= -65504.0 && (hi - off) / ref.levels < 65520.0;
          for (const std::uint64_t i : g.members) {
            double xi = x[i];
            if (!in_range) xi = std::clamp(xi, off, off + ref.levels * sc);  // clipped
            const double err = std::fabs(xi - double{y[i]});
            ASSERT_LE(err, group_bound(xi, sc, ref.levels))
                << "value " << i << " x " << x[i] << " x_hat " << y[i] << " s " << sc << " a "
                << off;
            if (d == Data::gaussian && sc >= std::ldexp(1.0, -14)) {
              worst_ratio = std::max(worst_ratio, err / (0.5 * sc));
            }
          }
        }
        // Residual window (KIVI): exact fp16 of the input; float codecs: exact rounding.
        for (std::uint64_t i = ref.residual_first; is_kv_group_codec(codec) && i < x.size(); ++i) {
          ASSERT_EQ(y[i], static_cast<float>(half_value(ref_half(x[i]))));
        }
      }
    }
  }
  if (is_kv_group_codec(codec)) {
    // The bound is tight: some value sits near half a step away (a step twice too fine,
    // i.e. a bound that could be halved, shows here).
    EXPECT_GT(worst_ratio, 0.9);
    std::printf("%s %s: largest error / (s/2) on gaussian data %.6f\n", to_string(codec),
                to_string(role), worst_ratio);
  }
}

// bf16 and f16 input: the bytes equal those of the same values given as FP32; decoding to
// bf16 / f16 rounds the FP32 reconstruction to nearest even.
TEST_P(KvCodec, SixteenBitInputAndOutputRoundLikeTheFp32Path) {
  const auto [codec, role] = GetParam();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const std::uint64_t T : {1ull, 129ull, 200ull}) {
      for (const std::uint64_t C : {31ull, 128ull}) {
        const KvStream s{codec, role, T, C};
        SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::to_string(T) + "x" +
                     std::to_string(C));
        std::vector<std::byte> raw;
        const std::vector<float> seen =
            through(dtype, make_values(Data::gaussian, T, C, T * 7 + C), raw);
        std::vector<std::byte> enc16(kv_encoded_bytes(s));
        std::vector<std::byte> enc32(kv_encoded_bytes(s));
        kv_encode(s, dtype, raw, enc16);
        kv_encode(s, seen, enc32);
        ASSERT_EQ(enc16, enc32);
        if (codec == KvCodecId::bf16 && dtype == DType::bf16) {
          ASSERT_EQ(enc16, raw);  // bf16 into bf16: a copy
        }
        std::vector<float> y(T * C);
        kv_decode(s, enc16, y);
        std::vector<std::byte> y16(T * C * 2);
        kv_decode(s, enc16, dtype, y16);
        for (std::size_t i = 0; i < y.size(); ++i) {
          const std::uint16_t want = dtype == DType::bf16 ? ref_bf16(y[i]) : ref_half(y[i]);
          ASSERT_EQ(get16(y16, 2 * i), want) << i;
        }
        if (is_kv_group_codec(codec) || codec == KvCodecId::bf16) {
          // f16 input through the residual window (and bf16 through bf16) comes back exact.
          const std::uint64_t first =
              codec == KvCodecId::bf16 ? 0 : (T - std::min<std::uint64_t>(T, 128)) * C;
          const bool exact = codec == KvCodecId::bf16
                                 ? dtype == DType::bf16
                                 : codec != KvCodecId::flexgen4 && dtype == DType::f16;
          for (std::size_t i = first; exact && i < y.size(); ++i) ASSERT_EQ(y[i], seen[i]) << i;
        }
      }
    }
  }
}

// Non-finite input is rejected, naming the first position. (What was written before it is
// unspecified: the values are checked as they are encoded, docs in kv.hpp.)
TEST_P(KvCodec, NonFiniteInputThrowsNamingTheFirst) {
  const auto [codec, role] = GetParam();
  const std::uint64_t T = 200;
  const std::uint64_t C = 33;
  const KvStream s{codec, role, T, C};
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const float bad : specials) {
      for (const std::uint64_t at : {std::uint64_t{0}, 77 * C + 5, 150 * C + 32, T * C - 1}) {
        std::vector<float> x = make_values(Data::gaussian, T, C, at);
        x[at] = bad;
        x[at + (T * C - 1 - at) / 2] = bad;  // a later one (or the same) is not the one named
        std::vector<std::byte> raw;
        if (dtype == DType::f32) {
          raw.resize(4 * x.size());
          std::memcpy(raw.data(), x.data(), raw.size());
        } else {
          raw.resize(2 * x.size());
          for (std::size_t i = 0; i < x.size(); ++i) {
            std::uint16_t b = 0;
            if (std::isnan(x[i]))
              b = dtype == DType::bf16 ? 0x7FC0 : 0x7E00;
            else if (std::isinf(x[i]))
              b = (x[i] > 0 ? 0 : 0x8000) | (dtype == DType::bf16 ? 0x7F80 : 0x7C00);
            else
              b = dtype == DType::bf16 ? ref_bf16(x[i]) : ref_half(x[i]);
            std::memcpy(raw.data() + 2 * i, &b, 2);
          }
        }
        std::vector<std::byte> out(kv_encoded_bytes(s));
        try {
          kv_encode(s, dtype, raw, out);
          FAIL() << "no exception for " << bad << " at " << at;
        } catch (const KvNonFiniteError& e) {
          EXPECT_EQ(e.token(), at / C);
          EXPECT_EQ(e.channel(), at % C);
          EXPECT_NE(std::string(e.what()).find("token " + std::to_string(at / C) + " channel " +
                                               std::to_string(at % C)),
                    std::string::npos)
              << e.what();
        }
      }
    }
  }
}

// Wrong buffer sizes and arguments throw std::invalid_argument and write nothing.
TEST_P(KvCodec, WrongSizesThrowAndWriteNothing) {
  const auto [codec, role] = GetParam();
  const KvStream s{codec, role, 150, 40};
  const std::vector<float> x = make_values(Data::gaussian, 150, 40, 3);
  const std::size_t n = kv_encoded_bytes(s);
  for (const std::size_t size : {n - 1, n + 1, std::size_t{0}}) {
    std::vector<std::byte> out(size, std::byte{0x11});
    EXPECT_THROW(kv_encode(s, x, out), std::invalid_argument) << size;
    EXPECT_TRUE(
        std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x11}; }));
  }
  std::vector<std::byte> out(n, std::byte{0x11});
  const std::vector<float> short_input(x.begin(), x.end() - 1);
  EXPECT_THROW(kv_encode(s, short_input, out), std::invalid_argument);
  std::vector<std::byte> odd_bytes(2 * x.size() + 1);
  EXPECT_THROW(kv_encode(s, DType::bf16, odd_bytes, out), std::invalid_argument);
  EXPECT_THROW(kv_encode(s, static_cast<DType>(9), std::as_bytes(std::span(x)), out),
               std::invalid_argument);
  EXPECT_THROW(kv_encode({s.codec, static_cast<KvRole>(2), 150, 40}, x, out),
               std::invalid_argument);
  EXPECT_THROW(kv_encode({static_cast<KvCodecId>(7), role, 150, 40}, x, out),
               std::invalid_argument);
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](std::byte b) { return b == std::byte{0x11}; }));

  kv_encode(s, x, out);
  std::vector<float> y(x.size(), 2.0f);
  const std::vector<std::byte> shorter(out.begin(), out.end() - 1);
  EXPECT_THROW(kv_decode(s, shorter, y), std::invalid_argument);
  std::vector<float> y_short(x.size() - 1, 2.0f);
  EXPECT_THROW(kv_decode(s, out, y_short), std::invalid_argument);
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 2.0f; }));
  EXPECT_TRUE(std::all_of(y_short.begin(), y_short.end(), [](float v) { return v == 2.0f; }));
}

// tokens == 0 (and channels == 0) is a legal, empty stream.
TEST_P(KvCodec, EmptyStreamsTakeNoBytes) {
  const auto [codec, role] = GetParam();
  for (const KvStream s : {KvStream{codec, role, 0, 128}, KvStream{codec, role, 300, 0}}) {
    EXPECT_EQ(kv_encoded_bytes(s), 0u);
    kv_encode(s, std::span<const float>{}, std::span<std::byte>{});
    kv_decode(s, std::span<const std::byte>{}, std::span<float>{});
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, KvCodec,
                         ::testing::Combine(::testing::ValuesIn(kCodecs),
                                            ::testing::Values(KvRole::keys, KvRole::values)),
                         param_name);

// ---------------------------------------------------------------------------------------

// STEPQUANT.md: B = 4, X = [0, 0.7, 1.4, 3] -> s = 0.2, q = [0, 4, 7, 15],
// X_hat = [0, 0.8, 1.4, 3]. With fp16 storage the scale is fp16(0.2) = 0x3266 =
// 0.199951171875 (0.2 is not an fp16 value); the codes are the same (0.7 / 0.19995 =
// 3.5009 rounds to 4, where an exact 0.2 would leave a tie), and X_hat = q * 0.199951171875:
// [0, 0.7998046875, 1.399658203125, 2.999267578125].
TEST(KvWorkedExample, FourBitGroupOfStepquantMd) {
  const std::vector<float> x = {0.0f, 0.7f, 1.4f, 3.0f};
  const std::uint8_t record[20] = {0x66, 0x32, 0x00, 0x00,  // scale 0x3266, offset +0
                                   0x40, 0xF7};             // q = 0, 4 | 7, 15; then zeros
  const double want[] = {0.0, 0.7998046875, 1.399658203125, 2.999267578125};
  // FlexGen-4: one token of 4 channels is one group.
  {
    const KvStream s{KvCodecId::flexgen4, KvRole::keys, 1, 4};
    std::vector<std::byte> enc(kv_encoded_bytes(s));
    ASSERT_EQ(enc.size(), 20u);
    kv_encode(s, x, enc);
    EXPECT_EQ(first_difference(enc, record), -1);
    std::vector<float> y(4);
    kv_decode(s, enc, y);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(double{y[i]}, want[i]) << i;
  }
  // KIVI-4 values: token 0 of 129 is quantized (one record per token), the rest FP16.
  {
    const KvStream s{KvCodecId::kivi4, KvRole::values, 129, 4};
    std::vector<float> xs(129 * 4, 1.0f);
    std::copy(x.begin(), x.end(), xs.begin());
    std::vector<std::byte> enc(kv_encoded_bytes(s));
    ASSERT_EQ(enc.size(), 20u + 128 * 4 * 2);
    kv_encode(s, xs, enc);
    EXPECT_EQ(first_difference(std::span(enc).first(20), record), -1);
    EXPECT_EQ(get16(enc, 20), 0x3C00);  // residual token 1, channel 0: fp16(1.0)
  }
  // KIVI-4 keys: channel 0 of the oldest token group holds X along tokens 0..3 (4 quantized
  // tokens, a partial group stored whole).
  {
    const KvStream s{KvCodecId::kivi4, KvRole::keys, 132, 1};
    std::vector<float> xs(132, 1.0f);
    std::copy(x.begin(), x.end(), xs.begin());
    std::vector<std::byte> enc(kv_encoded_bytes(s));
    ASSERT_EQ(enc.size(), 20u + 128 * 2);
    kv_encode(s, xs, enc);
    EXPECT_EQ(first_difference(std::span(enc).first(20), record), -1);
  }
}

// The 2-bit layout by hand: four codes per byte, lowest bits first.
TEST(KvLayout, TwoBitRecordByHand) {
  // One key channel, 129 + 128 tokens would be too many to write out: 160 tokens, the
  // oldest 32 quantized in one group: values 0, 1, 2, 3 repeating -> s = 1, a = 0,
  // q = x; bytes 0b11100100 = 0xE4.
  const KvStream s{KvCodecId::kivi2, KvRole::keys, 160, 1};
  std::vector<float> x(160, 0.5f);
  for (int t = 0; t < 32; ++t) x[t] = static_cast<float>(t % 4);
  std::vector<std::byte> enc(kv_encoded_bytes(s));
  ASSERT_EQ(enc.size(), 12u + 128 * 2);
  kv_encode(s, x, enc);
  std::vector<std::uint8_t> want = {0x00, 0x3C, 0x00, 0x00};  // scale 1.0, offset +0
  want.insert(want.end(), 8, 0xE4);
  EXPECT_EQ(first_difference(std::span(enc).first(12), want), -1);
  EXPECT_EQ(get16(enc, 12), 0x3800);  // residual: token 32 = 0.5
  std::vector<float> y(160);
  kv_decode(s, enc, y);
  EXPECT_EQ(y, x);  // exact here
}

// A constant group decodes to its value: exactly when it is an fp16 value (scale 0),
// else within the bound (the offset is the fp16 value below it, the scale a fraction of
// an fp16 step).
TEST(KvLayout, ConstantGroups) {
  for (const float c : {1.5f, -3.0f, 0.0f, 0.1f, -0.1f, 1000.001f}) {
    const KvStream s{KvCodecId::flexgen4, KvRole::values, 2, 40};
    const std::vector<float> x(80, c);
    std::vector<std::byte> enc(kv_encoded_bytes(s));
    kv_encode(s, x, enc);
    std::vector<float> y(80);
    kv_decode(s, enc, y);
    const bool fp16_value = half_value(ref_half(c)) == double{c};
    EXPECT_EQ(get16(enc, 0) == 0, fp16_value) << c;
    for (const float v : y) {
      if (fp16_value) {
        EXPECT_EQ(v, c);
      } else {
        EXPECT_LE(std::fabs(double{v} - c), group_bound(c, half_value(get16(enc, 0)), 15));
        EXPECT_LE(std::fabs(double{v} - c), 1e-4 * std::fabs(double{c}));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Codes near a tie: the product by the group's reciprocal, not the quotient.

// A group of two anchors, lo = a (an fp16 value, so the offset) and hi = a + L s0, and
// values near a + (k + 1/2) s (s the group's stored scale) whose documented code (x - a)
// * (1 / s) differs by one level from the earlier encoder's (x - a) / s.
struct NearTieGroup {
  float lo = 0;
  float hi = 0;
  std::vector<float> values;
};

std::vector<NearTieGroup> near_tie_groups(std::uint32_t levels) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<NearTieGroup> out;
  for (const float a : {0.0f, -2.5f, 1000.0f}) {
    for (std::uint32_t s_bits = 0x2400; s_bits < 0x5800; s_bits += 7) {  // 0.0156 .. 128
      NearTieGroup g;
      g.lo = a;
      g.hi = static_cast<float>(a + levels * half_value(static_cast<std::uint16_t>(s_bits)));
      const float t = (g.hi - a) / static_cast<float>(levels);  // as ref_group
      const auto s = static_cast<float>(half_value(ref_half(t)));
      for (std::uint32_t k = 0; k < levels; ++k) {
        float x = static_cast<float>(a + (k + 0.5) * double{s});
        for (int j = 0; j < 4; ++j) x = std::nextafter(x, -kInf);
        for (int j = 0; j < 9; ++j, x = std::nextafter(x, kInf)) {
          if (x > g.lo && x < g.hi && ref_code(x, a, s, levels) != quotient_code(x, a, s, levels)) {
            g.values.push_back(x);
          }
        }
      }
      if (!g.values.empty()) out.push_back(std::move(g));
    }
  }
  return out;
}

// The encoder's codes are the documented ones on values where dividing per value would
// give another code (so an encoder that divides fails here), for every group codec and
// role.
TEST(KvGroupCodes, NearTiesFollowTheReciprocalNotTheQuotient) {
  for (const KvCodecId codec : {KvCodecId::kivi2, KvCodecId::kivi4, KvCodecId::flexgen4}) {
    const std::uint32_t levels = codec == KvCodecId::kivi2 ? 3 : 15;
    const std::vector<NearTieGroup> cases = near_tie_groups(levels);
    ASSERT_GE(cases.size(), 50u) << to_string(codec);
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      SCOPED_TRACE(std::string(to_string(codec)) + " " + to_string(role));
      const std::uint64_t T = (codec == KvCodecId::flexgen4 ? 0 : 128) + 96;
      const std::uint64_t C = 96;
      const KvStream s{codec, role, T, C};
      std::vector<float> x(T * C, 0.5f);
      const Ref layout = ref_encode(s, x);  // the groups' members
      std::size_t differing = 0;
      for (std::size_t gi = 0; gi < layout.groups.size(); ++gi) {
        const NearTieGroup& c = cases[gi % cases.size()];
        const std::vector<std::uint64_t>& m = layout.groups[gi].members;
        ASSERT_EQ(m.size(), 32u);
        x[m[0]] = c.lo;
        x[m[1]] = c.hi;
        for (std::size_t i = 2; i < m.size(); ++i) x[m[i]] = c.values[(i - 2) % c.values.size()];
        differing += std::min(m.size() - 2, c.values.size());
      }
      const Ref ref = ref_encode(s, x);
      std::vector<std::byte> enc(kv_encoded_bytes(s), std::byte{0xA5});
      kv_encode(s, x, enc);
      EXPECT_EQ(first_difference(enc, ref.bytes), -1);
      EXPECT_GE(differing, 300u);  // values whose code differs from the quotient's
      std::vector<float> y(T * C);
      kv_decode(s, enc, y);
      for (std::size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(y[i]), std::bit_cast<std::uint32_t>(ref.decoded[i]))
            << "value " << i;
      }
    }
  }
}

// KIVI's residual window holds the newest min(tokens, 128) tokens exactly as fp16, and
// the quantized part is untouched by them (changing the window changes only its bytes).
TEST(KvLayout, ResidualWindowIsTheNewestTokensInFp16) {
  for (const KvCodecId codec : {KvCodecId::kivi2, KvCodecId::kivi4}) {
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      const std::uint64_t T = 300;
      const std::uint64_t C = 64;
      const KvStream s{codec, role, T, C};
      std::vector<float> x = make_values(Data::gaussian, T, C, 9);
      std::vector<std::byte> a(kv_encoded_bytes(s));
      kv_encode(s, x, a);
      const std::size_t window = 128 * C * 2;
      ASSERT_GT(a.size(), window);
      const std::size_t start = a.size() - window;
      for (std::uint64_t i = 0; i < 128 * C; ++i) {
        ASSERT_EQ(get16(a, start + 2 * i), ref_half(x[(T - 128) * C + i])) << i;
      }
      for (std::uint64_t i = (T - 128) * C; i < T * C; ++i) x[i] *= 3.0f;
      std::vector<std::byte> b(a.size());
      kv_encode(s, x, b);
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(start), b.begin()));
      EXPECT_NE(a, b);
    }
  }
}

// FP8 E4M3: every finite code decodes exactly and re-encodes to itself; values round to
// the nearest code (ties to even) and saturate at +-448.
TEST(KvFp8, E4m3RoundsToNearestEvenAndSaturates) {
  const KvStream one{KvCodecId::fp8, KvRole::keys, 1, 1};
  const auto encode = [&](float v) {
    std::byte b{};
    kv_encode(one, std::span(&v, 1), std::span(&b, 1));
    return std::to_integer<std::uint8_t>(b);
  };
  const auto decode = [&](std::uint8_t code) {
    const std::byte b{code};
    float v = 0;
    kv_decode(one, std::span(&b, 1), std::span(&v, 1));
    return v;
  };
  for (std::uint32_t code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(decode(static_cast<std::uint8_t>(code))));
      continue;
    }
    const double v = e4m3s().values[code & 0x7F] * ((code & 0x80) != 0 ? -1 : 1);
    EXPECT_EQ(double{decode(static_cast<std::uint8_t>(code))}, v) << code;
    EXPECT_EQ(encode(static_cast<float>(v)), code) << code;
  }
  EXPECT_EQ(encode(448.0f), 0x7E);
  EXPECT_EQ(encode(465.0f), 0x7E);
  EXPECT_EQ(encode(1e30f), 0x7E);
  EXPECT_EQ(encode(-1e30f), 0xFE);
  EXPECT_EQ(encode(0.0009765625f), 0x00);  // 2^-10: halfway to the smallest subnormal: even
  EXPECT_EQ(encode(0.0029296875f), 0x02);  // 1.5 * 2^-9: halfway between 1 and 2: even
  EXPECT_EQ(encode(1.0625f), 0x38);        // halfway between 1 and 1.125: even (1)
  EXPECT_EQ(encode(1.1875f), 0x3A);        // halfway between 1.125 and 1.25: even (1.25)
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> e(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(e(rng)) * (i % 2 == 0 ? 1.0f : -1.0f);
    ASSERT_EQ(encode(v), ref_e4m3(v)) << v;
    // Relative error <= 2^-4 in the normal range, absolute <= 2^-10 below it.
    const double err = std::fabs(double{decode(encode(v))} - v);
    if (std::fabs(v) <= 448) {
      ASSERT_LE(err, std::max(std::fabs(double{v}) / 16, std::ldexp(1.0, -10)));
    }
  }
}

// Sizes are the documented formulas at shapes beyond the round-trip tests too.
TEST(KvSizes, EncodedBytesAreTheDocumentedFormulas) {
  for (const KvCodecId codec : kCodecs) {
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      for (const std::uint64_t T : {0ull, 1ull, 127ull, 128ull, 129ull, 159ull, 160ull, 161ull,
                                    10000ull, 32768ull, 1ull << 24}) {
        for (const std::uint64_t C : {0ull, 1ull, 31ull, 32ull, 33ull, 576ull, 1024ull}) {
          EXPECT_EQ(kv_encoded_bytes(codec, role, T, C), formula_bytes(codec, role, T, C))
              << to_string(codec) << " " << to_string(role) << " " << T << "x" << C;
        }
      }
    }
  }
  EXPECT_EQ(kv_encoded_bytes(static_cast<KvCodecId>(9), KvRole::keys, 10, 10), 0u);
}

// STEPQUANT.md's benchmark ratios at 10K tokens, 128 channels, keys + values, from the
// sizes of real encoded buffers (the naive encoder's, which appends what it writes)
// against FP16.
TEST(KvSizes, RatiosAtTenThousandTokensReproduceStepquantMd) {
  const std::uint64_t T = 10000;
  const std::uint64_t C = 128;
  const std::vector<float> keys = make_values(Data::gaussian, T, C, 1);
  const std::vector<float> values = make_values(Data::gaussian, T, C, 2);
  const auto ratio = [&](KvCodecId codec) {
    std::size_t bytes = 0;
    for (const auto& [role, x] :
         {std::pair{KvRole::keys, &keys}, std::pair{KvRole::values, &values}}) {
      const KvStream s{codec, role, T, C};
      std::vector<std::byte> enc(kv_encoded_bytes(s));
      kv_encode(s, *x, enc);
      EXPECT_EQ(enc.size(), ref_encode(s, *x).bytes.size());
      bytes += enc.size();
    }
    return static_cast<double>(2 * T * C * 2) / static_cast<double>(bytes);
  };
  const double kivi2 = ratio(KvCodecId::kivi2);
  const double kivi4 = ratio(KvCodecId::kivi4);
  const double flexgen4 = ratio(KvCodecId::flexgen4);
  EXPECT_NEAR(kivi2, 5.05, 0.005);
  EXPECT_NEAR(kivi4, 3.11, 0.005);
  EXPECT_NEAR(flexgen4, 3.20, 0.005);
  EXPECT_DOUBLE_EQ(ratio(KvCodecId::bf16), 1.0);
  EXPECT_DOUBLE_EQ(ratio(KvCodecId::fp8), 2.0);
  std::printf("ratios vs FP16 at 10000 x 128: kivi2 %.4f  kivi4 %.4f  flexgen4 %.4f\n", kivi2,
              kivi4, flexgen4);
}

TEST(KvNames, ToStringAndParse) {
  for (const KvCodecId codec : kCodecs) {
    KvCodecId parsed = KvCodecId::bf16;
    ASSERT_TRUE(parse_kv_codec(to_string(codec), parsed));
    EXPECT_EQ(parsed, codec);
  }
  KvCodecId untouched = KvCodecId::fp8;
  EXPECT_FALSE(parse_kv_codec("kivi8", untouched));
  EXPECT_FALSE(parse_kv_codec("", untouched));
  EXPECT_EQ(untouched, KvCodecId::fp8);
  EXPECT_STREQ(to_string(KvRole::keys), "keys");
  EXPECT_STREQ(to_string(KvRole::values), "values");
}

// KV blocks: the streams of every attention layer, back to back, each exactly the bytes
// kv_encode writes for it alone.
TEST(KvBlocks, StreamsAreBackToBackAndEncodeLikeSingleStreams) {
  const KvBlocks b{KvCodecId::kivi2, 3, 96, 64, 150};
  const std::vector<KvBlockStream> streams = kv_block_streams(b, DType::bf16);
  ASSERT_EQ(streams.size(), 6u);
  std::uint64_t plain = 0;
  std::uint64_t encoded = 0;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const KvBlockStream& s = streams[i];
    EXPECT_EQ(s.layer, i / 2);
    EXPECT_EQ(s.stream.role, i % 2 == 0 ? KvRole::keys : KvRole::values);
    EXPECT_EQ(s.stream.channels, i % 2 == 0 ? 96u : 64u);
    EXPECT_EQ(s.plain_offset, plain);
    EXPECT_EQ(s.encoded_offset, encoded);
    EXPECT_EQ(s.plain_bytes, 150u * s.stream.channels * 2);
    EXPECT_EQ(s.encoded_bytes, kv_encoded_bytes(s.stream));
    plain += s.plain_bytes;
    encoded += s.encoded_bytes;
  }
  EXPECT_EQ(kv_blocks_plain_bytes(b, DType::bf16), plain);
  EXPECT_EQ(kv_blocks_encoded_bytes(b), encoded);

  // f32 values, encoded as blocks, then stream by stream: the same bytes.
  std::vector<float> values(kv_blocks_plain_bytes(b, DType::f32) / 4);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (float& v : values) v = normal(rng);
  std::vector<std::byte> blocks(encoded);
  kv_encode_blocks(b, DType::f32, std::as_bytes(std::span(values)), blocks);
  std::vector<std::byte> one(encoded, std::byte{0x5a});
  for (const KvBlockStream& s : kv_block_streams(b, DType::f32)) {
    kv_encode(s.stream, DType::f32,
              std::as_bytes(std::span(values)).subspan(s.plain_offset, s.plain_bytes),
              std::span(one).subspan(s.encoded_offset, s.encoded_bytes));
  }
  EXPECT_EQ(blocks, one);

  std::vector<float> back(values.size());
  kv_decode_blocks(b, blocks, DType::f32, std::as_writable_bytes(std::span(back)));
  for (const KvBlockStream& s : kv_block_streams(b, DType::f32)) {
    std::vector<float> alone(s.plain_bytes / 4);
    kv_decode(s.stream, std::span(blocks).subspan(s.encoded_offset, s.encoded_bytes), alone);
    ASSERT_TRUE(std::equal(alone.begin(), alone.end(), back.begin() + s.plain_offset / 4));
  }
}

TEST(KvBlocks, KeysOnlyHaveOneStreamPerLayer) {
  const KvBlocks b{KvCodecId::flexgen4, 2, 512, 0, 33};
  const std::vector<KvBlockStream> streams = kv_block_streams(b, DType::f16);
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[1].layer, 1u);
  EXPECT_EQ(streams[1].stream.role, KvRole::keys);
  EXPECT_EQ(kv_blocks_encoded_bytes(b),
            2 * kv_encoded_bytes(KvCodecId::flexgen4, KvRole::keys, 33, 512));
  EXPECT_NE(describe(b).find("no values"), std::string::npos);
}

TEST(KvBlocks, IllFormedBlocksAreRefusedWithTheReason) {
  const KvBlocks good{KvCodecId::kivi4, 1, 128, 128, 10};
  EXPECT_EQ(kv_blocks_problem(good), nullptr);
  const auto problem = [&](auto mutate) {
    KvBlocks b = good;
    mutate(b);
    const char* why = kv_blocks_problem(b);
    EXPECT_NE(why, nullptr);
    EXPECT_EQ(kv_blocks_encoded_bytes(b), 0u);
    EXPECT_EQ(kv_blocks_plain_bytes(b, DType::f32), 0u);
    EXPECT_THROW((void)kv_block_streams(b, DType::f32), std::invalid_argument);
    return std::string(why == nullptr ? "" : why);
  };
  EXPECT_EQ(problem([](KvBlocks& b) { b.layers = 0; }), "KV blocks need at least 1 layer");
  EXPECT_EQ(problem([](KvBlocks& b) { b.layers = kKvMaxLayers + 1; }),
            "KV blocks have at most 1024 layers");
  EXPECT_EQ(problem([](KvBlocks& b) { b.key_channels = 0; }),
            "KV blocks need at least 1 key channel");
  EXPECT_EQ(problem([](KvBlocks& b) { b.value_channels = kKvMaxChannels + 1; }),
            "KV blocks have at most 1048576 channels per stream");
  EXPECT_EQ(problem([](KvBlocks& b) { b.tokens = 0; }), "KV blocks need at least 1 token");
  EXPECT_EQ(problem([](KvBlocks& b) {
              b.layers = kKvMaxLayers;
              b.tokens = kKvMaxTokens;
              b.key_channels = b.value_channels = kKvMaxChannels;
            }),
            "KV blocks hold at most 2^48 bytes of FP32 values");
  EXPECT_EQ(problem([](KvBlocks& b) { b.codec = static_cast<KvCodecId>(7); }), "unknown KV codec");

  // Wrong buffer sizes: refused before anything is written.
  std::vector<std::byte> plain(kv_blocks_plain_bytes(good, DType::bf16));
  std::vector<std::byte> out(kv_blocks_encoded_bytes(good) + 1, std::byte{0x33});
  EXPECT_THROW(kv_encode_blocks(good, DType::bf16, plain, out), std::invalid_argument);
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](std::byte x) { return x == std::byte{0x33}; }));
  out.resize(out.size() - 1);
  EXPECT_THROW(kv_encode_blocks(good, DType::f32, plain, out), std::invalid_argument);
  EXPECT_THROW(kv_decode_blocks(good, out, DType::bf16, std::span(plain).first(plain.size() - 2)),
               std::invalid_argument);
}

// The ratios, from KV blocks of a whole model: 10,000 tokens, keys and values of
// 128 channels, against FP16.
TEST(KvBlocks, RatiosAtTenThousandTokens) {
  const auto ratio = [](KvCodecId codec) {
    const KvBlocks b{codec, 4, 128, 128, 10000};
    return static_cast<double>(kv_blocks_plain_bytes(b, DType::f16)) /
           static_cast<double>(kv_blocks_encoded_bytes(b));
  };
  EXPECT_NEAR(ratio(KvCodecId::kivi2), 5.05, 0.005);
  EXPECT_NEAR(ratio(KvCodecId::kivi4), 3.11, 0.005);
  EXPECT_NEAR(ratio(KvCodecId::flexgen4), 3.20, 0.005);
  EXPECT_DOUBLE_EQ(ratio(KvCodecId::fp8), 2.0);
}

}  // namespace
}  // namespace statepool::kernels
