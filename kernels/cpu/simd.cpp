// The run-time choice of the hand-written AVX2 loops (simd.hpp).

#include "simd.hpp"

#include <cstdlib>
#include <cstring>

namespace statepool::kernels::detail {

bool use_avx2_loops() noexcept {
#if defined(STATEPOOL_KERNELS_AVX2)
  static const bool yes = [] {
    const char* portable = std::getenv("STATEPOOL_KERNELS_PORTABLE");
    if (portable != nullptr && *portable != '\0' && std::strcmp(portable, "0") != 0) return false;
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace statepool::kernels::detail
