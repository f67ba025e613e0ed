// What the snapshot handlers share: snapshot_io.hpp.
#include "handlers/snapshot_io.hpp"

#include <utility>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/coroutine_frames.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/status.hpp"
#include "store/snapshot_value.hpp"

namespace statepool::service {

STATEPOOL_COROUTINES_BEGIN

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

boost::asio::awaitable<void> copy_page(Call& call, kernels::BufferRef source,
                                       kernels::BufferRef target,
                                       std::vector<std::shared_ptr<const Allocation>> keep_alive) {
  Operation op;
  op.kind = OperationKind::copy;
  op.source = source;
  op.page = target;
  op.keep_alive = std::move(keep_alive);
  const std::vector<std::shared_ptr<const Allocation>> used = op.keep_alive;
  co_await async_execute(call.server.executor, std::move(op), boost::asio::use_awaitable);
  expect_intact(used);  // a staging range may be memory a client lent
}

kernels::BufferRef host_buffer(std::span<std::byte> bytes) {
  return kernels::BufferRef{bytes.data(), bytes.size(), kernels::MemorySpace::host, -1};
}

KvRange kv_range(const Call& call, const wire::KvStaging& in, const kernels::KvBlocks& blocks) {
  KvRange out;
  out.dtype = protocol::from_wire(in.dtype(), "kv_staging.dtype");
  const std::uint64_t bytes = kernels::kv_blocks_plain_bytes(blocks, out.dtype);
  out.staged = staging_range(call.connection, in.staging_id(), in.offset(), bytes, out.memory);
  return out;
}

boost::asio::awaitable<void> run_kv(Call& call, OperationKind kind, const kernels::KvBlocks& kv,
                                    const KvRange& range, std::vector<kernels::BufferRef> chunks,
                                    std::vector<std::shared_ptr<const Allocation>> keep_alive) {
  Operation op;
  op.kind = kind;
  op.kv = kv;
  op.dtype = range.dtype;
  op.staged = range.staged;
  op.chunks = std::move(chunks);
  op.keep_alive = std::move(keep_alive);
  op.keep_alive.push_back(range.memory);
  const std::vector<std::shared_ptr<const Allocation>> used = op.keep_alive;
  co_await async_execute(call.server.executor, std::move(op), boost::asio::use_awaitable);
  expect_intact(used);
}

boost::asio::awaitable<void> fill_value(Call& call, std::string& value, const SnapshotCopy& pages,
                                        kernels::BufferRef page) {
  co_await copy_page(call, page, host_buffer(snapshot_value_page(value)), pages.keep_alive);
  std::size_t at = 0;
  const std::span<std::byte> kv_area = snapshot_value_kv(value);
  for (const kernels::BufferRef& chunk : pages.kv_chunks) {
    co_await copy_page(call, chunk, host_buffer(kv_area.subspan(at, chunk.size)), pages.keep_alive);
    at += chunk.size;
  }
}

boost::asio::awaitable<void> write_through(Call& call, const SnapshotPut& put,
                                           const SnapshotKey& key,
                                           std::shared_ptr<SnapshotTierHold> hold) {
  ServerContext& s = call.server;
  SnapshotName name{put.space, key.prefix, key.position, put.layout_digest};
  auto value = std::make_shared<std::string>(snapshot_value_frame(name, put.page_bytes, put.kv));
  co_await fill_value(call, *value, *put.copy, put.copy->target);
  const std::string tenant = call.connection.tenant;
  s.workers.post([tiers = s.tiers, name = std::move(name), tenant, value = std::move(value),
                  hold = std::move(hold)] {
    seal_snapshot_value(*value);
    tiers->publish(name, tenant, value, hold);
  });
}

std::shared_ptr<SnapshotTierHold> tier_hold(const ServerContext& s) {
  return s.tiers != nullptr && s.tiers->enabled() ? std::make_shared<SnapshotTierHold>() : nullptr;
}

kernels::BufferRef read_only(std::span<const std::byte> bytes) {
  return host_buffer({const_cast<std::byte*>(bytes.data()), bytes.size()});  // NOLINT
}

STATEPOOL_COROUTINES_END

}  // namespace statepool::service
