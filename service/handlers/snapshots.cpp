// PutSnapshot, GetSnapshot (the page copy on the Executor, replied to when it is done),
// DeleteSnapshot, PinSnapshot, ListSnapshots (the pool's tables only: inline).
#include <algorithm>
#include <string>
#include <vector>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/handlers.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

constexpr std::uint32_t kDefaultListLimit = 1000;
constexpr std::uint32_t kMaxListLimit = 10000;

std::string bytes_of(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return {};
  return {reinterpret_cast<const char*>(bytes->data()), bytes->size()};
}

SnapshotKey key_of(const wire::SnapshotKey* key) {
  STATEPOOL_EXPECTS(key != nullptr, Status::invalid_argument, "the request has no snapshot key");
  return SnapshotKey{bytes_of(key->prefix()), key->position()};
}

flatbuffers::Offset<wire::SnapshotKey> to_wire(flatbuffers::FlatBufferBuilder& b,
                                               const SnapshotKey& key) {
  const auto prefix =
      b.CreateVector(reinterpret_cast<const std::uint8_t*>(key.prefix.data()), key.prefix.size());
  return wire::CreateSnapshotKey(b, prefix, key.position);
}

/// Runs the page copy of a put or a get on the Executor and ends it.
boost::asio::awaitable<void> run_copy(Call& call, SnapshotCopy& copy) {
  Operation op;
  op.kind = OperationKind::copy;
  op.source = copy.source;
  op.page = copy.target;
  op.keep_alive = copy.keep_alive;
  co_await async_execute(call.server.executor, std::move(op), boost::asio::use_awaitable);
  copy.done();
}

}  // namespace

Handled handle(Call& call, const wire::PutSnapshot& in) {
  SnapshotPut put = call.server.pool.put_snapshot(call.connection.lease, in.arena_id(), in.slot(),
                                                  key_of(in.key()));
  if (put.copy) co_await run_copy(call, *put.copy);  // an error forgets the snapshot
  call.reply<wire::PutSnapshot>(
      wire::CreatePutSnapshotReply(call.builder(), put.created, put.evicted, put.page_bytes));
}

Handled handle(Call& call, const wire::GetSnapshot& in) {
  SnapshotGet get = call.server.pool.get_snapshot(call.connection.lease, in.arena_id(), in.slot(),
                                                  key_of(in.key()));
  if (get.copy) co_await run_copy(call, *get.copy);
  call.reply<wire::GetSnapshot>(
      wire::CreateGetSnapshotReply(call.builder(), get.hit, get.other_layouts, get.page_bytes));
}

Handled handle(Call& call, const wire::DeleteSnapshot& in) {
  const std::uint32_t deleted =
      call.server.pool.delete_snapshot(call.connection.tenant, key_of(in.key()));
  call.reply<wire::DeleteSnapshot>(wire::CreateDeleteSnapshotReply(call.builder(), deleted));
  co_return;
}

Handled handle(Call& call, const wire::PinSnapshot& in) {
  const std::uint32_t changed =
      call.server.pool.pin_snapshot(call.connection.tenant, key_of(in.key()), in.pinned());
  call.reply<wire::PinSnapshot>(wire::CreatePinSnapshotReply(call.builder(), changed));
  co_return;
}

Handled handle(Call& call, const wire::ListSnapshots& in) {
  const std::string start = bytes_of(in.prefix());
  STATEPOOL_EXPECTS(
      start.size() <= kMaxSnapshotPrefixBytes, Status::invalid_argument,
      cat("a snapshot prefix is at most ", kMaxSnapshotPrefixBytes, " bytes, got ", start.size()));
  STATEPOOL_EXPECTS(in.limit() <= kMaxListLimit, Status::invalid_argument,
                    cat("list limit must be at most ", kMaxListLimit, ", got ", in.limit()));
  const std::uint32_t limit = in.limit() == 0 ? kDefaultListLimit : in.limit();
  Pool& pool = call.server.pool;
  bool more = false;
  const std::vector<SnapshotInfo> found =
      pool.list_snapshots(call.connection.tenant, start, limit, more);
  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::SnapshotEntry>> entries;
  entries.reserve(found.size());
  for (const SnapshotInfo& s : found) {
    entries.push_back(wire::CreateSnapshotEntry(
        b, to_wire(b, s.key), s.layout, b.CreateString(s.layout_name), protocol::to_wire(s.codec),
        b.CreateString(s.tenant), s.arena, s.page_bytes, s.fp32_bytes, s.pinned, s.hits,
        s.age_seconds, s.idle_seconds));
  }
  const auto space = b.CreateString(pool.snapshot_namespace(call.connection.tenant));
  call.reply<wire::ListSnapshots>(
      wire::CreateListSnapshotsReply(b, b.CreateVector(entries), more, space));
  co_return;
}

}  // namespace statepool::service
