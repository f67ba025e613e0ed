#pragma once
// The hand-over conversation between a running statepoold (the predecessor) and the one
// started with --take-over (the successor), over the hand-over socket (--handover-socket):
//
//   successor   -> request      its image version (u32, little-endian)
//   predecessor -> descriptors  names, one per line, of the descriptors attached: the
//                               listening sockets ("listener", "handover", "api",
//                               "metrics") and every arena's memory ("arena ID"), at most
//                               kFdsPerMessage per message, as many messages as needed
//   predecessor -> state        the hand-over image (image.hpp), after its descriptors
//   successor   -> verdict      "ok", or why it refused (the predecessor then serves on)
//   predecessor -> refusal      instead of descriptors and state: why it will not hand
//                               over (another hand-over under way, a drain, a version it
//                               does not write)
//
// A message is a 16-byte header (magic "SPHO", kind u16, zero u16, body length u64, all
// little-endian) and its body; descriptors ride on the header's first byte (SCM_RIGHTS).
// Every call has a deadline; every failure is a HandoverError naming what went wrong.
// What arrives is input: a body longer than the caller allows, a header that is not one,
// or descriptors where none belong are refused, and received descriptors are always owned
// (closed unless the caller keeps them).
//
// Thread-safety: as the socket; one conversation per socket.

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/support/unique_fd.hpp"

namespace statepool::service::handover {

class HandoverError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// connect(): nothing listens on the hand-over socket (no such file, or the connection
/// was refused): no daemon runs there to take over from.
class NoPredecessor : public HandoverError {
 public:
  using HandoverError::HandoverError;
};

enum class MessageKind : std::uint16_t {
  request = 1,
  descriptors = 2,
  state = 3,
  verdict = 4,
  refusal = 5,
};

/// Descriptors one message carries at most (support::kMaxFdsPerRead).
inline constexpr std::size_t kFdsPerMessage = 16;

struct Message {
  MessageKind kind = MessageKind::request;
  std::vector<std::byte> body;
  std::vector<support::UniqueFd> fds;
};

using Deadline = std::chrono::steady_clock::time_point;

/// Sends one message (`fds` only with MessageKind::descriptors, at most kFdsPerMessage).
/// Throws HandoverError (the peer went away, the deadline passed).
void send_message(int socket, MessageKind kind, std::span<const std::byte> body,
                  std::span<const int> fds, Deadline deadline);
/// The same with a text body.
void send_text(int socket, MessageKind kind, const std::string& text, Deadline deadline);

/// Receives one message whose body is at most `max_body` bytes. Throws HandoverError.
[[nodiscard]] Message receive_message(int socket, std::uint64_t max_body, Deadline deadline);

/// A named descriptor of the hand-over ("listener", "arena 3").
struct NamedFd {
  std::string name;
  int fd = -1;  ///< borrowed
};

/// Sends `fds` as descriptors messages, then `image` as the state message.
void send_state(int socket, std::span<const NamedFd> fds, std::span<const std::byte> image,
                Deadline deadline);

/// What the predecessor sent: its descriptors by name, and the image.
struct ReceivedState {
  std::vector<std::pair<std::string, support::UniqueFd>> fds;
  std::vector<std::byte> image;
};
/// Receives descriptors messages until the state message (at most `max_fds` descriptors,
/// an image of at most `max_image` bytes). A refusal message is thrown as HandoverError
/// with the predecessor's reason.
[[nodiscard]] ReceivedState receive_state(int socket, std::size_t max_fds, std::uint64_t max_image,
                                          Deadline deadline);

/// Connects to the hand-over socket at `path`. Throws HandoverError naming the path.
[[nodiscard]] support::UniqueFd connect(const std::string& path);

}  // namespace statepool::service::handover
