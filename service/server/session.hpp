#pragma once
// One client connection: reads frames, verifies them, runs the handler, writes the reply
// (with an fd when the handler attached one). Everything runs on the connection's loop
// (an io_context run by one I/O thread, server.hpp);
// a handler's heavy work runs on the executor or the worker pool while the session awaits
// it, so an I/O thread never waits for codec work or an allocation.
//
// Reading a frame's header may wait forever (idle clients are normal); once its first
// byte has arrived, the rest of the frame must arrive within --io-timeout, and a reply
// the socket does not take at once must be written within --io-timeout, or the
// connection is closed. The time between the two (the request waiting for the executor
// and running) is never limited: a request that has arrived is answered. One reply per request,
// written before the next request is read: a client that does not read its replies cannot grow the
// daemon's memory.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <boost/asio.hpp>

#include "handlers/handlers.hpp"
#include "server/session_host.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {

class Session : public std::enable_shared_from_this<Session> {
 public:
  /// `host` (what the session may use of its server) must outlive the session.
  Session(SessionHost& host, boost::asio::local::stream_protocol::socket socket, std::uint64_t id);
  ~Session();

  boost::asio::awaitable<void> run();
  /// Posts to the loop: close now if no request is in flight and no byte of one has
  /// arrived, else after the reply to that request.
  void close_when_idle();
  /// Posts to the loop: close now.
  void close_now();
  /// Claims one of the peer uid's places before Hello. The server calls it as it accepts,
  /// so places go in the order connections arrived; run() turns the connection away when
  /// it got none.
  void claim_unattached();
  [[nodiscard]] std::uint64_t id() const noexcept { return state_.id; }
  [[nodiscard]] boost::asio::any_io_executor socket_executor() { return socket_.get_executor(); }

 private:
  boost::asio::awaitable<void> watchdog();
  /// Closes the connection if Hello has not completed within --hello-timeout.
  boost::asio::awaitable<void> hello_deadline();
  /// Ends this connection's claim on that budget (once).
  void leave_unattached() noexcept;
  /// refuse() then close(), counting the refusal under `reason`.
  boost::asio::awaitable<void> turn_away(Status status, const std::string& message,
                                         const char* reason);
  /// Reads what the socket holds now, up to out.size() bytes, without waiting: the count
  /// read (0 when nothing is there); `ended` is set on EOF or a reset.
  std::size_t read_now(std::span<std::byte> out, bool& ended);
  boost::asio::awaitable<bool> read_frame(protocol::FrameHeader& header,
                                          std::vector<std::byte>& payload);
  boost::asio::awaitable<void> write_frame(const flatbuffers::FlatBufferBuilder& builder, int fd);
  /// Hands the staging buffers to a worker to release (unmapping GiBs takes a while).
  void release_staging() noexcept;
  boost::asio::awaitable<void> refuse(Status status, const std::string& message);
  /// Resizes the request buffer to `bytes`, its capacity never above `limit` (the frame's
  /// length), keeping statepool_request_buffer_bytes up to date.
  void resize_payload(std::vector<std::byte>& payload, std::size_t bytes, std::size_t limit);
  /// Lets a large request buffer go after its request (idle connections hold none).
  void shrink_payload(std::vector<std::byte>& payload);
  /// True when at least one unread byte is in the socket (a request has begun to arrive).
  [[nodiscard]] bool bytes_waiting();
  /// Stores the I/O deadline `timeout` from now; `phase` names it in the timeout's log
  /// line ("inside a frame", "writing a reply").
  void arm(std::chrono::milliseconds timeout, const char* phase);
  void disarm();
  void close();

  SessionHost& host_;
  boost::asio::local::stream_protocol::socket socket_;
  // The I/O deadline (arm, disarm: max when none runs) and the timer of the watchdog that
  // enforces it. The watchdog reads deadline_at_ when its timer fires; arm() moves the
  // timer only when it would fire too late.
  std::chrono::steady_clock::time_point deadline_at_ = std::chrono::steady_clock::time_point::max();
  const char* deadline_phase_ = "inside a frame";
  boost::asio::steady_timer deadline_;
  std::vector<std::byte> out_;  // the reply frame being written (kept between replies)
  // Descriptors that arrived with the frame being read (closed unless its request takes one).
  std::vector<support::UniqueFd> received_fds_;
  // --hello-timeout; cancelled by Hello and by close() (its waiter holds the session).
  boost::asio::steady_timer hello_timer_;
  ConnectionState state_;
  bool busy_ = false;
  bool closing_ = false;
  bool timed_out_ = false;
  bool unattached_ = false;     // holds a place in host_.unattached
  bool hello_expired_ = false;  // --hello-timeout passed before Hello completed
};

}  // namespace statepool::service
