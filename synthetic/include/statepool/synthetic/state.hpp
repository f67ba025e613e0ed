#pragma once
// Synthetic but realistic recurrent states, for tests, demos and benchmarks: the gated
// delta rule of STEPQUANT.md run for a number of steps on seeded random inputs.
//
// Per step (FP32): S' = diag(exp(g)) S;  u = beta (v - S'^T k);  S = S' + k u^T, with
//   k: Gaussian with a per-head bias on a few key rows (row outliers), L2-normalised;
//   v: Gaussian times a per-column scale, a few columns 4-8x larger (column outliers);
//   beta = sigmoid(N(0, 1)) in (0, 1);
//   g <= 0: GDN draws one log-decay rate per head (log-uniform in [1e-3, 0.7], plus a
//   small per-step jitter); KDA draws one per key row.
// Deterministic for a given seed with a given toolchain (PortableNormal of random.hpp:
// std::mt19937_64 and its own Gaussian sampler).
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "statepool/kernels/layout.hpp"

namespace statepool::synthetic {

/// Fills `out` (key_dim * value_dim floats, row-major K x V) with the state of one GDN
/// head after `steps` steps. Throws std::invalid_argument if out.size() is wrong.
void synthetic_gdn_state(std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t steps,
                         std::uint64_t seed, std::span<float> out);

/// Same for one KDA head (one decay rate per key row).
void synthetic_kda_state(std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t steps,
                         std::uint64_t seed, std::span<float> out);

/// A whole staged state for `layout` (PageCodec::staged_bytes(dtype) bytes, dtype f32 or
/// bf16): every (layer, head) gets its own seed derived from `seed` and runs `steps`
/// steps of its architecture's recurrence; the conv state is Gaussian, stored in
/// layout.conv_dtype. Cost ~ 4 * layers * heads * K * V * steps flops. Throws
/// std::invalid_argument on an invalid layout or dtype.
[[nodiscard]] std::vector<std::byte> synthetic_staged_state(const kernels::StateLayout& layout,
                                                            std::uint32_t steps, std::uint64_t seed,
                                                            kernels::DType dtype);

}  // namespace statepool::synthetic
