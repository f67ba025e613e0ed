#pragma once
// What the snapshot handlers share (snapshots.cpp, snapshot_batches.cpp): keys between the
// wire and the pool, page copies and KV blocks on the Executor, the write-through of a
// published snapshot to the tiers below the pool. Handler internals: not a public API.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "handlers/handlers.hpp"

namespace statepool::service {

inline constexpr std::uint32_t kDefaultListLimit = 1000;
inline constexpr std::uint32_t kMaxListLimit = 10000;

/// A byte vector of a request as a string (empty when absent).
[[nodiscard]] std::string bytes_of(const flatbuffers::Vector<std::uint8_t>* bytes);
/// The request's key; invalid_argument when absent.
[[nodiscard]] SnapshotKey key_of(const wire::SnapshotKey* key);
[[nodiscard]] flatbuffers::Offset<wire::SnapshotKey> to_wire(flatbuffers::FlatBufferBuilder& b,
                                                             const SnapshotKey& key);

/// Host bytes as an executor buffer.
[[nodiscard]] kernels::BufferRef host_buffer(std::span<std::byte> bytes);
/// Read only: the executor's buffers are mutable in general.
[[nodiscard]] kernels::BufferRef read_only(std::span<const std::byte> bytes);

/// Copies `source` to `target` (one page) on the Executor.
boost::asio::awaitable<void> copy_page(Call& call, kernels::BufferRef source,
                                       kernels::BufferRef target,
                                       std::vector<std::shared_ptr<const Allocation>> keep_alive);

/// Where a request's KV block values are: a staging range of this connection.
struct KvRange {
  kernels::DType dtype = kernels::DType::bf16;
  kernels::BufferRef staged;
  std::shared_ptr<const Allocation> memory;
};
/// The range of `in` for `blocks` (checked: not_found, invalid_argument).
[[nodiscard]] KvRange kv_range(const Call& call, const wire::KvStaging& in,
                               const kernels::KvBlocks& blocks);
/// KV blocks between a staging range and their encoded chunks, on the Executor.
boost::asio::awaitable<void> run_kv(Call& call, OperationKind kind, const kernels::KvBlocks& kv,
                                    const KvRange& range, std::vector<kernels::BufferRef> chunks,
                                    std::vector<std::shared_ptr<const Allocation>> keep_alive);

/// A value framed by snapshot_value_frame, filled from a snapshot's pages (its state's
/// page, then its KV pages into the KV area), one copy each on the Executor; not sealed.
boost::asio::awaitable<void> fill_value(Call& call, std::string& value, const SnapshotCopy& pages,
                                        kernels::BufferRef page);
/// A published snapshot into the tiers below the pool: its pages are copied into a value
/// while the snapshot is still being written (so they cannot go meanwhile); the checksum
/// and the tiers' work run on a worker, the remote write later. `hold` (the one the pool
/// keeps with the snapshot) follows the value down.
boost::asio::awaitable<void> write_through(Call& call, const SnapshotPut& put,
                                           const SnapshotKey& key,
                                           std::shared_ptr<SnapshotTierHold> hold);
/// What the tiers below the pool will hold of a snapshot published now: null without
/// tiers (its eviction is then no demotion).
[[nodiscard]] std::shared_ptr<SnapshotTierHold> tier_hold(const ServerContext& s);

}  // namespace statepool::service
