// CUDA KV-cache stream encode / decode / non-finite scan (kv_kernels.hpp): thin
// __global__ entries whose item loops run kv_math.hpp's per-item functions, one thread
// per item (a group record, a 32-bit word of flat values), and the host launchers that
// check arguments and size the grid. Built with --fmad=false
// (kernels/CMakeLists.txt).

#include <cstdint>

#include "statepool/kernels/cuda/kv_kernels.hpp"
#include "statepool/kernels/cuda/kv_stream.hpp"
#include "statepool/kernels/kv_math.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::cuda {
namespace {

constexpr unsigned kBlock = 256;
constexpr std::uint32_t kMaxGridY = 65535;  // more streams: blocks loop over them
constexpr std::uint64_t kMaxGridX = 8192;   // longer streams: threads stride over items
constexpr unsigned long long kFinite = ~0ull;
// Encode: a group's 32 values stay in registers (each read once); 4 blocks per SM (64
// registers, half the SM's warps) keep 32 loads in flight per thread without a spill.
constexpr unsigned kEncodeBlocksPerSm = 4;

// Element access of the plain side (aligned device loads and stores).
struct LoadF32 {
  const float* p;
  STATEPOOL_HD float operator()(std::uint64_t i) const noexcept { return p[i]; }
};
struct LoadBf16 {
  const std::uint16_t* p;
  STATEPOOL_HD float operator()(std::uint64_t i) const noexcept { return bf16_bits_to_float(p[i]); }
};
struct LoadF16 {
  const std::uint16_t* p;
  STATEPOOL_HD float operator()(std::uint64_t i) const noexcept { return half_bits_to_float(p[i]); }
};
struct StoreF32 {
  float* p;
  STATEPOOL_HD void operator()(std::uint64_t i, float v) const noexcept { p[i] = v; }
};
struct StoreBf16 {
  std::uint16_t* p;
  STATEPOOL_HD void operator()(std::uint64_t i, float v) const noexcept {
    p[i] = float_to_bf16_bits(v);
  }
};
struct StoreF16 {
  std::uint16_t* p;
  STATEPOOL_HD void operator()(std::uint64_t i, float v) const noexcept {
    p[i] = float_to_half_bits(v);
  }
};

template <class Load, class Elem>
__global__ void __launch_bounds__(kBlock, kEncodeBlocksPerSm)
    kv_encode_kernel(KvBatchView v, const KvRole* roles, const void* const* plain,
                     void* const* encoded, const unsigned long long* skip, std::uint32_t count) {
  const std::uint32_t first = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t step = gridDim.x * blockDim.x;
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    if (skip != nullptr && skip[slot] != kFinite) {
      continue;
    }
    const KvGeometry g = kv_geometry(v.codec, roles[slot], v.tokens, v.channels);
    const KvItems it = kv_items(v.codec, g);
    const Load load{static_cast<const Elem*>(plain[slot])};
    kv_encode_thread(g, it, load, encoded[slot], first, step);
  }
}

template <class Store, class Elem>
__global__ void __launch_bounds__(kBlock)
    kv_decode_kernel(KvBatchView v, const KvRole* roles, const void* const* encoded,
                     void* const* plain, std::uint32_t count) {
  const std::uint32_t first = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t step = gridDim.x * blockDim.x;
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    const KvGeometry g = kv_geometry(v.codec, roles[slot], v.tokens, v.channels);
    const KvItems it = kv_items(v.codec, g);
    const Store store{static_cast<Elem*>(plain[slot])};
    kv_decode_thread(g, it, encoded[slot], store, first, step);
  }
}

