#pragma once
// A fake systemd for the daemon's file-descriptor store, for tests that run where no
// systemd runs (CI): it receives sd_notify(3) datagrams on its own $NOTIFY_SOCKET and keeps
// the descriptors sent with FDSTORE=1, and spawn_with_fds() starts a process handing them
// back as systemd starts a unit's main process (sd_listen_fds(3): LISTEN_FDS, LISTEN_FDNAMES,
// LISTEN_PID, descriptors renumbered from 3). DaemonOptions::service_manager starts
// statepoold that way.
//
// What it does as systemd does (src/core/manager.c, service.c), so that a daemon that works
// here works under systemd:
// - A datagram is newline-separated KEY=VALUE lines; at most 4096 bytes, no NUL inside
//   (but one at the end), sender credentials required, else it is ignored and its
//   descriptors closed.
// - BARRIER=1 (sd_notify_barrier(3)) is acknowledged by closing the one descriptor sent
//   with it; a barrier message with any other line is ignored whole.
// - FDSTOREREMOVE=1 with FDNAME= closes every stored descriptor of that name; it wins over
//   FDSTORE=1 in the same message (whose descriptors are then closed).
// - FDSTORE=1 stores the descriptors under FDNAME= ("stored" without one). A name that is
//   not valid (more than 255 characters, a control or non-ASCII character, or ':') is NOT
//   refused by systemd: it warns and stores them under "stored"; so does this. The empty
//   name is valid. Beyond fd_store_max (FileDescriptorStoreMax=) the rest are closed. A
//   descriptor for an open file already in the store is not stored twice (closed).
// - A stored descriptor that reports POLLHUP or POLLERR (a pipe or socket whose other end
//   went away) is closed and dropped from the store, unless its message said FDPOLL=0.
// - Descriptors sent with any other message are closed.
// - Hand-back order: systemd prepends to its store, so it passes the most recently stored
//   descriptor first; spawn_with_fds() does the same (see handed_back_names()). A daemon
//   must find its descriptors by name, not by position.
// Every departure from the happy path is recorded in errors() (systemd logs a warning), so
// a test can assert that the daemon spoke the protocol cleanly. Not modelled: credential
// checks (NotifyAccess=: every sender is accepted), MAINPID=, READY=1 and the rest (recorded
// in messages(), not interpreted), FileDescriptorStorePreserve=.
//
// Errors (the socket cannot be bound, a process cannot be spawned) throw
// std::runtime_error. No GoogleTest here.
//
// Thread-safety: all const members and clear_store() may be called from any thread while
// the receiving thread runs; waiting for a message is eventually() (daemon.hpp) on
// messages() or stored_count().

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "statepool/support/unique_fd.hpp"

namespace statepool::testing {

class ServiceManager {
 public:
  /// Binds an AF_UNIX datagram socket at dir + "/notify" (dir must exist; the path must fit
  /// in sun_path, 108 bytes) and starts the receiving thread. `fd_store_max` is the unit's
  /// FileDescriptorStoreMax= (systemd's default is 0; tests want room).
  explicit ServiceManager(const std::string& dir, std::size_t fd_store_max = 64);
  /// Stops the receiving thread, closes every stored descriptor and removes the socket file.
  ~ServiceManager();
  ServiceManager(const ServiceManager&) = delete;
  ServiceManager& operator=(const ServiceManager&) = delete;

  /// The value for $NOTIFY_SOCKET.
  [[nodiscard]] const std::string& notify_socket() const noexcept { return path_; }
  /// The text of every datagram received, in order (also those ignored), without a
  /// trailing NUL.
  [[nodiscard]] std::vector<std::string> messages() const;
  /// What systemd would have logged a warning for: ignored messages, refused or closed
  /// descriptors, invalid names. Empty when the daemon spoke the protocol cleanly.
  [[nodiscard]] std::vector<std::string> errors() const;
  /// Names of the stored descriptors in the order they were stored, with repeats.
  [[nodiscard]] std::vector<std::string> stored_names() const;
  /// Names in the order spawn_with_fds() passes them (LISTEN_FDNAMES): newest first.
  [[nodiscard]] std::vector<std::string> handed_back_names() const;
  /// The first stored descriptor of `name` (stored first), or -1. Borrowed: valid until it
  /// is removed (FDSTOREREMOVE=1, a hang-up, clear_store(), destruction).
  [[nodiscard]] int stored_fd(const std::string& name) const;
  [[nodiscard]] std::size_t stored_count() const;

  /// Closes every stored descriptor, as `systemctl stop` does (without
  /// FileDescriptorStorePreserve=).
  void clear_store();

  /// The stored descriptors in hand-back order, each duplicated (F_DUPFD_CLOEXEC) to a
  /// number >= 3 + their count, so that they can be dup2'd onto 3, 4, ... in any order
  /// without overwriting one another. Taken under the lock: consistent with `names`.
  struct Duplicates {
    std::vector<std::string> names;
    std::vector<support::UniqueFd> fds;
  };
  [[nodiscard]] Duplicates duplicate_store() const;

 private:
  struct Stored {
    std::string name;
    support::UniqueFd fd;
    std::uint64_t id = 0;  // tells a stored descriptor from a later one with its number
    bool poll = true;      // FDPOLL=0 not given: dropped on POLLHUP/POLLERR
  };

  void run();
  void receive();
  void handle(const std::string& text, std::vector<support::UniqueFd> fds);
  void store(const std::string& name, std::vector<support::UniqueFd>& fds, bool poll);
  void wake() const;

  std::string path_;
  std::size_t fd_store_max_;
  support::UniqueFd socket_;
  support::UniqueFd wake_;  // eventfd: stop, or the store changed (poll set to rebuild)
  bool stopping_ = false;   // under mutex_

  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
  std::vector<std::string> errors_;
  std::vector<Stored> store_;  // in store order
  std::uint64_t next_id_ = 1;
  std::thread thread_;  // last: starts once everything above is built
};

/// Starts argv[0] with arguments argv[1..] as systemd starts a unit's main process: with
/// NOTIFY_SOCKET=manager.notify_socket() and, when the store holds descriptors, those as
/// descriptors 3, 4, ... (handed_back_names() order) with LISTEN_FDS, LISTEN_FDNAMES
/// (names joined with ':') and LISTEN_PID (the started process's pid) in its environment,
/// and nothing else beyond 2 but what this process leaves open without FD_CLOEXEC.
/// NOTIFY_SOCKET and LISTEN_* inherited from this process are dropped. stdout and stderr go
/// to the files (created or truncated; "/dev/null" works). The process starts as
/// `/bin/sh -c 'export LISTEN_PID=$$; exec "$0" "$@"'`: the exec keeps the pid, so the
/// returned pid is the program's, and LISTEN_PID matches it. Throws std::runtime_error
/// when it cannot be spawned; the caller reaps the process.
pid_t spawn_with_fds(const std::vector<std::string>& argv, const ServiceManager& manager,
                     const std::string& stdout_path, const std::string& stderr_path);

}  // namespace statepool::testing
