#pragma once
// Runtime dispatch of the hot CPU loops (internal to statepool_kernels).
//
// The loops are plain C++ written to auto-vectorize. A portable x86-64 build only has
// SSE2, which lacks unsigned compares and 32->16-bit packs, so the conversions cost about
// twice as much as with AVX2. STATEPOOL_SIMD_CLONES compiles a function three times
// (x86-64-v4, i.e. AVX-512 F/BW/DQ/VL; AVX2; the baseline) and picks one at load time
// (GCC/Clang target_clones, an ELF ifunc). The v4 clone's 512-bit vectors made the fused
// stepquant step 1.1-1.3x faster than the AVX2 clone on an AVX-512 Xeon VM (alternating
// runs of bench_fused_step, 2026-12-03). The v4 and AVX2 targets enable FMA, but the library builds with
// -ffp-contract=off, so no multiply-add is fused: every clone performs the same IEEE
// operations and writes the same bytes.

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && \
    !defined(STATEPOOL_NO_SIMD_CLONES)
#if __has_attribute(target_clones)
#define STATEPOOL_SIMD_CLONES [[gnu::target_clones("arch=x86-64-v4", "avx2", "default")]]
#endif
#endif

#ifndef STATEPOOL_SIMD_CLONES
#define STATEPOOL_SIMD_CLONES
#endif

// Clang does not clone templates: cloned entry points are plain functions that call a
// template body forced inline (so that it is compiled for each clone's target).
#if defined(__GNUC__)
#define STATEPOOL_FORCE_INLINE [[gnu::always_inline]] inline
#else
#define STATEPOOL_FORCE_INLINE inline
#endif

// Hand-written AVX2 loops (intrinsics, for what GCC does not vectorize well) sit behind
// STATEPOOL_KERNELS_AVX2 and are picked at run time with use_avx2_loops(), which says no
// when the CPU lacks AVX2 or STATEPOOL_KERNELS_PORTABLE is set (to anything but "0"): the
// tests run the portable loops that way too (docs/codecs.md).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(STATEPOOL_NO_SIMD_CLONES)
#define STATEPOOL_KERNELS_AVX2 1
#endif

namespace statepool::kernels::detail {
[[nodiscard]] bool use_avx2_loops() noexcept;
}  // namespace statepool::kernels::detail
