#pragma once
// Header-only, for tests that link statepool::client (the testing library itself does
// not): the client options that reach a daemon started by a test fixture.

#include <string>
#include <utility>

#include "statepool/client.hpp"
#include "statepool/testing/daemon.hpp"

namespace statepool::testing {

/// Options for connecting to `daemon` as `tenant` (empty: the daemon's default tenant),
/// with the client's default timeout.
inline client::Options client_options(const Daemon& daemon, std::string tenant = {}) {
  client::Options options;
  options.socket_path = daemon.socket_path();
  options.tenant = std::move(tenant);
  return options;
}

}  // namespace statepool::testing
