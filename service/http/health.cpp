#include "http/health.hpp"

#include <string>

namespace statepool::service {
namespace {

std::string_view path_of(std::string_view target) noexcept {
  return target.substr(0, target.find('?'));
}

HttpReply text(unsigned status, std::string body) {
  HttpReply reply;
  reply.status = status;
  reply.content_type = "text/plain; charset=utf-8";
  reply.body = std::move(body);
  return reply;
}

}  // namespace

bool is_probe(std::string_view target) noexcept {
  const std::string_view path = path_of(target);
  return path == "/healthz" || path == "/readyz";
}

HttpReply probe_reply(std::string_view method, std::string_view target,
                      const std::atomic<bool>& draining) {
  const std::string_view path = path_of(target);
  if (method != "GET" && method != "HEAD") {
    HttpReply reply = text(405, "method " + clip(method, 16) + " is not allowed on " +
                                    std::string(path) + " (GET or HEAD)\n");
    reply.allow = "GET, HEAD";
    return reply;
  }
  if (path == "/healthz") return text(200, "ok\n");
  if (draining.load()) return text(503, "draining\n");
  return text(200, "ready\n");
}

}  // namespace statepool::service
