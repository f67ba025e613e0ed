#include "server/systemd.hpp"

#include <cstring>
#include <stdexcept>

#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include "statepool/support/log.hpp"

namespace statepool::service::systemd {

bool notify(const std::string& state) noexcept {
  // unset_environment = 0: a later notification (STOPPING=1) still finds NOTIFY_SOCKET.
  const int sent = ::sd_notify(0, state.c_str());
  if (sent < 0) {
    LOG_WARN("server", "cannot notify the service manager (", state.substr(0, state.find('\n')),
             "): ", std::strerror(-sent));
  }
  return sent > 0;
}

bool notify_and_wait(const std::string& state) noexcept {
  if (!notify(state)) return false;
  const int waited = ::sd_notify_barrier(0, 5'000'000);
  if (waited < 0) {
    LOG_WARN("server", "the service manager did not confirm ", state.substr(0, state.find('\n')),
             ": ", std::strerror(-waited));
  }
  return waited >= 0;
}

int passed_socket(const std::string& path) {
  // unset_environment = 1: nothing the daemon starts inherits LISTEN_FDS.
  const int count = ::sd_listen_fds(1);
  if (count < 0) {
    throw std::runtime_error(std::string("cannot read the sockets systemd passed (LISTEN_FDS): ") +
                             std::strerror(-count));
  }
  if (count == 0) return -1;
  if (count > 1) {
    throw std::runtime_error(support::cat(
        "systemd passed ", count,
        " sockets; statepoold serves one: give its socket unit a single ListenStream=", path));
  }
  const int fd = SD_LISTEN_FDS_START;
  // Listening (1), stream, bound to path (length 0: a NUL-terminated path).
  const int match = ::sd_is_socket_unix(fd, SOCK_STREAM, 1, path.c_str(), 0);
  if (match < 0) {
    throw std::runtime_error(std::string("cannot inspect the socket systemd passed: ") +
                             std::strerror(-match));
  }
  if (match == 0) {
    throw std::runtime_error(
        "the socket systemd passed is not a listening Unix stream socket bound to " + path +
        ": the socket unit's ListenStream= must be the daemon's --socket");
  }
  return fd;
}

}  // namespace statepool::service::systemd
