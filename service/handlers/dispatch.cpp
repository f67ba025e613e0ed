#include <array>
#include <exception>

#include "handlers/handlers.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/log.hpp"

namespace statepool::service {
namespace {

using Entry = Handled (*)(Call&, const wire::Request&);

template <class Request>
Handled invoke(Call& call, const wire::Request& request) {
  return handle(call, *request.body_as<Request>());
}

/// One entry per RequestBody value; 0 (NONE) has none.
constexpr auto kHandlers = [] {
  std::array<Entry, static_cast<std::size_t>(wire::RequestBody::MAX) + 1> table{};
  protocol::for_each_request([&]<class Request>() {
    table[static_cast<std::size_t>(protocol::kRequestType<Request>)] = &invoke<Request>;
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

Handled dispatch(Call& call, const wire::Request& request) {
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
    try {
      co_await kHandlers[index](call, request);
    } catch (...) {
      call.result.close_after = true;  // a connection without a lease is of no use: say why
      throw;
    }
    co_return;
  }
  if (!call.connection.hello_done) {
    call.result.close_after = true;
    throw StatusError(Status::not_hello, "the first request on a connection must be hello");
  }
  co_await kHandlers[index](call, request);
}

}  // namespace

void build_error(flatbuffers::FlatBufferBuilder& builder, std::uint64_t id, Status status,
                 const std::string& message) {
  builder.Clear();
  builder.Finish(
      wire::CreateReply(builder, id, protocol::to_wire(status), builder.CreateString(message)));
}

Handled handle_request(ServerContext& server, ConnectionState& connection,
                       const wire::Request& request, HandlerResult& result) {
  Call call{server, connection, request.id(), result};
  std::exception_ptr failure;
  try {
    co_await dispatch(call, request);
    result.status = Status::ok;
    co_return;
  } catch (...) {
    failure = std::current_exception();
  }
  result.attach.reset();
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
