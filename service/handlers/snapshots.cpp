// PutSnapshot, GetSnapshot (the page copies and KV codecs on the Executor, the tiers below
// the pool on a worker; replied to when they are done), DeleteSnapshot, PinSnapshot,
// ListSnapshots (the pool's tables only: inline), ExportSnapshot and ImportSnapshot (a
// snapshot as one value through a staging buffer). docs/prefix-store.md.
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/handlers.hpp"
#include "handlers/snapshot_io.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/status.hpp"
#include "store/snapshot_value.hpp"

namespace statepool::service {

Handled handle(Call& call, const wire::PutSnapshot& in) {
  const SnapshotKey key = key_of(in.key());
  std::optional<kernels::KvBlocks> kv;
  KvRange range;
  if (in.kv() != nullptr) {
    STATEPOOL_EXPECTS(in.kv_staging() != nullptr, Status::invalid_argument,
                      "a snapshot with KV blocks needs kv_staging: where their values are");
    kv = protocol::from_wire(*in.kv());
    const char* problem = kernels::kv_blocks_problem(*kv);
    STATEPOOL_EXPECTS(
        problem == nullptr, Status::invalid_argument,
        support::cat("the snapshot's KV blocks: ", problem == nullptr ? "" : problem));
    range = kv_range(call, *in.kv_staging(), *kv);  // checked before anything is taken
  } else {
    STATEPOOL_EXPECTS(in.kv_staging() == nullptr, Status::invalid_argument,
                      "kv_staging without kv: say what KV blocks the range holds");
  }
  std::shared_ptr<SnapshotTierHold> hold = tier_hold(call.server);
  SnapshotPut put =
      call.server.pool.put_snapshot(call.connection.lease, in.arena_id(), in.slot(), key, kv, hold);
  if (put.copy) {  // an error below forgets the snapshot
    co_await copy_page(call, put.copy->source, put.copy->target, put.copy->keep_alive);
    if (kv) {
      co_await run_kv(call, OperationKind::kv_encode, *kv, range, put.copy->kv_chunks,
                      put.copy->keep_alive);
    }
    if (hold != nullptr) co_await write_through(call, put, key, std::move(hold));
    put.copy->done();
  }
  auto& b = call.builder();
  const auto kv_table = put.kv ? protocol::to_wire(b, *put.kv) : 0;
  call.reply<wire::PutSnapshot>(wire::CreatePutSnapshotReply(
      b, put.created, put.evicted, put.page_bytes, kv_table, put.kv_bytes, put.pages));
}

namespace {

/// A pool hit: the snapshot's page into the slot, and its KV blocks into the caller's range
/// when it asked for them (the range is checked before the page is copied: a refusal
/// leaves the slot as it was). Returns whether the KV blocks were delivered.
boost::asio::awaitable<bool> serve_from_pool(Call& call, SnapshotCopy& copy,
                                             const wire::KvStaging* where) {
  KvRange range;
  if (copy.kv && where != nullptr) range = kv_range(call, *where, *copy.kv);
  co_await copy_page(call, copy.source, copy.target, copy.keep_alive);
  bool delivered = false;
  if (range.memory != nullptr) {
    co_await run_kv(call, OperationKind::kv_decode, *copy.kv, range, copy.kv_chunks,
                    copy.keep_alive);
    delivered = true;
  }
  copy.done();
  co_return delivered;
}

/// A hit below the pool: the value's page into the slot (looked up again: it may have been
/// freed while the tiers were asked), its KV blocks into the caller's range as above.
boost::asio::awaitable<bool> serve_from_tier(Call& call, const wire::GetSnapshot& in,
                                             const SnapshotTiers::Found& found) {
  KvRange range;
  if (found.kv && in.kv_staging() != nullptr) range = kv_range(call, *in.kv_staging(), *found.kv);
  const PageRef page = call.server.pool.page(call.connection.lease, in.arena_id(), in.slot());
  // A named vector: GCC 12 rejects a braced list inside this co_await.
  std::vector<std::shared_ptr<const Allocation>> keep{page.memory};
  co_await copy_page(call, read_only(found.page), page.buffer(), keep);
  if (range.memory == nullptr) co_return false;
  std::vector<kernels::BufferRef> chunks{read_only(found.kv_bytes)};
  co_await run_kv(call, OperationKind::kv_decode, *found.kv, range, std::move(chunks),
                  std::move(keep));
  co_return true;
}

}  // namespace

Handled handle(Call& call, const wire::GetSnapshot& in) {
  ServerContext& s = call.server;
  const SnapshotKey key = key_of(in.key());
  const bool below = s.tiers != nullptr && s.tiers->enabled();
  SnapshotGet get =
      s.pool.get_snapshot(call.connection.lease, in.arena_id(), in.slot(), key, below);
  std::string tier;                     // the tier that served a hit
  std::optional<kernels::KvBlocks> kv;  // the hit's KV blocks
  bool delivered = false;
  if (get.copy) {
    tier = "pool";
    kv = get.copy->kv;
    delivered = co_await serve_from_pool(call, *get.copy, in.kv_staging());
  } else if (below) {
    const SnapshotName name{get.space, key.prefix, key.position, get.layout_digest};
    std::optional<SnapshotTiers::Found> found;
    const std::string tenant = call.connection.tenant;
    co_await async_run(
        s.workers, [&] { found = s.tiers->find(name, get.page_bytes, tenant); },
        boost::asio::use_awaitable);
    if (!found) {
      s.pool.count_lower_tier_lookup(tenant, "");  // a miss in every tier
    } else {
      kv = found->kv;
      delivered = co_await serve_from_tier(call, in, *found);
      s.pool.count_lower_tier_lookup(tenant, found->tier);
      get.hit = true;
      get.other_layouts = 0;
      tier = found->tier;
    }
  }
  auto& b = call.builder();
  const auto tier_text = get.hit ? b.CreateString(tier) : 0;
  const auto kv_table = kv ? protocol::to_wire(b, *kv) : 0;
  const std::uint64_t kv_bytes = kv ? kernels::kv_blocks_encoded_bytes(*kv) : 0;
  call.reply<wire::GetSnapshot>(wire::CreateGetSnapshotReply(
      b, get.hit, get.other_layouts, get.page_bytes, tier_text, kv_table, kv_bytes, delivered));
}

Handled handle(Call& call, const wire::DeleteSnapshot& in) {
  ServerContext& s = call.server;
  const SnapshotKey key = key_of(in.key());
  std::vector<std::string> digests;
  const std::uint32_t deleted = s.pool.delete_snapshot(call.connection.tenant, key, &digests);
  if (s.tiers != nullptr && s.tiers->enabled()) {
    std::vector<SnapshotName> names;
    const std::string& space = s.pool.snapshot_namespace(call.connection.tenant);
    for (std::string& digest : digests) {
      names.push_back(SnapshotName{space, key.prefix, key.position, std::move(digest)});
    }
    // The host tier's index is scanned: on a worker.
    co_await async_run(
        s.workers, [&] { s.tiers->remove(space, key.prefix, key.position, names); },
        boost::asio::use_awaitable);
  }
  call.reply<wire::DeleteSnapshot>(wire::CreateDeleteSnapshotReply(call.builder(), deleted));
}

void handle(Call& call, const wire::PinSnapshot& in) {
  const std::uint32_t changed =
      call.server.pool.pin_snapshot(call.connection.tenant, key_of(in.key()), in.pinned());
  call.reply<wire::PinSnapshot>(wire::CreatePinSnapshotReply(call.builder(), changed));
}

void handle(Call& call, const wire::ListSnapshots& in) {
  const std::string start = bytes_of(in.prefix());
  STATEPOOL_EXPECTS(start.size() <= kMaxSnapshotPrefixBytes, Status::invalid_argument,
                    support::cat("a snapshot prefix is at most ", kMaxSnapshotPrefixBytes,
                                 " bytes, got ", start.size()));
  STATEPOOL_EXPECTS(
      in.limit() <= kMaxListLimit, Status::invalid_argument,
      support::cat("list limit must be at most ", kMaxListLimit, ", got ", in.limit()));
  const std::uint32_t limit = in.limit() == 0 ? kDefaultListLimit : in.limit();
  Pool& pool = call.server.pool;
  bool more = false;
  const std::vector<SnapshotInfo> found =
      pool.list_snapshots(call.connection.tenant, start, limit, more);
  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::SnapshotEntry>> entries;
  entries.reserve(found.size());
  for (const SnapshotInfo& s : found) {
    entries.push_back(
        wire::CreateSnapshotEntry(b, to_wire(b, s.key), s.layout_id, b.CreateString(s.layout_name),
                                  protocol::to_wire(s.codec), b.CreateString(s.tenant), s.arena_id,
                                  s.page_bytes, s.fp32_bytes, s.pinned, s.hits, s.age_seconds,
                                  s.idle_seconds, s.kv ? protocol::to_wire(b, *s.kv) : 0,
                                  s.kv_bytes, s.pages, b.CreateString(s.layout_digest)));
  }
  const auto space = b.CreateString(pool.snapshot_namespace(call.connection.tenant));
  call.reply<wire::ListSnapshots>(
      wire::CreateListSnapshotsReply(b, b.CreateVector(entries), more, space));
}

Handled handle(Call& call, const wire::ExportSnapshot& in) {
  ServerContext& s = call.server;
  const SnapshotKey key = key_of(in.key());
  const std::string digest = in.layout_digest() == nullptr ? "" : in.layout_digest()->str();
  SnapshotGet got = s.pool.export_snapshot(call.connection.tenant, key, digest);
  auto& b = call.builder();
  if (!got.copy) {
    call.reply<wire::ExportSnapshot>(wire::CreateExportSnapshotReply(b, false));
    co_return;
  }
  const SnapshotName name{got.space, key.prefix, key.position, got.layout_digest};
  const std::optional<kernels::KvBlocks> kv = got.copy->kv;
  std::uint64_t bytes = 0;
  if (in.staging_id() == 0) {  // the size only
    // The header (the same with or without KV blocks), the page, the blocks.
    bytes = snapshot_value_frame(name, 0).size() + got.page_bytes +
            (kv ? kernels::kv_blocks_encoded_bytes(*kv) : 0);
  } else {
    std::string value = snapshot_value_frame(name, got.page_bytes, kv);
    bytes = value.size();
    std::shared_ptr<const Allocation> staging;  // checked before anything is copied
    const kernels::BufferRef range =
        staging_range(call.connection, in.staging_id(), in.offset(), value.size(), staging);
    co_await fill_value(call, value, *got.copy, got.copy->source);
    got.copy->done();  // the snapshot's pages are read
    co_await async_run(
        s.workers, [&] { seal_snapshot_value(value); }, boost::asio::use_awaitable);
    std::vector<std::shared_ptr<const Allocation>> keep{staging};
    co_await copy_page(call,
                       host_buffer({reinterpret_cast<std::byte*>(value.data()), value.size()}),
                       range, std::move(keep));
  }
  auto& out = call.builder();
  const auto digest_text = out.CreateString(got.layout_digest);
  const auto kv_table = kv ? protocol::to_wire(out, *kv) : 0;
  call.reply<wire::ExportSnapshot>(
      wire::CreateExportSnapshotReply(out, true, bytes, digest_text, kv_table));
}

namespace {

/// The bytes of a staging range in host memory, copied on the Executor.
boost::asio::awaitable<std::shared_ptr<std::string>> read_staging(
    Call& call, kernels::BufferRef range, std::shared_ptr<const Allocation> staging) {
  auto value = std::make_shared<std::string>(range.size, '\0');
  std::vector<std::shared_ptr<const Allocation>> keep{std::move(staging)};
  co_await copy_page(call, range,
                     host_buffer({reinterpret_cast<std::byte*>(value->data()), value->size()}),
                     std::move(keep));
  co_return value;
}

/// An imported value's page and KV blocks into the pages of `copy`, on the Executor.
boost::asio::awaitable<void> place_value(Call& call, const SnapshotCopy& copy,
                                         const SnapshotValueView& view) {
  co_await copy_page(call, read_only(view.page), copy.target, copy.keep_alive);
  std::size_t at = 0;
  for (const kernels::BufferRef& chunk : copy.kv_chunks) {
    co_await copy_page(call, read_only(view.kv_bytes.subspan(at, chunk.size)), chunk,
                       copy.keep_alive);
    at += chunk.size;
  }
}

}  // namespace

Handled handle(Call& call, const wire::ImportSnapshot& in) {
  ServerContext& s = call.server;
  STATEPOOL_EXPECTS(in.bytes() > 0, Status::invalid_argument, "import of an empty value");
  std::shared_ptr<const Allocation> staging;
  const kernels::BufferRef range =
      staging_range(call.connection, in.staging_id(), in.offset(), in.bytes(), staging);
  const std::shared_ptr<std::string> value = co_await read_staging(call, range, staging);
  // Checked whole (the CRC over every byte) on a worker.
  std::optional<SnapshotValueHeader> header;
  std::optional<SnapshotValueView> view;
  std::string why;
  co_await async_run(
      s.workers,
      [&] {
        header = peek_snapshot_value(*value, why);
        if (header) view = decode_snapshot_value(*value, header->name, header->page_bytes, why);
      },
      boost::asio::use_awaitable);
  STATEPOOL_EXPECTS(view.has_value(), Status::invalid_argument,
                    "not a snapshot value statepool can import: " + why);
  const SnapshotKey key{header->name.prefix, header->name.position};
  std::shared_ptr<SnapshotTierHold> hold = tier_hold(s);
  SnapshotPut put = s.pool.import_snapshot(call.connection.tenant, header->name.layout_digest, key,
                                           view->kv, hold);
  STATEPOOL_EXPECTS(!put.copy || put.page_bytes == view->page.size(), Status::invalid_argument,
                    support::cat("the value's page is ", view->page.size(),
                                 " bytes, the arena's layout has ", put.page_bytes));
  if (put.copy) {  // an error below forgets the snapshot
    co_await place_value(call, *put.copy, *view);
    if (hold != nullptr) {
      // Into the tiers under the caller's namespace (the value may come from another).
      SnapshotName name{put.space, key.prefix, key.position, put.layout_digest};
      s.workers.post([tiers = s.tiers, name = std::move(name), tenant = call.connection.tenant,
                      value, view = *view, hold = std::move(hold)] {
        std::shared_ptr<std::string> encoded;
        try {
          encoded = std::make_shared<std::string>(
              encode_snapshot_value(name, view.page, view.kv, view.kv_bytes));
        } catch (...) {
          hold->publishing = false;  // it goes nowhere: its eviction is no demotion
          throw;
        }
        tiers->publish(name, tenant, std::move(encoded), hold);
        (void)value;  // captured: the spans of `view` point into it
      });
    }
    put.copy->done();
  }
  auto& b = call.builder();
  const auto k = to_wire(b, key);
  const auto kv_table = put.kv ? protocol::to_wire(b, *put.kv) : 0;
  call.reply<wire::ImportSnapshot>(wire::CreateImportSnapshotReply(
      b, put.created, put.evicted, put.arena, k, kv_table, put.pages));
}

}  // namespace statepool::service
