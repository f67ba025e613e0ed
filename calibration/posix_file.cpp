#include "posix_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::calibration::detail {

bool pread_all(int fd, std::span<std::byte> bytes, std::uint64_t offset) noexcept {
  while (!bytes.empty()) {
    const ssize_t n = ::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    if (n == 0) {
      errno = 0;
      return false;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace statepool::calibration::detail
