#pragma once
// Seed derivation shared by calibration and testing/ (public): splitmix64's finaliser, so
// that related seeds (layer, head, stream) give unrelated random streams.

#include <cstdint>

namespace statepool::calibration {

constexpr std::uint64_t mix_seed(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace statepool::calibration
