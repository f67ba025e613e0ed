// Protocol version 2: memory lent to the daemon and snapshots N at a time
// (docs/protocol.md, "Batched snapshot requests"). Connection.register_memory(),
// lookup_snapshots(), put_snapshots(), get_snapshots(); StateRange, KvRange,
// SnapshotPutEntry, SnapshotGetEntry and the results (service/handlers/snapshot_batches.cpp
// serves them). Ranges name a Staging object or a staging id.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "client/keys.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;

/// A range's buffer: a Staging object or a staging id.
using BufferArg = py::object;

client::StagingId buffer_id(const py::object& buffer) {
  if (py::isinstance<StagingHandle>(buffer))
    return staging_of(buffer.cast<const StagingHandle&>()).id();
  return buffer.cast<client::StagingId>();
}

client::StagingId optional_buffer_id(const py::object& buffer) {
  return buffer.is_none() ? 0 : buffer_id(buffer);
}

/// Positions of a call's keys: one for every key, or one each.
using Positions = std::variant<std::uint64_t, std::vector<std::uint64_t>>;

std::vector<client::SnapshotKey> keys_of(const std::vector<PrefixArg>& prefixes,
                                         const Positions& positions) {
  std::vector<client::SnapshotKey> keys(prefixes.size());
  const auto* each = std::get_if<std::vector<std::uint64_t>>(&positions);
  if (each != nullptr && each->size() != prefixes.size())
    throw py::value_error("positions: one per prefix, or one for all");
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys[i].prefix = prefix_bytes(prefixes[i]);
    keys[i].position = each != nullptr ? (*each)[i] : std::get<std::uint64_t>(positions);
  }
  return keys;
}

std::string tier_repr(client::SnapshotTier tier) {
  return std::string("SnapshotTier.") + client::to_string(tier);
}

}  // namespace

