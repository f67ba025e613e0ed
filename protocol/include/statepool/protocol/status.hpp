#pragma once
// The error vocabulary shared by the daemon and the client library: one exception type
// carrying a wire status code, and EXPECTS-style checks that throw it with file:line.

#include <stdexcept>
#include <string>

#include "statepool_generated.h"

namespace statepool {

using Status = wire::Status;

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
