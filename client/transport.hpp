#pragma once
// Internal: the socket layer of the client. Non-blocking Unix stream socket, every wait
// bounded by a deadline through poll(), SCM_RIGHTS descriptors collected on every read.
// Every failure is a ConnectionError with a message that says what to do.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::client::detail {

using support::UniqueFd;

using Clock = std::chrono::steady_clock;

/// A point in time after which a call gives up; `infinite` never expires.
struct Deadline {
  Clock::time_point at{};
  bool infinite = true;

  [[nodiscard]] static Deadline after(std::chrono::milliseconds timeout) noexcept;
  /// Milliseconds to pass to poll(): -1 when infinite, else the remaining time rounded up
  /// (0 once expired).
  [[nodiscard]] int poll_ms() const noexcept;
};

/// Connects a non-blocking, close-on-exec Unix stream socket to `path` ('@' prefix =
/// abstract namespace).
[[nodiscard]] UniqueFd connect_unix(const std::string& path, std::chrono::milliseconds timeout);

/// Makes an adopted socket non-blocking and close-on-exec.
void prepare_socket(int fd);

/// Writes `head` then `body` completely (MSG_NOSIGNAL); `attach` (>= 0) rides on the
/// first byte (SCM_RIGHTS).
void send_frame(int fd, std::span<const std::byte> head, std::span<const std::byte> body,
                const Deadline& deadline, int attach = -1);

/// Waits until the socket is readable (or hung up), at most until the deadline. A reply
/// is never there the moment its request has gone: waiting first saves a read that
/// finds nothing.
void wait_readable(int fd, const Deadline& deadline, const char* what);

/// One read of what has arrived, at least one byte, into `first` then `second` (waits
/// when nothing has): the count read. Descriptors as recv_exact.
[[nodiscard]] std::size_t recv_some(int fd, std::span<std::byte> first, std::span<std::byte> second,
                                    std::vector<UniqueFd>& fds, const Deadline& deadline,
                                    const char* what);

/// Reads exactly `out.size()` bytes. Descriptors that arrive as SCM_RIGHTS on the way are
/// appended to `fds` (close-on-exec); excess ones the kernel could not fit are closed by it.
/// `what` names the part being read for error messages ("reply header").
void recv_exact(int fd, std::span<std::byte> out, std::vector<UniqueFd>& fds,
                const Deadline& deadline, const char* what);

}  // namespace statepool::client::detail
