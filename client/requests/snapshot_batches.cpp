// RegisterMemory, LookupSnapshots, PutSnapshots, GetSnapshots: protocol version 2
// (docs/protocol.md, "Batched snapshot requests"). A call with more keys than one request
// may carry (the daemon's --max-batch-keys, or what fits in its frame limit) is split into
// several requests, in order.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::Impl;
using detail::inconsistent;
using detail::key_to_wire;
using detail::kv_of;
using detail::str;

/// Error(invalid_argument) without a round trip when the daemon speaks only version 1.
void expect_version_2(const Impl& i, const char* what) {
  if (i.version < 2) {
    throw Error(Status::invalid_argument,
                std::string(what) + " needs protocol version 2; statepoold " + i.server +
                    " speaks version " + std::to_string(i.version) + " (upgrade statepoold)");
  }
}

/// Bytes a key takes in a request, generously (the prefix, the key table, the entry table
/// around it and its ranges): for cutting a long call into requests that fit the frame.
std::size_t key_cost(const SnapshotKey& key) {
  return key.prefix.size() + 256;
}

/// Splits [0, n) into consecutive requests of at most max_batch_keys keys (`per_entry`
/// keys each entry) whose estimated size stays within the frame limit; calls send(first,
/// last) for each, in order, until it returns false.
template <class Cost, class Send>
void in_requests(const Impl& i, std::size_t n, Cost&& cost, Send&& send,
                 std::size_t per_entry = 1) {
  const std::size_t frame_budget = std::max<std::size_t>(i.max_frame_bytes, 4096) - 1024;
  const std::size_t max_entries = std::max<std::size_t>(1, i.max_batch_keys / per_entry);
  std::size_t first = 0;
  while (first < n) {
    std::size_t last = first;
    std::size_t bytes = 0;
    while (last < n && last - first < max_entries) {
      const std::size_t c = cost(last);
      if (last > first && bytes + c > frame_budget) break;
      bytes += c;
      ++last;
    }
    if (!send(first, last)) return;
    first = last;
  }
}

flatbuffers::Offset<wire::StateRange> to_wire(flatbuffers::FlatBufferBuilder& b,
                                              const StateRange& r) {
  return wire::CreateStateRange(b, r.staging, r.offset, protocol::to_wire(r.dtype), r.value_major,
                                r.conv_staging, r.conv_offset);
}

flatbuffers::Offset<wire::KvRange> to_wire(flatbuffers::FlatBufferBuilder& b, const KvRange& r) {
  return wire::CreateKvRange(b, r.staging, protocol::to_wire(r.dtype), r.key_offset,
                             r.value_staging, r.value_offset, r.layer_stride, r.token_stride);
}

SnapshotTier tier_of(wire::SnapshotTier tier) {
  switch (tier) {
    case wire::SnapshotTier::none: return SnapshotTier::none;
    case wire::SnapshotTier::pool: return SnapshotTier::pool;
    case wire::SnapshotTier::host: return SnapshotTier::host;
    case wire::SnapshotTier::remote: return SnapshotTier::remote;
  }
  inconsistent("unknown snapshot tier " + std::to_string(static_cast<int>(tier)));
}

template <class Vector>
void expect_results(const Vector* results, std::size_t expected, const char* what) {
  const std::size_t got = results == nullptr ? 0 : results->size();
  if (got != expected) {
    inconsistent(std::string(what) + ": " + std::to_string(got) + " results for " +
                 std::to_string(expected) + " entries");
  }
}

}  // namespace

const char* to_string(SnapshotTier tier) noexcept {
  switch (tier) {
    case SnapshotTier::none: return "none";
    case SnapshotTier::pool: return "pool";
    case SnapshotTier::host: return "host";
    case SnapshotTier::remote: return "remote";
  }
  return "?";
}

std::uint32_t Connection::max_batch_keys() const {
  return impl().max_batch_keys;
}

std::uint64_t Connection::max_batch_bytes() const {
  return impl().max_batch_bytes;
}

