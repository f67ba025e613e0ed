// CUDA KV-cache stream kernels (kernels/cuda/kv_kernels.cu) against the CPU codecs
// (kv.hpp): for every codec, plain dtype and awkward shape, a batch of streams of both
// roles must encode to exactly kv_encode's bytes (a skipped stream left untouched) and
// decode to exactly kv_decode's values; the non-finite scan feeds the skip array. Skips
// cleanly without a CUDA device.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_buffer.hpp"
#include "statepool/kernels/cuda/kv_kernels.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::kernels {
namespace {

using cuda::KvBatchView;
using testing::DeviceBuffer;
using testing::first_difference;

constexpr unsigned long long kFinite = std::numeric_limits<unsigned long long>::max();
constexpr KvCodecId kCodecs[] = {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2,
                                 KvCodecId::kivi4, KvCodecId::flexgen4};
// Stream i of a batch: roles alternate keys, values.
constexpr std::uint32_t kStreams = 4;

std::size_t elem_bytes(DType dtype) {
  return dtype == DType::f32 ? 4 : 2;
}

// Values in `dtype`: wide-range random data with edge values (zeros of both signs, FP32
// denormals, constant runs, beyond the fp16 range, negative-only stretches).
std::vector<std::byte> plain_values(std::uint64_t n, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-20.0f, 18.0f);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::vector<std::byte> raw(n * elem_bytes(dtype));
  for (std::uint64_t i = 0; i < n; ++i) {
    float v = mantissa(rng) * std::exp2(exponent(rng));
    switch (i % 97) {
      case 0: v = 0.0f; break;
      case 1: v = -0.0f; break;
      case 2: v = 1e-40f; break;
      case 3: v = 65520.0f; break;
      case 4: v = -1e6f; break;
      default: break;
    }
    if (i / 64 % 5 == 3) v = -std::fabs(v) - 1.0f;
    if (i / 64 % 7 == 4) v = 0.3f;
    if (dtype == DType::f32) {
      std::memcpy(raw.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t b = dtype == DType::bf16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
      std::memcpy(raw.data() + 2 * i, &b, 2);
    }
  }
  return raw;
}

// A device array holding `host` (pointers or roles).
template <class T>
std::unique_ptr<DeviceBuffer> device_array(const std::vector<T>& host) {
  auto d = std::make_unique<DeviceBuffer>(sizeof(T) * host.size());
  if (d->ok()) (void)d->upload(host.data(), sizeof(T) * host.size());
  return d;
}

struct Buffers {
  std::vector<std::unique_ptr<DeviceBuffer>> plain;
  std::vector<std::unique_ptr<DeviceBuffer>> encoded;
  std::vector<const void*> plain_ptrs;
  std::vector<void*> encoded_ptrs;
};

KvRole role_of(std::uint32_t i) {
  return i % 2 == 0 ? KvRole::keys : KvRole::values;
}

TEST(GpuKv, BatchedEncodeAndDecodeEqualTheCpuForEveryCodecDtypeAndShape) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  std::vector<KvRole> roles;
  for (std::uint32_t i = 0; i < kStreams; ++i) roles.push_back(role_of(i));
  const auto d_roles = device_array(roles);
  ASSERT_TRUE(d_roles->ok());
  std::uint64_t seed = 0;
  for (const KvCodecId codec : kCodecs) {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (const std::uint64_t tokens : {0ull, 1ull, 33ull, 129ull, 200ull, 1000ull}) {
        for (const std::uint64_t channels : {1ull, 33ull, 128ull}) {
          SCOPED_TRACE(std::string(to_string(codec)) + " " + to_string(dtype) + " " +
                       std::to_string(tokens) + "x" + std::to_string(channels));
          const KvBatchView view{codec, dtype, tokens, channels};
          const std::uint64_t n = tokens * channels;
          // CPU side.
          std::vector<std::vector<std::byte>> plain, encoded, decoded;
          for (std::uint32_t i = 0; i < kStreams; ++i) {
            const KvStream s{codec, role_of(i), tokens, channels};
            plain.push_back(plain_values(n, dtype, ++seed));
            encoded.emplace_back(kv_encoded_bytes(s));
            kv_encode(s, dtype, plain.back(), encoded.back());
            decoded.emplace_back(n * elem_bytes(dtype));
            kv_decode(s, encoded.back(), dtype, decoded.back());
          }
          // Encode on the device, stream 2 skipped.
          Buffers b;
          for (std::uint32_t i = 0; i < kStreams; ++i) {
            b.plain.push_back(std::make_unique<DeviceBuffer>(plain[i].size()));
            b.encoded.push_back(std::make_unique<DeviceBuffer>(encoded[i].size()));
            ASSERT_TRUE(b.plain[i]->ok() && b.encoded[i]->ok());
            STATEPOOL_CUDA_OK(b.plain[i]->upload(plain[i]));
            STATEPOOL_CUDA_OK(b.encoded[i]->fill(0xA7));  // every byte must be written
            b.plain_ptrs.push_back(b.plain[i]->get());
            b.encoded_ptrs.push_back(b.encoded[i]->get());
          }
          const auto d_plain = device_array(b.plain_ptrs);
          const auto d_encoded = device_array(b.encoded_ptrs);
          const auto d_skip =
              device_array(std::vector<unsigned long long>{kFinite, kFinite, 5, kFinite});
          ASSERT_TRUE(d_plain->ok() && d_encoded->ok() && d_skip->ok());
          STATEPOOL_CUDA_OK(cuda::kv_encode_streams(
              view, static_cast<const KvRole*>(d_roles->get()),
              static_cast<const void* const*>(d_plain->get()),
              static_cast<void* const*>(d_encoded->get()), kStreams,
              static_cast<const unsigned long long*>(d_skip->get()), nullptr));
          STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
          for (std::uint32_t i = 0; i < kStreams; ++i) {
            std::vector<std::byte> got;
            STATEPOOL_CUDA_OK(b.encoded[i]->download(got));
            const std::vector<std::byte> untouched(encoded[i].size(), std::byte{0xA7});
            EXPECT_EQ(first_difference(got, i == 2 ? untouched : encoded[i]), -1) << "stream " << i;
          }
          // Decode the CPU bytes on the device, into the plain buffers.
          std::vector<const void*> enc_ptrs;
          std::vector<void*> plain_out;
          for (std::uint32_t i = 0; i < kStreams; ++i) {
            STATEPOOL_CUDA_OK(b.encoded[i]->upload(encoded[i]));
            STATEPOOL_CUDA_OK(b.plain[i]->fill(0x5C));
            enc_ptrs.push_back(b.encoded[i]->get());
            plain_out.push_back(b.plain[i]->get());
          }
          const auto d_enc_in = device_array(enc_ptrs);
          const auto d_plain_out = device_array(plain_out);
          ASSERT_TRUE(d_enc_in->ok() && d_plain_out->ok());
          STATEPOOL_CUDA_OK(cuda::kv_decode_streams(
              view, static_cast<const KvRole*>(d_roles->get()),
              static_cast<const void* const*>(d_enc_in->get()),
              static_cast<void* const*>(d_plain_out->get()), kStreams, nullptr));
          STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
          for (std::uint32_t i = 0; i < kStreams; ++i) {
            std::vector<std::byte> got;
            STATEPOOL_CUDA_OK(b.plain[i]->download(got));
            EXPECT_EQ(first_difference(got, decoded[i]), -1) << "stream " << i;
          }
        }
      }
    }
  }
}

