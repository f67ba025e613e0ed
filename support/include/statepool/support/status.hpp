#pragma once
// The error vocabulary of the daemon and the client library: the status of a request,
// one exception type carrying it, and EXPECTS-style checks that throw it.
//
// Status is the domain's own enum. The wire protocol has an enum of the same values
// (wire::Status in protocol/statepool.fbs); protocol/convert.hpp maps between the two in
// one place and proves at compile time that every value matches, so the pool, memory
// resources and executors depend on nothing generated.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace statepool {

/// How a request ended. docs/protocol.md section 6 says which requests send each one.
enum class Status : std::uint16_t {
  ok = 0,
  invalid_argument = 1,       // a field is out of range or inconsistent
  not_found = 2,              // no such layout, arena, staging buffer or plan digest
  quota_exceeded = 3,         // a per-tenant or per-connection limit would be exceeded
  pool_exhausted = 4,         // no capacity left in the daemon, or the OS/driver refused memory
  not_owner = 5,              // the slot belongs to another lease (or holds a snapshot)
  unsupported_version = 6,    // no common protocol version
  protocol_error = 7,         // malformed frame or message, unknown body type, missing body
  lease_busy = 8,             // the lease token is held by another live connection
  unknown_tenant = 9,         // the tenant is not configured
  permission_denied = 10,     // the peer or its tenant may not do this
  draining = 11,              // reserved, never sent: a draining daemon closes connections
  not_finite = 12,            // a state or KV block to compress contains NaN or Inf
  internal = 13,              // a bug or an operating-system failure in the daemon
  not_hello = 14,             // the first request of a connection must be Hello
  too_many_connections = 15,  // a connection limit, or no file descriptor left; retry later
  in_use = 16,                // the arena still has pages held, pinned or busy snapshots
};

/// The highest value of Status (the mapping's compile-time check walks 0..kMaxStatus).
inline constexpr std::uint16_t kMaxStatus = static_cast<std::uint16_t>(Status::in_use);

/// "ok", "invalid_argument", ... as in the protocol's schema; "unknown" for a value this
/// build does not know (a newer daemon's reply).
[[nodiscard]] const char* status_name(Status status) noexcept;

/// An error that maps one-to-one to a reply status. Thrown by the pool, codecs glue and
/// request handlers; the server turns it into an error reply, the client rethrows it.
class StatusError : public std::runtime_error {
 public:
  StatusError(Status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  [[nodiscard]] Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace statepool

/// Throws StatusError(status, message) when `cond` is false. `message` may be any
/// expression convertible to std::string; it is evaluated only on failure.
#define STATEPOOL_EXPECTS(cond, status, message)                      \
  do {                                                                \
    if (!(cond)) throw ::statepool::StatusError((status), (message)); \
  } while (false)