Staging Connection::register_memory(int fd, std::uint64_t bytes, std::string_view name,
                                    bool* sealed) {
  Impl& i = impl();
  expect_version_2(i, "register_memory");
  if (bytes == 0) throw Error(Status::invalid_argument, "register_memory: bytes must be > 0");
  detail::UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own) {
    throw Error(Status::invalid_argument,
                "register_memory: descriptor " + std::to_string(fd) + " is not open");
  }
  Staging staging;
  bool was_sealed = false;
  i.call<wire::RegisterMemory>(
      [&](auto& b) {
        return wire::CreateRegisterMemory(b, bytes, b.CreateString(name.data(), name.size()));
      },
      [&](const wire::RegisterMemoryReply* r) {
        staging.id_ = r->staging_id();
        staging.size_ = r->bytes();
        was_sealed = r->sealed();
      },
      nullptr, own.get());
  // From here the Staging object owns the loan: its destructor ends it (CloseStaging).
  staging.impl_ = impl_;
  staging.fd_ = own.release();
  staging.memory_.space = kernels::MemorySpace::host;
  staging.memory_.handle_kind = kernels::HandleKind::memfd;
  if (staging.size_ != bytes) {
    inconsistent("registered " + std::to_string(staging.size_) + " bytes of " +
                 std::to_string(bytes));
  }
  staging.map();
  if (sealed != nullptr) *sealed = was_sealed;
  return staging;
}

SnapshotLookup Connection::lookup_snapshots(ArenaId arena, std::span<const SnapshotKey> keys,
                                            bool lower_tiers, bool stop_at_miss,
                                            std::span<const LookupAlso> also) {
  Impl& i = impl();
  expect_version_2(i, "lookup_snapshots");
  for (const LookupAlso& group : also) {
    if (group.keys.size() > keys.size()) {
      throw Error(Status::invalid_argument,
                  "lookup_snapshots: an `also` group has more keys than the pages asked");
    }
  }
  SnapshotLookup out;
  out.found.assign(keys.size(), SnapshotTier::none);
  for (const LookupAlso& group : also) out.also.emplace_back(group.keys.size(), SnapshotTier::none);
  // A request's keys: its pages' and their `also` keys (each counts against the caps).
  const std::size_t per_page = 1 + also.size();
  bool missed = false;
  const auto cost = [&](std::size_t k) {
    std::size_t c = key_cost(keys[k]);
    for (const LookupAlso& group : also)
      if (k < group.keys.size()) c += key_cost(group.keys[k]);
    return c;
  };
  const Impl& limits = i;
  in_requests(
      limits, keys.size(), cost,
      [&](std::size_t first, std::size_t last) {
        i.call<wire::LookupSnapshots>(
            [&](auto& b) {
              const auto to_keys = [&](std::span<const SnapshotKey> from) {
                std::vector<flatbuffers::Offset<wire::SnapshotKey>> wire_keys;
                const std::size_t end = std::min(last, from.size());
                for (std::size_t k = first; k < end; ++k)
                  wire_keys.push_back(key_to_wire(b, from[k]));
                return b.CreateVector(wire_keys);
              };
              std::vector<flatbuffers::Offset<wire::LookupAlso>> wire_also;
              for (const LookupAlso& group : also)
                wire_also.push_back(wire::CreateLookupAlso(b, group.arena, to_keys(group.keys)));
              const auto main_keys = to_keys(keys);
              return wire::CreateLookupSnapshots(b, arena, main_keys, lower_tiers, stop_at_miss,
                                                 also.empty() ? 0 : b.CreateVector(wire_also));
            },
            [&](const wire::LookupSnapshotsReply* r) {
              expect_results(r == nullptr ? nullptr : r->found(), last - first, "lookup_snapshots");
              for (std::size_t k = first; k < last; ++k)
                out.found[k] =
                    tier_of(r->found()->Get(static_cast<flatbuffers::uoffset_t>(k - first)));
              expect_results(r->also(), also.size(), "lookup_snapshots (also)");
              for (std::size_t g = 0; g < also.size(); ++g) {
                const auto* found = r->also()->Get(static_cast<flatbuffers::uoffset_t>(g))->found();
                const std::size_t end = std::min(last, also[g].keys.size());
                const std::size_t count = end > first ? end - first : 0;
                expect_results(found, count, "lookup_snapshots (also)");
                for (std::size_t k = first; k < end; ++k)
                  out.also[g][k] =
                      tier_of(found->Get(static_cast<flatbuffers::uoffset_t>(k - first)));
              }
              if (!missed) {
                out.leading += r->leading();
                missed = r->leading() < last - first;
              }
            });
        return !(stop_at_miss && missed);
      },
      per_page);
  return out;
}

