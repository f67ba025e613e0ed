// CUDA page encode/decode for the float and uniform int codecs (see codec_kernels.hpp).
//
// Work split:
//   uniform encode: one warp per (head, group): warp max of |x| bits, lane 0 writes the
//     fp16 scale, then each lane quantizes and packs whole quads (groups are multiples of
//     4 values, so every quad starts on a byte boundary and lanes write disjoint bytes);
//   uniform decode: one thread per quad;
//   float codecs: one thread per value.
// The warp handling a head's last group (or the thread handling its last value) also
// writes the head's zero padding, so every byte of the recurrent part is written.

#include <cstdint>

#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/packing.hpp"
#include "statepool/kernels/quantize.hpp"

namespace statepool::kernels::cuda {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kBlock = 256;
constexpr unsigned kMaxBlocks = 1u << 16;  // grid-stride loops cover the rest

// ---------------------------------------------------------------------------------------
// Element access

struct F32 {
  using Storage = float;
  __device__ static float load(const Storage* p, std::uint64_t i) { return p[i]; }
  __device__ static void store(Storage* p, std::uint64_t i, float v) { p[i] = v; }
  __device__ static bool non_finite(const Storage* p, std::uint64_t i) {
    return is_non_finite_bits(float_bits(p[i]));
  }
};

struct Bf16 {
  using Storage = std::uint16_t;
  __device__ static float load(const Storage* p, std::uint64_t i) {
    return bf16_bits_to_float(p[i]);
  }
  __device__ static void store(Storage* p, std::uint64_t i, float v) {
    p[i] = float_to_bf16_bits(v);
  }
  __device__ static bool non_finite(const Storage* p, std::uint64_t i) {
    return is_non_finite_bf16(p[i]);
  }
};

__device__ inline std::uint64_t values_per_head(const PageDesc& d) {
  return static_cast<std::uint64_t>(d.key_dim) * d.value_dim;
}

__device__ inline void zero_bytes(std::uint8_t* p, std::uint64_t begin, std::uint64_t end) {
  for (std::uint64_t i = begin; i < end; ++i) {
    p[i] = 0;
  }
}

// ---------------------------------------------------------------------------------------
// Uniform int codecs

template <std::uint32_t Bits, typename In>
__device__ void encode_group_warp(const PageDesc& d, const typename In::Storage* x,
                                  std::uint32_t count, std::uint8_t* head, std::uint64_t group,
                                  std::uint64_t groups, unsigned lane) {
  constexpr std::uint32_t qmax = code_qmax(Bits);

  std::uint32_t m = 0;
  for (std::uint32_t i = lane; i < count; i += kWarp) {
    m = max(m, abs_bits(In::load(x, i)));
  }
  for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
    m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  }
  const std::uint16_t scale_bits = uniform_scale_bits(m, qmax);
  const float s = half_bits_to_float(scale_bits);
  if (lane == 0) {
    head[2 * group] = static_cast<std::uint8_t>(scale_bits & 0xFFu);
    head[2 * group + 1] = static_cast<std::uint8_t>(scale_bits >> 8);
  }

  std::uint8_t* codes =
      head + 2 * groups + packed_bytes(group * static_cast<std::uint64_t>(d.group_size), Bits);
  const std::uint32_t quads = (count + 3u) / 4u;
  for (std::uint32_t q = lane; q < quads; q += kWarp) {
    const std::uint32_t first = 4u * q;
    std::uint8_t u[4];
    for (std::uint32_t k = 0; k < 4; ++k) {
      u[k] = first + k < count
                 ? static_cast<std::uint8_t>(uniform_code(In::load(x, first + k), s, qmax))
                 : std::uint8_t{0};
    }
    std::uint8_t* dst = codes + static_cast<std::uint64_t>(q) * quad_bytes(Bits);
    if (first + 4u <= count) {
      pack_quad<Bits>(u[0], u[1], u[2], u[3], dst);
    } else {
      pack_partial_quad<Bits>(u, count - first, dst);
    }
  }

