// The CUDA KV-cache kernels' code, run on the host: every thread of a grid of 1 or 37
// threads runs kv_stream.hpp's kv_encode_thread / kv_decode_thread, the code of
// kernels/cuda/kv_kernels.cu's threads (a group cursor; 32-bit word access to aligned
// streams, byte access to others) over kv_math.hpp's per-item functions, against the CPU's
// kv_encode / kv_decode (which work in tiles, with vectorized loops). Equal bytes for every codec,
// role, plain dtype and awkward shape (partial groups, a residual window that starts inside a
// group, channels past one CPU tile), on random values over a wide range and on arbitrary encoded
// bytes. The GPU runs exactly these item bodies, so this is the evidence that the device bytes
// equal the CPU bytes where no GPU is at hand; tests/gpu/test_kv_kernels_gpu.cpp checks the device
// itself.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "statepool/kernels/cuda/kv_stream.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/kv_math.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::kernels {
namespace {

using testing::first_difference;

// The device kernels' element access (kv_kernels.cu), on host arrays.
struct LoadPlain {
  const std::byte* p;
  DType dtype;
  float operator()(std::uint64_t i) const noexcept {
    std::uint16_t h = 0;
    switch (dtype) {
      case DType::f32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        return v;
      }
      case DType::bf16: std::memcpy(&h, p + 2 * i, 2); return bf16_bits_to_float(h);
      default: std::memcpy(&h, p + 2 * i, 2); return half_bits_to_float(h);
    }
  }
};
struct StorePlain {
  std::byte* p;
  DType dtype;
  void operator()(std::uint64_t i, float v) const noexcept {
    std::uint16_t h = 0;
    switch (dtype) {
      case DType::f32: std::memcpy(p + 4 * i, &v, 4); return;
      case DType::bf16: h = float_to_bf16_bits(v); break;
      default: h = float_to_half_bits(v); break;
    }
    std::memcpy(p + 2 * i, &h, 2);
  }
};

// How the kernels' threads meet a stream (kv_stream.hpp, the kernels' own code): a grid
// `step` threads wide, thread `first` taking records first, first + step, ... with a
// group cursor, then flat words the same way, thread 0 the tail. Words where the stream
// starts 4-byte aligned; else by the byte (the stream placed at an odd address).
enum class Access { words, bytes };

std::vector<std::byte> device_encode(const KvStream& s, DType dtype,
                                     const std::vector<std::byte>& plain, Access access,
                                     std::uint32_t step) {
  const KvGeometry g = kv_geometry(s);
  const KvItems it = kv_items(s.codec, g);
  const std::size_t at = access == Access::words ? 0 : 1;
  std::vector<std::byte> buffer(g.bytes + 4, std::byte{0x5A});
  const LoadPlain load{plain.data(), dtype};
  for (std::uint32_t first = 0; first < step; ++first) {
    cuda::kv_encode_thread(g, it, load, buffer.data() + at, first, step);
  }
  EXPECT_EQ(buffer[at + g.bytes], std::byte{0x5A}) << "a byte past the stream was written";
  return {buffer.begin() + static_cast<std::ptrdiff_t>(at),
          buffer.begin() + static_cast<std::ptrdiff_t>(at + g.bytes)};
}

std::vector<std::byte> device_decode(const KvStream& s, const std::vector<std::byte>& encoded,
                                     DType dtype, Access access, std::uint32_t step) {
  const KvGeometry g = kv_geometry(s);
  const KvItems it = kv_items(s.codec, g);
  const std::size_t at = access == Access::words ? 0 : 1;
  std::vector<std::byte> in(encoded.size() + 4);
  std::copy(encoded.begin(), encoded.end(), in.begin() + static_cast<std::ptrdiff_t>(at));
  std::vector<std::byte> out(s.tokens * s.channels * dtype_bytes(dtype), std::byte{0x5A});
  const StorePlain store{out.data(), dtype};
  for (std::uint32_t first = 0; first < step; ++first) {
    cuda::kv_decode_thread(g, it, in.data() + at, store, first, step);
  }
  return out;
}

