#include "statepool/synthetic/state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "statepool/calibration/seed.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/synthetic/random.hpp"

namespace statepool::synthetic {
namespace {

using calibration::mix_seed;
using kernels::Arch;
using kernels::DType;

// log-decay rate, log-uniform magnitude in [1e-3, 0.7]: slow units keep their state
// (and their errors) for thousands of steps, fast ones forget within a few.
float draw_log_decay(PortableNormal& rng) {
  const double lo = std::log(1e-3);
  const double hi = std::log(0.7);
  return static_cast<float>(-std::exp(lo + (hi - lo) * rng.uniform()));
}

void run_recurrence(std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t steps,
                    std::uint64_t seed, bool per_row_decay, std::span<float> out) {
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  if (out.size() != K * V) {
    throw std::invalid_argument("synthetic state: output has " + std::to_string(out.size()) +
                                " floats, expected " + std::to_string(K * V));
  }
  PortableNormal rng(seed);

  std::vector<float> log_decay(K, draw_log_decay(rng));
  if (per_row_decay) {
    for (auto& g : log_decay) {
      g = draw_log_decay(rng);
    }
  }
  std::vector<float> key_bias(K, 0.0f);
  for (std::size_t r = 0; r < std::max<std::size_t>(1, K / 32); ++r) {
    const float sign = rng.below(2) == 0 ? 1.0f : -1.0f;
    key_bias[rng.below(K)] = sign * static_cast<float>(2.0 + 2.0 * rng.uniform());
  }
  std::vector<float> column_scale(V);
  for (auto& c : column_scale) {
    c = std::exp(0.3f * rng.next());
  }
  for (std::size_t r = 0; r < std::max<std::size_t>(1, V / 32); ++r) {
    column_scale[rng.below(V)] *= static_cast<float>(4.0 + 4.0 * rng.uniform());
  }

  std::fill(out.begin(), out.end(), 0.0f);
  std::vector<float> k(K);
  std::vector<float> decay(K);
  std::vector<float> u(V);
  float* S = out.data();
  for (std::uint32_t t = 0; t < steps; ++t) {
    double norm = 0.0;
    for (std::size_t i = 0; i < K; ++i) {
      k[i] = rng.next() + key_bias[i];
      norm += static_cast<double>(k[i]) * k[i];
    }
    const auto inv_norm = static_cast<float>(1.0 / std::sqrt(std::max(norm, 1e-30)));
    const float jitter = std::exp(0.25f * rng.next());
    for (std::size_t i = 0; i < K; ++i) {
      k[i] *= inv_norm;
      decay[i] = std::exp(log_decay[i] * jitter);
    }
    const float beta = 1.0f / (1.0f + std::exp(-rng.next()));

    // S' = diag(d) S, and u = beta (v - S'^T k) accumulated row by row.
    std::fill(u.begin(), u.end(), 0.0f);
    for (std::size_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float d = decay[i];
      const float ki = k[i];
      for (std::size_t j = 0; j < V; ++j) {
        row[j] *= d;
        u[j] += row[j] * ki;
      }
    }
    for (std::size_t j = 0; j < V; ++j) {
      u[j] = beta * (rng.next() * column_scale[j] - u[j]);
    }
    // S = S' + k u^T
    for (std::size_t i = 0; i < K; ++i) {
      float* row = S + i * V;
      const float ki = k[i];
      for (std::size_t j = 0; j < V; ++j) {
        row[j] += ki * u[j];
      }
    }
  }
}

// Staged values are little-endian, as every host statepool builds for is.
void store_value(std::byte* dst, std::size_t i, float value, DType dtype) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst + 4 * i, &value, 4); return;
    case DType::bf16: {
      const std::uint16_t bits = kernels::float_to_bf16_bits(value);
      std::memcpy(dst + 2 * i, &bits, 2);
      return;
    }
    case DType::f16: {
      const std::uint16_t bits = kernels::float_to_half_bits(value);
      std::memcpy(dst + 2 * i, &bits, 2);
      return;
    }
  }
}

}  // namespace

void synthetic_gdn_state(std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t steps,
                         std::uint64_t seed, std::span<float> out) {
  run_recurrence(key_dim, value_dim, steps, seed, false, out);
}

void synthetic_kda_state(std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t steps,
                         std::uint64_t seed, std::span<float> out) {
  run_recurrence(key_dim, value_dim, steps, seed, true, out);
}

std::vector<std::byte> synthetic_staged_state(const kernels::StateLayout& layout,
                                              std::uint32_t steps, std::uint64_t seed,
                                              DType dtype) {
  if (const std::string problem = kernels::validate(layout); !problem.empty()) {
    throw std::invalid_argument("synthetic state: invalid layout: " + problem);
  }
  if (dtype != DType::f32 && dtype != DType::bf16) {
    throw std::invalid_argument(
        std::string("synthetic state: staged dtype must be f32 or bf16, got ") +
        kernels::to_string(dtype));
  }
  const std::size_t n = std::size_t{layout.key_dim} * layout.value_dim;
  const std::size_t heads = std::size_t{layout.num_layers} * layout.num_heads;
  const std::size_t conv_values =
      std::size_t{layout.num_layers} * layout.conv_channels * layout.conv_width;
  const std::size_t recurrent = heads * n * kernels::dtype_bytes(dtype);
  std::vector<std::byte> staged(recurrent + conv_values * kernels::dtype_bytes(layout.conv_dtype));

  std::vector<float> head(n);
  for (std::size_t index = 0; index < heads; ++index) {
    const std::uint64_t head_seed = mix_seed(seed ^ mix_seed(index));
    run_recurrence(layout.key_dim, layout.value_dim, steps, head_seed, layout.arch == Arch::kda,
                   head);
    std::byte* dst = staged.data() + index * n * kernels::dtype_bytes(dtype);
    for (std::size_t i = 0; i < n; ++i) {
      store_value(dst, i, head[i], dtype);
    }
  }
  PortableNormal rng(mix_seed(seed ^ 0xC0117u));
  for (std::size_t i = 0; i < conv_values; ++i) {
    store_value(staged.data() + recurrent, i, 0.5f * rng.next(), layout.conv_dtype);
  }
  return staged;
}

}  // namespace statepool::synthetic
