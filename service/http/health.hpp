#pragma once
// Probes for service managers and orchestrators (Kubernetes liveness and readiness),
// answered by every HttpServer (--metrics-address and --api-address) before the
// service's authorization, so a probe needs no API token and reveals nothing but these
// two states:
//
//   GET /healthz  200 "ok" while the daemon's event loop answers, draining or not.
//   GET /readyz   200 "ready" while the daemon accepts connections on its socket;
//                 503 "draining" from the moment a drain starts (SIGTERM, SIGINT, or a
//                 Drain request), so that endpoints stop routing new engines to it.
//
// HEAD is answered like GET; another method gets 405. A query string is ignored.

#include <atomic>
#include <string_view>

#include "http/server.hpp"

namespace statepool::service {

/// Whether `target` names a probe (/healthz or /readyz, with or without a query).
[[nodiscard]] bool is_probe(std::string_view target) noexcept;

/// The answer to a probe; `draining` is the daemon's drain flag.
[[nodiscard]] HttpReply probe_reply(std::string_view method, std::string_view target,
                                    const std::atomic<bool>& draining);

}  // namespace statepool::service
