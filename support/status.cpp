#include "statepool/support/status.hpp"

namespace statepool {

const char* status_name(Status status) noexcept {
  switch (status) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid_argument";
    case Status::not_found: return "not_found";
    case Status::quota_exceeded: return "quota_exceeded";
    case Status::pool_exhausted: return "pool_exhausted";
    case Status::not_owner: return "not_owner";
    case Status::unsupported_version: return "unsupported_version";
    case Status::protocol_error: return "protocol_error";
    case Status::lease_busy: return "lease_busy";
    case Status::unknown_tenant: return "unknown_tenant";
    case Status::permission_denied: return "permission_denied";
    case Status::draining: return "draining";
    case Status::not_finite: return "not_finite";
    case Status::internal: return "internal";
    case Status::not_hello: return "not_hello";
    case Status::too_many_connections: return "too_many_connections";
    case Status::in_use: return "in_use";
  }
  return "unknown";
}

}  // namespace statepool
