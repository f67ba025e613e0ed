#include "server/systemd.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
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
  return notify(state) && barrier();
}

bool barrier() noexcept {
  const int waited = ::sd_notify_barrier(0, 5'000'000);
  if (waited < 0) {
    LOG_WARN("server",
             "the service manager did not confirm our notifications: ", std::strerror(-waited));
  }
  return waited >= 0;
}

bool has_service_manager() noexcept {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && *socket != '\0';
}

std::vector<PassedFd> passed_fds() {
  char** names = nullptr;
  // unset_environment = 1: nothing the daemon starts inherits LISTEN_FDS.
  const int count = ::sd_listen_fds_with_names(1, &names);
  if (count < 0) {
    throw std::runtime_error(std::string("cannot read the descriptors systemd passed "
                                         "(LISTEN_FDS, LISTEN_FDNAMES): ") +
                             std::strerror(-count));
  }
  std::vector<PassedFd> out;
  for (int i = 0; i < count; ++i) {
    PassedFd passed;
    passed.fd.reset(SD_LISTEN_FDS_START + i);
    // Passed descriptors are inherited without O_CLOEXEC; a successor gets its own.
    (void)::fcntl(passed.fd.get(), F_SETFD, FD_CLOEXEC);
    passed.name = names != nullptr && names[i] != nullptr ? names[i] : "unknown";
    out.push_back(std::move(passed));
  }
  if (names != nullptr) {
    for (int i = 0; i < count; ++i) std::free(names[i]);
    std::free(names);
  }
  return out;
}

support::UniqueFd passed_socket(const std::string& path, std::vector<PassedFd>& passed) {
  support::UniqueFd socket;
  for (auto it = passed.begin(); it != passed.end();) {
    if (::sd_is_socket(it->fd.get(), AF_UNSPEC, 0, -1) <= 0) {
      ++it;
      continue;
    }
    if (socket) {
      throw std::runtime_error(
          "systemd passed more than one socket; statepoold serves one: give its socket unit a "
          "single ListenStream=" +
          path);
    }
    // Listening (1), stream, bound to path (length 0: a NUL-terminated path).
    const int match = ::sd_is_socket_unix(it->fd.get(), SOCK_STREAM, 1, path.c_str(), 0);
    if (match < 0) {
      throw std::runtime_error(std::string("cannot inspect the socket systemd passed: ") +
                               std::strerror(-match));
    }
    if (match == 0) {
      throw std::runtime_error("the socket systemd passed ('" + it->name +
                               "') is not a listening Unix stream socket bound to " + path +
                               ": the socket unit's ListenStream= must be the daemon's --socket");
    }
    socket = std::move(it->fd);
    it = passed.erase(it);
  }
  return socket;
}

bool store_fd(const std::string& name, int fd) noexcept {
  const std::string state = "FDSTORE=1\nFDNAME=" + name;
  const int sent = ::sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1);
  if (sent < 0) {
    LOG_WARN("server", "cannot store ", name, " with the service manager: ", std::strerror(-sent));
  }
  return sent > 0;
}

bool remove_stored_fd(const std::string& name) noexcept {
  return notify("FDSTOREREMOVE=1\nFDNAME=" + name);
}

}  // namespace statepool::service::systemd
