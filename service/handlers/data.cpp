// Compress, Decompress, Copy: validated here, run by the Executor (never on this thread),
// replied to when the work is complete.
#include <cstring>
#include <exception>
#include <optional>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/coroutine_frames.hpp"
#include "handlers/handlers.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

kernels::DType staging_dtype(wire::DType dtype) {
  STATEPOOL_EXPECTS(
      dtype == wire::DType::f32 || dtype == wire::DType::bf16, Status::invalid_argument,
      support::cat("staged states are f32 or bf16, got dtype value ", static_cast<int>(dtype)));
  return protocol::from_wire(dtype);
}

/// The request's `after` event: absent, or exactly the bytes of a cudaIpcEventHandle_t.
std::optional<IpcEventBytes> after_event(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return std::nullopt;
  IpcEventBytes event{};
  STATEPOOL_EXPECTS(bytes->size() == event.size(), Status::invalid_argument,
                    support::cat("`after` holds ", bytes->size(),
                                 " bytes; an IPC event handle has ", event.size()));
  std::memcpy(event.data(), bytes->data(), event.size());
  return event;
}

/// A compress or decompress of one page from / into a staging range.
Operation codec_operation(Call& call, OperationKind kind, std::uint32_t arena, std::uint32_t slot,
                          std::uint32_t staging, std::uint64_t offset, wire::DType wire_dtype) {
  const kernels::DType dtype = staging_dtype(wire_dtype);
  const PageRef page = call.server.pool.page(call.connection.lease, arena, slot);
  Operation op;
  op.kind = kind;
  op.dtype = dtype;
  op.codec = page.codec;
  std::shared_ptr<const Allocation> staging_memory;
  op.staged = staging_range(call.connection, staging, offset, page.codec->staged_bytes(dtype),
                            staging_memory);
  op.page = page.buffer();
  op.keep_alive = {page.memory, std::move(staging_memory)};
  return op;
}

// (handlers/coroutine_frames.hpp)
STATEPOOL_COROUTINES_BEGIN

/// Runs `op`; with `early` (the request's `event` flag), completes as soon as the executor
/// has it on a device stream and returns the IPC event's bytes (the executor's own
/// completion then only releases memory, and a late error is logged). Without `early`, or
/// on an executor that exports no events, completes when the work is done.
boost::asio::awaitable<std::optional<IpcEventBytes>> execute(Call& call, Operation op, bool early) {
  if (!early) {
    const std::vector<std::shared_ptr<const Allocation>> used = op.keep_alive;
    co_await async_execute(call.server.executor, std::move(op), boost::asio::use_awaitable);
    expect_intact(used);
    co_return std::nullopt;
  }
  const OperationKind kind = op.kind;
  const std::uint64_t connection = call.connection.id;
  auto late = [kind, connection](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      LOG_WARN("data", "connection ", connection, ": ", to_string(kind),
               " answered early (IPC event) failed on the device: ", e.what());
    }
  };
  auto [error, event] =
      co_await async_execute_early(call.server.executor, std::move(op), std::move(late),
                                   boost::asio::as_tuple(boost::asio::use_awaitable));
  if (error) std::rethrow_exception(error);
  co_return event;
}
STATEPOOL_COROUTINES_END

flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> event_bytes(
    Call& call, const std::optional<IpcEventBytes>& event) {
  if (!event) return 0;
  return call.builder().CreateVector(reinterpret_cast<const std::uint8_t*>(event->data()),
                                     event->size());
}

}  // namespace

kernels::BufferRef staging_range(const ConnectionState& c, std::uint32_t id, std::uint64_t offset,
                                 std::size_t bytes, std::shared_ptr<const Allocation>& owner) {
  const auto it = c.staging.find(id);
  STATEPOOL_EXPECTS(it != c.staging.end(), Status::not_found,
                    support::cat("no staging buffer ", id, " on this connection"));
  kernels::BufferRef all = it->second->buffer();
  STATEPOOL_EXPECTS(offset <= all.size && bytes <= all.size - offset, Status::invalid_argument,
                    support::cat("staging range [", offset, ", ", offset + bytes, ") exceeds the ",
                                 all.size, "-byte staging buffer"));
  owner = it->second;
  all.data += offset;
  all.size = bytes;
  return all;
}

Handled handle(Call& call, const wire::Compress& in) {
  auto after = after_event(in.after());
  Operation op = codec_operation(call, OperationKind::compress, in.arena_id(), in.slot(),
                                 in.staging_id(), in.offset(), in.dtype());
  op.after = std::move(after);
  const std::uint64_t page_bytes = op.codec->page_bytes();
  const auto event = co_await execute(call, std::move(op), in.event());
  const auto bytes = event_bytes(call, event);
  call.reply<wire::Compress>(wire::CreateCompressReply(call.builder(), page_bytes, bytes));
}

Handled handle(Call& call, const wire::Decompress& in) {
  auto after = after_event(in.after());
  Operation op = codec_operation(call, OperationKind::decompress, in.arena_id(), in.slot(),
                                 in.staging_id(), in.offset(), in.dtype());
  op.after = std::move(after);
  const std::uint64_t state_bytes = op.staged.size;
  const auto event = co_await execute(call, std::move(op), in.event());
  const auto bytes = event_bytes(call, event);
  call.reply<wire::Decompress>(wire::CreateDecompressReply(call.builder(), state_bytes, bytes));
}

Handled handle(Call& call, const wire::Copy& in) {
  auto after = after_event(in.after());
  Pool& pool = call.server.pool;
  const PageRef src = pool.page(call.connection.lease, in.arena_id(), in.src_slot());
  const PageRef dst = pool.page(call.connection.lease, in.arena_id(), in.dst_slot());
  Operation op;
  op.kind = OperationKind::copy;
  op.source = src.buffer();
  op.page = dst.buffer();
  op.keep_alive = {src.memory};
  op.after = std::move(after);
  const auto event = co_await execute(call, std::move(op), in.event());
  const auto bytes = event_bytes(call, event);
  call.reply<wire::Copy>(wire::CreateCopyReply(call.builder(), bytes));
}

}  // namespace statepool::service
