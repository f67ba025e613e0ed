#pragma once
// The daemon's side of systemd's service protocol, through libsystemd:
//
// - notify(): state changes for a Type=notify unit (sd_notify(3)). The daemon sends
//   READY=1 once its socket listens (main.cpp), so units ordered After=statepoold.service
//   start only when a connect() succeeds, and STOPPING=1 when a drain starts
//   (Server::begin_drain), with EXTEND_TIMEOUT_USEC covering --drain-timeout.
// - passed_socket(): a listening socket handed over by a socket unit (sd_listen_fds(3)),
//   which the daemon serves instead of creating one. systemd keeps it open across
//   restarts, so connects that arrive while the daemon restarts wait in its backlog
//   instead of being refused.
//
// Outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS in the environment) both do nothing.
// deploy/systemd/ holds the units; docs/operations.md §10 describes them.

#include <string>

namespace statepool::service::systemd {

/// Sends `state` (newline-separated assignments, "READY=1\nSTATUS=...") to the service
/// manager. Returns whether one received it; a failure to send is logged at WARN, never
/// thrown.
bool notify(const std::string& state) noexcept;
/// notify(), then waits (at most 5 s, sd_notify_barrier(3)) until the service manager has
/// processed it: for MAINPID= before this process exits (the hand-over).
bool notify_and_wait(const std::string& state) noexcept;

/// The listening Unix stream socket that a socket unit passed for `path`, or -1 when the
/// daemon was started without one. The descriptor is the caller's from then on. Throws
/// std::runtime_error, naming what was passed, when systemd passed anything else: more
/// than one descriptor, or one that is not a listening Unix stream socket bound to
/// `path` (the socket unit's ListenStream= and the daemon's --socket must agree).
[[nodiscard]] int passed_socket(const std::string& path);

}  // namespace statepool::service::systemd
