#include "server/session.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <sys/socket.h>

#include "statepool/protocol/frame.hpp"
#include "statepool/support/fd_passing.hpp"
#include "statepool/support/log.hpp"

namespace statepool::service {
namespace asio = boost::asio;
using asio::use_awaitable;

namespace {
constexpr auto kAsTuple = asio::as_tuple(use_awaitable);
/// A frame's payload is received in pieces of this size and the buffer grows with what
/// has arrived: a frame announced and never sent costs nothing.
constexpr std::size_t kReceivePiece = std::size_t{256} << 10;
/// Request buffers up to this size are kept between requests; larger ones are let go.
constexpr std::size_t kKeptPayload = std::size_t{64} << 10;
}  // namespace

void Session::resize_payload(std::vector<std::byte>& payload, std::size_t bytes,
                             std::size_t limit) {
  const std::size_t before = payload.capacity();
  // Grow geometrically, as resize would, but never past the frame's announced length:
  // a buffer holds at most the largest frame (docs/operations.md, 8.1).
  if (bytes > before) payload.reserve(std::min(limit, std::max(bytes, 2 * before)));
  payload.resize(bytes);
  if (host_.metrics != nullptr && payload.capacity() != before) {
    host_.metrics->request_buffers_changed(static_cast<std::int64_t>(payload.capacity()) -
                                           static_cast<std::int64_t>(before));
  }
}

void Session::shrink_payload(std::vector<std::byte>& payload) {
  if (payload.capacity() <= kKeptPayload) return;
  const std::size_t before = payload.capacity();
  std::vector<std::byte>().swap(payload);
  if (host_.metrics != nullptr)
    host_.metrics->request_buffers_changed(-static_cast<std::int64_t>(before));
}

Session::Session(SessionHost& host, asio::local::stream_protocol::socket socket, std::uint64_t id)
    : host_(host),
      socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      hello_timer_(socket_.get_executor()) {
  state_.id = id;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    state_.pid = cred.pid;
    state_.uid = cred.uid;
    state_.gid = cred.gid;
  }
  deadline_.expires_at(std::chrono::steady_clock::time_point::max());
}

void Session::release_staging() noexcept {
  for (auto& [id, memory] : state_.staging) release_later(host_.context.workers, std::move(memory));
  state_.staging.clear();
}

Session::~Session() {
  leave_unattached();
  release_staging();
  if (state_.hello_done) {
    try {
      host_.context.pool.detach_lease(state_.lease, Clock::now());
    } catch (const std::exception& e) {
      LOG_ERROR("session", "connection ", state_.id, ": detaching lease failed: ", e.what());
    }
  }
}

void Session::arm(std::chrono::milliseconds timeout, const char* phase) {
  deadline_at_ = std::chrono::steady_clock::now() + timeout;
  deadline_phase_ = phase;
  // The watchdog's timer moves only when it must fire earlier than it will: after an
  // idle spell (it waits for ever then). Back-to-back requests only store a time.
  if (deadline_.expiry() > deadline_at_) deadline_.expires_at(deadline_at_);
}
void Session::disarm() {
  deadline_at_ = std::chrono::steady_clock::time_point::max();
}

void Session::close() {
  if (closing_) return;
  closing_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  deadline_.cancel();
  hello_timer_.cancel();
}

bool Session::bytes_waiting() {
  boost::system::error_code ec;
  const std::size_t n = socket_.available(ec);  // FIONREAD
  return !ec && n > 0;
}

void Session::close_when_idle() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    // A request whose first byte is in the socket has arrived: run() serves it and then
    // closes (see the loop there). Only a connection with nothing to serve closes now.
    if (!self->busy_ && !self->bytes_waiting()) self->close();
  });
}

void Session::close_now() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
}

asio::awaitable<void> Session::watchdog() {
  using std::chrono::steady_clock;
  while (!closing_) {
    // Wakes when the timer fires or is moved earlier by arm() (operation_aborted); either
    // way the stored deadline decides.
    co_await deadline_.async_wait(kAsTuple);
    if (closing_) break;
    if (deadline_at_ <= steady_clock::now()) {
      timed_out_ = true;
      LOG_WARN("session", "connection ", state_.id, ": timed out after ",
               host_.context.config.io_timeout.count(), " ms ", deadline_phase_, "; closing");
      close();
      break;
    }
    // Disarmed (wait until arm() moves the timer), or re-armed later than the timer was
    // set: wait for that deadline.
    if (deadline_.expiry() != deadline_at_) deadline_.expires_at(deadline_at_);
  }
}

