#pragma once
// The one owner of a POSIX file descriptor in statepool (daemon, client, tools).
//
// Move-only; closes on destruction and on reset(). close(2) is never retried: on Linux the
// descriptor is released even when close reports EINTR, and retrying could close a
// descriptor another thread has just been given.
//
// Thread-safety: as for any value; distinct objects may be used concurrently.

#include <utility>

namespace statepool::support {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  [[nodiscard]] explicit operator bool() const noexcept { return valid(); }
  /// Gives the descriptor up without closing it.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (if any and if different) and owns `fd` instead.
  void reset(int fd = -1) noexcept;
  /// Closes now; false (errno set) when close(2) reported an error (the descriptor is
  /// released either way). For writers that must know whether buffered data reached the
  /// file.
  bool close() noexcept;

 private:
  int fd_ = -1;
};

/// A second descriptor for the same open file (F_DUPFD_CLOEXEC). Throws
/// std::system_error when the process is out of descriptors.
[[nodiscard]] UniqueFd duplicate(int fd);

}  // namespace statepool::support
