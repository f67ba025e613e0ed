#include "posix_file.hpp"

#include "statepool/calibration/files.hpp"

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

namespace statepool::calibration {

std::string read_file(const std::string& path, std::size_t max_bytes) {
  const support::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    throw std::runtime_error(path + ": cannot open: " + support::errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw std::runtime_error(path + ": cannot stat: " + support::errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error(path + ": not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw std::runtime_error(path + ": file of " + std::to_string(size) +
                             " bytes is larger than the limit of " + std::to_string(max_bytes));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  if (!detail::pread_all(fd.get(), std::as_writable_bytes(std::span<char>(text)), 0)) {
    throw std::runtime_error(path + ": read failed: " +
                             (errno == 0 ? "unexpected end of file" : support::errno_text(errno)));
  }
  return text;
}

}  // namespace statepool::calibration
