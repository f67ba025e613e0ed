#pragma once
// The page kernels run on the host: the block bodies of block_codec.hpp with a team of
// host threads in place of a CUDA thread block, over the same grid as the launchers of
// codec_kernels.hpp (every slot, every block), on host memory and a PageFormatTables
// view. This is how the CPU tests check, without a GPU or nvcc, that the code the GPU
// runs writes PageCodec's bytes, for a team of one rank and for teams of several ranks
// that really run concurrently (so that a missing sync() or two ranks writing the same
// byte show up).
//
// Thread-safety: the emulate_* functions may run concurrently on different buffers.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

#include "statepool/kernels/cuda/block_codec.hpp"
#include "statepool/kernels/cuda/block_step.hpp"
#include "statepool/kernels/cuda/page_format.hpp"

namespace statepool::kernels::cuda {

/// One rank: sync() has nothing to wait for.
struct SerialTeam {
  [[nodiscard]] unsigned rank() const noexcept { return 0; }
  [[nodiscard]] unsigned size() const noexcept { return 1; }
  void sync() const noexcept {}
  void atomic_min(unsigned long long* p, unsigned long long v) const noexcept {
    std::atomic_ref<unsigned long long> target(*p);
    unsigned long long seen = target.load();
    while (v < seen && !target.compare_exchange_weak(seen, v)) {
    }
  }
};

/// Rank `rank` of `size` host threads that share `barrier`.
struct ThreadTeam {
  unsigned rank_;
  unsigned size_;
  std::barrier<>* barrier_;

  [[nodiscard]] unsigned rank() const noexcept { return rank_; }
  [[nodiscard]] unsigned size() const noexcept { return size_; }
  void sync() const { barrier_->arrive_and_wait(); }
  void atomic_min(unsigned long long* p, unsigned long long v) const noexcept {
    SerialTeam{}.atomic_min(p, v);
  }
};

/// Runs body(team) on `ranks` threads (ranks <= 1: on this thread with a SerialTeam).
/// The body runs every block of the grid in the same order on every rank, so each
/// rank's sync() calls pair up with the other ranks' calls of the same block.
template <class Body>
void run_team(unsigned ranks, const Body& body) {
  if (ranks <= 1) {
    body(SerialTeam{});
    return;
  }
  std::barrier<> barrier(static_cast<std::ptrdiff_t>(ranks));
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (unsigned r = 0; r < ranks; ++r) {
    threads.emplace_back([&body, &barrier, r, ranks] { body(ThreadTeam{r, ranks, &barrier}); });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
}

/// Calls fn.template operator()<Family>() with f's family (codec_family): the kernel
/// instance the device launches, so the host runs exactly the paths compiled into it.
template <class Fn>
void with_family(const PageFormatView& f, const Fn& fn) {
  switch (codec_family(f)) {
    case CodecFamily::floats: fn.template operator()<CodecFamily::floats>(); break;
    case CodecFamily::uniform: fn.template operator()<CodecFamily::uniform>(); break;
    case CodecFamily::stepquant_rows: fn.template operator()<CodecFamily::stepquant_rows>(); break;
    default: fn.template operator()<CodecFamily::stepquant>(); break;
  }
}

/// encode_pages on the host: staged[i] -> pages[i] for i < count, skipping slot i when
/// skip is not null and skip[i] != kAllFinite.
inline void emulate_encode_pages(const PageFormatView& f, const void* const* staged,
                                 void* const* pages, std::uint32_t count,
                                 const unsigned long long* skip, unsigned ranks) {
  std::vector<float> scratch(encode_scratch_floats(f));  // the block's shared memory
  with_family(f, [&]<CodecFamily Family>() {
    run_team(ranks, [&](const auto& team) {
      for (std::uint32_t slot = 0; slot < count; ++slot) {
        for (std::uint32_t block = 0; block < page_blocks(f); ++block) {
          const unsigned long long* s = skip != nullptr ? skip + slot : nullptr;
          float* shared = scratch.data();
          if (f.staged_dtype == DType::f32) {
            encode_block<StagedF32, Family>(team, f, staged[slot], pages[slot], s, block, shared);
          } else {
            encode_block<StagedBf16, Family>(team, f, staged[slot], pages[slot], s, block, shared);
          }
        }
      }
    });
  });
}

/// decode_pages on the host: pages[i] -> staged[i].
inline void emulate_decode_pages(const PageFormatView& f, const void* const* pages,
                                 void* const* staged, std::uint32_t count, unsigned ranks) {
  std::vector<float> scratch(decode_scratch_floats(f));  // the block's shared memory
  with_family(f, [&]<CodecFamily Family>() {
    run_team(ranks, [&](const auto& team) {
      for (std::uint32_t slot = 0; slot < count; ++slot) {
        for (std::uint32_t block = 0; block < page_blocks(f); ++block) {
          if (f.staged_dtype == DType::f32) {
            decode_block<StagedF32, Family>(team, f, pages[slot], staged[slot], block,
                                            scratch.data());
          } else {
            decode_block<StagedBf16, Family>(team, f, pages[slot], staged[slot], block,
                                             scratch.data());
          }
        }
      }
    });
  });
}

/// find_non_finite_pages on the host: first_index[i] <- the smallest flat index of a
/// NaN/Inf in staged[i]'s recurrent part, or kAllFinite.
inline void emulate_find_non_finite_pages(const PageFormatView& f, const void* const* staged,
                                          std::uint32_t count, unsigned long long* first_index,
                                          unsigned ranks) {
  std::fill(first_index, first_index + count, kAllFinite);
  run_team(ranks, [&](const auto& team) {
    for (std::uint32_t slot = 0; slot < count; ++slot) {
      for (std::uint32_t head = 0; head < f.head_count; ++head) {
        if (f.staged_dtype == DType::f32) {
          find_non_finite_block<StagedF32>(team, f, staged[slot], first_index + slot, head);
        } else {
          find_non_finite_block<StagedBf16>(team, f, staged[slot], first_index + slot, head);
        }
      }
    }
  });
}

/// The fused step kernel on the host: step_block for every (request, head) of `s`, the
/// same grid and family as fused_step_pages (step_kernels.hpp), one scratch shared by
/// the team.
inline void emulate_fused_step(const PageFormatView& f, const StepView& s, unsigned ranks) {
  std::vector<float> scratch(step_scratch_floats(f));
  unsigned long long flags[2] = {kAllFinite, kAllFinite};
  with_family(f, [&]<CodecFamily Family>() {
    run_team(ranks, [&](const auto& team) {
      for (std::uint32_t request = 0; request < s.batch; ++request) {
        for (std::uint32_t h = 0; h < s.num_heads; ++h) {
          step_block<Family>(team, f, s, scratch.data(), flags, request, h);
        }
      }
    });
  });
}

}  // namespace statepool::kernels::cuda