TEST(GpuKv, FindNonFiniteFeedsTheSkipArray) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  const std::uint64_t tokens = 300;
  const std::uint64_t channels = 64;
  const std::uint64_t n = tokens * channels;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const KvBatchView view{KvCodecId::kivi2, dtype, tokens, channels};
    std::vector<std::vector<std::byte>> plain;
    for (std::uint32_t i = 0; i < kStreams; ++i) plain.push_back(plain_values(n, dtype, 40 + i));
    // Stream 1: an Inf at 5000 and a NaN later; stream 3: a NaN in the residual window.
    const auto poke = [dtype](std::vector<std::byte>& p, std::uint64_t at, bool nan) {
      if (dtype == DType::f32) {
        const float v =
            nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
        std::memcpy(p.data() + 4 * at, &v, 4);
      } else {
        const std::uint16_t v =
            dtype == DType::bf16 ? (nan ? 0x7FC0 : 0x7F80) : (nan ? 0x7E00 : 0x7C00);
        std::memcpy(p.data() + 2 * at, &v, 2);
      }
    };
    poke(plain[1], 9000, true);
    poke(plain[1], 5000, false);
    poke(plain[3], n - 3, true);
    std::vector<std::vector<std::byte>> encoded;
    Buffers b;
    std::vector<KvRole> roles;
    for (std::uint32_t i = 0; i < kStreams; ++i) {
      const KvStream s{KvCodecId::kivi2, role_of(i), tokens, channels};
      roles.push_back(role_of(i));
      encoded.emplace_back(kv_encoded_bytes(s));
      if (i % 2 == 0) kv_encode(s, dtype, plain[i], encoded[i]);
      b.plain.push_back(std::make_unique<DeviceBuffer>(plain[i].size()));
      b.encoded.push_back(std::make_unique<DeviceBuffer>(encoded[i].size()));
      ASSERT_TRUE(b.plain[i]->ok() && b.encoded[i]->ok());
      STATEPOOL_CUDA_OK(b.plain[i]->upload(plain[i]));
      STATEPOOL_CUDA_OK(b.encoded[i]->fill(0x42));
      b.plain_ptrs.push_back(b.plain[i]->get());
      b.encoded_ptrs.push_back(b.encoded[i]->get());
    }
    const auto d_roles = device_array(roles);
    const auto d_plain = device_array(b.plain_ptrs);
    const auto d_encoded = device_array(b.encoded_ptrs);
    DeviceBuffer d_first(sizeof(unsigned long long) * kStreams);
    ASSERT_TRUE(d_roles->ok() && d_plain->ok() && d_encoded->ok() && d_first.ok());
    auto* first = static_cast<unsigned long long*>(d_first.get());
    const auto* plain_array = static_cast<const void* const*>(d_plain->get());
    STATEPOOL_CUDA_OK(
        cuda::kv_find_non_finite_streams(view, plain_array, kStreams, first, nullptr));
    STATEPOOL_CUDA_OK(cuda::kv_encode_streams(
        view, static_cast<const KvRole*>(d_roles->get()), plain_array,
        static_cast<void* const*>(d_encoded->get()), kStreams, first, nullptr));
    STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
    unsigned long long found[kStreams] = {};
    STATEPOOL_CUDA_OK(cudaMemcpy(found, first, sizeof found, cudaMemcpyDeviceToHost));
    EXPECT_EQ(found[0], kFinite);
    EXPECT_EQ(found[1], 5000u);
    EXPECT_EQ(found[2], kFinite);
    EXPECT_EQ(found[3], n - 3);
    for (std::uint32_t i = 0; i < kStreams; ++i) {
      std::vector<std::byte> got;
      STATEPOOL_CUDA_OK(b.encoded[i]->download(got));
      const std::vector<std::byte> untouched(encoded[i].size(), std::byte{0x42});
      EXPECT_EQ(first_difference(got, i % 2 == 0 ? encoded[i] : untouched), -1) << "stream " << i;
    }
  }
}

