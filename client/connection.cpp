// The round trip every request takes (Impl::call: framing, status, reply type,
// descriptors), what makes a connection unusable, and the Connection's own state. The
// request methods are in requests/, one file per concern (requests/requests.hpp).

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace detail {
namespace {

using Kind = ConnectionError::Kind;

/// Payload bytes the first read of a reply may take with its header: most replies fit.
constexpr std::size_t kFirstRead = 4096;

// After these statuses the daemon closes the connection (protocol/statepool.fbs).
bool closes_connection(Status status) noexcept {
  return status == Status::protocol_error || status == Status::not_hello ||
         status == Status::unsupported_version || status == Status::too_many_connections;
}

// Reply tables without fields: a daemon may leave the union empty for them.
bool empty_reply(wire::ReplyBody body) noexcept {
  return body == wire::ReplyBody::CloseStagingReply || body == wire::ReplyBody::CopyReply ||
         body == wire::ReplyBody::DrainReply;
}

const char* reply_name(wire::ReplyBody body) noexcept {
  const char* name = wire::EnumNameReplyBody(body);
  return (name != nullptr && *name != '\0') ? name : "unknown";
}

}  // namespace

Impl::Impl(UniqueFd fd, const Options& options)
    : socket(std::move(fd)),
      timeout(options.timeout),
      max_reply_bytes(std::min(
          options.max_reply_bytes == 0 ? protocol::kDefaultMaxPayload : options.max_reply_bytes,
          protocol::kAbsoluteMaxPayload)),
      map_device_memory(options.map_device_memory),
      legacy_ipc(options.legacy_ipc) {}

void Impl::mark_broken(const std::string& reason) noexcept {
  if (broken) return;
  try {
    broken_reason = reason;
  } catch (...) {
    // Keep going without the text: being broken matters more than saying why.
  }
  broken = true;
  socket.reset();
  received_fds.clear();
}

void Impl::check_usable() const {
  if (broken || !socket) {
    throw ConnectionError(Kind::closed, "the connection to statepoold is no longer usable (" +
                                            broken_reason + "); make a new Connection");
  }
}

bool Impl::healthy() {
  const std::lock_guard lock(mutex);
  return !broken && static_cast<bool>(socket);
}

const wire::Reply& Impl::roundtrip(wire::RequestBody type, flatbuffers::Offset<void> body,
                                   wire::ReplyBody expected, UniqueFd* fd_out, int fd_in) {
  check_usable();
  const char* name = protocol::request_name(type);
  const std::uint64_t id = next_id++;
  builder.Finish(wire::CreateRequest(builder, id, type, body));
  const std::uint32_t size = builder.GetSize();
  if (max_frame_bytes != 0 && size > max_frame_bytes) {
    throw Error(Status::invalid_argument,
                std::string(name) + " request is " + std::to_string(size) +
                    " bytes, more than the daemon's frame limit of " +
                    std::to_string(max_frame_bytes) + "; split it into smaller requests");
  }
  try {
    const Deadline deadline = Deadline::after(timeout);
    protocol::FrameHeader header;
    header.type = protocol::FrameType::request;
    header.flags = fd_in >= 0 ? protocol::kFlagFdAttached : protocol::kFlagNone;
    header.length = size;
    const auto head = protocol::encode_header(header);
    // A daemon that refuses a connection (limit reached, peer not allowed) writes its
    // error reply and closes without reading; the request may then fail with EPIPE while
    // the reply already waits in the receive queue. Read it: it says what went wrong.
    std::optional<ConnectionError> send_error;
    try {
      send_frame(socket.get(), head,
                 std::as_bytes(std::span(builder.GetBufferPointer(), builder.GetSize())), deadline,
                 fd_in);
    } catch (const ConnectionError& error) {
      if (error.kind() != Kind::closed) throw;
      send_error = error;
    }

    received_fds.clear();
    std::array<std::byte, protocol::kHeaderBytes> raw{};
    // The reply's header and, when it is small, its whole payload in one read: nothing
    // but this reply can be in the socket (one request at a time on a connection, and
    // the daemon sends nothing unasked).
    if (payload.size() < kFirstRead) payload.resize(kFirstRead);
    std::size_t got = 0;
    try {
      wait_readable(socket.get(), deadline, "waiting for the reply");
      got = recv_some(socket.get(), raw, payload, received_fds, deadline, "waiting for the reply");
      if (got < raw.size())
        recv_exact(socket.get(), std::span(raw).subspan(got), received_fds, deadline,
                   "waiting for the reply");
    } catch (const ConnectionError&) {
      if (send_error) throw ConnectionError(*send_error);
      throw;
    }
    const protocol::FrameHeader reply_header = protocol::decode_header(raw);
    const protocol::FrameError header_error =
        protocol::check_header(reply_header, protocol::FrameType::reply, max_reply_bytes);
    if (header_error == protocol::FrameError::too_large) {
      throw ConnectionError(Kind::bad_frame, std::string("statepoold's reply to ") + name + " is " +
                                                 std::to_string(reply_header.length) +
                                                 " bytes, more than this client accepts (" +
                                                 std::to_string(max_reply_bytes) +
                                                 "); raise Options::max_reply_bytes");
    }
    if (header_error != protocol::FrameError::none) {
      throw ConnectionError(Kind::bad_frame,
                            std::string("statepoold sent an invalid reply header to ") + name +
                                ": " + protocol::to_string(header_error) +
                                " (is this socket really statepoold's, and of a compatible "
                                "version?)");
    }
    const std::size_t early = got > raw.size() ? got - raw.size() : 0;
    if (early > reply_header.length) {
      throw ConnectionError(Kind::bad_frame, std::string("statepoold sent ") +
                                                 std::to_string(early - reply_header.length) +
                                                 " bytes after its reply to " + name);
    }
    if (payload.size() < reply_header.length) payload.resize(reply_header.length);
    const std::span<std::byte> reply_bytes(payload.data(), reply_header.length);
    recv_exact(socket.get(), reply_bytes.subspan(early), received_fds, deadline,
               "reading the reply");
    protocol::FrameError payload_error = protocol::FrameError::none;
    const wire::Reply* reply = protocol::verify_reply(reply_bytes, payload_error);
    if (reply == nullptr) {
      throw ConnectionError(Kind::bad_frame,
                            std::string("statepoold's reply to ") + name +
                                " does not verify: " + protocol::to_string(payload_error));
    }
    const Status status = protocol::from_wire(reply->status());
    const bool status_ok = status == Status::ok;
    if (send_error && status_ok) throw ConnectionError(*send_error);
    if (reply->id() != id && !(reply->id() == 0 && !status_ok)) {
      throw ConnectionError(
          Kind::bad_frame, std::string("statepoold answered request ") + std::to_string(id) + " (" +
                               name + ") with the reply to request " + std::to_string(reply->id()));
    }
    UniqueFd attached;
    if ((reply_header.flags & protocol::kFlagFdAttached) != 0) {
      if (received_fds.empty()) {
        throw ConnectionError(Kind::bad_frame,
                              std::string("statepoold's reply to ") + name +
                                  " is flagged FD_ATTACHED but carries no file descriptor");
      }
      attached = std::move(received_fds.front());
    }
    received_fds.clear();  // closes whatever else arrived: never leak a descriptor

    if (!status_ok) {
      std::string message = reply->message() != nullptr ? reply->message()->str() : "";
      if (message.empty()) {
        message = std::string("statepoold refused ") + name + ": " + status_name(status);
      }
      // Id 0 answers a frame the daemon could not read, or refuses the whole connection:
      // either way the daemon closes it.
      if (closes_connection(status) || reply->id() == 0 || send_error) {
        mark_broken("statepoold closed it: " + message);
      }
      throw Error(status, message);
    }
    if (reply->body_type() != expected || reply->body() == nullptr) {
      if (!(reply->body_type() == wire::ReplyBody::NONE && empty_reply(expected))) {
        throw ConnectionError(Kind::bad_frame, std::string("statepoold answered ") + name +
                                                   " with a " + reply_name(reply->body_type()) +
                                                   " body, expected " + reply_name(expected));
      }
    }
    if (fd_out != nullptr) *fd_out = std::move(attached);
    return *reply;
  } catch (const ConnectionError& error) {
    mark_broken(error.what());
    throw;
  }
}

std::string str(const flatbuffers::String* s) {
  return s != nullptr ? s->str() : std::string();
}

void inconsistent(const std::string& what) {
  throw Error(Status::internal, "statepoold sent an inconsistent reply: " + what +
                                    " (client and daemon builds may differ; report it)");
}

kernels::CodecId reply_codec(wire::CodecId codec) {
  try {
    return protocol::from_wire(codec);
  } catch (const StatusError& e) {
    inconsistent(e.what());
  }
}

std::shared_ptr<const kernels::PageCodec> Impl::codec_for(LayoutId layout) {
  const std::lock_guard lock(codecs_mutex);
  const auto it = codecs.find(layout);
  return it == codecs.end() ? nullptr : it->second;
}

}  // namespace detail

namespace {
using Kind = ConnectionError::Kind;
}  // namespace

const char* to_string(ConnectionError::Kind kind) noexcept {
  switch (kind) {
    case Kind::connect_failed: return "connect_failed";
    case Kind::closed: return "closed";
    case Kind::timed_out: return "timed_out";
    case Kind::bad_frame: return "bad_frame";
    case Kind::io_error: return "io_error";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// Connection

Connection::~Connection() = default;

detail::Impl& Connection::impl() const {
  if (!impl_) {
    throw ConnectionError(Kind::closed, "use of a moved-from statepool::client::Connection");
  }
  return *impl_;
}

bool Connection::healthy() const noexcept {
  return impl_ != nullptr && impl_->healthy();
}

}  // namespace statepool::client
