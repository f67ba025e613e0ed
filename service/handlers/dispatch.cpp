#include <array>
#include <exception>
#include <type_traits>
#include <utility>

#include "handlers/handlers.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/protocol/messages.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

// A handler either answers at once (returns void: ping, allocate, free, ...) or waits
// for a worker or the executor (returns Handled, a coroutine). The table holds one of
// the two per request type; the session runs the first kind with no coroutine frame.
using Now = void (*)(Call&, const wire::Request&);
using Later = Handled (*)(Call&, const wire::Request&);
struct Entry {
  Now now = nullptr;
  Later later = nullptr;
};

template <class Request>
constexpr bool kAnswersNow =
    std::is_void_v<decltype(handle(std::declval<Call&>(), std::declval<const Request&>()))>;

template <class Request>
void invoke_now(Call& call, const wire::Request& request) {
  handle(call, *request.body_as<Request>());
}

template <class Request>
Handled invoke_later(Call& call, const wire::Request& request) {
  return handle(call, *request.body_as<Request>());
}

/// One entry per RequestBody value; 0 (NONE) has none.
constexpr auto kHandlers = [] {
  std::array<Entry, static_cast<std::size_t>(wire::RequestBody::MAX) + 1> table{};
  protocol::for_each_request([&]<class Request>() {
    Entry& entry = table[static_cast<std::size_t>(protocol::kRequestType<Request>)];
    if constexpr (kAnswersNow<Request>)
      entry.now = &invoke_now<Request>;
    else
      entry.later = &invoke_later<Request>;
  });
  return table;
}();

// Every RequestBody value but NONE is one request table for_each_request names (function
// pointers themselves are no constant expressions under the sanitizers, so the tables'
// values are counted instead).
constexpr bool every_request_handled() {
  std::array<bool, kHandlers.size()> named{};
  protocol::for_each_request([&]<class Request>() {
    named[static_cast<std::size_t>(protocol::kRequestType<Request>)] = true;
  });
  for (std::size_t i = 1; i < named.size(); ++i) {
    if (!named[i]) return false;
  }
  return true;
}
static_assert(every_request_handled(), "a request type has no handler");

/// The request's table entry, once it may run: a known type with a body, and Hello first.
/// Throws StatusError otherwise (closing the connection).
const Entry& admit(Call& call, const wire::Request& request) {
  const wire::RequestBody type = request.body_type();
  const auto index = static_cast<std::size_t>(type);
  if (index == 0 || index >= kHandlers.size()) {
    call.result.close_after = true;
    throw StatusError(Status::protocol_error,
                      "unknown request type " + std::to_string(static_cast<int>(type)));
  }
  if (request.body() == nullptr) {
    // The verifier accepts a union type without its table; every request needs one.
    call.result.close_after = true;
    throw StatusError(Status::protocol_error, std::string("request of type ") +
                                                  protocol::request_name(type) + " has no body");
  }
  if (type == wire::RequestBody::Hello) {
    // A connection without a lease is of no use: a failed Hello closes it (fail()).
    return kHandlers[index];
  }
  if (!call.connection.hello_done) {
    call.result.close_after = true;
    throw StatusError(Status::not_hello, "the first request on a connection must be hello");
  }
  if (protocol::min_version(type) > call.connection.version) {
    throw StatusError(Status::invalid_argument,
                      support::cat(protocol::request_name(type), " needs protocol version ",
                                   protocol::min_version(type), "; this connection negotiated ",
                                   call.connection.version));
  }
  return kHandlers[index];
}

/// Turns the exception a request ended with into its error reply: logged when internal,
/// audited when refused for access.
void fail(Call& call, const wire::Request& request, std::exception_ptr failure) noexcept {
  HandlerResult& result = call.result;
  const ConnectionState& connection = call.connection;
  result.attach.reset();
  if (request.body_type() == wire::RequestBody::Hello) result.close_after = true;
  try {
    std::rethrow_exception(failure);
  } catch (const StatusError& e) {
    result.status = e.status();
    // Every internal reply is logged (docs/operations.md), whoever raised it.
    if (e.status() == Status::internal) {
      LOG_ERROR("session", "connection ", connection.id, ": internal error in ",
                protocol::request_name(request.body_type()), ": ", e.what());
    }
    // What a peer may not do goes to the audit log: who, as which tenant, what, and whose.
    if (e.status() == Status::permission_denied || e.status() == Status::unknown_tenant) {
      const auto* refused = dynamic_cast<const AccessRefused*>(&e);
      support::audit(support::cat(
          "refused ", protocol::request_name(request.body_type()), " of connection ", connection.id,
          " (pid ", connection.pid, ", uid ", connection.uid, ", gid ", connection.gid, ", tenant ",
          connection.tenant.empty() ? std::string("none yet") : "'" + connection.tenant + "'",
          "): ", status_name(e.status()), ": ", e.what(),
          refused != nullptr ? support::cat(" (it belongs to tenant '", refused->owner(), "')")
                             : std::string()));
    }
    build_error(result.builder, request.id(), e.status(), e.what());
  } catch (const std::exception& e) {
    result.status = Status::internal;
    LOG_ERROR("session", "connection ", connection.id, ": internal error in ",
              protocol::request_name(request.body_type()), ": ", e.what());
    build_error(result.builder, request.id(), Status::internal,
                support::cat("internal error: ", e.what()));
  } catch (...) {
    result.status = Status::internal;
    LOG_ERROR("session", "connection ", connection.id, ": unknown exception in ",
              protocol::request_name(request.body_type()));
    build_error(result.builder, request.id(), Status::internal, "internal error");
  }
}

}  // namespace

void build_error(flatbuffers::FlatBufferBuilder& builder, std::uint64_t id, Status status,
                 const std::string& message) {
  builder.Clear();
  builder.Finish(
      wire::CreateReply(builder, id, protocol::to_wire(status), builder.CreateString(message)));
}

bool handle_request_now(ServerContext& server, ConnectionState& connection,
                        const wire::Request& request, HandlerResult& result) {
  Call call{server, connection, request.id(), result};
  try {
    const Entry& entry = admit(call, request);
    if (entry.now == nullptr) return false;
    entry.now(call, request);
    result.status = Status::ok;
  } catch (...) {
    fail(call, request, std::current_exception());
  }
  return true;
}

Handled handle_request(ServerContext& server, ConnectionState& connection,
                       const wire::Request& request, HandlerResult& result) {
  Call call{server, connection, request.id(), result};
  std::exception_ptr failure;
  try {
    const Entry& entry = admit(call, request);
    if (entry.now != nullptr)
      entry.now(call, request);
    else
      co_await entry.later(call, request);
    result.status = Status::ok;
    co_return;
  } catch (...) {
    failure = std::current_exception();
  }
  fail(call, request, failure);
}

void release_later(support::WorkerPool& workers,
                   std::shared_ptr<const Allocation> memory) noexcept {
  if (memory == nullptr) return;
  try {
    workers.post([memory = std::move(memory)]() mutable { memory.reset(); });
  } catch (...) {
    // Could not queue it (out of memory): release it here instead.
  }
}

}  // namespace statepool::service
