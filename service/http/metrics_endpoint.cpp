#include "http/metrics_endpoint.hpp"

#include <exception>
#include <string>
#include <utility>

namespace statepool::service {
namespace {

HttpReply text(unsigned status, std::string body) {
  HttpReply reply;
  reply.status = status;
  reply.content_type = "text/plain; charset=utf-8";
  reply.body = std::move(body);
  if (reply.body.empty() || reply.body.back() != '\n') reply.body += '\n';
  return reply;
}

}  // namespace

HttpReply MetricsEndpoint::refusal(unsigned status, const std::string& message) const {
  return text(status, message);
}

HttpReply MetricsEndpoint::handle(std::string_view method, std::string_view target,
                                  std::string_view) const {
  // The path without a query (Prometheus sends none; a browser may).
  const std::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics" && path != "/") {
    return text(404, "no " + clip(path, 200) +
                         " here: the metrics are at /metrics, the probes at /healthz and /readyz");
  }
  if (method != "GET" && method != "HEAD") {
    HttpReply reply = text(405, "method " + clip(method, 16) + " is not allowed on " +
                                    std::string(path) + " (GET or HEAD)");
    reply.allow = "GET, HEAD";
    return reply;
  }
  if (path == "/") return text(200, "statepoold: the Prometheus metrics are at /metrics");
  try {
    HttpReply reply;
    reply.content_type = std::string(kPrometheusTextType);
    reply.body = metrics_.render();
    return reply;
  } catch (const std::exception& e) {
    return text(500, std::string("internal error: ") + e.what());
  }
}

}  // namespace statepool::service
