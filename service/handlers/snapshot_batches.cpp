// LookupSnapshots, PutSnapshots, GetSnapshots (protocol version 2; docs/protocol.md,
// "Batched snapshot requests"): N keys in one round trip. The pool answers a batch under
// one lock (pool_snapshot_batches.cpp); the entries' codec work goes to the Executor all
// at once, straight between the client's memory (staging buffers, or memory it
// registered: RegisterMemory) and the snapshots' pages, in the layouts the client
// describes (kernels/staged_view.hpp); lookups in the tiers below the pool run on a
// worker. A malformed batch is refused whole before anything is done; an entry's own
// failure (a full arena, a non-finite state, KV blocks that do not fit its range) is its
// result.
#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/coroutine_frames.hpp"
#include "handlers/handlers.hpp"
#include "handlers/snapshot_io.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using Keep = std::vector<std::shared_ptr<const Allocation>>;

/// The number of entries of a batch: present, 1..--max-batch-keys.
template <class Vector>
std::size_t batch_size(const ServerContext& s, const Vector* entries, const char* what) {
  const std::size_t n = entries == nullptr ? 0 : entries->size();
  STATEPOOL_EXPECTS(n >= 1 && n <= s.config.max_batch_keys, Status::invalid_argument,
                    support::cat(what, " of ", n, " entries: a batch names 1 to ",
                                 s.config.max_batch_keys, " (--max-batch-keys; split it)"));
  return n;
}

void expect_batch_bytes(const ServerContext& s, std::uint64_t bytes, const char* what) {
  STATEPOOL_EXPECTS(bytes <= s.config.max_batch_bytes, Status::invalid_argument,
                    support::cat(what, " moves ", bytes,
                                 " bytes of states and KV blocks, more "
                                 "than one batch may (",
                                 s.config.max_batch_bytes, ", --max-batch-bytes; split it)"));
}

kernels::DType state_dtype(wire::DType dtype) {
  STATEPOOL_EXPECTS(
      dtype == wire::DType::f32 || dtype == wire::DType::bf16, Status::invalid_argument,
      support::cat("staged states are f32 or bf16, got dtype value ", static_cast<int>(dtype)));
  return protocol::from_wire(dtype);
}

/// A range of `memory` as an executor buffer.
kernels::BufferRef sub(const kernels::BufferRef& all, const std::byte* at, std::size_t bytes) {
  kernels::BufferRef out = all;
  out.data += at - all.data;
  out.size = bytes;
  return out;
}

/// The state range of an entry, checked against the arena's page format: the recurrent
/// part and the conv state inside this connection's staging buffers (or registered
/// memory), whose memory is added to `keep`.
StateViewRef state_view(const ConnectionState& c, const wire::StateRange& in,
                        const kernels::PageCodec& codec, Keep& keep) {
  StateViewRef view;
  view.dtype = state_dtype(in.dtype());
  view.order = in.value_major() ? kernels::HeadOrder::value_major : kernels::HeadOrder::key_major;
  const std::size_t conv_bytes = codec.conv_bytes();
  const std::size_t recurrent_bytes = codec.staged_bytes(view.dtype) - conv_bytes;
  std::shared_ptr<const Allocation> owner;
  if (in.conv_staging_id() == 0) {  // packed: the conv state follows the recurrent part
    const kernels::BufferRef all =
        staging_range(c, in.staging_id(), in.offset(), recurrent_bytes + conv_bytes, owner);
    view.recurrent = sub(all, all.data, recurrent_bytes);
    view.conv = sub(all, all.data + recurrent_bytes, conv_bytes);
    keep.push_back(std::move(owner));
    return view;
  }
  view.recurrent = staging_range(c, in.staging_id(), in.offset(), recurrent_bytes, owner);
  keep.push_back(std::move(owner));
  view.conv = staging_range(c, in.conv_staging_id(), in.conv_offset(), conv_bytes, owner);
  keep.push_back(std::move(owner));
  return view;
}

/// Where an entry's KV values are: statepool's packed order in one range (`packed`, for
/// the executor's packed operation) or an engine's rows (`view`).
struct KvPlace {
  kernels::DType dtype = kernels::DType::bf16;
  kernels::BufferRef packed;
  std::optional<KvViewRef> view;
};

