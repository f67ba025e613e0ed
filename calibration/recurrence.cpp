#include "statepool/calibration/recurrence.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace statepool::calibration {
namespace {

void check_size(const char* name, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw std::invalid_argument(std::string("recurrence: ") + name + " has " + std::to_string(got) +
                                " values, expected " + std::to_string(expected));
  }
}

// decay(i) gives exp(g) of row i; one template for both gate shapes keeps GDN's scalar in a
// register.
template <typename Decay>
void step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
          std::span<const float> q, std::span<const float> k, std::span<const float> v, Decay decay,
          float beta, std::span<float> residual, std::span<float> out) {
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
  float* S = state.data();
  float* u = residual.data();
  std::fill(residual.begin(), residual.end(), 0.0f);
  // S' = diag(d) S; S'^T k accumulated row by row.
  for (std::size_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    const float d = decay(i);
    const float ki = k[i];
    for (std::size_t j = 0; j < V; ++j) {
      row[j] *= d;
      u[j] += row[j] * ki;
    }
  }
  for (std::size_t j = 0; j < V; ++j) {
    u[j] = beta * (v[j] - u[j]);
  }
  if (!out.empty()) {
    std::fill(out.begin(), out.end(), 0.0f);
  }
  // S = S' + k u^T, then o = S^T q.
  for (std::size_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    const float ki = k[i];
    for (std::size_t j = 0; j < V; ++j) {
      row[j] += ki * u[j];
    }
    if (!out.empty()) {
      const float qi = q[i];
      float* o = out.data();
      for (std::size_t j = 0; j < V; ++j) {
        o[j] += row[j] * qi;
      }
    }
  }
}

}  // namespace

void gdn_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              float log_decay, float beta, std::span<float> residual, std::span<float> out) {
  const float d = std::exp(log_decay);
  step(
      state, key_dim, value_dim, q, k, v, [d](std::size_t) { return d; }, beta, residual, out);
}

void kda_step(std::span<float> state, std::uint32_t key_dim, std::uint32_t value_dim,
              std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> log_decay, float beta, std::span<float> residual,
              std::span<float> out) {
  check_size("log_decay", log_decay.size(), key_dim);
  step(
      state, key_dim, value_dim, q, k, v,
      [log_decay](std::size_t i) { return std::exp(log_decay[i]); }, beta, residual, out);
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

}  // namespace statepool::calibration