void bind_snapshot_batches(py::module_& m, ConnectionClass& connection) {
  py::enum_<client::SnapshotTier>(m, "SnapshotTier", "Where a snapshot was found.")
      .value("none", client::SnapshotTier::none, "Nowhere.")
      .value("pool", client::SnapshotTier::pool, "In the daemon's pool.")
      .value("host", client::SnapshotTier::host, "In the daemon's host tier.")
      .value("remote", client::SnapshotTier::remote, "In the remote store (Redis).");

  py::class_<client::StateRange>(m, "StateRange", R"doc(
Where a state is (put_snapshots() reads it) or goes (get_snapshots() writes it): in a Staging
buffer or memory lent with register_memory(), in the engine's own layout. The recurrent part
holds every layer's heads in page order, each head [K][V], or [V][K] with ``value_major``
(SGLang's and vLLM's GDN/KDA state); the conv state [L][C][W] follows it (no ``conv_staging``)
or lies in ``conv_staging`` at ``conv_offset``.)doc")
      .def(
          py::init([](const BufferArg& staging, std::uint64_t offset, DType dtype, bool value_major,
                      const py::object& conv_staging, std::uint64_t conv_offset) {
            return client::StateRange{
                buffer_id(staging), offset, dtype, value_major, optional_buffer_id(conv_staging),
                conv_offset};
          }),
          py::arg("staging"), py::arg("offset") = 0, py::arg("dtype") = DType::f32,
          py::arg("value_major") = false, py::arg("conv_staging") = py::none(),
          py::arg("conv_offset") = 0)
      .def_readonly("staging_id", &client::StateRange::staging)
      .def_readonly("offset", &client::StateRange::offset)
      .def_readonly("dtype", &client::StateRange::dtype)
      .def_readonly("value_major", &client::StateRange::value_major)
      .def_readonly("conv_staging_id", &client::StateRange::conv_staging)
      .def_readonly("conv_offset", &client::StateRange::conv_offset);

  py::class_<client::KvRange>(m, "KvRange", R"doc(
Where KV blocks' plain values are (or go): for layer l and token t, the row of keys starts at
key_offset + l * layer_stride + t * token_stride bytes of ``staging``, the row of values at
value_offset of ``value_staging`` (default: ``staging``). With both strides 0, statepool's
packed order from key_offset (layer 0 keys, layer 0 values, layer 1 keys, ...).)doc")
      .def(py::init([](const BufferArg& staging, DType dtype, std::uint64_t key_offset,
                       const py::object& value_staging, std::uint64_t value_offset,
                       std::uint64_t layer_stride, std::uint64_t token_stride) {
             return client::KvRange{
                 buffer_id(staging), dtype,        key_offset,  optional_buffer_id(value_staging),
                 value_offset,       layer_stride, token_stride};
           }),
           py::arg("staging"), py::arg("dtype") = DType::bf16, py::arg("key_offset") = 0,
           py::arg("value_staging") = py::none(), py::arg("value_offset") = 0,
           py::arg("layer_stride") = 0, py::arg("token_stride") = 0)
      .def_readonly("staging_id", &client::KvRange::staging)
      .def_readonly("dtype", &client::KvRange::dtype)
      .def_readonly("key_offset", &client::KvRange::key_offset)
      .def_readonly("value_staging_id", &client::KvRange::value_staging)
      .def_readonly("value_offset", &client::KvRange::value_offset)
      .def_readonly("layer_stride", &client::KvRange::layer_stride)
      .def_readonly("token_stride", &client::KvRange::token_stride);

  py::class_<client::SnapshotPutEntry>(m, "SnapshotPutEntry", R"doc(
One snapshot for put_snapshots(): its state from ``state`` (a StateRange), or without it a copy
of ``slot`` of the arena; with ``kv`` (KvBlocks) its KV blocks from ``kv_range``.)doc")
      .def(py::init([](const PrefixArg& prefix, std::uint64_t position,
                       const std::optional<client::StateRange>& state, client::SlotId slot,
                       const std::optional<kernels::KvBlocks>& kv,
                       const std::optional<client::KvRange>& kv_range) {
             if (kv.has_value() != kv_range.has_value())
               throw py::value_error("kv and kv_range come together");
             return client::SnapshotPutEntry{client::SnapshotKey{prefix_bytes(prefix), position},
                                             state, slot, kv, kv_range.value_or(client::KvRange{})};
           }),
           py::arg("prefix"), py::arg("position"), py::arg("state") = py::none(),
           py::arg("slot") = 0, py::arg("kv") = py::none(), py::arg("kv_range") = py::none());

  py::class_<client::SnapshotGetEntry>(m, "SnapshotGetEntry", R"doc(
One snapshot for get_snapshots(): its state into ``state`` and its KV blocks into
``kv_range`` (each optional; with neither, the call only says whether it is there).)doc")
      .def(py::init([](const PrefixArg& prefix, std::uint64_t position,
                       const std::optional<client::StateRange>& state,
                       const std::optional<client::KvRange>& kv_range) {
             return client::SnapshotGetEntry{client::SnapshotKey{prefix_bytes(prefix), position},
                                             state, kv_range};
           }),
           py::arg("prefix"), py::arg("position"), py::arg("state") = py::none(),
           py::arg("kv_range") = py::none());

  py::class_<client::SnapshotLookup>(m, "SnapshotLookup", "What lookup_snapshots() found.")
      .def_readonly("found", &client::SnapshotLookup::found, "Per key, the tier that has it.")
      .def_readonly("leading", &client::SnapshotLookup::leading,
                    "How many keys from the first on are present.")
      .def_readonly("also", &client::SnapshotLookup::also,
                    "Per ``also`` group of the call, per key, the tier that has it.")
      .def("__repr__", [](const client::SnapshotLookup& l) {
        return "SnapshotLookup(leading=" + std::to_string(l.leading) +
               ", keys=" + std::to_string(l.found.size()) + ")";
      });
  py::class_<client::SnapshotPutResult>(m, "SnapshotPutResult",
                                        "One entry of put_snapshots(); true when ok.")
      .def_readonly("status", &client::SnapshotPutResult::status)
      .def_readonly("message", &client::SnapshotPutResult::message)
      .def_readonly("created", &client::SnapshotPutResult::created,
                    "False with status ok: the key had a snapshot, which stays.")
      .def_readonly("evicted", &client::SnapshotPutResult::evicted)
      .def("__bool__", [](const client::SnapshotPutResult& r) { return r.status == Status::ok; })
      .def("__repr__", [](const client::SnapshotPutResult& r) {
        return std::string("SnapshotPutResult(status=") + status_name(r.status) +
               ", created=" + (r.created ? "True" : "False") +
               (r.message.empty()
                    ? ""
                    : ", message=" + py::repr(py::str(r.message)).cast<std::string>()) +
               ")";
      });
  py::class_<client::SnapshotPuts>(m, "SnapshotPuts", "What put_snapshots() did.")
      .def_readonly("results", &client::SnapshotPuts::results, "Per entry, in order.")
      .def_readonly("created", &client::SnapshotPuts::created)
      .def_readonly("existing", &client::SnapshotPuts::existing)
      .def_readonly("failed", &client::SnapshotPuts::failed)
      .def_readonly("bytes", &client::SnapshotPuts::bytes, "State and KV bytes the daemon read.")
      .def("__repr__", [](const client::SnapshotPuts& p) {
        return "SnapshotPuts(created=" + std::to_string(p.created) +
               ", existing=" + std::to_string(p.existing) + ", failed=" + std::to_string(p.failed) +
               ", bytes=" + std::to_string(p.bytes) + ")";
      });
  py::class_<client::SnapshotGetResult>(m, "SnapshotGetResult",
                                        "One entry of get_snapshots(); true on a hit.")
      .def_readonly("status", &client::SnapshotGetResult::status)
      .def_readonly("message", &client::SnapshotGetResult::message)
      .def_readonly("hit", &client::SnapshotGetResult::hit)
      .def_readonly("tier", &client::SnapshotGetResult::tier)
      .def_readonly("kv", &client::SnapshotGetResult::kv)
      .def_readonly("kv_delivered", &client::SnapshotGetResult::kv_delivered)
      .def("__bool__", [](const client::SnapshotGetResult& r) { return r.hit; })
      .def("__repr__", [](const client::SnapshotGetResult& r) {
        return std::string("SnapshotGetResult(status=") + status_name(r.status) +
               ", hit=" + (r.hit ? "True" : "False") + ", tier=" + tier_repr(r.tier) +
               ", kv_delivered=" + (r.kv_delivered ? "True" : "False") + ")";
      });
  py::class_<client::SnapshotGets>(m, "SnapshotGets", "What get_snapshots() found.")
      .def_readonly("results", &client::SnapshotGets::results, "Per entry, in order.")
      .def_readonly("hits", &client::SnapshotGets::hits)
      .def_readonly("bytes", &client::SnapshotGets::bytes, "State and KV bytes the daemon wrote.")
      .def("__repr__", [](const client::SnapshotGets& g) {
        return "SnapshotGets(hits=" + std::to_string(g.hits) +
               ", bytes=" + std::to_string(g.bytes) + ")";
      });

  connection
      .def_property_readonly(
          "max_batch_keys", [](const ConnectionHandle& c) { return c.get()->max_batch_keys(); },
          "Keys one batched request may carry (--max-batch-keys; 0: the daemon speaks protocol "
          "1). The calls split longer lists themselves.")
      .def_property_readonly(
          "max_batch_bytes", [](const ConnectionHandle& c) { return c.get()->max_batch_bytes(); },
          "State and KV bytes one batched request may move (--max-batch-bytes).")
      .def(
          "register_memory",
          [](const ConnectionHandle& c, int fd, std::uint64_t bytes, const std::string& name) {
            bool sealed = false;
            auto staging = call(c, [&](Connection& conn) {
              return std::make_shared<client::Staging>(
                  conn.register_memory(fd, bytes, name, &sealed));
            });
            return py::make_tuple(StagingHandle{std::move(staging)}, sealed);
          },
          py::arg("fd"), py::arg("bytes"), py::arg("name") = "", R"doc(
Lends the daemon the first ``bytes`` of the memory file descriptor ``fd`` refers to (a memfd
or tmpfs file of this process; the caller keeps ``fd``), so that batched requests read and
write it in place: returns (Staging, sealed). The Staging names it in StateRange/KvRange and
maps it here too; closing it ends the loan. ``sealed``: the daemon sealed the file against
shrinking (a memfd made with MFD_ALLOW_SEALING); otherwise shrinking it breaks the loan
(requests on it then fail), never the daemon. Needs protocol version 2.)doc")
      .def(
          "lookup_snapshots",
          [](const ConnectionHandle& c, client::ArenaId arena,
             const std::vector<PrefixArg>& prefixes, const Positions& positions, bool lower_tiers,
             bool stop_at_miss,
             const std::vector<std::tuple<client::ArenaId, std::vector<PrefixArg>, Positions>>&
                 also) {
            const std::vector<client::SnapshotKey> keys = keys_of(prefixes, positions);
            std::vector<client::LookupAlso> groups;
            groups.reserve(also.size());
            for (const auto& [also_arena, also_prefixes, also_positions] : also) {
              groups.push_back(
                  client::LookupAlso{also_arena, keys_of(also_prefixes, also_positions)});
            }
            return call(c, [&](Connection& conn) {
              return conn.lookup_snapshots(arena, keys, lower_tiers, stop_at_miss, groups);
            });
          },
          py::arg("arena_id"), py::arg("prefixes"), py::arg("positions") = 0,
          py::arg("lower_tiers") = true, py::arg("stop_at_miss") = false,
          py::arg("also") =
              std::vector<std::tuple<client::ArenaId, std::vector<PrefixArg>, Positions>>{},
          R"doc(
Which keys (prefixes, with one position for all or one each) have a snapshot for the layout of
arena ``arena_id``, answered from the indexes: nothing is read or copied, no hit is counted.
``lower_tiers``: keys not in the pool are looked for in the host tier and the remote store.
``stop_at_miss``: keys after the first absent one are not looked up (answered none).
``also``: (arena_id, prefixes, positions) of other pools of the same pages (a hybrid engine's
state beside its KV pages; prefixes[i] belongs to page i), answered in the same round trip in
SnapshotLookup.also; with stop_at_miss only for the pages before the first absent key.)doc")
      .def(
          "put_snapshots",
          [](const ConnectionHandle& c, client::ArenaId arena,
             const std::vector<client::SnapshotPutEntry>& entries) {
            return call(c, [&](Connection& conn) { return conn.put_snapshots(arena, entries); });
          },
          py::arg("arena_id"), py::arg("entries"), R"doc(
Publishes SnapshotPutEntry objects into arena ``arena_id``: keys already published are skipped
before their bytes are read (created False); an entry that fails (a full arena, a non-finite
state) says why in its result and the others go on. InvalidArgument, with nothing done, for a
malformed entry (a range outside this connection's memory, ill-formed KV blocks).)doc")
      .def(
          "get_snapshots",
          [](const ConnectionHandle& c, client::ArenaId arena,
             const std::vector<client::SnapshotGetEntry>& entries, bool stop_at_miss) {
            return call(c, [&](Connection& conn) {
              return conn.get_snapshots(arena, entries, stop_at_miss);
            });
          },
          py::arg("arena_id"), py::arg("entries"), py::arg("stop_at_miss") = false, R"doc(
Reads SnapshotGetEntry objects' snapshots of the layout of arena ``arena_id`` straight into
their ranges (no slot in between). A miss is no error; ``stop_at_miss``: nothing after the first
miss is read.)doc");
}

}  // namespace statepool::python
