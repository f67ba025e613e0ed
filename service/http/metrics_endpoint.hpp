#pragma once
// The Prometheus endpoint: GET /metrics on --metrics-address, the text exposition format
// (version 0.0.4) of Metrics::render(), served by an HttpServer (http/server.hpp) on the
// daemon's io_context. "/" answers a line that points at /metrics; every other path is
// 404 (the probes /healthz and /readyz are the HttpServer's: http/health.hpp), every
// method but GET and HEAD 405. No request has a body.
//
// It serves until the daemon stops: during a drain Prometheus still sees
// statepool_draining 1 and the connections going.
//
// Thread-safety: const; Metrics::render() is thread-safe.

#include <cstddef>
#include <string>
#include <string_view>

#include "http/server.hpp"
#include "metrics/metrics.hpp"

namespace statepool::service {

/// Content-Type of the text exposition format.
inline constexpr std::string_view kPrometheusTextType = "text/plain; version=0.0.4; charset=utf-8";

class MetricsEndpoint final : public HttpService {
 public:
  explicit MetricsEndpoint(const Metrics& metrics) : metrics_(metrics) {}

  [[nodiscard]] std::string_view name() const noexcept override { return "metrics endpoint"; }
  [[nodiscard]] std::size_t max_body() const noexcept override { return 0; }
  [[nodiscard]] bool authorized(std::string_view) const noexcept override { return true; }
  [[nodiscard]] HttpReply refusal(unsigned status, const std::string& message) const override;
  [[nodiscard]] HttpReply handle(std::string_view method, std::string_view target,
                                 std::string_view body) const override;

 private:
  const Metrics& metrics_;
};

}  // namespace statepool::service