// Values of a wide range (magnitudes 2^-30 .. 2^20, both signs), per channel offsets
// (a group far from zero), exact zeros, and some constant groups.
std::vector<std::byte> random_plain(std::uint64_t tokens, std::uint64_t channels, DType dtype,
                                    std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 15);
  std::vector<float> offset(channels);
  for (float& o : offset) o = kind(rng) < 3 ? 1000.0f * mantissa(rng) : 0.0f;
  std::vector<std::byte> out(tokens * channels * dtype_bytes(dtype));
  const StorePlain store{out.data(), dtype};
  for (std::uint64_t t = 0; t < tokens; ++t) {
    for (std::uint64_t c = 0; c < channels; ++c) {
      const int k = kind(rng);
      float v = k == 0 ? 0.0f : k == 1 ? -0.0f : mantissa(rng) * std::exp2(exponent(rng));
      if (c % 7 == 3) v = 0.25f;  // constant channels: constant key groups
      v += offset[c];
      // Out of the plain dtype's finite range: saturated on the way in, as an engine's
      // own conversion would; the codecs reject non-finite values.
      store(t * channels + c, dtype == DType::f16 ? std::fmin(std::fmax(v, -6e4f), 6e4f) : v);
    }
  }
  return out;
}

const char* dtype_name(DType d) {
  return d == DType::f32 ? "f32" : d == DType::bf16 ? "bf16" : "f16";
}

constexpr KvCodecId kCodecs[] = {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2,
                                 KvCodecId::kivi4, KvCodecId::flexgen4};
constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};
// Tokens: a single one, partial and whole key groups, residual windows that start inside
// a group; channels: partial value groups, one tile of the CPU loops and past it.
constexpr std::uint64_t kTokens[] = {1, 31, 33, 160, 161, 200};
constexpr std::uint64_t kChannels[] = {1, 5, 32, 33, 1030};
// Grid widths: one thread, and a width that is no multiple of any shape's records per
// row (the group cursor wraps at every step).
constexpr std::uint32_t kSteps[] = {1, 37};

TEST(DeviceKvEmulation, ItemBodiesWriteTheCpuBytesBothWays) {
  std::uint64_t seed = 7;
  for (const KvCodecId codec : kCodecs) {
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      for (const std::uint64_t tokens : kTokens) {
        for (const std::uint64_t channels : kChannels) {
          const KvStream s{codec, role, tokens, channels};
          for (const DType dtype : kDtypes) {
            if (tokens * channels > 10000 && dtype != DType::bf16) continue;  // time under ASan
            SCOPED_TRACE(std::string(to_string(codec)) + " " + to_string(role) + " " +
                         std::to_string(tokens) + "x" + std::to_string(channels) + " " +
                         dtype_name(dtype));
            const std::vector<std::byte> plain = random_plain(tokens, channels, dtype, seed++);
            std::vector<std::byte> cpu(kv_encoded_bytes(s), std::byte{0xA5});
            kv_encode(s, dtype, plain, cpu);
            for (const Access access : {Access::words, Access::bytes}) {
              for (const std::uint32_t step : kSteps) {
                SCOPED_TRACE(std::string(access == Access::words ? "words" : "bytes") +
                             ", grid of " + std::to_string(step));
                ASSERT_EQ(first_difference(cpu, device_encode(s, dtype, plain, access, step)), -1);
                for (const DType out : kDtypes) {
                  std::vector<std::byte> decoded(plain.size() / dtype_bytes(dtype) *
                                                 dtype_bytes(out));
                  kv_decode(s, cpu, out, decoded);
                  ASSERT_EQ(first_difference(decoded, device_decode(s, cpu, out, access, step)), -1)
                      << "decoding to " << dtype_name(out);
                }
              }
            }
          }
        }
      }
    }
  }
}

// kv_decode accepts any bytes: random scales, offsets and codes (non-finite ones
// included) decode to the same values on both paths; NaNs compare as NaNs (which NaN an
// operation returns is not part of the format).
TEST(DeviceKvEmulation, ArbitraryBytesDecodeAlike) {
  std::mt19937_64 rng(99);
  for (const KvCodecId codec : kCodecs) {
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      const KvStream s{codec, role, 200, 45};
      std::vector<std::byte> encoded(kv_encoded_bytes(s));
      for (std::byte& b : encoded) b = static_cast<std::byte>(rng());
      std::vector<float> cpu(s.tokens * s.channels);
      kv_decode(s, encoded, cpu);
      for (const Access access : {Access::words, Access::bytes}) {
        const std::vector<std::byte> device = device_decode(s, encoded, DType::f32, access, 37);
        for (std::size_t i = 0; i < cpu.size(); ++i) {
          float d;
          std::memcpy(&d, device.data() + 4 * i, 4);
          if (std::isnan(cpu[i]) && std::isnan(d)) continue;
          ASSERT_EQ(std::bit_cast<std::uint32_t>(cpu[i]), std::bit_cast<std::uint32_t>(d))
              << to_string(codec) << " " << to_string(role) << " value " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace statepool::kernels
