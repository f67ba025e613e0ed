// Snapshots: the prefix-state store (docs/prefix-store.md). Connection.put_snapshot(),
// get_snapshot(), delete_snapshot(), pin_snapshot(), list_snapshots(), export_snapshot(),
// import_snapshot() and their _bytes forms (service/handlers/snapshots.cpp serves them), the
// KvBlocks of hybrid entries and the results SnapshotPut, SnapshotGet, SnapshotInfo,
// SnapshotExport, SnapshotImport and SnapshotList.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <variant>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "client/keys.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/kv.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;

// --- KV blocks of hybrid snapshots ---------------------------------------------------------

/// "KvBlocks(codec=KvCodec.kivi2, layers=2, key_channels=64, value_channels=64, tokens=200)".
std::string kv_repr(const kernels::KvBlocks& b) {
  return std::string("KvBlocks(codec=KvCodec.") + kernels::to_string(b.codec) +
         ", layers=" + std::to_string(b.layers) +
         ", key_channels=" + std::to_string(b.key_channels) +
         ", value_channels=" + std::to_string(b.value_channels) +
         ", tokens=" + std::to_string(b.tokens) + ")";
}

/// ", kv=KvBlocks(...), kv_bytes=N" for an entry with KV blocks, "" otherwise.
std::string kv_fields_repr(const std::optional<kernels::KvBlocks>& kv, std::uint64_t kv_bytes) {
  if (!kv) return {};
  return ", kv=" + kv_repr(*kv) + ", kv_bytes=" + std::to_string(kv_bytes);
}

const kernels::KvBlocks& well_formed(const kernels::KvBlocks& b) {
  if (const char* problem = kernels::kv_blocks_problem(b)) throw py::value_error(problem);
  return b;
}

/// The staging range of a put's or get's KV values; checked before anything is sent. A
/// put names its blocks (`kv`) and their range together; a get only the range.
std::optional<client::KvStaging> kv_range(const OptionalStaging& staging, std::uint64_t offset,
                                          DType dtype) {
  if (!staging) {
    if (offset != 0) throw py::value_error("kv_offset without kv_staging");
    return std::nullopt;
  }
  return client::KvStaging{staging_of(*staging).id(), offset, dtype};
}

/// put_snapshot()'s KV blocks and their range, checked before anything is sent: both or
/// neither.
std::optional<client::SnapshotKv> snapshot_kv(const std::optional<kernels::KvBlocks>& kv,
                                              const OptionalStaging& kv_staging,
                                              std::uint64_t kv_offset, DType kv_dtype) {
  if (kv && !kv_staging) {
    throw py::value_error(
        "kv without kv_staging: name the staging buffer that holds the KV values");
  }
  if (!kv && kv_staging) {
    throw py::value_error("kv_staging without kv: name the KV blocks it holds");
  }
  const std::optional<client::KvStaging> range = kv_range(kv_staging, kv_offset, kv_dtype);
  if (!kv) return std::nullopt;
  return client::SnapshotKv{*kv, *range};
}

// --- moving snapshots (docs/prefix-store.md, "Moving snapshots") ---------------------------

/// The host mapping of a staging buffer opened for a snapshot value; RuntimeError (after
/// closing it) when the daemon's staging buffers are device memory.
std::span<std::byte> host_bytes(client::Staging& staging, const char* call) {
  if (!staging.bytes().empty()) return staging.bytes();
  staging.close();
  throw std::runtime_error(std::string(call) +
                           " needs a staging buffer in host memory, and this daemon's are device "
                           "memory (cuda backend): use export_snapshot()/import_snapshot() with a "
                           "staging buffer and copy the value with the engine's own kernels");
}

/// export_snapshot_bytes(): the size, a staging buffer of it, the export, the bytes copied
/// out, the buffer closed. None when the key has no snapshot (or it went meanwhile).
std::optional<py::bytes> export_bytes(const ConnectionHandle& c, const client::SnapshotKey& key,
                                      const std::string& layout_digest) {
  const std::shared_ptr<Connection> conn = c.get();
  client::Staging staging;
  std::span<std::byte> value;
  {
    ReleaseGil release;
    const client::SnapshotExport size = conn->export_snapshot(key, nullptr, 0, layout_digest);
    if (!size) return std::nullopt;
    staging = conn->open_staging(size.value_bytes);
    const std::span<std::byte> mapped = host_bytes(staging, "export_snapshot_bytes()");
    // The layout the size was asked for, so both calls name the same entry.
    const client::SnapshotExport got = conn->export_snapshot(key, &staging, 0, size.layout_digest);
    if (!got) {  // deleted between the two calls
      staging.close();
      return std::nullopt;
    }
    value = mapped.first(std::min<std::uint64_t>(got.value_bytes, mapped.size()));
  }
  py::bytes out(nullptr, value.size());  // filled below, before anything else sees it
  char* data = PyBytes_AsString(out.ptr());
  {
    ReleaseGil release;
    std::memcpy(data, value.data(), value.size());
    staging.close();
  }
  return out;
}

