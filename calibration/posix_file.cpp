#include "posix_file.hpp"

#include "statepool/calibration/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace statepool::calibration::detail {

UniqueFd::~UniqueFd() {
  close();
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int UniqueFd::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

bool UniqueFd::close() noexcept {
  if (fd_ < 0) {
    return true;
  }
  const int fd = release();
  return ::close(fd) == 0;
}

std::string errno_text() {
  return std::strerror(errno);
}

bool write_all(int fd, std::span<const std::byte> bytes) noexcept {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

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
  using detail::errno_text;
  using detail::UniqueFd;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    throw std::runtime_error(path + ": cannot open: " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw std::runtime_error(path + ": cannot stat: " + errno_text());
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
                             (errno == 0 ? std::string("unexpected end of file") : errno_text()));
  }
  return text;
}

void write_file_atomic(const std::string& path, std::span<const std::byte> bytes) {
  using detail::errno_text;
  const std::string partial = path + ".partial";
  detail::UniqueFd fd(::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw std::runtime_error(path + ": cannot create: " + errno_text());
  }
  if (!detail::write_all(fd.get(), bytes) || !fd.close()) {
    const std::string reason = errno_text();
    ::unlink(partial.c_str());
    throw std::runtime_error(path + ": write failed: " + reason);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(partial.c_str());
    throw std::runtime_error(path + ": cannot rename into place: " + reason);
  }
}

}  // namespace statepool::calibration