SnapshotPuts Connection::put_snapshots(ArenaId arena, std::span<const SnapshotPutEntry> entries) {
  Impl& i = impl();
  expect_version_2(i, "put_snapshots");
  SnapshotPuts out;
  out.results.resize(entries.size());
  in_requests(
      i, entries.size(), [&](std::size_t k) { return key_cost(entries[k].key); },
      [&](std::size_t first, std::size_t last) {
        i.call<wire::PutSnapshots>(
            [&](auto& b) {
              std::vector<flatbuffers::Offset<wire::SnapshotPutEntry>> wire_entries;
              wire_entries.reserve(last - first);
              for (std::size_t k = first; k < last; ++k) {
                const SnapshotPutEntry& e = entries[k];
                const auto key = key_to_wire(b, e.key);
                const auto state = e.state ? to_wire(b, *e.state) : 0;
                const auto kv = e.kv ? protocol::to_wire(b, *e.kv) : 0;
                const auto range = e.kv ? to_wire(b, e.kv_range) : 0;
                wire_entries.push_back(
                    wire::CreateSnapshotPutEntry(b, key, state, e.slot, kv, range));
              }
              return wire::CreatePutSnapshots(b, arena, b.CreateVector(wire_entries));
            },
            [&](const wire::PutSnapshotsReply* r) {
              expect_results(r == nullptr ? nullptr : r->results(), last - first, "put_snapshots");
              for (std::size_t k = first; k < last; ++k) {
                const wire::SnapshotPutResult& w =
                    *r->results()->Get(static_cast<flatbuffers::uoffset_t>(k - first));
                SnapshotPutResult& result = out.results[k];
                result.status = protocol::from_wire(w.status());
                result.message = str(w.message());
                result.created = w.created();
                result.evicted = w.evicted();
              }
              out.created += r->created();
              out.existing += r->existing();
              out.failed += r->failed();
              out.bytes += r->bytes();
            });
        return true;
      });
  return out;
}

SnapshotGets Connection::get_snapshots(ArenaId arena, std::span<const SnapshotGetEntry> entries,
                                       bool stop_at_miss) {
  Impl& i = impl();
  expect_version_2(i, "get_snapshots");
  SnapshotGets out;
  out.results.resize(entries.size());
  in_requests(
      i, entries.size(), [&](std::size_t k) { return key_cost(entries[k].key); },
      [&](std::size_t first, std::size_t last) {
        bool missed = false;
        i.call<wire::GetSnapshots>(
            [&](auto& b) {
              std::vector<flatbuffers::Offset<wire::SnapshotGetEntry>> wire_entries;
              wire_entries.reserve(last - first);
              for (std::size_t k = first; k < last; ++k) {
                const SnapshotGetEntry& e = entries[k];
                const auto key = key_to_wire(b, e.key);
                const auto state = e.state ? to_wire(b, *e.state) : 0;
                const auto range = e.kv_range ? to_wire(b, *e.kv_range) : 0;
                wire_entries.push_back(wire::CreateSnapshotGetEntry(b, key, state, range));
              }
              return wire::CreateGetSnapshots(b, arena, b.CreateVector(wire_entries), stop_at_miss);
            },
            [&](const wire::GetSnapshotsReply* r) {
              expect_results(r == nullptr ? nullptr : r->results(), last - first, "get_snapshots");
              for (std::size_t k = first; k < last; ++k) {
                const wire::SnapshotGetResult& w =
                    *r->results()->Get(static_cast<flatbuffers::uoffset_t>(k - first));
                SnapshotGetResult& result = out.results[k];
                result.status = protocol::from_wire(w.status());
                result.message = str(w.message());
                result.hit = w.hit();
                result.tier = tier_of(w.tier());
                result.kv = kv_of(w.kv());
                result.kv_delivered = w.kv_delivered();
                missed = missed || (result.status == Status::ok && !result.hit);
              }
              out.hits += r->hits();
              out.bytes += r->bytes();
            });
        return !(stop_at_miss && missed);
      });
  return out;
}

}  // namespace statepool::client
