#pragma once
// The daemon's side of systemd's service protocol, through libsystemd:
//
// - notify(): state changes for a Type=notify unit (sd_notify(3)). The daemon sends
//   READY=1 once its socket listens (main.cpp), so units ordered After=statepoold.service
//   start only when a connect() succeeds, and STOPPING=1 when a drain starts
//   (Server::begin_drain), with EXTEND_TIMEOUT_USEC covering --drain-timeout.
// - passed_fds(): the descriptors systemd passed at start (sd_listen_fds_with_names(3)):
//   a socket unit's listening socket, which the daemon serves instead of creating one
//   (passed_socket(); systemd keeps it open across restarts, so connects that arrive while
//   the daemon restarts wait in its backlog instead of being refused), and what the daemon
//   kept in the unit's file-descriptor store before it crashed (the crash journal,
//   server/crash_journal.hpp).
// - store_fd() / remove_stored_fd(): that store (FDSTORE=1, FDSTOREREMOVE=1; the unit's
//   FileDescriptorStoreMax= must leave room).
//
// Outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS in the environment) all do nothing.
// deploy/systemd/ holds the units; docs/operations.md §10 describes them.

#include <string>
#include <vector>

#include "statepool/support/unique_fd.hpp"

namespace statepool::service::systemd {

/// Sends `state` (newline-separated assignments, "READY=1\nSTATUS=...") to the service
/// manager. Returns whether one received it; a failure to send is logged at WARN, never
/// thrown.
bool notify(const std::string& state) noexcept;
/// notify(), then waits (at most 5 s, sd_notify_barrier(3)) until the service manager has
/// processed it: for MAINPID= before this process exits (the hand-over).
bool notify_and_wait(const std::string& state) noexcept;
/// Waits (at most 5 s, sd_notify_barrier(3)) until the service manager has processed every
/// notification sent so far (FDSTORE=1 before a journal that relies on it). Returns
/// whether it confirmed; a failure is logged at WARN.
bool barrier() noexcept;

/// Whether a service manager listens for notifications (NOTIFY_SOCKET is set).
[[nodiscard]] bool has_service_manager() noexcept;

/// A descriptor systemd passed at start, with its name (LISTEN_FDNAMES: a socket unit's
/// FileDescriptorName=, or the FDNAME= it was stored under).
struct PassedFd {
  std::string name;
  support::UniqueFd fd;
};

/// Every descriptor passed with LISTEN_FDS, in order; none outside systemd. Clears
/// LISTEN_FDS and LISTEN_FDNAMES, so nothing the daemon starts inherits them. Throws
/// std::runtime_error when they cannot be read.
[[nodiscard]] std::vector<PassedFd> passed_fds();

/// Takes the listening socket out of `passed` (the socket unit's, for `path`): an invalid
/// descriptor when none of them is a socket. Throws std::runtime_error, naming what was
/// passed, for more than one socket, or one that is not a listening Unix stream socket
/// bound to `path` (the socket unit's ListenStream= and the daemon's --socket must agree).
[[nodiscard]] support::UniqueFd passed_socket(const std::string& path,
                                              std::vector<PassedFd>& passed);

/// Asks the service manager to keep a copy of `fd` under `name` (FDSTORE=1, FDNAME=) in
/// the unit's store, handed back at the next start when this process dies. Returns whether
/// it was sent (a full store, FileDescriptorStoreMax=, is refused in systemd's log only).
bool store_fd(const std::string& name, int fd) noexcept;
/// Asks it to close every stored descriptor named `name` (FDSTOREREMOVE=1).
bool remove_stored_fd(const std::string& name) noexcept;

}  // namespace statepool::service::systemd
