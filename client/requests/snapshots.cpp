// PutSnapshot, GetSnapshot, ExportSnapshot, ImportSnapshot, DeleteSnapshot, PinSnapshot,
// ListSnapshots: the prefix-state store (docs/prefix-store.md).
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::inconsistent;
using detail::key_to_wire;
using detail::kv_of;
using detail::reply_codec;
using detail::str;

flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> bytes_to_wire(
    flatbuffers::FlatBufferBuilder& b, std::string_view bytes) {
  return b.CreateVector(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

std::string bytes_of(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return {};
  return {reinterpret_cast<const char*>(bytes->data()), bytes->size()};
}

flatbuffers::Offset<wire::KvStaging> kv_staging_to_wire(flatbuffers::FlatBufferBuilder& b,
                                                        const KvStaging& where) {
  return wire::CreateKvStaging(b, where.staging, where.offset, protocol::to_wire(where.dtype));
}

/// A key a reply names.
SnapshotKey key_of(const wire::SnapshotKey& key) {
  return SnapshotKey{bytes_of(key.prefix()), key.position()};
}

}  // namespace

flatbuffers::Offset<wire::SnapshotKey> detail::key_to_wire(flatbuffers::FlatBufferBuilder& b,
                                                           const SnapshotKey& key) {
  const auto prefix = bytes_to_wire(b, key.prefix);
  return wire::CreateSnapshotKey(b, prefix, key.position);
}

std::optional<kernels::KvBlocks> detail::kv_of(const wire::KvBlocks* kv) {
  if (kv == nullptr) return std::nullopt;
  try {
    return protocol::from_wire(*kv);
  } catch (const StatusError& e) {
    inconsistent(e.what());
  }
}

SnapshotPut Connection::put_snapshot(const Slot& slot, const SnapshotKey& key,
                                     const std::optional<SnapshotKv>& kv) {
  return put_snapshot(slot.arena_id(), slot.id(), key, kv);
}

SnapshotPut Connection::put_snapshot(ArenaId arena, SlotId slot, const SnapshotKey& key,
                                     const std::optional<SnapshotKv>& kv) {
  return impl().call<wire::PutSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto blocks = kv ? protocol::to_wire(b, kv->blocks) : 0;
        const auto where = kv ? kv_staging_to_wire(b, kv->values) : 0;
        return wire::CreatePutSnapshot(b, arena, slot, k, blocks, where);
      },
      [](const wire::PutSnapshotReply* r) {
        SnapshotPut out;
        out.created = r->created();
        out.evicted = r->evicted();
        out.page_bytes = r->page_bytes();
        out.kv = kv_of(r->kv());
        out.kv_bytes = r->kv_bytes();
        out.pages = r->pages();
        return out;
      });
}

SnapshotGet Connection::get_snapshot(const SnapshotKey& key, const Slot& slot,
                                     const std::optional<KvStaging>& kv) {
  return get_snapshot(key, slot.arena_id(), slot.id(), kv);
}

SnapshotGet Connection::get_snapshot(const SnapshotKey& key, ArenaId arena, SlotId slot,
                                     const std::optional<KvStaging>& kv) {
  return impl().call<wire::GetSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto where = kv ? kv_staging_to_wire(b, *kv) : 0;
        return wire::CreateGetSnapshot(b, arena, slot, k, where);
      },
      [](const wire::GetSnapshotReply* r) {
        SnapshotGet out;
        out.hit = r->hit();
        out.other_layouts = r->other_layouts();
        out.page_bytes = r->page_bytes();
        out.tier = str(r->tier());
        out.kv = kv_of(r->kv());
        out.kv_bytes = r->kv_bytes();
        out.kv_delivered = r->kv_delivered();
        return out;
      });
}

SnapshotExport Connection::export_snapshot(const SnapshotKey& key, const Staging* staging,
                                           std::uint64_t offset, std::string_view layout_digest) {
  return impl().call<wire::ExportSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto digest = b.CreateString(layout_digest.data(), layout_digest.size());
        return wire::CreateExportSnapshot(b, k, digest, staging == nullptr ? 0 : staging->id(),
                                          offset);
      },
      [](const wire::ExportSnapshotReply* r) {
        SnapshotExport out;
        out.found = r->found();
        out.value_bytes = r->value_bytes();
        out.layout_digest = str(r->layout_digest());
        out.kv = kv_of(r->kv());
        return out;
      });
}

SnapshotImport Connection::import_snapshot(const Staging& staging, std::uint64_t offset,
                                           std::uint64_t bytes) {
  return impl().call<wire::ImportSnapshot>(
      [&](auto& b) { return wire::CreateImportSnapshot(b, staging.id(), offset, bytes); },
      [](const wire::ImportSnapshotReply* r) {
        SnapshotImport out;
        out.created = r->created();
        out.evicted = r->evicted();
        out.arena_id = r->arena_id();
        if (const auto* k = r->key()) out.key = key_of(*k);
        out.kv = kv_of(r->kv());
        out.pages = r->pages();
        return out;
      });
}

std::uint32_t Connection::delete_snapshot(const SnapshotKey& key) {
  return impl().call<wire::DeleteSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        return wire::CreateDeleteSnapshot(b, k);
      },
      [](const wire::DeleteSnapshotReply* r) { return r->deleted(); });
}

std::uint32_t Connection::pin_snapshot(const SnapshotKey& key, bool pinned) {
  return impl().call<wire::PinSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        return wire::CreatePinSnapshot(b, k, pinned);
      },
      [](const wire::PinSnapshotReply* r) { return r->changed(); });
}

SnapshotList Connection::list_snapshots(std::string_view prefix, std::uint32_t limit) {
  return impl().call<wire::ListSnapshots>(
      [&](auto& b) {
        const auto p = bytes_to_wire(b, prefix);
        return wire::CreateListSnapshots(b, p, limit);
      },
      [](const wire::ListSnapshotsReply* r) {
        SnapshotList out;
        out.truncated = r->truncated();
        out.snapshot_namespace = str(r->snapshot_namespace());
        if (const auto* entries = r->snapshots()) {
          out.snapshots.reserve(entries->size());
          for (const auto* e : *entries) {
            SnapshotInfo info;
            if (const auto* k = e->key()) info.key = key_of(*k);
            info.layout_id = e->layout_id();
            info.layout_name = str(e->layout_name());
            info.codec = reply_codec(e->codec());
            info.tenant = str(e->tenant());
            info.arena_id = e->arena_id();
            info.page_bytes = e->page_bytes();
            info.fp32_bytes = e->fp32_bytes();
            info.pinned = e->pinned();
            info.hits = e->hits();
            info.age_seconds = e->age_seconds();
            info.idle_seconds = e->idle_seconds();
            info.kv = kv_of(e->kv());
            info.kv_bytes = e->kv_bytes();
            info.pages = e->pages();
            info.layout_digest = str(e->layout_digest());
            out.snapshots.push_back(std::move(info));
          }
        }
        return out;
      });
}

}  // namespace statepool::client
