#include "statepool/kernels/recurrence.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "simd.hpp"
#include "step_internal.hpp"

namespace statepool::kernels {

float decay_factor(float g) noexcept {
  return detail::decay_factor_body(g);
}

namespace detail {

STATEPOOL_SIMD_CLONES void step_head_gdn(float* state, std::uint32_t key_dim,
                                         std::uint32_t value_dim, const float* q, const float* k,
                                         const float* v, float log_decay, float beta,
                                         float* residual, float* out) noexcept {
  const float d = decay_factor(log_decay);
  const auto decay = [d](std::size_t) { return d; };
  if (value_dim == 128) {
    step_head(state, key_dim, 128, q, k, v, decay, beta, residual, out);
  } else {
    step_head(state, key_dim, value_dim, q, k, v, decay, beta, residual, out);
  }
}

STATEPOOL_SIMD_CLONES void step_head_kda(float* state, std::uint32_t key_dim,
                                         std::uint32_t value_dim, const float* q, const float* k,
                                         const float* v, const float* log_decay, float beta,
                                         float* residual, float* out) noexcept {
  const auto decay = [log_decay](std::size_t i) { return decay_factor(log_decay[i]); };
  if (value_dim == 128) {
    step_head(state, key_dim, 128, q, k, v, decay, beta, residual, out);
  } else {
    step_head(state, key_dim, value_dim, q, k, v, decay, beta, residual, out);
  }
}

}  // namespace detail

namespace {

void check_size(const char* name, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw std::invalid_argument(std::string("recurrence: ") + name + " has " + std::to_string(got) +
                                " values, expected " + std::to_string(expected));
  }
}

void check_sizes(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
                 std::span<const float> q, std::span<const float> k, std::span<const float> v,
                 std::span<float> residual, std::span<float> out) {
  const std::size_t K = key_dim;
  const std::size_t V = value_dim;
  check_size("state", state.size(), K * V);
  check_size("q", q.size(), K);
  check_size("k", k.size(), K);
  check_size("v", v.size(), V);
  check_size("residual", residual.size(), V);
  if (!out.empty()) {
    check_size("out", out.size(), V);
  }
}

}  // namespace

void gdn_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              float log_decay, float beta, std::span<float> residual, std::span<float> out) {
  check_sizes(state, key_dim, value_dim, q, k, v, residual, out);
  detail::step_head_gdn(state.data(), key_dim, value_dim, q.data(), k.data(), v.data(), log_decay,
                        beta, residual.data(), out.empty() ? nullptr : out.data());
}

void kda_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> log_decay, float beta, std::span<float> residual,
              std::span<float> out) {
  check_size("log_decay", log_decay.size(), key_dim);
  check_sizes(state, key_dim, value_dim, q, k, v, residual, out);
  detail::step_head_kda(state.data(), key_dim, value_dim, q.data(), k.data(), v.data(),
                        log_decay.data(), beta, residual.data(),
                        out.empty() ? nullptr : out.data());
}

void normalize_qk(std::span<float> q, std::span<float> k) {
  check_size("k", k.size(), q.size());
  const auto scale_to = [](std::span<float> x, double target) {
    double norm2 = 0.0;
    for (const float value : x) {
      norm2 += static_cast<double>(value) * value;
    }
    if (norm2 <= 0.0) {
      return;
    }
    const auto factor = static_cast<float>(target / std::sqrt(norm2));
    for (float& value : x) {
      value *= factor;
    }
  };
  scale_to(q, 1.0 / std::sqrt(static_cast<double>(q.size())));
  scale_to(k, 1.0);
}

}  // namespace statepool::kernels