TEST(GpuKv, RejectsBadViewsAndArraysWithoutLaunching) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DeviceBuffer a(1 << 16);
  ASSERT_TRUE(a.ok());
  const auto* roles = static_cast<const KvRole*>(a.get());
  const auto* in = static_cast<const void* const*>(a.get());
  auto* const* out = static_cast<void* const*>(a.get());
  KvBatchView bad{static_cast<KvCodecId>(9), DType::f32, 10, 10};
  EXPECT_EQ(cuda::kv_encode_streams(bad, roles, in, out, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  bad = {KvCodecId::kivi4, static_cast<DType>(7), 10, 10};
  EXPECT_EQ(cuda::kv_decode_streams(bad, roles, in, out, 1, nullptr), cudaErrorInvalidValue);
  bad = {KvCodecId::kivi4, DType::f32, 1ull << 40, 1ull << 40};
  EXPECT_NE(cuda::kv_view_problem(bad), nullptr);
  const KvBatchView good{KvCodecId::kivi4, DType::f32, 10, 10};
  EXPECT_EQ(cuda::kv_view_problem(good), nullptr);
  EXPECT_EQ(cuda::kv_encode_streams(good, nullptr, in, out, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kv_encode_streams(good, roles, nullptr, out, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kv_decode_streams(good, roles, in, nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kv_find_non_finite_streams(good, in, 1, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::kv_encode_streams(good, roles, in, out, 0, nullptr, nullptr), cudaSuccess);
  STATEPOOL_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace statepool::kernels