template <class Load, class Elem>
__global__ void __launch_bounds__(kBlock)
    kv_find_kernel(KvBatchView v, const void* const* plain, unsigned long long* first_index,
                   std::uint32_t count) {
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t n = v.tokens * v.channels;
  for (std::uint32_t slot = blockIdx.y; slot < count; slot += gridDim.y) {
    const Load load{static_cast<const Elem*>(plain[slot])};
    // kernel-report: kv-find 1/1 io
    for (std::uint64_t i = first; i < n; i += step) {
      if (is_non_finite_bits(float_bits(load(i)))) {
        atomicMin(first_index + slot, static_cast<unsigned long long>(i));
        break;  // this thread's later indices are larger
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host side

dim3 grid(std::uint64_t items, std::uint32_t count) {
  std::uint64_t x = (items + kBlock - 1) / kBlock;
  x = x < kMaxGridX ? x : kMaxGridX;
  return {static_cast<unsigned>(x), count < kMaxGridY ? count : kMaxGridY, 1};
}

/// The most items one loop of a stream runs (group records or flat words), over both
/// roles (they differ under KIVI); at least 1 for a tail.
std::uint64_t max_items(const KvBatchView& v) {
  std::uint64_t most = 0;
  for (const KvRole role : {KvRole::keys, KvRole::values}) {
    const KvItems it = kv_items(v.codec, kv_geometry(v.codec, role, v.tokens, v.channels));
    most = it.groups > most ? it.groups : most;
    most = it.words > most ? it.words : most;
    most = it.tail != 0 && most == 0 ? 1 : most;
  }
  return most;
}

}  // namespace

const char* kv_view_problem(const KvBatchView& v) noexcept {
  if (kv_code_bits(v.codec) == 0) {
    return "unknown KV codec";
  }
  if (v.dtype != DType::f32 && v.dtype != DType::bf16 && v.dtype != DType::f16) {
    return "plain values must be f32, bf16 or f16";
  }
  if (v.channels > kKvMaxChannels) {  // the group walks divide 32-bit (kv_math.hpp)
    return "too many channels";
  }
  std::uint64_t values = 0;
  std::uint64_t bytes = 0;
  // Generous bound: 20 B per value covers every codec's bytes (a partial group of one).
  if (__builtin_mul_overflow(v.tokens, v.channels, &values) ||
      __builtin_mul_overflow(values, std::uint64_t{20}, &bytes)) {
    return "too many values";
  }
  return nullptr;
}

cudaError_t kv_encode_streams(const KvBatchView& view, const KvRole* roles,
                              const void* const* plain, void* const* encoded, std::uint32_t count,
                              const unsigned long long* skip, cudaStream_t stream) noexcept {
  if (kv_view_problem(view) != nullptr || roles == nullptr || plain == nullptr ||
      encoded == nullptr) {
    return cudaErrorInvalidValue;
  }
  const std::uint64_t items = max_items(view);
  if (count == 0 || items == 0) {
    return cudaSuccess;
  }
  const dim3 g = grid(items, count);
  switch (view.dtype) {
    case DType::f32:
      kv_encode_kernel<LoadF32, float>
          <<<g, kBlock, 0, stream>>>(view, roles, plain, encoded, skip, count);
      break;
    case DType::bf16:
      kv_encode_kernel<LoadBf16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, roles, plain, encoded, skip, count);
      break;
    case DType::f16:
      kv_encode_kernel<LoadF16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, roles, plain, encoded, skip, count);
      break;
  }
  return cudaGetLastError();
}

cudaError_t kv_decode_streams(const KvBatchView& view, const KvRole* roles,
                              const void* const* encoded, void* const* plain, std::uint32_t count,
                              cudaStream_t stream) noexcept {
  if (kv_view_problem(view) != nullptr || roles == nullptr || plain == nullptr ||
      encoded == nullptr) {
    return cudaErrorInvalidValue;
  }
  const std::uint64_t items = max_items(view);
  if (count == 0 || items == 0) {
    return cudaSuccess;
  }
  const dim3 g = grid(items, count);
  switch (view.dtype) {
    case DType::f32:
      kv_decode_kernel<StoreF32, float>
          <<<g, kBlock, 0, stream>>>(view, roles, encoded, plain, count);
      break;
    case DType::bf16:
      kv_decode_kernel<StoreBf16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, roles, encoded, plain, count);
      break;
    case DType::f16:
      kv_decode_kernel<StoreF16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, roles, encoded, plain, count);
      break;
  }
  return cudaGetLastError();
}

cudaError_t kv_find_non_finite_streams(const KvBatchView& view, const void* const* plain,
                                       std::uint32_t count, unsigned long long* first_index,
                                       cudaStream_t stream) noexcept {
  if (kv_view_problem(view) != nullptr || plain == nullptr || first_index == nullptr ||
      reinterpret_cast<std::uintptr_t>(first_index) % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) {
    return cudaSuccess;
  }
  // Every entry starts at UINT64_MAX (all bytes 0xFF); the blocks lower it.
  const cudaError_t status =
      cudaMemsetAsync(first_index, 0xFF, sizeof(unsigned long long) * count, stream);
  if (status != cudaSuccess) {
    return status;
  }
  const std::uint64_t n = view.tokens * view.channels;
  if (n == 0) {
    return cudaSuccess;
  }
  const dim3 g = grid(n, count);
  switch (view.dtype) {
    case DType::f32:
      kv_find_kernel<LoadF32, float><<<g, kBlock, 0, stream>>>(view, plain, first_index, count);
      break;
    case DType::bf16:
      kv_find_kernel<LoadBf16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, plain, first_index, count);
      break;
    case DType::f16:
      kv_find_kernel<LoadF16, std::uint16_t>
          <<<g, kBlock, 0, stream>>>(view, plain, first_index, count);
      break;
  }
  return cudaGetLastError();
}

}  // namespace statepool::kernels::cuda