void Session::claim_unattached() { unattached_ = host_.unattached.enter(state_.uid); }

void Session::leave_unattached() noexcept {
  if (!unattached_) return;
  unattached_ = false;
  host_.unattached.leave(state_.uid);
}

asio::awaitable<void> Session::hello_deadline() {
  hello_timer_.expires_after(host_.context.config.hello_timeout);
  const auto [ec] = co_await hello_timer_.async_wait(kAsTuple);
  if (ec || closing_ || state_.hello_done) co_return;  // cancelled: Hello came, or closed
  if (host_.metrics != nullptr) host_.metrics->connection_refused("hello_timeout");
  LOG_WARN("session", "connection ", state_.id, " (pid ", state_.pid, ", uid ", state_.uid,
           "): no Hello within ", host_.context.config.hello_timeout.count(),
           " ms (--hello-timeout); closing");
  // Mid-request (a Hello being handled), the reply is not cut off: the session closes
  // after it unless that Hello succeeded.
  hello_expired_ = true;
  if (!busy_) close();
}

asio::awaitable<void> Session::turn_away(Status status, const std::string& message,
                                         const char* reason) {
  busy_ = true;
  leave_unattached();
  if (host_.metrics != nullptr) host_.metrics->connection_refused(reason);
  co_await refuse(status, message);
  close();
  host_.ended(state_.id);
}

std::size_t Session::read_now(std::span<std::byte> out, bool& ended) {
  for (;;) {
    // recvmsg: a descriptor a client attached (RegisterMemory) arrives with the frame's
    // first byte; any other is collected too, and refused with its frame.
    const ssize_t n =
        support::recv_with_fds(socket_.native_handle(), out, received_fds_, MSG_DONTWAIT);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    // EOF, or reset: the connection has ended. EAGAIN: nothing is there yet.
    ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    return 0;
  }
}

asio::awaitable<bool> Session::read_frame(protocol::FrameHeader& header,
                                          std::vector<std::byte>& payload) {
  std::array<std::byte, protocol::kHeaderBytes> head{};
  // Waiting for a frame's first byte may take forever (idle clients are normal); from
  // then on the whole frame must arrive within the I/O timeout. The wait consumes
  // nothing: until the read below takes the bytes, they stay in the socket, where a
  // drain (close_when_idle) sees them and lets the request finish. The read and busy_
  // happen with no suspension between them.
  //
  // The fast path is one wait and two reads (header, payload) straight on the socket; an
  // asio read costs a trip through the io_context's queue even when its bytes are there,
  // so asio reads only what has not arrived yet.
  std::size_t got = 0;
  bool ended = false;
  for (;;) {
    auto [ec_wait] = co_await socket_.async_wait(asio::socket_base::wait_read, kAsTuple);
    if (ec_wait || closing_) co_return false;  // closed by drain or by a deadline
    // The reactor may report readiness that an earlier read consumed already: look.
    got = read_now(head, ended);
    if (got > 0) break;          // a frame has begun
    if (ended) co_return false;  // EOF or reset between frames: not an error
  }
  busy_ = true;
  arm(host_.context.config.io_timeout, "inside a frame");
  if (got < head.size()) {
    auto [ec1, n1] = co_await asio::async_read(
        socket_, asio::buffer(head.data() + got, head.size() - got), kAsTuple);
    if (ec1) {
      if (!timed_out_ && !closing_)
        LOG_WARN("session", "connection ", state_.id, ": connection lost inside a frame header");
      co_return false;
    }
  }
  header = protocol::decode_header(head);
  const auto error = protocol::check_header(header, protocol::FrameType::request,
                                            host_.context.config.max_frame_bytes);
  if (error != protocol::FrameError::none) {
    std::string message = protocol::to_string(error);
    if (error == protocol::FrameError::too_large)
      message +=
          support::cat(": ", header.length, " bytes > ", host_.context.config.max_frame_bytes);
    if (error == protocol::FrameError::bad_version)
      message += support::cat(": frame version ", header.version, ", daemon speaks ",
                              protocol::kFrameVersion);
    co_await refuse(Status::protocol_error, message);
    co_return false;
  }
  resize_payload(payload, 0, header.length);
  for (got = 0; got < header.length;) {
    const std::size_t piece = std::min<std::size_t>(kReceivePiece, header.length - got);
    resize_payload(payload, got + piece, header.length);
    const std::span<std::byte> rest(payload.data() + got, piece);
    const std::size_t now = ended ? 0 : read_now(rest, ended);
    if (now < piece) {
      auto [ec2, n2] = co_await asio::async_read(
          socket_, asio::buffer(rest.data() + now, piece - now), kAsTuple);
      if (ec2) {
        if (!timed_out_ && !closing_)
          LOG_WARN("session", "connection ", state_.id,
                   ": connection lost inside a frame: ", ec2.message());
        co_return false;
      }
    }
    got += piece;
  }
  // The frame is in: the deadline covers reading it and writing its reply, never the
  // time it waits for the executor or runs (docs/protocol.md, 5.2).
  disarm();
  co_return true;
}

