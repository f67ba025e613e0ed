#pragma once
// The daemon's HTTP JSON API for capacity planning (docs/http-api.md):
//   GET  /v1        index of the endpoints
//   POST /v1/plan   the planner's report for a model's config.json (the body), with
//                   "fits_now" against the live pool
//   GET  /v1/fits   what fits now for a layout the pool holds arenas of
//
// Served by an HttpServer (http/server.hpp) on --api-address: request bodies up to
// kMaxModelConfigBytes (1 MiB; larger ones get 413). Replies are JSON; errors are
// {"error": "<message>"}.
//
// Who may ask: the API is an operator's tool; it answers about every tenant. It listens
// on loopback by default, and anywhere else only with --api-token-file, whose token
// every request must then carry (Authorization: Bearer TOKEN, 401 otherwise; checked
// after the header, before any body is read). A token may be set on loopback too, where
// every local user could otherwise ask (docs/http-api.md, "Access").
//
// Thread-safety: const; reads the pool through its thread-safe snapshots.

#include <cstddef>
#include <string>
#include <string_view>

#include "config/config.hpp"
#include "http/server.hpp"
#include "pool/pool.hpp"

namespace statepool::service {

class HttpApi final : public HttpService {
 public:
  HttpApi(const Config& config, const Pool& pool) : config_(config), pool_(pool) {}

  [[nodiscard]] std::string_view name() const noexcept override { return "HTTP API"; }
  [[nodiscard]] std::size_t max_body() const noexcept override;
  /// True when no --api-token-file is set, or `header` (the Authorization field) is
  /// "Bearer TOKEN" with the right token (compared in constant time).
  [[nodiscard]] bool authorized(std::string_view header) const noexcept override;
  [[nodiscard]] HttpReply refusal(unsigned status, const std::string& message) const override;
  /// Answers one request: routing, query parsing, the planner against the pool.
  [[nodiscard]] HttpReply handle(std::string_view method, std::string_view target,
                                 std::string_view body) const override;

 private:
  const Config& config_;
  const Pool& pool_;
};

}  // namespace statepool::service
