#pragma once
// Descriptors over a Unix stream socket (SCM_RIGHTS): the one implementation the daemon's
// sessions, the client's transport and the test peers use.
//
// A descriptor travels with the first byte a sendmsg() carries; the receiver collects it
// from whichever recvmsg() reads that byte. Receive with room for more descriptors than
// expected, so that a misbehaving peer's extra ones arrive (and get closed) instead of
// being cut off by the kernel.
//
// Thread-safety: as the socket calls themselves.

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <vector>

#include "statepool/support/unique_fd.hpp"

namespace statepool::support {

/// Most descriptors recv_with_fds() takes from one read.
inline constexpr std::size_t kMaxFdsPerRead = 16;

/// One sendmsg() of `bytes` with `fds` attached (none when empty). Returns what sendmsg
/// returns: bytes sent, or -1 with errno set. `flags` go to sendmsg (e.g. MSG_NOSIGNAL |
/// MSG_DONTWAIT). Never throws.
ssize_t send_with_fds(int socket, std::span<const std::byte> bytes, std::span<const int> fds,
                      int flags) noexcept;

/// One recvmsg() into `out` (MSG_CMSG_CLOEXEC is added to `flags`). Every descriptor that
/// arrived is appended to `fds`, owned, before the call returns, also when it returns 0.
/// Returns what recvmsg returns: bytes read (0 at end of stream), or -1 with errno set.
/// Throws std::bad_alloc only (the descriptors already taken are closed then).
ssize_t recv_with_fds(int socket, std::span<std::byte> out, std::vector<UniqueFd>& fds, int flags);
/// The same into two buffers, filled in order (a frame's header, then its payload).
ssize_t recv_with_fds(int socket, std::span<std::byte> first, std::span<std::byte> second,
                      std::vector<UniqueFd>& fds, int flags);

}  // namespace statepool::support