/// import_snapshot_bytes(): a staging buffer of the value's size, the bytes copied in, the
/// import, the buffer closed.
client::SnapshotImport import_bytes(const ConnectionHandle& c, const py::bytes& data) {
  char* begin = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(data.ptr(), &begin, &size) != 0) throw py::error_already_set();
  if (size == 0) throw py::value_error("an empty value: nothing to import");
  // The bytes object is immutable and held by the caller: read without the GIL.
  return call(c, [&](Connection& conn) {
    client::Staging staging = conn.open_staging(static_cast<std::uint64_t>(size));
    std::memcpy(host_bytes(staging, "import_snapshot_bytes()").data(), begin,
                static_cast<std::size_t>(size));
    client::SnapshotImport put = conn.import_snapshot(staging, 0, static_cast<std::uint64_t>(size));
    staging.close();
    return put;
  });
}

/// "b'...'", as Python writes the prefix bytes. Needs the GIL.
std::string bytes_repr(const std::string& bytes) {
  return py::repr(py::bytes(bytes)).cast<std::string>();
}

}  // namespace

void bind_snapshots(py::module_& m, ConnectionClass& connection) {
  // --- KV blocks -------------------------------------------------------------------------
  py::class_<kernels::KvBlocks>(m, "KvBlocks", R"doc(
The attention layers' KV blocks of a hybrid prefix snapshot (docs/prefix-store.md, "Hybrid
entries"): the keys and values of ``layers`` attention layers over ``tokens`` tokens, stored
under one KV codec. In a staging buffer the values are the streams layer 0 keys, layer 0
values, layer 1 keys, ... back to back, each ``[tokens][channels]`` row-major (channels =
kv_heads * head_dim, head-major); ``value_channels`` 0 means keys only (an MLA latent), one
stream per layer. Not validated when built: the daemon refuses ill-formed blocks
(InvalidArgument); plain_bytes() and encoded_bytes raise ValueError for them.)doc")
      .def(py::init([](kernels::KvCodecId codec, std::uint32_t layers, std::uint32_t key_channels,
                       std::uint32_t value_channels, std::uint64_t tokens) {
             return kernels::KvBlocks{codec, layers, key_channels, value_channels, tokens};
           }),
           py::kw_only(), py::arg("codec"), py::arg("layers"), py::arg("key_channels"),
           py::arg("value_channels") = 0, py::arg("tokens"),
           "Describes KV blocks (no validation: see the class).")
      .def_readwrite("codec", &kernels::KvBlocks::codec, "The KV codec of every stream.")
      .def_readwrite("layers", &kernels::KvBlocks::layers, "Full-attention layers (1..1024).")
      .def_readwrite("key_channels", &kernels::KvBlocks::key_channels,
                     "Channels of a layer's keys: kv_heads * head_dim (1..2^20).")
      .def_readwrite("value_channels", &kernels::KvBlocks::value_channels,
                     "Channels of a layer's values (0: keys only; at most 2^20).")
      .def_readwrite("tokens", &kernels::KvBlocks::tokens,
                     "Tokens of every stream, token 0 the oldest (1..2^32).")
      .def(
          "plain_bytes",
          [](const kernels::KvBlocks& b, DType dtype) {
            return kernels::kv_blocks_plain_bytes(well_formed(b), dtype);
          },
          py::arg("dtype"),
          "Bytes of the plain values in ``dtype``: the staging range put_snapshot() reads and "
          "get_snapshot() writes. ValueError (naming the problem) for ill-formed blocks.")
      .def_property_readonly(
          "encoded_bytes",
          [](const kernels::KvBlocks& b) {
            return kernels::kv_blocks_encoded_bytes(well_formed(b));
          },
          "Bytes of every stream encoded, metadata included (what an entry stores: kv_bytes). "
          "ValueError for ill-formed blocks.")
      .def(
          "__eq__",
          [](const kernels::KvBlocks& a, const py::object& other) {
            return py::isinstance<kernels::KvBlocks>(other) &&
                   a == other.cast<const kernels::KvBlocks&>();
          },
          py::arg("other"), "Same codec and shape; False for anything else.")
      .def("__repr__", &kv_repr,
           "'KvBlocks(codec=KvCodec.kivi2, layers=..., key_channels=..., value_channels=..., "
           "tokens=...)'.");

  py::class_<client::SnapshotPut>(m, "SnapshotPut", "What put_snapshot() did.")
      .def_readonly("created", &client::SnapshotPut::created,
                    "False: the key had a snapshot for this layout already (nothing copied).")
      .def_readonly("evicted", &client::SnapshotPut::evicted,
                    "Older snapshots evicted from the arena to make room.")
      .def_readonly("page_bytes", &client::SnapshotPut::page_bytes, "Bytes of the page copied.")
      .def_property_readonly(
          "kv", [](const client::SnapshotPut& p) { return p.kv; },
          "The key's entry's KV blocks (the new entry's, or those of the one that stood), or "
          "None for a state-only entry.")
      .def_readonly("kv_bytes", &client::SnapshotPut::kv_bytes,
                    "Encoded bytes of those KV blocks (0 without).")
      .def_readonly("pages", &client::SnapshotPut::pages,
                    "Pages of the arena the entry holds: 1 + its KV blocks' pages.")
      .def(
          "__repr__",
          [](const client::SnapshotPut& p) {
            std::string out = "SnapshotPut(created=" + std::string(p.created ? "True" : "False") +
                              ", evicted=" + std::to_string(p.evicted);
            if (p.kv)
              out += kv_fields_repr(p.kv, p.kv_bytes) + ", pages=" + std::to_string(p.pages);
            return out + ")";
          },
          "SnapshotPut(created=..., evicted=...), with kv=..., kv_bytes=..., pages=... for a "
          "hybrid entry.");
  py::class_<client::SnapshotGet>(m, "SnapshotGet", "What get_snapshot() found; true on a hit.")
      .def_readonly("hit", &client::SnapshotGet::hit,
                    "True: the slot now holds the snapshot's state.")
      .def_readonly("other_layouts", &client::SnapshotGet::other_layouts,
                    "On a miss: snapshots of the key for other layouts.")
      .def_readonly("page_bytes", &client::SnapshotGet::page_bytes, "Bytes of the slot's page.")
      .def_readonly("tier", &client::SnapshotGet::tier,
                    "On a hit: the tier that served it, pool, host or remote.")
      .def_property_readonly(
          "kv", [](const client::SnapshotGet& g) { return g.kv; },
          "On a hit of a hybrid entry: its KV blocks (with or without kv_staging); else None.")
      .def_readonly("kv_bytes", &client::SnapshotGet::kv_bytes,
                    "Encoded bytes of those KV blocks (0 without).")
      .def_readonly("kv_delivered", &client::SnapshotGet::kv_delivered,
                    "True: the KV blocks were decoded into the kv_staging range.")
      .def(
          "__bool__", [](const client::SnapshotGet& g) { return g.hit; }, "hit.")
      .def(
          "__repr__",
          [](const client::SnapshotGet& g) {
            std::string out = "SnapshotGet(hit=" + std::string(g.hit ? "True" : "False");
            if (g.kv) {
              out += kv_fields_repr(g.kv, g.kv_bytes) +
                     ", kv_delivered=" + (g.kv_delivered ? "True" : "False");
            }
            return out + ")";
          },
          "SnapshotGet(hit=...), with kv=..., kv_bytes=..., kv_delivered=... for a hybrid entry.");
  py::class_<client::SnapshotInfo>(m, "SnapshotInfo", "One snapshot in list_snapshots().")
      .def_property_readonly(
          "prefix", [](const client::SnapshotInfo& i) { return py::bytes(i.key.prefix); },
          "The key's prefix bytes.")
      .def_property_readonly(
          "position", [](const client::SnapshotInfo& i) { return i.key.position; },
          "The key's token position.")
      .def_readonly("layout_id", &client::SnapshotInfo::layout_id, "The layout it is bound to.")
      .def_readonly("layout_name", &client::SnapshotInfo::layout_name, "That layout's name.")
      .def_readonly("codec", &client::SnapshotInfo::codec, "That layout's codec.")
      .def_readonly("tenant", &client::SnapshotInfo::tenant, "The publisher.")
      .def_readonly("arena_id", &client::SnapshotInfo::arena_id,
                    "The publisher's arena that holds the page.")
      .def_readonly("page_bytes", &client::SnapshotInfo::page_bytes, "Bytes of its page.")
      .def_readonly("fp32_bytes", &client::SnapshotInfo::fp32_bytes,
                    "The same state with every value in FP32.")
      .def_readonly("pinned", &client::SnapshotInfo::pinned, "Never evicted.")
      .def_readonly("hits", &client::SnapshotInfo::hits, "get_snapshot hits on it.")
      .def_readonly("age_seconds", &client::SnapshotInfo::age_seconds, "Since it was published.")
      .def_readonly("idle_seconds", &client::SnapshotInfo::idle_seconds,
                    "Since it was published or last read.")
      .def_property_readonly(
          "kv", [](const client::SnapshotInfo& i) { return i.kv; },
          "A hybrid entry's KV blocks, or None.")
      .def_readonly("kv_bytes", &client::SnapshotInfo::kv_bytes,
                    "Encoded bytes of its KV blocks (0 without).")
      .def_readonly("pages", &client::SnapshotInfo::pages,
                    "Pages of the arena it holds: 1 + its KV blocks' pages.")
      .def_readonly("layout_digest", &client::SnapshotInfo::layout_digest,
                    "Names its layout across daemons (16 hex digits): export_snapshot()'s "
                    "layout_digest.");
  py::class_<client::SnapshotExport>(m, "SnapshotExport",
                                     "What export_snapshot() found; true when found.")
      .def_readonly("found", &client::SnapshotExport::found,
                    "True: the key has a snapshot (for the layout asked for).")
      .def_readonly("value_bytes", &client::SnapshotExport::value_bytes,
                    "Bytes of the value: written into the staging buffer, or needed there.")
      .def_readonly("layout_digest", &client::SnapshotExport::layout_digest,
                    "The digest of the entry's layout.")
      .def_property_readonly(
          "kv", [](const client::SnapshotExport& e) { return e.kv; },
          "A hybrid entry's KV blocks (in the value), or None.")
      .def(
          "__bool__", [](const client::SnapshotExport& e) { return e.found; }, "found.")
      .def(
          "__repr__",
          [](const client::SnapshotExport& e) {
            std::string out = "SnapshotExport(found=" + std::string(e.found ? "True" : "False");
            if (e.found) {
              out += ", value_bytes=" + std::to_string(e.value_bytes) + ", layout_digest='" +
                     e.layout_digest + "'";
            }
            if (e.kv) out += ", kv=" + kv_repr(*e.kv);
            return out + ")";
          },
          "SnapshotExport(found=...), with value_bytes=..., layout_digest='...' when found and "
          "kv=... for a hybrid entry.");
  py::class_<client::SnapshotImport>(m, "SnapshotImport", "What import_snapshot() did.")
      .def_readonly("created", &client::SnapshotImport::created,
                    "False: the key had a snapshot for this layout already (nothing copied).")
      .def_readonly("evicted", &client::SnapshotImport::evicted,
                    "Older snapshots evicted from the arena to make room.")
      .def_readonly("arena_id", &client::SnapshotImport::arena_id,
                    "This tenant's arena that holds it.")
      .def_property_readonly(
          "prefix", [](const client::SnapshotImport& i) { return py::bytes(i.key.prefix); },
          "The key's prefix bytes (the value's key).")
      .def_property_readonly(
          "position", [](const client::SnapshotImport& i) { return i.key.position; },
          "The key's token position.")
      .def_property_readonly(
          "kv", [](const client::SnapshotImport& i) { return i.kv; },
          "The entry's KV blocks, or None for a state-only entry.")
      .def_readonly("pages", &client::SnapshotImport::pages,
                    "Pages of the arena the entry holds: 1 + its KV blocks' pages.")
      .def(
          "__repr__",
          [](const client::SnapshotImport& i) {
            std::string out =
                "SnapshotImport(created=" + std::string(i.created ? "True" : "False") +
                ", evicted=" + std::to_string(i.evicted) +
                ", arena_id=" + std::to_string(i.arena_id) +
                ", prefix=" + bytes_repr(i.key.prefix) +
                ", position=" + std::to_string(i.key.position);
            if (i.kv) out += ", kv=" + kv_repr(*i.kv);
            return out + ", pages=" + std::to_string(i.pages) + ")";
          },
          "SnapshotImport(created=..., evicted=..., arena_id=..., prefix=b'...', position=..., "
          "pages=...), with kv=... for a hybrid entry.");
  py::class_<client::SnapshotList>(m, "SnapshotList", "What list_snapshots() returns.")
      .def_readonly("snapshots", &client::SnapshotList::snapshots,
                    "The snapshots found, in key order.")
      .def_readonly("truncated", &client::SnapshotList::truncated, "More matched than the limit.")
      .def_readonly("snapshot_namespace", &client::SnapshotList::snapshot_namespace,
                    "The namespace this tenant's keys live in.");

  connection
      .def(
          "put_snapshot",
          [](const ConnectionHandle& c, const SlotHandle& slot, const PrefixArg& prefix,
             std::uint64_t position, const std::optional<kernels::KvBlocks>& kv,
             const OptionalStaging& kv_staging, std::uint64_t kv_offset, DType kv_dtype) {
            const std::optional<client::SnapshotKv> with =
                snapshot_kv(kv, kv_staging, kv_offset, kv_dtype);
            const client::Slot& s = slot_of(slot);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(c, [&](Connection& conn) { return conn.put_snapshot(s, key, with); });
          },
          py::arg("slot"), py::arg("prefix"), py::arg("position"), py::arg("kv") = py::none(),
          py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16, R"doc(
Publishes the state in ``slot`` under the key (prefix: the engine's prefix hash, 1..256 bytes,
str or bytes; position: the token position). Idempotent: a key that has a snapshot for this
layout keeps it (created is False). docs/prefix-store.md.

With ``kv`` (KvBlocks), a hybrid entry: the daemon reads the KV values from this connection's
staging buffer ``kv_staging`` at byte ``kv_offset`` (kv.plain_bytes(kv_dtype) bytes of
``kv_dtype``: f32, bf16 or f16), encodes them with kv.codec and keeps them in further pages of
the arena (the result's pages and kv_bytes). NotFinite for a NaN/Inf value, InvalidArgument
for ill-formed blocks or blocks that need more pages than the arena has; in both cases
nothing is published. ValueError, before anything is sent, for kv without kv_staging or the
reverse.)doc")
      .def(
          "put_snapshot",
          [](const ConnectionHandle& c, client::ArenaId arena, client::SlotId slot,
             const PrefixArg& prefix, std::uint64_t position,
             const std::optional<kernels::KvBlocks>& kv, const OptionalStaging& kv_staging,
             std::uint64_t kv_offset, DType kv_dtype) {
            const std::optional<client::SnapshotKv> with =
                snapshot_kv(kv, kv_staging, kv_offset, kv_dtype);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(
                c, [&](Connection& conn) { return conn.put_snapshot(arena, slot, key, with); });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("prefix"), py::arg("position"),
          py::arg("kv") = py::none(), py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16,
          "put_snapshot() by ids: the arena and a slot of this lease (a released or adopted one).")
      .def(
          "get_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             const SlotHandle& slot, const OptionalStaging& kv_staging, std::uint64_t kv_offset,
             DType kv_dtype) {
            const std::optional<client::KvStaging> range =
                kv_range(kv_staging, kv_offset, kv_dtype);
            const client::Slot& s = slot_of(slot);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(c, [&](Connection& conn) { return conn.get_snapshot(key, s, range); });
          },
          py::arg("prefix"), py::arg("position"), py::arg("slot"),
          py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16, R"doc(
Copies the key's snapshot for the slot's layout into ``slot``; a miss (false result) leaves it
unchanged.

With ``kv_staging`` (a staging buffer of this connection), a hit on a hybrid entry also decodes
its KV blocks into it at byte ``kv_offset``, as ``kv_dtype`` values (kv.plain_bytes(kv_dtype)
bytes; a range too small is InvalidArgument and leaves the slot unchanged); kv_delivered says
so. Without it the result still names the blocks (kv, kv_bytes) and kv_delivered is False.)doc")
      .def(
          "get_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             client::ArenaId arena, client::SlotId slot, const OptionalStaging& kv_staging,
             std::uint64_t kv_offset, DType kv_dtype) {
            const std::optional<client::KvStaging> range =
                kv_range(kv_staging, kv_offset, kv_dtype);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(
                c, [&](Connection& conn) { return conn.get_snapshot(key, arena, slot, range); });
          },
          py::arg("prefix"), py::arg("position"), py::arg("arena_id"), py::arg("slot_id"),
          py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16,
          "get_snapshot() by ids: the arena and a slot of this lease (a released or adopted one).")
      .def(
          "export_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             const OptionalStaging& staging, std::uint64_t offset,
             const std::string& layout_digest) {
            if (!staging && offset != 0) {
              throw py::value_error("offset without staging: name the staging buffer");
            }
            const client::Staging* into = staging ? &staging_of(*staging) : nullptr;
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(c, [&](Connection& conn) {
              return conn.export_snapshot(key, into, offset, layout_digest);
            });
          },
          py::arg("prefix"), py::arg("position"), py::arg("staging") = py::none(),
          py::arg("offset") = 0, py::arg("layout_digest") = "", R"doc(
Writes the key's snapshot into ``staging`` (a staging buffer of this connection) at byte
``offset`` as one self-checking value: header, page, KV blocks, CRC-32, the format of
``statepoolctl snapshot-get`` files (docs/prefix-store.md, "Moving snapshots"). With
``layout_digest`` (SnapshotInfo.layout_digest) the entry of that layout, else the key's
first. Without ``staging`` only asks: found and value_bytes (the range it needs). A miss is
no error (found False); a range too small is InvalidArgument. export_snapshot_bytes() does
it all in one call.)doc")
      .def(
          "import_snapshot",
          [](const ConnectionHandle& c, const StagingHandle& staging, std::uint64_t offset,
             std::uint64_t bytes) {
            const client::Staging& from = staging_of(staging);
            return call(
                c, [&](Connection& conn) { return conn.import_snapshot(from, offset, bytes); });
          },
          py::arg("staging"), py::arg("offset"), py::arg("bytes"), R"doc(
Publishes a value made by export_snapshot() (by this daemon or another), ``bytes`` bytes of
``staging`` from byte ``offset``, under the value's key in this tenant's namespace, into the
tenant's arena of the value's layout (same layout, codec and plan: an engine of the model must
have opened one, else NotFound). As put_snapshot(): idempotent, evicting. InvalidArgument,
naming the problem (checksum mismatch, truncated, another format), for a value it refuses;
nothing is published then.)doc")
      .def(
          "export_snapshot_bytes",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             const std::string& layout_digest) {
            return export_bytes(c, client::SnapshotKey{prefix_bytes(prefix), position},
                                layout_digest);
          },
          py::arg("prefix"), py::arg("position"), py::arg("layout_digest") = "", R"doc(
