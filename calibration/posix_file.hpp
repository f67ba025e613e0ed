#pragma once
// Small POSIX file helpers shared by the calibration sources (internal).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace statepool::calibration::detail {

/// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept;
  /// Closes now; returns false (errno set) when close() failed.
  bool close() noexcept;

 private:
  int fd_ = -1;
};

/// strerror(errno) of the current errno.
[[nodiscard]] std::string errno_text();
/// Writes all bytes (retrying on EINTR / short writes); false with errno set on failure.
[[nodiscard]] bool write_all(int fd, std::span<const std::byte> bytes) noexcept;
/// Reads exactly bytes.size() bytes at `offset`; false on error or end of file
/// (errno 0 then).
[[nodiscard]] bool pread_all(int fd, std::span<std::byte> bytes, std::uint64_t offset) noexcept;

}  // namespace statepool::calibration::detail
