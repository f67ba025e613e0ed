#pragma once
// The fused decode step's test inputs and its unfused oracle, shared by the kernel tests
// (tests/kernels/test_fused_step.cpp) and the client's (tests/integration/
// decode_step_test.cpp): seeded q, k, v, gates and beta for a batch, and "decode the
// layer's heads, step each with kernels::gdn_step / kda_step, encode them" on one page.
//
// Thread-safety: pure functions; a StepBatch belongs to one thread.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/recurrence.hpp"
#include "statepool/synthetic/random.hpp"

namespace statepool::testing {

/// Inputs of one step for `batch` requests, seeded (q, k normalised; gates in [-0.7, 0]
/// with every 8th in [-40, 0]); owns the buffers kernels::StepInputs points to.
struct StepBatch {
  std::uint32_t batch = 0;
  std::uint32_t qk_heads = 0;
  std::vector<float> q, k, v, log_decay, beta, out;

  StepBatch(const kernels::StateLayout& l, std::uint32_t batch_size, std::uint32_t qk,
            std::uint64_t seed)
      : batch(batch_size), qk_heads(qk) {
    synthetic::PortableNormal rng(seed);
    const std::size_t B = batch;
    const std::size_t H = l.num_heads;
    const std::size_t K = l.key_dim;
    q.resize(B * qk * K);
    k.resize(B * qk * K);
    for (float& x : q) x = rng.next();
    for (float& x : k) x = rng.next();
    for (std::size_t i = 0; i < B * qk; ++i) {
      kernels::normalize_qk({q.data() + i * K, K}, {k.data() + i * K, K});
    }
    v.resize(B * H * l.value_dim);
    for (float& x : v) x = rng.next();
    log_decay.resize(B * H * (l.arch == kernels::Arch::kda ? K : 1u));
    // Mostly slow and moderate decay, every 8th gate a strong one (down to exp(-40):
    // tiny and subnormal state values).
    for (std::size_t i = 0; i < log_decay.size(); ++i) {
      const auto u = static_cast<float>(rng.uniform());
      log_decay[i] = i % 8 == 7 ? -40.0f * u : -0.7f * u;
    }
    beta.resize(B * H);
    for (float& x : beta) x = 1.0f / (1.0f + std::exp(-rng.next()));
    out.assign(B * H * l.value_dim, std::numeric_limits<float>::quiet_NaN());
  }

  [[nodiscard]] kernels::StepInputs view() {
    return {batch, qk_heads, q, k, v, log_decay, beta, out};
  }
};

/// The unfused path for request b of `in`: decode layer `layer`'s heads of `page`, step
/// each with kernels::gdn_step / kda_step, encode them back; writes o into `out`.
/// Returns false (page unchanged) when kernels::PageCodec refuses the new state as non-finite.
inline bool unfused_step(const kernels::PageCodec& codec, std::uint32_t layer,
                         std::span<std::byte> page, const StepBatch& in, std::uint32_t b,
                         std::span<float> out) {
  const kernels::StateLayout& l = codec.layout();
  const std::size_t H = l.num_heads;
  const std::size_t K = l.key_dim;
  const std::size_t V = l.value_dim;
  const std::size_t group = H / in.qk_heads;
  std::vector<std::byte> staged(codec.staged_bytes(kernels::DType::f32));
  const std::size_t first = std::size_t{layer} * H;
  codec.decode_heads(page, kernels::DType::f32, staged, first, first + H);
  std::vector<float> residual(V);
  for (std::size_t h = 0; h < H; ++h) {
    auto* values = reinterpret_cast<float*>(staged.data()) + (first + h) * K * V;
    const std::size_t item = b * H + h;
    const std::size_t qk = b * in.qk_heads + h / group;
    const std::span<float> state(values, K * V);
    const std::span<const float> q(in.q.data() + qk * K, K);
    const std::span<const float> k(in.k.data() + qk * K, K);
    const std::span<const float> v(in.v.data() + item * V, V);
    const std::span<float> o = out.subspan(item * V, V);
    if (l.arch == kernels::Arch::kda) {
      kernels::kda_step(state, l.key_dim, l.value_dim, q, k, v, {in.log_decay.data() + item * K, K},
                        in.beta[item], residual, o);
    } else {
      kernels::gdn_step(state, l.key_dim, l.value_dim, q, k, v, in.log_decay[item], in.beta[item],
                        residual, o);
    }
  }
  try {
    codec.check_finite(staged, kernels::DType::f32, first, first + H);
  } catch (const kernels::NonFiniteError&) {
    return false;
  }
  codec.encode_heads(staged, kernels::DType::f32, page, first, first + H);
  return true;
}

}  // namespace statepool::testing