/// The KV range of an entry for `kv`, checked: inside this connection's buffers, rows that
/// do not overlap. Its plain bytes go to `bytes`.
KvPlace kv_place(const ConnectionState& c, const wire::KvRange& in, const kernels::KvBlocks& kv,
                 Keep& keep, std::uint64_t& bytes) {
  KvPlace place;
  place.dtype = protocol::from_wire(in.dtype(), "kv_range.dtype");
  const std::uint64_t plain = kernels::kv_blocks_plain_bytes(kv, place.dtype);
  STATEPOOL_EXPECTS(plain > 0, Status::invalid_argument, "KV block values are f32, bf16 or f16");
  bytes += plain;
  std::shared_ptr<const Allocation> owner;
  if (in.layer_stride() == 0 && in.token_stride() == 0) {  // statepool's packed order
    place.packed = staging_range(c, in.staging_id(), in.key_offset(), plain, owner);
    keep.push_back(std::move(owner));
    return place;
  }
  KvViewRef& view = place.view.emplace();
  view.dtype = place.dtype;
  const char* problem =
      kernels::kv_view_problem(kv, place.dtype, in.layer_stride(), in.token_stride());
  STATEPOOL_EXPECTS(problem == nullptr, Status::invalid_argument,
                    support::cat("kv_range: ", problem == nullptr ? "" : problem));
  view.layer_stride = in.layer_stride();
  view.token_stride = in.token_stride();
  const auto extent = [&](std::uint64_t channels) {
    return kernels::kv_view_extent(kv, channels, place.dtype, view.layer_stride, view.token_stride);
  };
  view.keys = staging_range(c, in.staging_id(), in.key_offset(), extent(kv.key_channels), owner);
  keep.push_back(std::move(owner));
  if (kv.value_channels > 0) {
    const std::uint32_t values_in =
        in.value_staging_id() != 0 ? in.value_staging_id() : in.staging_id();
    view.values = staging_range(c, values_in, in.value_offset(), extent(kv.value_channels), owner);
    keep.push_back(std::move(owner));
  }
  return place;
}

/// The KV operation of an entry: its values where `place` says.
Operation kv_operation(OperationKind kind, const kernels::KvBlocks& kv, const KvPlace& place,
                       std::vector<kernels::BufferRef> chunks, Keep keep) {
  Operation op;
  op.kind = kind;
  op.kv = kv;
  op.dtype = place.dtype;
  if (place.view) {
    op.kv_view = place.view;
  } else {
    op.staged = place.packed;
  }
  op.chunks = std::move(chunks);
  op.keep_alive = std::move(keep);
  return op;
}

/// An entry's failure, from the exception that ended its work.
void failure_of(std::exception_ptr error, Status& status, std::string& message) {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const StatusError& e) {
    status = e.status();
    message = e.what();
  } catch (const std::exception& e) {
    status = Status::internal;
    message = support::cat("internal error: ", e.what());
  }
}

wire::SnapshotTier tier_of(std::string_view tier) {
  if (tier == "pool") return wire::SnapshotTier::pool;
  if (tier == "host") return wire::SnapshotTier::host;
  if (tier == "remote") return wire::SnapshotTier::remote;
  return wire::SnapshotTier::none;
}

}  // namespace

STATEPOOL_COROUTINES_BEGIN

namespace {

/// One pool's keys of a lookup: found per key, from the pool's index first.
struct LookupGroup {
  std::vector<SnapshotKey> keys;
  SnapshotLookup pool;
  std::vector<wire::SnapshotTier> found;
};

LookupGroup look_up(const ServerContext& s, const ConnectionState& c, std::uint32_t arena,
                    const flatbuffers::Vector<flatbuffers::Offset<wire::SnapshotKey>>& keys) {
  LookupGroup group;
  group.keys.reserve(keys.size());
  for (const wire::SnapshotKey* key : keys) group.keys.push_back(key_of(key));
  group.pool = s.pool.lookup_snapshots(c.lease, arena, group.keys);
  group.found.resize(group.keys.size(), wire::SnapshotTier::none);
  for (std::size_t i = 0; i < group.keys.size(); ++i) {
    if (group.pool.in_pool[i]) group.found[i] = wire::SnapshotTier::pool;
  }
  return group;
}

/// The keys of `group` in [0, limit) not in the pool, from the tiers below (blocking: on a
/// worker); with `stop`, up to the first absent one.
void look_below(SnapshotTiers& tiers, LookupGroup& group, std::size_t limit, bool stop) {
  for (std::size_t i = 0; i < std::min(limit, group.keys.size()); ++i) {
    if (group.found[i] != wire::SnapshotTier::none) continue;
    const SnapshotName name{group.pool.space, group.keys[i].prefix, group.keys[i].position,
                            group.pool.layout_digest};
    const char* where = tiers.locate(name);
    group.found[i] = tier_of(where == nullptr ? "" : where);
    if (group.found[i] == wire::SnapshotTier::none && stop) return;
  }
}

std::size_t leading_of(const std::vector<wire::SnapshotTier>& found) {
  return static_cast<std::size_t>(std::find(found.begin(), found.end(), wire::SnapshotTier::none) -
                                  found.begin());
}

flatbuffers::Offset<flatbuffers::Vector<wire::SnapshotTier>> tiers_to_wire(
    flatbuffers::FlatBufferBuilder& b, const std::vector<wire::SnapshotTier>& found) {
  const auto bytes =
      b.CreateVector(reinterpret_cast<const std::uint8_t*>(found.data()), found.size());
  return flatbuffers::Offset<flatbuffers::Vector<wire::SnapshotTier>>(bytes.o);
}

}  // namespace