asio::awaitable<void> Session::write_frame(const flatbuffers::FlatBufferBuilder& builder, int fd) {
  protocol::FrameHeader header;
  header.type = protocol::FrameType::reply;
  header.flags = fd >= 0 ? protocol::kFlagFdAttached : protocol::kFlagNone;
  header.length = builder.GetSize();
  // The frame is assembled in a buffer the session keeps (small replies allocate
  // nothing) and sent straight on the socket; asio writes only what the socket did not
  // take at once. An fd rides on the frame's first bytes: one sendmsg with SCM_RIGHTS.
  const auto head = protocol::encode_header(header);
  out_.resize(head.size() + builder.GetSize());
  std::memcpy(out_.data(), head.data(), head.size());
  if (builder.GetSize() != 0)
    std::memcpy(out_.data() + head.size(), builder.GetBufferPointer(), builder.GetSize());
  const std::span<const std::byte> bytes(out_);
  std::size_t sent = 0;
  for (;;) {
    const ssize_t n =
        fd >= 0 ? support::send_with_fds(socket_.native_handle(), bytes,
                                         std::span<const int>(&fd, 1), MSG_DONTWAIT | MSG_NOSIGNAL)
                : ::send(socket_.native_handle(), bytes.data(), bytes.size(),
                         MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      sent = static_cast<std::size_t>(n);
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw std::system_error(errno, std::generic_category(), "sendmsg");
    if (fd < 0) break;  // nothing sent: asio writes it all
    if (deadline_at_ == std::chrono::steady_clock::time_point::max())
      arm(host_.context.config.io_timeout, "writing a reply");
    auto [ec] = co_await socket_.async_wait(asio::socket_base::wait_write, kAsTuple);
    if (ec) throw std::system_error(ec, "waiting to send");
  }
  if (sent < bytes.size()) {
    // Armed once for the whole reply (also after a wait above); a refusal written inside
    // a frame stays under that frame's deadline.
    if (deadline_at_ == std::chrono::steady_clock::time_point::max())
      arm(host_.context.config.io_timeout, "writing a reply");
    auto [ec, n] = co_await asio::async_write(
        socket_, asio::buffer(bytes.data() + sent, bytes.size() - sent), kAsTuple);
    if (ec) throw std::system_error(ec, "sending reply");
  }
  disarm();
  if (out_.capacity() > kKeptPayload) std::vector<std::byte>().swap(out_);
}

asio::awaitable<void> Session::refuse(Status status, const std::string& message) {
  if (host_.metrics != nullptr) host_.metrics->observe_refused(status);
  LOG_WARN("session", "connection ", state_.id, " (pid ", state_.pid, "): ", message,
           "; closing the connection");
  flatbuffers::FlatBufferBuilder builder;
  build_error(builder, 0, status, message);
  try {
    co_await write_frame(builder, -1);
  } catch (const std::exception&) {
    // the peer is already gone; nothing more to tell it
  }
}

asio::awaitable<void> Session::run() {
  auto self = shared_from_this();
  asio::co_spawn(
      socket_.get_executor(), [self]() { return self->watchdog(); }, asio::detached);
  LOG_DEBUG("session", "connection ", state_.id, " from pid ", state_.pid, " uid ", state_.uid);

  const auto& allow = host_.context.config.allow_uids;
  if (!allow.empty() && state_.uid != 0 &&
      std::find(allow.begin(), allow.end(), state_.uid) == allow.end()) {
    support::audit(support::cat("refused connection ", state_.id, " (pid ", state_.pid, ", uid ",
                                state_.uid, ", gid ", state_.gid,
                                "): its uid is not in --allow-uids"));
    co_await turn_away(Status::permission_denied,
                       support::cat("uid ", state_.uid, " is not in the daemon's --allow-uids"),
                       "uid");
    co_return;
  }
  if (host_.context.clients_connected() > host_.context.config.max_connections) {
    co_await turn_away(Status::too_many_connections,
                       support::cat("connection limit of ", host_.context.config.max_connections,
                                    " reached (--max-connections); retry later"),
                       "connection_limit");
    co_return;
  }
  // Until Hello attaches it to a tenant, a connection holds one of its uid's small budget
  // of such connections, and only for --hello-timeout: one user's silent connections can
  // neither take every slot nor keep other users (root included) out. The place was
  // claimed at accept (claim_unattached), in arrival order.
  if (!unattached_) {
    co_await turn_away(
        Status::too_many_connections,
        support::cat("uid ", state_.uid, " already has ",
                     host_.context.config.max_unattached_connections,
                     " connections waiting to say Hello (--max-unattached-connections);"
                     " retry later"),
        "unattached_limit");
    co_return;
  }
  asio::co_spawn(
      socket_.get_executor(), [self]() { return self->hello_deadline(); }, asio::detached);

  std::vector<std::byte> payload;
  // One reply builder for the connection's life: a small reply allocates nothing.
  HandlerResult result;
  try {
    while (!closing_) {
      busy_ = false;
      // Draining, with the listener closed: finish what has arrived (the request whose
      // first byte is here), then close. A drain that starts while this connection waits
      // is close_when_idle()'s.
      if (host_.listener_closed.load() && !bytes_waiting()) break;
      protocol::FrameHeader header;
      if (!co_await read_frame(header, payload)) break;
      const auto arrived = std::chrono::steady_clock::now();

      protocol::FrameError error = protocol::FrameError::none;
      const wire::Request* request = protocol::verify_request(payload, error);
      if (request == nullptr) {
        co_await refuse(Status::protocol_error,
                        support::cat(protocol::to_string(error), " (", payload.size(), " bytes)"));
        break;
      }
      // A descriptor comes with exactly the requests that take one (RegisterMemory),
      // flagged FD_ATTACHED and on the frame's first byte.
      const bool takes_fd = request->body_type() == wire::RequestBody::RegisterMemory;
      const bool flagged = header.flags == protocol::kFlagFdAttached;
      if (header.flags != protocol::kFlagNone && !flagged) {
        co_await refuse(Status::protocol_error, "unknown frame flags");
        break;
      }
      if (flagged != takes_fd || received_fds_.size() != (takes_fd ? 1u : 0u)) {
        co_await refuse(Status::protocol_error,
                        support::cat(protocol::request_name(request->body_type()), " frame with ",
                                     received_fds_.size(), " descriptor(s)",
                                     flagged ? " and" : " without", " FD_ATTACHED: ",
                                     takes_fd ? "register_memory carries exactly one, flagged"
                                              : "only register_memory carries a descriptor"));
        break;
      }
      if (takes_fd) state_.received_fd = std::move(received_fds_.front());
      received_fds_.clear();
      result.reset();
      if (!handle_request_now(host_.context, state_, *request, result))
        co_await handle_request(host_.context, state_, *request, result);
      // Counted before the reply goes out: a client holding its reply must find the
      // request in the next scrape.
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived).count();
      if (host_.metrics != nullptr)
        host_.metrics->observe_request(static_cast<std::size_t>(request->body_type()),
                                       result.status, seconds);
      if (state_.hello_done && unattached_) {
        leave_unattached();
        hello_timer_.cancel();
      }
      state_.received_fd.reset();  // a descriptor the handler did not take is closed
      co_await write_frame(result.builder, result.fd());
      if (result.status != Status::ok) {
        LOG_DEBUG("session", "connection ", state_.id, ": ",
                  protocol::request_name(request->body_type()), " -> ", status_name(result.status));
      }
      shrink_payload(payload);
      result.attach.reset();  // the reply is out: its memory's descriptor is the peer's now
      if (result.builder.GetSize() > kKeptPayload)
        result.builder = flatbuffers::FlatBufferBuilder();
      if (result.close_after) break;
      // The Hello deadline passed while that request was handled, and it attached nothing.
      if (hello_expired_ && !state_.hello_done) break;
    }
  } catch (const std::exception& e) {
    if (!closing_)
      LOG_WARN("session", "connection ", state_.id, ": ", e.what(), "; closing the connection");
  }
  busy_ = false;
  close();
  leave_unattached();
  resize_payload(payload, 0, 0);
  shrink_payload(payload);
  if (host_.metrics != nullptr && payload.capacity() != 0) {
    host_.metrics->request_buffers_changed(-static_cast<std::int64_t>(payload.capacity()));
  }
  if (state_.hello_done) {
    LOG_INFO("session", "connection ", state_.id, ": client '", state_.client_name, "' (pid ",
             state_.pid, ") disconnected", state_.staging.empty() ? "" : "; staging released");
  }
  release_staging();
  host_.ended(state_.id);
}

}  // namespace statepool::service
