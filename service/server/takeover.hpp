#pragma once
// The successor's side of a hand-over (server.hpp, handover/transfer.hpp): a statepoold
// started with --take-over asks the one serving --socket for its pool, receives the state
// image, the arenas' memory and the listening sockets, and restores its (new, empty) pool
// from them before it serves. Its verdict tells the predecessor to exit (ok) or to serve
// on (anything else).

#include <chrono>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "handover/image.hpp"
#include "pool/pool.hpp"
#include "server/server.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {

struct TakenOver {
  support::UniqueFd peer;  ///< the conversation, for the verdict
  Server::Listeners listeners;
  /// The predecessor's crash journal (server/crash_journal.hpp) and its name in the
  /// service manager's store, when it kept one: this daemon continues it.
  support::UniqueFd journal;
  std::string journal_name;
  Pool::RestoreReport report;
  handover::ImageMeta meta;  ///< the predecessor's (its generation: ours is one more)
  std::uint64_t image_bytes = 0;
  std::chrono::milliseconds took{0};  ///< from the request to a restored pool
};

/// Takes the pool over from the daemon serving config.handover_socket into `pool` (new:
/// the operator's plans may be installed). Throws std::runtime_error naming what failed;
/// once the predecessor has paused, a refusal with that reason is sent back to it (it
/// serves on) before the throw. With config.take_over_if_running, returns nothing when no
/// daemon listens on the hand-over socket (this one then starts fresh).
[[nodiscard]] std::optional<TakenOver> take_over(const Config& config, Pool& pool);

/// Tells the predecessor that this daemon serves now, and waits for its last word: it
/// exits. Throws std::runtime_error when that word does not come (the predecessor gave up
/// waiting and serves on): this process must not serve then.
void confirm(TakenOver& taken);

}  // namespace statepool::service