Handled handle(Call& call, const wire::LookupSnapshots& in) {
  ServerContext& s = call.server;
  const ConnectionState& c = call.connection;
  std::size_t n = batch_size(s, in.keys(), "lookup_snapshots");
  const std::size_t also_count = in.also() == nullptr ? 0 : in.also()->size();
  for (std::size_t g = 0; g < also_count; ++g) {
    const wire::LookupAlso& also = *in.also()->Get(static_cast<flatbuffers::uoffset_t>(g));
    const std::size_t keys = also.keys() == nullptr ? 0 : also.keys()->size();
    STATEPOOL_EXPECTS(keys <= in.keys()->size(), Status::invalid_argument,
                      support::cat("lookup_snapshots: `also` ", g, " has ", keys,
                                   " keys, more than the ", in.keys()->size(), " pages asked"));
    n += keys;
  }
  STATEPOOL_EXPECTS(n <= s.config.max_batch_keys, Status::invalid_argument,
                    support::cat("lookup_snapshots of ", n, " keys in all: a batch names 1 to ",
                                 s.config.max_batch_keys, " (--max-batch-keys; split it)"));
  LookupGroup first = look_up(s, c, in.arena_id(), *in.keys());
  std::vector<LookupGroup> more;
  more.reserve(also_count);
  for (std::size_t g = 0; g < also_count; ++g) {
    const wire::LookupAlso& also = *in.also()->Get(static_cast<flatbuffers::uoffset_t>(g));
    more.push_back(also.keys() != nullptr ? look_up(s, c, also.arena_id(), *also.keys())
                                          : LookupGroup{});
  }
  const bool stop = in.stop_at_miss();
  const bool below = in.lower_tiers() && s.tiers != nullptr && s.tiers->enabled();
  const auto absent = [](const LookupGroup& g, std::size_t limit) {
    for (std::size_t i = 0; i < std::min(limit, g.found.size()); ++i) {
      if (g.found[i] == wire::SnapshotTier::none) return true;
    }
    return false;
  };
  const std::size_t pool_leading = leading_of(first.found);
  bool ask = below && absent(first, first.found.size());
  for (const LookupGroup& g : more)
    ask = ask || (below && absent(g, stop ? pool_leading : g.found.size()));
  if (ask) {
    // The host tier's index and the remote store's EXISTS, on a worker (may block).
    co_await async_run(
        s.workers,
        [&] {
          look_below(*s.tiers, first, first.found.size(), stop);
          const std::size_t limit = stop ? leading_of(first.found) : first.found.size();
          for (LookupGroup& g : more) look_below(*s.tiers, g, limit, false);
        },
        boost::asio::use_awaitable);
  }
  const std::size_t leading = leading_of(first.found);
  if (stop) {
    std::fill(first.found.begin() + static_cast<std::ptrdiff_t>(leading), first.found.end(),
              wire::SnapshotTier::none);
    for (LookupGroup& g : more) {
      if (g.found.size() > leading)
        std::fill(g.found.begin() + static_cast<std::ptrdiff_t>(leading), g.found.end(),
                  wire::SnapshotTier::none);
    }
  }
  auto& b = call.builder();
  const auto found = tiers_to_wire(b, first.found);
  std::vector<flatbuffers::Offset<wire::LookupAlsoFound>> also_found;
  also_found.reserve(more.size());
  for (const LookupGroup& g : more) {
    also_found.push_back(wire::CreateLookupAlsoFound(b, tiers_to_wire(b, g.found)));
  }
  call.reply<wire::LookupSnapshots>(
      wire::CreateLookupSnapshotsReply(b, found, static_cast<std::uint32_t>(leading),
                                       also_count > 0 ? b.CreateVector(also_found) : 0));
}

