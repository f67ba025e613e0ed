#pragma once
// The work of one thread of the KV stream kernels (kv_kernels.cu), written for the device
// and the host alike, so that the host emulation (tests/kernels/test_device_kv_emulation.cpp)
// runs the kernels' own loops: thread `first` of a grid `step` threads wide takes the
// group records first, first + step, ... with a group cursor (no division per record),
// then the flat words the same way; thread 0 writes the stream's tail. Word access
// where the stream starts 4-byte aligned (kv_math.hpp, "Alignment"), else by the byte.
// The per-item arithmetic is kv_math.hpp's, which the CPU codecs share.
//
// Thread-safety: pure functions of their inputs; threads of one stream write disjoint
// bytes.

#include <cstdint>

#include "statepool/kernels/kv_math.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels::cuda {
namespace kv_detail {

// Word access to an encoded stream whose first byte is 4-byte aligned (kv_math.hpp,
// "Alignment": every record and flat word is then a 32-bit word).
struct WordsOut {
  std::uint32_t* p;
  STATEPOOL_HD void word(std::uint64_t i, std::uint32_t w) const noexcept { p[i] = w; }
};
struct WordsIn {
  const std::uint32_t* p;
  STATEPOOL_HD std::uint32_t word(std::uint64_t i) const noexcept { return p[i]; }
};

STATEPOOL_HD inline bool word_aligned(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 4 == 0;
}

// The item loops of one stream. Threads start at `first` (their index in the grid's x
// dimension, < 2^21) and stride by `step` (the grid's width); the group loops keep a
// cursor instead of dividing per record.

template <std::uint32_t Bits, class Load, class Out>
STATEPOOL_HD void encode_groups(const KvGeometry& g, const KvItems& it, const Load& load,
                                const Out& out, std::uint32_t first, std::uint32_t step) {
  const KvGroupWalk walk = kv_group_walk(g, step);
  KvGroupCursor c = kv_group_cursor(walk, first);
  // kernel-report: kivi-encode 32/37 io
  for (std::uint64_t r = first; r < it.groups; r += step) {
    kv_encode_group<Bits>(load, kv_group_span(g, c), out, r * (1 + Bits));
    kv_group_advance(c, walk);
  }
}

template <KvFlatFormat F, class Load, class Out>
STATEPOOL_HD void encode_flat16(const KvItems& it, const Load& load, const Out& out,
                                std::uint32_t first, std::uint32_t step) {
  // kernel-report: kv16-encode 2/3 io
  for (std::uint64_t w = first; w < it.words; w += step) {
    kv_encode_flat<F>(it, w, load, out);
  }
}

template <class Load, class Out>
STATEPOOL_HD void encode_fp8(const KvItems& it, const Load& load, const Out& out,
                             std::uint32_t first, std::uint32_t step) {
  // kernel-report: fp8-encode 4/5 io
  for (std::uint64_t w = first; w < it.words; w += step) {
    kv_encode_flat<KvFlatFormat::e4m3>(it, w, load, out);
  }
}

// A stream that is not 4-byte aligned (the API takes any alignment: e.g. streams packed
// back to back after an fp8 stream of an odd number of values): the same items, by the
// byte. Not a layout of the executors' aligned buffers; not marked as a hot loop.
template <class Load>
STATEPOOL_HD void encode_bytes(const KvGeometry& g, const KvItems& it, const Load& load,
                               const KvBytesOut& out, std::uint32_t first, std::uint32_t step) {
  const KvGroupWalk walk = kv_group_walk(g, step);
  KvGroupCursor c = kv_group_cursor(walk, first);
  for (std::uint64_t r = first; r < it.groups; r += step) {
    if (g.bits == 2) {
      kv_encode_group<2>(load, kv_group_span(g, c), out, r * 3);
    } else {
      kv_encode_group<4>(load, kv_group_span(g, c), out, r * 5);
    }
    kv_group_advance(c, walk);
  }
  for (std::uint64_t w = first; w < it.words; w += step) {
    switch (it.format) {
      case KvFlatFormat::bf16: kv_encode_flat<KvFlatFormat::bf16>(it, w, load, out); break;
      case KvFlatFormat::fp16: kv_encode_flat<KvFlatFormat::fp16>(it, w, load, out); break;
      case KvFlatFormat::e4m3: kv_encode_flat<KvFlatFormat::e4m3>(it, w, load, out); break;
    }
  }
}

template <std::uint32_t Bits, class In, class Store>
STATEPOOL_HD void decode_groups(const KvGeometry& g, const KvItems& it, const In& in,
                                const Store& store, std::uint32_t first, std::uint32_t step) {
  const KvGroupWalk walk = kv_group_walk(g, step);
  KvGroupCursor c = kv_group_cursor(walk, first);
  // kernel-report: kivi-decode 32/37 io
  for (std::uint64_t r = first; r < it.groups; r += step) {
    kv_decode_group<Bits>(in, r * (1 + Bits), kv_group_span(g, c), store);
    kv_group_advance(c, walk);
  }
}

template <KvFlatFormat F, class In, class Store>
STATEPOOL_HD void decode_flat16(const KvItems& it, const In& in, const Store& store,
                                std::uint32_t first, std::uint32_t step) {
  // kernel-report: kv16-decode 2/3 io
  for (std::uint64_t w = first; w < it.words; w += step) {
    kv_decode_flat<F>(it, w, in, store);
  }
}

template <class In, class Store>
STATEPOOL_HD void decode_fp8(const KvItems& it, const In& in, const Store& store,
                             std::uint32_t first, std::uint32_t step) {
  // kernel-report: fp8-decode 4/5 io
  for (std::uint64_t w = first; w < it.words; w += step) {
    kv_decode_flat<KvFlatFormat::e4m3>(it, w, in, store);
  }
}

// encode_bytes' counterpart.
template <class Store>
STATEPOOL_HD void decode_bytes(const KvGeometry& g, const KvItems& it, const KvBytesIn& in,
                               const Store& store, std::uint32_t first, std::uint32_t step) {
  const KvGroupWalk walk = kv_group_walk(g, step);
  KvGroupCursor c = kv_group_cursor(walk, first);
  for (std::uint64_t r = first; r < it.groups; r += step) {
    if (g.bits == 2) {
      kv_decode_group<2>(in, r * 3, kv_group_span(g, c), store);
    } else {
      kv_decode_group<4>(in, r * 5, kv_group_span(g, c), store);
    }
    kv_group_advance(c, walk);
  }
  for (std::uint64_t w = first; w < it.words; w += step) {
    switch (it.format) {
      case KvFlatFormat::bf16: kv_decode_flat<KvFlatFormat::bf16>(it, w, in, store); break;
      case KvFlatFormat::fp16: kv_decode_flat<KvFlatFormat::fp16>(it, w, in, store); break;
      case KvFlatFormat::e4m3: kv_decode_flat<KvFlatFormat::e4m3>(it, w, in, store); break;
    }
  }
}

}  // namespace kv_detail