  if (group + 1 == groups && lane == 0) {
    zero_bytes(head, 2 * groups + packed_bytes(values_per_head(d), Bits), d.head_bytes);
  }
}

template <std::uint32_t Bits, typename In>
__global__ void __launch_bounds__(kBlock)
    encode_uniform_kernel(PageDesc d, const typename In::Storage* staged, std::uint8_t* page) {
  const std::uint64_t n = values_per_head(d);
  const std::uint64_t groups = uniform_group_count(n, d.group_size);
  const std::uint64_t items = groups * d.num_heads;
  const unsigned lane = threadIdx.x % kWarp;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (std::uint64_t item =
           (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
       item < items; item += warps) {
    const std::uint64_t head = item / groups;
    const std::uint64_t group = item % groups;
    const std::uint64_t begin = group * d.group_size;
    const auto count = static_cast<std::uint32_t>(min(n - begin, std::uint64_t{d.group_size}));
    encode_group_warp<Bits, In>(d, staged + head * n + begin, count, page + head * d.head_bytes,
                                group, groups, lane);
  }
}

template <std::uint32_t Bits, typename Out>
__global__ void __launch_bounds__(kBlock)
    decode_uniform_kernel(PageDesc d, const std::uint8_t* page, typename Out::Storage* staged) {
  constexpr std::uint32_t qmax = code_qmax(Bits);
  const std::uint64_t n = values_per_head(d);
  const std::uint64_t groups = uniform_group_count(n, d.group_size);
  const std::uint64_t quads_per_head = (n + 3) / 4;
  const std::uint64_t items = quads_per_head * d.num_heads;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < items; item += stride) {
    const std::uint64_t head = item / quads_per_head;
    const std::uint64_t q = item % quads_per_head;
    const std::uint64_t first = 4 * q;
    const std::uint8_t* in = page + head * d.head_bytes;
    const std::uint64_t group = first / d.group_size;  // a quad never spans two groups
    const auto scale_bits = static_cast<std::uint16_t>(in[2 * group] | (in[2 * group + 1] << 8));
    const float s = half_bits_to_float(scale_bits);
    const std::uint8_t* src = in + 2 * groups + q * quad_bytes(Bits);
    const auto rest = static_cast<std::uint32_t>(min(n - first, std::uint64_t{4}));
    std::uint32_t u[4];
    if (rest == 4) {
      unpack_quad<Bits>(src, u);
    } else {
      unpack_partial_quad<Bits>(src, rest, u);
    }
    for (std::uint32_t k = 0; k < rest; ++k) {
      Out::store(staged, head * n + first + k, uniform_value(u[k], s, qmax));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Float codecs

template <typename In>
__global__ void __launch_bounds__(kBlock)
    encode_float_kernel(PageDesc d, const typename In::Storage* staged, std::uint8_t* page) {
  const std::uint64_t n = values_per_head(d);
  const std::uint64_t items = n * d.num_heads;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint32_t value_bytes = float_codec_value_bytes(d.codec);
  for (std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < items; item += stride) {
    const std::uint64_t head = item / n;
    const std::uint64_t i = item % n;
    const float v = In::load(staged, item);
    std::uint8_t* out = page + head * d.head_bytes;
    if (d.codec == CodecId::fp32) {
      reinterpret_cast<std::uint32_t*>(out)[i] = float_bits(v);
    } else {
      const std::uint16_t bits =
          d.codec == CodecId::bf16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
      reinterpret_cast<std::uint16_t*>(out)[i] = bits;
    }
    if (i + 1 == n) {
      zero_bytes(out, n * value_bytes, d.head_bytes);
    }
  }
}

template <typename Out>
__global__ void __launch_bounds__(kBlock)
    decode_float_kernel(PageDesc d, const std::uint8_t* page, typename Out::Storage* staged) {
  const std::uint64_t n = values_per_head(d);
  const std::uint64_t items = n * d.num_heads;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < items; item += stride) {
    const std::uint64_t head = item / n;
    const std::uint64_t i = item % n;
    const std::uint8_t* in = page + head * d.head_bytes;
    float v;
    if (d.codec == CodecId::fp32) {
      v = bits_float(reinterpret_cast<const std::uint32_t*>(in)[i]);
    } else {
      const std::uint16_t bits = reinterpret_cast<const std::uint16_t*>(in)[i];
      v = d.codec == CodecId::bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
    }
    Out::store(staged, item, v);
  }
}

// ---------------------------------------------------------------------------------------
// Non-finite scan

template <typename In>
__global__ void __launch_bounds__(kBlock)
    find_non_finite_kernel(PageDesc d, const typename In::Storage* staged,
                           unsigned long long* first_index) {
  const std::uint64_t items = values_per_head(d) * d.num_heads;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t item = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < items; item += stride) {
    if (In::non_finite(staged, item)) {
      atomicMin(first_index, static_cast<unsigned long long>(item));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host side

bool aligned(const void* p, std::uintptr_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

std::uint64_t staged_value_bytes(const PageDesc& d) {
  return d.staged_dtype == DType::f32 ? 4 : 2;
}

bool valid(const PageDesc& d, const void* staged, const void* page) {
  if (staged == nullptr || page == nullptr || d.num_heads == 0 || d.key_dim == 0 ||
      d.value_dim == 0) {
    return false;
  }
  if (d.staged_dtype != DType::f32 && d.staged_dtype != DType::bf16) {
    return false;
  }
  const std::uint64_t n = static_cast<std::uint64_t>(d.key_dim) * d.value_dim;
  if (is_float_codec(d.codec)) {
    if (d.head_bytes != float_head_bytes(n, d.codec)) {
      return false;
    }
  } else if (is_uniform_codec(d.codec)) {
    if (!is_valid_group_size(d.group_size) ||
        d.head_bytes != uniform_head_bytes(n, d.group_size, codec_code_bits(d.codec))) {
      return false;
    }
  } else {
    return false;
  }
  return aligned(page, 4) && aligned(staged, staged_value_bytes(d));
}

unsigned grid_for(std::uint64_t threads) {
  const std::uint64_t blocks = (threads + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks == 0 ? 1 : blocks) : kMaxBlocks);
}

template <typename Io>
cudaError_t launch_encode(const PageDesc& d, const void* staged, void* page, cudaStream_t stream) {
  const auto* in = static_cast<const typename Io::Storage*>(staged);
  auto* out = static_cast<std::uint8_t*>(page);
  const std::uint64_t n = static_cast<std::uint64_t>(d.key_dim) * d.value_dim;
  if (is_float_codec(d.codec)) {
    encode_float_kernel<Io><<<grid_for(n * d.num_heads), kBlock, 0, stream>>>(d, in, out);
    return cudaGetLastError();
  }
  const std::uint64_t warps = uniform_group_count(n, d.group_size) * d.num_heads;
  const unsigned grid = grid_for(warps * kWarp);
  switch (d.codec) {
    case CodecId::int4:
      encode_uniform_kernel<4, Io><<<grid, kBlock, 0, stream>>>(d, in, out);
      break;
    case CodecId::int6:
      encode_uniform_kernel<6, Io><<<grid, kBlock, 0, stream>>>(d, in, out);
      break;
    default: encode_uniform_kernel<8, Io><<<grid, kBlock, 0, stream>>>(d, in, out); break;
  }
  return cudaGetLastError();
}

template <typename Io>
cudaError_t launch_decode(const PageDesc& d, const void* page, void* staged, cudaStream_t stream) {
  const auto* in = static_cast<const std::uint8_t*>(page);
  auto* out = static_cast<typename Io::Storage*>(staged);
  const std::uint64_t n = static_cast<std::uint64_t>(d.key_dim) * d.value_dim;
  if (is_float_codec(d.codec)) {
    decode_float_kernel<Io><<<grid_for(n * d.num_heads), kBlock, 0, stream>>>(d, in, out);
    return cudaGetLastError();
  }
  const unsigned grid = grid_for((n + 3) / 4 * d.num_heads);
  switch (d.codec) {
    case CodecId::int4:
      decode_uniform_kernel<4, Io><<<grid, kBlock, 0, stream>>>(d, in, out);
      break;
    case CodecId::int6:
      decode_uniform_kernel<6, Io><<<grid, kBlock, 0, stream>>>(d, in, out);
      break;
    default: decode_uniform_kernel<8, Io><<<grid, kBlock, 0, stream>>>(d, in, out); break;
  }
  return cudaGetLastError();
}

std::uint64_t recurrent_staged_bytes(const PageDesc& d) {
  return static_cast<std::uint64_t>(d.key_dim) * d.value_dim * d.num_heads * staged_value_bytes(d);
}

}  // namespace

cudaError_t encode_recurrent(PageDesc desc, const void* staged, void* page,
                             cudaStream_t stream) noexcept {
  if (!valid(desc, staged, page)) {
    return cudaErrorInvalidValue;
  }
  return desc.staged_dtype == DType::f32 ? launch_encode<F32>(desc, staged, page, stream)
                                         : launch_encode<Bf16>(desc, staged, page, stream);
}

cudaError_t decode_recurrent(PageDesc desc, const void* page, void* staged,
                             cudaStream_t stream) noexcept {
  if (!valid(desc, staged, page)) {
    return cudaErrorInvalidValue;
  }
  return desc.staged_dtype == DType::f32 ? launch_decode<F32>(desc, page, staged, stream)
                                         : launch_decode<Bf16>(desc, page, staged, stream);
}

cudaError_t encode_page(PageDesc desc, const void* staged, void* page,
                        cudaStream_t stream) noexcept {
  const cudaError_t status = encode_recurrent(desc, staged, page, stream);
  if (status != cudaSuccess || desc.conv_bytes == 0) {
    return status;
  }
  return cudaMemcpyAsync(static_cast<std::uint8_t*>(page) + desc.head_bytes * desc.num_heads,
                         static_cast<const std::uint8_t*>(staged) + recurrent_staged_bytes(desc),
                         desc.conv_bytes, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t decode_page(PageDesc desc, const void* page, void* staged,
                        cudaStream_t stream) noexcept {
  const cudaError_t status = decode_recurrent(desc, page, staged, stream);
  if (status != cudaSuccess || desc.conv_bytes == 0) {
    return status;
  }
  return cudaMemcpyAsync(static_cast<std::uint8_t*>(staged) + recurrent_staged_bytes(desc),
                         static_cast<const std::uint8_t*>(page) + desc.head_bytes * desc.num_heads,
                         desc.conv_bytes, cudaMemcpyDeviceToDevice, stream);
}

cudaError_t find_non_finite(PageDesc desc, const void* staged, unsigned long long* first_index,
                            cudaStream_t stream) noexcept {
  if (first_index == nullptr || !aligned(first_index, 8) || !valid(desc, staged, first_index)) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t status = cudaMemsetAsync(first_index, 0xFF, sizeof(unsigned long long), stream);
  if (status != cudaSuccess) {
    return status;
  }
  const unsigned grid =
      grid_for(static_cast<std::uint64_t>(desc.key_dim) * desc.value_dim * desc.num_heads);
  if (desc.staged_dtype == DType::f32) {
    find_non_finite_kernel<F32>
        <<<grid, kBlock, 0, stream>>>(desc, static_cast<const float*>(staged), first_index);
  } else {
    find_non_finite_kernel<Bf16>
        <<<grid, kBlock, 0, stream>>>(desc, static_cast<const std::uint16_t*>(staged), first_index);
  }
  return cudaGetLastError();
}

}  // namespace statepool::kernels::cuda