Handled handle(Call& call, const wire::PutSnapshots& in) {
  ServerContext& s = call.server;
  ConnectionState& c = call.connection;
  const std::size_t n = batch_size(s, in.entries(), "put_snapshots");
  const std::shared_ptr<const kernels::PageCodec> codec = s.pool.page_codec(c.lease, in.arena_id());

  // Everything is checked before anything is taken: a malformed batch is refused whole.
  struct Entry {
    SnapshotKey key;
    std::optional<StateViewRef> state;
    std::optional<KvPlace> kv;
    Keep keep;
    std::shared_ptr<SnapshotTierHold> hold;
    Status status = Status::ok;
    std::string message;
  };
  std::vector<Entry> entries(n);
  std::vector<SnapshotPutRequest> requests(n);
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const wire::SnapshotPutEntry& e = *in.entries()->Get(static_cast<flatbuffers::uoffset_t>(i));
    Entry& entry = entries[i];
    SnapshotPutRequest& request = requests[i];
    entry.key = key_of(e.key());
    request.key = entry.key;
    if (e.state() != nullptr) {
      entry.state = state_view(c, *e.state(), *codec, entry.keep);
      bytes += codec->staged_bytes(entry.state->dtype);
    } else {
      request.slot = e.slot();
    }
    STATEPOOL_EXPECTS((e.kv() == nullptr) == (e.kv_range() == nullptr), Status::invalid_argument,
                      support::cat("put_snapshots entry ", i,
                                   ": kv and kv_range come together (the blocks and where "
                                   "their values are)"));
    if (e.kv() != nullptr) {
      request.kv = protocol::from_wire(*e.kv());
      const char* problem = kernels::kv_blocks_problem(*request.kv);
      STATEPOOL_EXPECTS(problem == nullptr, Status::invalid_argument,
                        support::cat("put_snapshots entry ", i,
                                     ": KV blocks: ", problem == nullptr ? "" : problem));
      entry.kv = kv_place(c, *e.kv_range(), *request.kv, entry.keep, bytes);
    }
    entry.hold = tier_hold(s);
    request.below = entry.hold;
  }
  expect_batch_bytes(s, bytes, "put_snapshots");

  std::vector<SnapshotPutOutcome> outcomes =
      s.pool.put_snapshots(c.lease, in.arena_id(), std::move(requests));

  // The new snapshots' pages, written by the Executor all at once.
  std::vector<Operation> ops;
  std::vector<std::size_t> entry_of;
  for (std::size_t i = 0; i < n; ++i) {
    Entry& entry = entries[i];
    if (!outcomes[i].put || !outcomes[i].put->copy) continue;
    const SnapshotCopy& copy = *outcomes[i].put->copy;
    Operation op;
    op.keep_alive = copy.keep_alive;
    op.keep_alive.insert(op.keep_alive.end(), entry.keep.begin(), entry.keep.end());
    op.page = copy.target;
    if (entry.state) {
      op.kind = OperationKind::compress;
      op.codec = codec;
      op.dtype = entry.state->dtype;
      op.state_view = entry.state;
      op.page_disposable = true;  // a new snapshot's page: a failure forgets it
    } else {
      op.kind = OperationKind::copy;
      op.source = copy.source;
    }
    ops.push_back(op);
    entry_of.push_back(i);
    if (entry.kv) {
      ops.push_back(kv_operation(OperationKind::kv_encode, *copy.kv, *entry.kv, copy.kv_chunks,
                                 std::move(op.keep_alive)));
      entry_of.push_back(i);
    }
  }
  std::vector<std::exception_ptr> errors =
      co_await async_execute_all(s.executor, std::move(ops), boost::asio::use_awaitable);
  for (std::size_t k = 0; k < errors.size(); ++k) {
    Entry& entry = entries[entry_of[k]];
    if (errors[k] && entry.status == Status::ok) {
      failure_of(errors[k], entry.status, entry.message);
    }
  }

  std::uint32_t created = 0, existing = 0, failed = 0;
  std::uint64_t read = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Entry& entry = entries[i];
    SnapshotPutOutcome& outcome = outcomes[i];
    if (outcome.status != Status::ok) {
      entry.status = outcome.status;
      entry.message = std::move(outcome.message);
    }
    if (entry.status == Status::ok && outcome.put && outcome.put->copy) {
      try {
        expect_intact(entry.keep);
        read += entry.state ? codec->staged_bytes(entry.state->dtype) : 0;
        if (entry.kv) read += kernels::kv_blocks_plain_bytes(*outcome.put->kv, entry.kv->dtype);
        if (entry.hold != nullptr)
          co_await write_through(call, *outcome.put, entry.key, entry.hold);
        outcome.put->copy->done();
      } catch (...) {
        failure_of(std::current_exception(), entry.status, entry.message);
      }
    }
    if (entry.status != Status::ok && outcome.put) {
      outcome.put->copy.reset();  // abandoned: the snapshot is forgotten
    }
  }
  // A key that an earlier entry of this batch set out to publish, and whose publication
  // then failed, was not published by its later entries either.
  std::map<std::pair<std::string, std::uint64_t>, std::size_t> publisher;
  for (std::size_t i = 0; i < n; ++i) {
    const auto name = std::make_pair(entries[i].key.prefix, entries[i].key.position);
    if (outcomes[i].put && outcomes[i].put->created) {
      publisher.emplace(name, i);
    } else if (entries[i].status == Status::ok) {
      const auto it = publisher.find(name);
      if (it != publisher.end() && entries[it->second].status != Status::ok) {
        entries[i].status = entries[it->second].status;
        entries[i].message = support::cat(
            "entry ", it->second,
            " of this batch, which published the key, failed: ", entries[it->second].message);
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (entries[i].status != Status::ok) {
      ++failed;
    } else if (outcomes[i].put->created) {
      ++created;
    } else {
      ++existing;
    }
  }

  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::SnapshotPutResult>> results;
  results.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Entry& entry = entries[i];
    const bool ok = entry.status == Status::ok;
    results.push_back(wire::CreateSnapshotPutResult(
        b, protocol::to_wire(entry.status), ok ? 0 : b.CreateString(entry.message),
        ok && outcomes[i].put->created, ok ? outcomes[i].put->evicted : 0));
  }
  call.reply<wire::PutSnapshots>(
      wire::CreatePutSnapshotsReply(b, b.CreateVector(results), created, existing, failed, read));
}

