#include "statepool/support/unique_fd.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace statepool::support {

void UniqueFd::reset(int fd) noexcept {
  const int old = std::exchange(fd_, fd);
  if (old >= 0 && old != fd) ::close(old);
}

bool UniqueFd::close() noexcept {
  if (fd_ < 0) return true;
  return ::close(release()) == 0;
}

UniqueFd duplicate(int fd) {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw std::system_error(errno, std::generic_category(), "fcntl(F_DUPFD_CLOEXEC)");
  return UniqueFd(copy);
}

}  // namespace statepool::support