The key's snapshot as one self-checking value (the bytes of a ``statepoolctl snapshot-get``
file), or None when it has none: asks the size, opens a staging buffer of it, exports,
copies the bytes out and closes the buffer. RuntimeError where staging buffers are not host
memory (the cuda backend).)doc")
      .def("import_snapshot_bytes", &import_bytes, py::arg("data"), R"doc(
Publishes a value from export_snapshot_bytes() (or a ``statepoolctl snapshot-get`` file) as
import_snapshot() does, through a staging buffer it opens and closes. ValueError for empty
``data``; RuntimeError where staging buffers are not host memory (the cuda backend).)doc")
      .def(
          "delete_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position) {
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(c, [&](Connection& conn) { return conn.delete_snapshot(key); });
          },
          py::arg("prefix"), py::arg("position"),
          "Deletes the key's snapshots (every layout, pinned ones too); returns how many.")
      .def(
          "pin_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             bool pinned) {
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(c, [&](Connection& conn) { return conn.pin_snapshot(key, pinned); });
          },
          py::arg("prefix"), py::arg("position"), py::arg("pinned") = true,
          "Pins (never evicted) or unpins the key's snapshots; returns how many changed.")
      .def(
          "list_snapshots",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint32_t limit) {
            const std::string start = prefix_bytes(prefix);
            return call(c, [&](Connection& conn) { return conn.list_snapshots(start, limit); });
          },
          py::arg("prefix") = py::bytes(), py::arg("limit") = 0,
          "Snapshots of the namespace whose prefix starts with ``prefix``, in key order, at most "
          "``limit`` (0 = 1000).");
}

}  // namespace statepool::python