Handled handle(Call& call, const wire::GetSnapshots& in) {
  ServerContext& s = call.server;
  ConnectionState& c = call.connection;
  const std::size_t n = batch_size(s, in.entries(), "get_snapshots");
  const std::shared_ptr<const kernels::PageCodec> codec = s.pool.page_codec(c.lease, in.arena_id());
  struct Entry {
    std::optional<StateViewRef> state;
    std::optional<KvPlace> place;
    Keep keep;
    std::string tier;
    std::optional<kernels::KvBlocks> kv;
    bool hit = false;
    Status status = Status::ok;
    std::string message;
  };
  std::vector<Entry> entries(n);
  std::vector<SnapshotKey> keys(n);
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const wire::SnapshotGetEntry& e = *in.entries()->Get(static_cast<flatbuffers::uoffset_t>(i));
    keys[i] = key_of(e.key());
    if (e.state() != nullptr) {
      entries[i].state = state_view(c, *e.state(), *codec, entries[i].keep);
      bytes += codec->staged_bytes(entries[i].state->dtype);
    }
  }
  expect_batch_bytes(s, bytes, "get_snapshots");

  const bool below = s.tiers != nullptr && s.tiers->enabled();
  const bool stop = in.stop_at_miss();
  std::vector<SnapshotGet> gets = s.pool.get_snapshots(c.lease, in.arena_id(), keys, below, stop);
  std::vector<std::optional<SnapshotTiers::Found>> found(n);
  if (below) {
    // The pool's misses from the host tier, then the remote store, in order, on a worker.
    std::vector<bool> asked(n, false);
    const std::string tenant = c.tenant;
    co_await async_run(
        s.workers,
        [&] {
          for (std::size_t i = 0; i < n; ++i) {
            if (gets[i].hit) continue;
            const SnapshotName name{gets[i].space, keys[i].prefix, keys[i].position,
                                    gets[i].layout_digest};
            found[i] = s.tiers->find(name, gets[i].page_bytes, tenant);
            asked[i] = true;
            if (!found[i] && stop) break;
          }
        },
        boost::asio::use_awaitable);
    for (std::size_t i = 0; i < n; ++i) {
      if (asked[i]) s.pool.count_lower_tier_lookup(tenant, found[i] ? found[i]->tier : "");
    }
  }
  // stop_at_miss: nothing after the first miss is read.
  bool missed = false;
  for (std::size_t i = 0; i < n; ++i) {
    Entry& entry = entries[i];
    if (!missed && gets[i].hit) {
      entry.hit = true;
      entry.tier = "pool";
      entry.kv = gets[i].copy->kv;
    } else if (!missed && found[i]) {
      entry.hit = true;
      entry.tier = found[i]->tier;
      entry.kv = found[i]->kv;
    } else {
      if (stop) missed = true;
      gets[i].copy.reset();
      found[i].reset();
    }
  }

  // The hits' states and KV blocks, decoded by the Executor all at once.
  std::vector<Operation> ops;
  std::vector<std::size_t> entry_of;
  for (std::size_t i = 0; i < n; ++i) {
    Entry& entry = entries[i];
    if (!entry.hit) continue;
    const wire::SnapshotGetEntry& e = *in.entries()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (e.kv_range() != nullptr && entry.kv) {
      // The entry's blocks are known now: a range they do not fit, or more bytes than the
      // batch may still move, fails this entry alone.
      std::uint64_t kv_bytes = 0;
      try {
        entry.place = kv_place(c, *e.kv_range(), *entry.kv, entry.keep, kv_bytes);
        expect_batch_bytes(s, bytes + kv_bytes, "get_snapshots");
        bytes += kv_bytes;
      } catch (const StatusError& error) {
        entry.place.reset();
        entry.status = error.status();
        entry.message = error.what();
        continue;
      }
    }
    Keep keep = entry.keep;
    kernels::BufferRef page;
    std::vector<kernels::BufferRef> chunks;
    if (gets[i].copy) {
      page = gets[i].copy->source;
      chunks = gets[i].copy->kv_chunks;
      keep.insert(keep.end(), gets[i].copy->keep_alive.begin(), gets[i].copy->keep_alive.end());
    } else {  // a lower tier's value, alive in found[i] until the ops are done
      page = read_only(found[i]->page);
      if (entry.kv) chunks = {read_only(found[i]->kv_bytes)};
    }
    if (entry.state) {
      Operation op;
      op.kind = OperationKind::decompress;
      op.codec = codec;
      op.dtype = entry.state->dtype;
      op.page = page;
      op.state_view = entry.state;
      op.keep_alive = keep;
      ops.push_back(std::move(op));
      entry_of.push_back(i);
    }
    if (entry.place) {
      ops.push_back(kv_operation(OperationKind::kv_decode, *entry.kv, *entry.place,
                                 std::move(chunks), std::move(keep)));
      entry_of.push_back(i);
    }
  }
  std::vector<std::exception_ptr> errors =
      co_await async_execute_all(s.executor, std::move(ops), boost::asio::use_awaitable);
  for (std::size_t k = 0; k < errors.size(); ++k) {
    Entry& entry = entries[entry_of[k]];
    if (errors[k] && entry.status == Status::ok) failure_of(errors[k], entry.status, entry.message);
  }

  std::uint32_t hits = 0;
  std::uint64_t written = 0;
  auto& b = call.builder();
  std::vector<flatbuffers::Offset<wire::SnapshotGetResult>> results;
  results.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    Entry& entry = entries[i];
    if (gets[i].copy) gets[i].copy->done();  // the read of the snapshot's pages ends
    if (entry.status == Status::ok && entry.hit) {
      try {
        expect_intact(entry.keep);
      } catch (const StatusError& error) {
        entry.status = error.status();
        entry.message = error.what();
      }
    }
    const bool ok = entry.status == Status::ok;
    if (ok && entry.hit) {
      ++hits;
      written += entry.state ? codec->staged_bytes(entry.state->dtype) : 0;
      if (entry.place) written += kernels::kv_blocks_plain_bytes(*entry.kv, entry.place->dtype);
    }
    const auto kv_table = entry.kv ? protocol::to_wire(b, *entry.kv) : 0;
    results.push_back(wire::CreateSnapshotGetResult(
        b, protocol::to_wire(entry.status), ok ? 0 : b.CreateString(entry.message), ok && entry.hit,
        ok && entry.hit ? tier_of(entry.tier) : wire::SnapshotTier::none, kv_table,
        ok && entry.place.has_value()));
  }
  call.reply<wire::GetSnapshots>(
      wire::CreateGetSnapshotsReply(b, b.CreateVector(results), hits, written));
}

STATEPOOL_COROUTINES_END

}  // namespace statepool::service