/// Thread `first` (< 2^21) of a grid `step` threads wide encodes its items of one stream:
/// `load(i)` gives plain value i, `out` is the stream's first byte.
template <class Load>
STATEPOOL_HD void kv_encode_thread(const KvGeometry& g, const KvItems& it, const Load& load,
                                   void* out, std::uint32_t first, std::uint32_t step) noexcept {
  if (kv_detail::word_aligned(out)) {  // uniform across the grid
    const kv_detail::WordsOut words{static_cast<std::uint32_t*>(out)};
    if (g.bits == 2) {
      kv_detail::encode_groups<2>(g, it, load, words, first, step);
    } else if (g.bits == 4) {
      kv_detail::encode_groups<4>(g, it, load, words, first, step);
    }
    switch (it.format) {
      case KvFlatFormat::bf16:
        kv_detail::encode_flat16<KvFlatFormat::bf16>(it, load, words, first, step);
        break;
      case KvFlatFormat::fp16:
        kv_detail::encode_flat16<KvFlatFormat::fp16>(it, load, words, first, step);
        break;
      case KvFlatFormat::e4m3: kv_detail::encode_fp8(it, load, words, first, step); break;
    }
  } else {
    kv_detail::encode_bytes(g, it, load, KvBytesOut{static_cast<std::uint8_t*>(out)}, first, step);
  }
  if (first == 0) {
    kv_encode_tail(it, load, KvBytesOut{static_cast<std::uint8_t*>(out)});
  }
}

/// Thread `first` of a grid `step` threads wide decodes its items of one stream:
/// store(i, v) writes plain value i, `in` is the stream's first byte.
template <class Store>
STATEPOOL_HD void kv_decode_thread(const KvGeometry& g, const KvItems& it, const void* in,
                                   const Store& store, std::uint32_t first,
                                   std::uint32_t step) noexcept {
  if (kv_detail::word_aligned(in)) {  // uniform across the grid
    const kv_detail::WordsIn words{static_cast<const std::uint32_t*>(in)};
    if (g.bits == 2) {
      kv_detail::decode_groups<2>(g, it, words, store, first, step);
    } else if (g.bits == 4) {
      kv_detail::decode_groups<4>(g, it, words, store, first, step);
    }
    switch (it.format) {
      case KvFlatFormat::bf16:
        kv_detail::decode_flat16<KvFlatFormat::bf16>(it, words, store, first, step);
        break;
      case KvFlatFormat::fp16:
        kv_detail::decode_flat16<KvFlatFormat::fp16>(it, words, store, first, step);
        break;
      case KvFlatFormat::e4m3: kv_detail::decode_fp8(it, words, store, first, step); break;
    }
  } else {
    kv_detail::decode_bytes(g, it, KvBytesIn{static_cast<const std::uint8_t*>(in)}, store, first,
                            step);
  }
  if (first == 0) {
    kv_decode_tail(it, KvBytesIn{static_cast<const std::uint8_t*>(in)}, store);
  }
}

}  // namespace statepool::kernels::cuda
