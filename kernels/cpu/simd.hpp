#pragma once
// Runtime dispatch of the hot CPU loops (internal to statepool_kernels).
//
// The loops are plain C++ written to auto-vectorize. A portable x86-64 build only has
// SSE2, which lacks unsigned compares and 32->16-bit packs, so the conversions cost about
// twice as much as with AVX2. STATEPOOL_SIMD_CLONES compiles a function twice (AVX2 and
// the baseline) and picks one at load time (GCC/Clang target_clones, an ELF ifunc).
// AVX2 alone does not enable FMA, and the library builds with -ffp-contract=off, so both
// clones perform the same IEEE operations and write the same bytes.

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && \
    !defined(STATEPOOL_NO_SIMD_CLONES)
#if __has_attribute(target_clones)
#define STATEPOOL_SIMD_CLONES [[gnu::target_clones("avx2", "default")]]
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
