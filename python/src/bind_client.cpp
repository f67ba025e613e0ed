// statepool.connect() and the objects of a connection. Every call that talks to the daemon
// releases the GIL, so Python threads may share one Connection (the C++ client serializes
// its requests) and other threads run while a call waits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/decode_step.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "views.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;
using release_gil = py::call_guard<ReleaseGil>;

void refuse_if_viewed(long use_count, const char* what) {
  if (use_count > 1) {
    throw py::buffer_error(std::string("cannot close the ") + what + ": " +
                           std::to_string(use_count - 1) +
                           " view(s) of it (or arrays/tensors made from them) are alive");
  }
}

// --- owners ------------------------------------------------------------------------------
// The Python objects own their C++ counterparts through these handles. Views share the
// staging/arena object (shared_ptr), so close() can tell whether any are alive.
// Destruction (which talks to the daemon for slots and staging) keeps the GIL (gil.hpp).

// Calls take their own reference to the connection (with the GIL held) before they release
// the GIL, so close() on another thread only drops the handle's reference: a call in flight
// finishes on a live connection, and later calls find none (TransportError 'closed').
struct ConnectionHandle {
  std::shared_ptr<Connection> conn;
  /// Needs the GIL.
  [[nodiscard]] std::shared_ptr<Connection> get() const {
    if (!conn)
      throw client::ConnectionError(client::ConnectionError::Kind::closed,
                                    "the connection is closed");
    return conn;
  }
  void close() { conn.reset(); }  // closes the socket when no slot or staging holds it
};

/// f(connection) without the GIL, on a reference taken with it.
template <class F>
auto call(const ConnectionHandle& c, F&& f) {
  const std::shared_ptr<Connection> conn = c.get();
  ReleaseGil release;
  return f(*conn);
}

struct StagingHandle {
  std::shared_ptr<client::Staging> staging;
  /// Needs the GIL: the buffer is moved out of the shared object (views made later find it
  /// closed) and closed without the GIL.
  void close() {
    refuse_if_viewed(staging.use_count(), "staging buffer");
    if (!staging->valid()) return;
    client::Staging closing = std::move(*staging);
    ReleaseGil release;
    closing.close();
  }
};

// A DecodeStep shares its arena object, so Arena.close() refuses while one exists.
struct DecodeStepHandle {
  std::shared_ptr<client::Arena> arena;
  std::unique_ptr<client::DecodeStep> step;
};

// A view's owner: destroying the last one may close a staging buffer on the daemon.
template <class T>
std::shared_ptr<const void> view_owner(const std::shared_ptr<T>& object) {
  return {object.get(), [keep = object](const void*) mutable { keep.reset(); }};
}

// __exit__(type, value, traceback): true when the with block raised.
bool exception_pending(const py::args& exc) {
  return exc.size() > 0 && !exc[0].is_none();
}

// A timeout in seconds: 0, negative or inf wait forever (the client's 0); otherwise at
// least 1 ms, so that a small timeout never becomes "forever".
std::chrono::milliseconds to_ms(double seconds) {
  if (std::isnan(seconds)) throw py::value_error("timeout must be a number of seconds, not nan");
  if (seconds <= 0 || std::isinf(seconds) || seconds > 1e12) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(seconds * 1000.0))));
}

std::string memory_space(const kernels::MemoryDescriptor& m) {
  return kernels::to_string(m.space);
}

// A float32 buffer for the fused step: its bytes as floats (4-byte multiple and aligned).
std::span<float> floats(const Borrowed& b, const char* what) {
  const std::span<std::byte> bytes = b.bytes();
  if (bytes.size() % sizeof(float) != 0 ||
      reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) != 0) {
    throw py::value_error(std::string(what) + " must be an aligned float32 buffer");
  }
  return {reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float)};
}

py::object pending_event(const client::Pending& p) {
  if (!p.event) return py::none();
  return py::bytes(reinterpret_cast<const char*>(p.event->data()), p.event->size());
}

/// The `after` argument: None, or the 64 bytes of an IPC event handle (bytes-like, as
/// torch.cuda.Event(interprocess=True).ipc_handle() returns). ValueError otherwise.
std::optional<client::IpcEventBytes> after_event(const py::object& after) {
  if (after.is_none()) return std::nullopt;
  if (!py::isinstance<py::buffer>(after)) {
    throw py::type_error(
        "after must be None or bytes-like: the IPC handle of an interprocess CUDA event");
  }
  // bytes() of a buffer copies its bytes (any layout, C order).
  const auto bytes = py::module_::import("builtins").attr("bytes")(after).cast<std::string>();
  client::IpcEventBytes event{};
  if (bytes.size() != event.size()) {
    throw py::value_error("after must be the " + std::to_string(event.size()) +
                          "-byte IPC handle of an interprocess CUDA event, got " +
                          std::to_string(bytes.size()) + " bytes");
  }
  std::memcpy(event.data(), bytes.data(), event.size());
  return event;
}

/// A snapshot key's prefix as Python gives it: bytes as they are, str as its UTF-8 bytes.
using PrefixArg = std::variant<py::bytes, std::string>;

std::string prefix_bytes(const PrefixArg& prefix) {
  if (const auto* b = std::get_if<py::bytes>(&prefix)) return std::string(*b);
  return std::get<std::string>(prefix);
}

const client::Staging& staging_of(const StagingHandle& s) {
  if (!s.staging || !s.staging->valid()) throw py::value_error("the staging buffer is closed");
  return *s.staging;
}

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
std::optional<client::KvStaging> kv_range(const StagingHandle* staging, std::uint64_t offset,
                                          DType dtype) {
  if (staging == nullptr) {
    if (offset != 0) throw py::value_error("kv_offset without kv_staging");
    return std::nullopt;
  }
  return client::KvStaging{staging_of(*staging).id(), offset, dtype};
}

/// put_snapshot()'s KV blocks and their range, checked before anything is sent: both or
/// neither.
std::optional<client::SnapshotKv> snapshot_kv(const std::optional<kernels::KvBlocks>& kv,
                                              const StagingHandle* kv_staging,
                                              std::uint64_t kv_offset, DType kv_dtype) {
  if (kv && kv_staging == nullptr) {
    throw py::value_error(
        "kv without kv_staging: name the staging buffer that holds the KV values");
  }
  if (!kv && kv_staging != nullptr) {
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

void bind_client(py::module_& m) {
  m.attr("DEFAULT_SOCKET_PATH") = client::kDefaultSocketPath;

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
          "__eq__", [](const kernels::KvBlocks& a, const kernels::KvBlocks& b) { return a == b; },
          py::is_operator())
      .def("__repr__", &kv_repr);

  // --- results ---------------------------------------------------------------------------
  py::class_<client::LayoutInfo>(m, "LayoutInfo", "A layout registered with the daemon.")
      .def_readonly("id", &client::LayoutInfo::id)
      .def_readonly("page_bytes", &client::LayoutInfo::page_bytes, "Exact bytes of one page.")
      .def_readonly("fp32_bytes", &client::LayoutInfo::fp32_bytes,
                    "Bytes of the same state with every value in float32.")
      .def_readonly("state_bytes_f32", &client::LayoutInfo::state_bytes_f32,
                    "Bytes of a staged state, recurrent part in float32.")
      .def_readonly("state_bytes_bf16", &client::LayoutInfo::state_bytes_bf16,
                    "Bytes of a staged state, recurrent part in bfloat16.")
      .def_readonly("layout", &client::LayoutInfo::layout)
      .def_property_readonly("compression_ratio", &client::LayoutInfo::compression_ratio)
      .def("state_bytes", &client::LayoutInfo::state_bytes, py::arg("dtype") = DType::f32)
      .def("__repr__", [](const client::LayoutInfo& l) {
        return "<statepool.LayoutInfo id=" + std::to_string(l.id) +
               " page_bytes=" + std::to_string(l.page_bytes) +
               " fp32_bytes=" + std::to_string(l.fp32_bytes) + ">";
      });
  py::class_<client::PlanInfo>(m, "PlanInfo", "A STEPQuant plan the daemon holds.")
      .def_readonly("digest", &client::PlanInfo::digest)
      .def_readonly("units", &client::PlanInfo::units)
      .def_readonly("pivots", &client::PlanInfo::pivots)
      .def_readonly("average_bits", &client::PlanInfo::average_bits)
      .def_readonly("created", &client::PlanInfo::created, "False when the daemon had it already.");
  py::class_<client::ArenaStats>(m, "ArenaStats", "One arena in stats().")
      .def_readonly("arena_id", &client::ArenaStats::arena_id)
      .def_readonly("tenant", &client::ArenaStats::tenant)
      .def_readonly("layout_id", &client::ArenaStats::layout_id)
      .def_readonly("layout_name", &client::ArenaStats::layout_name)
      .def_readonly("codec", &client::ArenaStats::codec)
      .def_readonly("backend", &client::ArenaStats::backend)
      .def_readonly("page_bytes", &client::ArenaStats::page_bytes)
      .def_readonly("page_stride", &client::ArenaStats::page_stride)
      .def_readonly("pages_total", &client::ArenaStats::pages_total)
      .def_readonly("pages_used", &client::ArenaStats::pages_used)
      .def_readonly("bytes_total", &client::ArenaStats::bytes_total)
      .def_readonly("fp32_bytes_used", &client::ArenaStats::fp32_bytes_used)
      .def_readonly("snapshot_pages", &client::ArenaStats::snapshot_pages,
                    "Of pages_used, those holding prefix-state snapshots.")
      .def_property_readonly("stored_bytes_used", &client::ArenaStats::stored_bytes_used)
      .def_property_readonly("compression_ratio", &client::ArenaStats::compression_ratio);
  py::class_<client::TenantStats>(m, "TenantStats", "One tenant in stats().")
      .def_readonly("tenant", &client::TenantStats::tenant)
      .def_readonly("quota_bytes", &client::TenantStats::quota_bytes, "0 = unlimited.")
      .def_readonly("reserved_bytes", &client::TenantStats::reserved_bytes)
      .def_readonly("pages_used", &client::TenantStats::pages_used)
      .def_readonly("stored_bytes", &client::TenantStats::stored_bytes)
      .def_readonly("fp32_bytes", &client::TenantStats::fp32_bytes)
      .def_readonly("snapshots", &client::TenantStats::snapshots,
                    "Prefix-state snapshots it published.")
      .def_readonly("snapshot_bytes", &client::TenantStats::snapshot_bytes,
                    "Page bytes of those snapshots.")
      .def_readonly("pinned_snapshots", &client::TenantStats::pinned_snapshots)
      .def_readonly("snapshot_hits", &client::TenantStats::snapshot_hits,
                    "get_snapshot hits by the tenant since the daemon started.")
      .def_readonly("snapshot_misses", &client::TenantStats::snapshot_misses,
                    "get_snapshot misses by the tenant since the daemon started.")
      .def_readonly("snapshot_evictions", &client::TenantStats::snapshot_evictions,
                    "Its snapshots evicted to make room, since the daemon started.")
      .def_readonly("snapshot_demotions", &client::TenantStats::snapshot_demotions,
                    "Its snapshots evicted from the pool while lower tiers keep them.")
      .def_readonly("snapshot_hits_host", &client::TenantStats::snapshot_hits_host,
                    "Of snapshot_hits, those the host tier served.")
      .def_readonly("snapshot_hits_remote", &client::TenantStats::snapshot_hits_remote,
                    "Of snapshot_hits, those the remote store served.")
      .def_property_readonly("compression_ratio", &client::TenantStats::compression_ratio);
  py::class_<client::Stats>(m, "Stats", "The daemon's state (the Stats request).")
      .def_readonly("arenas", &client::Stats::arenas)
      .def_readonly("tenants", &client::Stats::tenants)
      .def_readonly("clients_connected", &client::Stats::clients_connected)
      .def_readonly("leases_active", &client::Stats::leases_active)
      .def_readonly("leases_orphaned", &client::Stats::leases_orphaned)
      .def_readonly("pages_reclaimed_total", &client::Stats::pages_reclaimed_total)
      .def_readonly("pool_capacity_bytes", &client::Stats::pool_capacity_bytes)
      .def_readonly("pool_reserved_bytes", &client::Stats::pool_reserved_bytes)
      .def_readonly("uptime_seconds", &client::Stats::uptime_seconds);
  py::class_<client::CodecFit>(m, "CodecFit", "How many more requests fit under one codec.")
      .def_readonly("codec", &client::CodecFit::codec)
      .def_readonly("nominal_plan", &client::CodecFit::nominal_plan)
      .def_readonly("page_stride", &client::CodecFit::page_stride)
      .def_readonly("arena_free_pages", &client::CodecFit::arena_free_pages)
      .def_readonly("new_arena_pages", &client::CodecFit::new_arena_pages)
      .def_readonly("requests", &client::CodecFit::requests)
      .def_readonly("limited_by", &client::CodecFit::limited_by,
                    "arena, pool, quota or max_arena_pages.");
  py::class_<client::Fits>(m, "Fits", "What fits now for this connection's tenant.")
      .def_readonly("tenant", &client::Fits::tenant)
      .def_readonly("pool_capacity_bytes", &client::Fits::pool_capacity_bytes)
      .def_readonly("pool_free_bytes", &client::Fits::pool_free_bytes)
      .def_readonly("quota_free_bytes", &client::Fits::quota_free_bytes, "None: no quota.")
      .def_readonly("max_arena_pages", &client::Fits::max_arena_pages)
      .def_readonly("codecs", &client::Fits::codecs);
  py::class_<client::SnapshotPut>(m, "SnapshotPut", "What put_snapshot() did.")
      .def_readonly("created", &client::SnapshotPut::created,
                    "False: the key had a snapshot for this layout already (nothing copied).")
      .def_readonly("evicted", &client::SnapshotPut::evicted,
                    "Older snapshots evicted from the arena to make room.")
      .def_readonly("page_bytes", &client::SnapshotPut::page_bytes)
      .def_property_readonly(
          "kv", [](const client::SnapshotPut& p) { return p.kv; },
          "The key's entry's KV blocks (the new entry's, or those of the one that stood), or "
          "None for a state-only entry.")
      .def_readonly("kv_bytes", &client::SnapshotPut::kv_bytes,
                    "Encoded bytes of those KV blocks (0 without).")
      .def_readonly("pages", &client::SnapshotPut::pages,
                    "Pages of the arena the entry holds: 1 + its KV blocks' pages.")
      .def("__repr__", [](const client::SnapshotPut& p) {
        std::string out = "SnapshotPut(created=" + std::string(p.created ? "True" : "False") +
                          ", evicted=" + std::to_string(p.evicted);
        if (p.kv) out += kv_fields_repr(p.kv, p.kv_bytes) + ", pages=" + std::to_string(p.pages);
        return out + ")";
      });
  py::class_<client::SnapshotGet>(m, "SnapshotGet", "What get_snapshot() found; true on a hit.")
      .def_readonly("hit", &client::SnapshotGet::hit,
                    "True: the slot now holds the snapshot's state.")
      .def_readonly("other_layouts", &client::SnapshotGet::other_layouts,
                    "On a miss: snapshots of the key for other layouts.")
      .def_readonly("page_bytes", &client::SnapshotGet::page_bytes)
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
      .def("__repr__", [](const client::SnapshotGet& g) {
        std::string out = "SnapshotGet(hit=" + std::string(g.hit ? "True" : "False");
        if (g.kv) {
          out += kv_fields_repr(g.kv, g.kv_bytes) +
                 ", kv_delivered=" + (g.kv_delivered ? "True" : "False");
        }
        return out + ")";
      });
  py::class_<client::SnapshotInfo>(m, "SnapshotInfo", "One snapshot in list_snapshots().")
      .def_property_readonly(
          "prefix", [](const client::SnapshotInfo& i) { return py::bytes(i.key.prefix); },
          "The key's prefix bytes.")
      .def_property_readonly(
          "position", [](const client::SnapshotInfo& i) { return i.key.position; },
          "The key's token position.")
      .def_readonly("layout_id", &client::SnapshotInfo::layout_id)
      .def_readonly("layout_name", &client::SnapshotInfo::layout_name)
      .def_readonly("codec", &client::SnapshotInfo::codec)
      .def_readonly("tenant", &client::SnapshotInfo::tenant, "The publisher.")
      .def_readonly("arena_id", &client::SnapshotInfo::arena_id,
                    "The publisher's arena that holds the page.")
      .def_readonly("page_bytes", &client::SnapshotInfo::page_bytes)
      .def_readonly("fp32_bytes", &client::SnapshotInfo::fp32_bytes)
      .def_readonly("pinned", &client::SnapshotInfo::pinned)
      .def_readonly("hits", &client::SnapshotInfo::hits)
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
      .def("__repr__", [](const client::SnapshotExport& e) {
        std::string out = "SnapshotExport(found=" + std::string(e.found ? "True" : "False");
        if (e.found) {
          out += ", value_bytes=" + std::to_string(e.value_bytes) + ", layout_digest='" +
                 e.layout_digest + "'";
        }
        if (e.kv) out += ", kv=" + kv_repr(*e.kv);
        return out + ")";
      });
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
      .def("__repr__", [](const client::SnapshotImport& i) {
        std::string out =
            "SnapshotImport(created=" + std::string(i.created ? "True" : "False") +
            ", evicted=" + std::to_string(i.evicted) + ", arena_id=" + std::to_string(i.arena_id) +
            ", prefix=" + bytes_repr(i.key.prefix) + ", position=" + std::to_string(i.key.position);
        if (i.kv) out += ", kv=" + kv_repr(*i.kv);
        return out + ", pages=" + std::to_string(i.pages) + ")";
      });
  py::class_<client::SnapshotList>(m, "SnapshotList", "What list_snapshots() returns.")
      .def_readonly("snapshots", &client::SnapshotList::snapshots)
      .def_readonly("truncated", &client::SnapshotList::truncated, "More matched than the limit.")
      .def_readonly("snapshot_namespace", &client::SnapshotList::snapshot_namespace,
                    "The namespace this tenant's keys live in.");
  py::class_<client::Pending>(m, "Pending", "An operation the daemon may still run on its device.")
      .def_readonly("bytes", &client::Pending::bytes)
      .def_property_readonly("event", &pending_event,
                             "The 64 bytes of a cudaIpcEventHandle_t that completes with the "
                             "work, or None when the work was done already (host backend).");

  py::class_<client::ArenaClose>(m, "ArenaClose", "What close_arena() gave back.")
      .def_readonly("bytes", &client::ArenaClose::bytes,
                    "The arena's bytes, charged to no quota any more.")
      .def_readonly("snapshots_dropped", &client::ArenaClose::snapshots_dropped,
                    "Its unpinned snapshots, evicted from the pool.")
      .def("__repr__", [](const client::ArenaClose& c) {
        return "ArenaClose(bytes=" + std::to_string(c.bytes) +
               ", snapshots_dropped=" + std::to_string(c.snapshots_dropped) + ")";
      });

  // --- slots -----------------------------------------------------------------------------
  py::class_<SlotHandle>(m, "Slot", R"doc(
One allocated page of an arena, owned by this connection's lease. Freed on the daemon when
the object is garbage-collected, when a ``with`` block ends, or by free(); release() keeps it
allocated (to adopt it again after a reconnect with the lease token).)doc")
      .def_property_readonly("id", [](const SlotHandle& s) { return s.slot.id(); })
      .def_property_readonly("arena_id", [](const SlotHandle& s) { return s.slot.arena_id(); })
      .def_property_readonly(
          "valid", [](const SlotHandle& s) { return s.slot.valid(); },
          "False once freed or released.")
      .def(
          "release", [](SlotHandle& s) { return s.slot.release(); },
          "Gives up ownership without freeing; returns the slot id.")
      .def(
          "free", [](SlotHandle& s) { s.slot.free(); }, release_gil(),
          "Frees the slot on the daemon now.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](SlotHandle& s, const py::args&) {
             if (s.slot.valid()) {
               ReleaseGil release;
               s.slot.free();
             }
           })
      .def("__repr__", [](const SlotHandle& s) {
        return "<statepool.Slot arena=" + std::to_string(s.slot.arena_id()) +
               " id=" + std::to_string(s.slot.id()) + (s.slot.valid() ? "" : " (invalid)") + ">";
      });

  // --- staging ---------------------------------------------------------------------------
  py::class_<StagingHandle>(m, "Staging", R"doc(
A staging buffer shared with the daemon: full-precision states are written here before
compress() and read from here after decompress(). view() gives zero-copy numpy/PyTorch access.
Closed on the daemon when garbage-collected, when a ``with`` block ends, or by close().)doc")
      .def_property_readonly("id", [](const StagingHandle& s) { return s.staging->id(); })
      .def_property_readonly(
          "size", [](const StagingHandle& s) { return s.staging->size(); },
          "Bytes (at least what was asked for).")
      .def_property_readonly("fd", [](const StagingHandle& s) { return s.staging->fd(); })
      .def_property_readonly("valid", [](const StagingHandle& s) { return s.staging->valid(); })
      .def_property_readonly(
          "memory_space", [](const StagingHandle& s) { return memory_space(s.staging->memory()); },
          "'host' or 'device'.")
      .def_property_readonly(
          "device_ptr",
          [](const StagingHandle& s) {
            return reinterpret_cast<std::uintptr_t>(s.staging->device_data());
          },
          "Device address when device memory is mapped here, else 0.")
      .def(
          "view",
          [](const StagingHandle& s, const py::object& dtype, const py::object& shape,
             std::size_t offset) {
            const client::Staging& st = staging_of(s);
            if (st.device_data() != nullptr) {
              return make_view(view_owner(s.staging), st.device_data(), st.size(), true,
                               st.memory().device, dtype, shape, offset);
            }
            if (st.bytes().empty()) {
              throw py::value_error("the staging buffer is not mapped into this process");
            }
            return make_view(view_owner(s.staging), st.bytes().data(), st.size(), false, -1, dtype,
                             shape, offset);
          },
          py::arg("dtype") = py::none(), py::arg("shape") = py::none(), py::arg("offset") = 0,
          R"doc(
A zero-copy view of the buffer: ``dtype`` elements (default uint8) in ``shape`` (default:
the rest of the buffer) from byte ``offset``. numpy.asarray(view), torch.from_dlpack(view).)doc")
      .def("close", &StagingHandle::close,
           "Closes the buffer on the daemon now. BufferError while views of it are alive.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](StagingHandle& s, const py::args& exc) {
             // With an exception on its way, views may be alive in its frames: leave the
             // buffer to garbage collection rather than hide the exception behind BufferError.
             if (exception_pending(exc) && s.staging.use_count() > 1) return;
             s.close();
           })
      .def("__repr__", [](const StagingHandle& s) {
        return "<statepool.Staging id=" + std::to_string(s.staging->id()) +
               " size=" + std::to_string(s.staging->size()) +
               (s.staging->valid() ? "" : " (closed)") + ">";
      });

  // --- arenas ----------------------------------------------------------------------------
  py::class_<ArenaHandle>(m, "Arena", R"doc(
A mapped arena: page_count pages of page_bytes each, page_stride apart. Owns the received
descriptor and the mapping (close() or the end of a ``with`` block unmaps it locally; arenas
live on in the daemon). page(slot) views one page; decode(slot, out) decodes it here.)doc")
      .def_property_readonly("id", [](const ArenaHandle& a) { return a.arena->id(); })
      .def_property_readonly("layout_id", [](const ArenaHandle& a) { return a.arena->layout_id(); })
      .def_property_readonly("page_bytes",
                             [](const ArenaHandle& a) { return a.arena->page_bytes(); })
      .def_property_readonly("page_stride",
                             [](const ArenaHandle& a) { return a.arena->page_stride(); })
      .def_property_readonly("page_count",
                             [](const ArenaHandle& a) { return a.arena->page_count(); })
      .def_property_readonly("bytes", [](const ArenaHandle& a) { return a.arena->bytes(); })
      .def_property_readonly(
          "backend", [](const ArenaHandle& a) { return a.arena->backend(); }, "'host' or 'cuda'.")
      .def_property_readonly(
          "created", [](const ArenaHandle& a) { return a.arena->created(); },
          "False when an existing arena of the tenant was opened.")
      .def_property_readonly(
          "mapped", [](const ArenaHandle& a) { return a.arena->mapped(); },
          "True when host memory is mapped here.")
      .def_property_readonly("fd", [](const ArenaHandle& a) { return a.arena->fd(); })
      .def_property_readonly(
          "memory_space", [](const ArenaHandle& a) { return memory_space(a.arena->memory()); },
          "'host' or 'device'.")
      .def_property_readonly(
          "device_ptr",
          [](const ArenaHandle& a) {
            return reinterpret_cast<std::uintptr_t>(a.arena->device_data());
          },
          "Device address when device memory is mapped here, else 0.")
      .def_property_readonly("has_codec", [](const ArenaHandle& a) { return a.arena->has_codec(); })
      .def_property_readonly(
          "codec",
          [](const ArenaHandle& a) {
            return std::make_shared<kernels::PageCodec>(a.arena->codec().layout());
          },
          "The arena's page format (a PageCodec).")
      .def(
          "page",
          [](const ArenaHandle& a, const py::object& slot) {
            const client::Arena& arena = *a.arena;
            const client::SlotId id = slot_in(arena, slot);
            if (arena.device_data() != nullptr) {
              std::byte* page = arena.device_page(id);
              return make_view(view_owner(a.arena), page, arena.page_bytes(), true,
                               arena.memory().device, py::none(), py::none(), 0);
            }
            const std::span<std::byte> page = arena.page(id);
            return make_view(view_owner(a.arena), page.data(), page.size(), false, -1, py::none(),
                             py::none(), 0);
          },
          py::arg("slot"), "A uint8 view of one page (a Slot or a slot id).")
      .def(
          "pages",
          [](const ArenaHandle& a) {
            const client::Arena& arena = *a.arena;
            py::object shape = py::make_tuple(arena.page_count(), arena.page_stride());
            if (arena.device_data() != nullptr) {
              return make_view(view_owner(a.arena), arena.device_data(), arena.bytes(), true,
                               arena.memory().device, py::none(), shape, 0);
            }
            if (!arena.mapped()) throw py::value_error("the arena is not mapped into this process");
            return make_view(view_owner(a.arena), arena.data().data(), arena.bytes(), false, -1,
                             py::none(), shape, 0);
          },
          "A uint8 view of the whole mapping, shape (page_count, page_stride).")
      .def(
          "decode",
          [](const ArenaHandle& a, const py::object& slot, const py::object& out, DType dtype,
             std::uintptr_t stream) {
            const std::shared_ptr<client::Arena> keep = a.arena;  // close() refuses meanwhile
            if (keep->device_data() != nullptr) {
              decode_on_device(keep, slot_in(*keep, slot), out, dtype, stream);
              return;
            }
            const std::span<std::byte> page = keep->page(slot_in(*keep, slot));
            const Borrowed staged(out, true, "out");
            ReleaseGil release;
            keep->codec().decode(page, dtype, staged.bytes());
          },
          py::arg("slot"), py::arg("out"), py::arg("dtype") = DType::f32, py::kw_only(),
          py::arg("stream") = 0, R"doc(
Decodes page ``slot`` here, with the daemon's codec code, into ``out``: the staged state,
codec.staged_bytes(dtype) bytes. A host arena decodes on the CPU into a C-contiguous host
buffer (numpy array, CPU tensor). A device arena (cuda backend, mapped here; a module built
with CUDA) decodes with the daemon's CUDA kernels into device memory on the arena's device (a
CUDA tensor, a device View: DLPack or __cuda_array_interface__) on CUDA stream ``stream`` (an
int handle such as torch.cuda.Stream.cuda_stream; 0 the legacy default stream) and returns
when it is done; DeviceDecoder decodes without waiting.)doc")
      .def(
          "close",
          [](ArenaHandle& a) {
            refuse_if_viewed(a.arena.use_count(), "arena mapping");
            *a.arena = client::Arena{};
          },
          "Unmaps the arena here (the daemon keeps it). BufferError while views are alive.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](ArenaHandle& a, const py::args& exc) {
             if (exception_pending(exc) && a.arena.use_count() > 1) return;  // as Staging.__exit__
             refuse_if_viewed(a.arena.use_count(), "arena mapping");
             *a.arena = client::Arena{};
           })
      .def("__repr__", [](const ArenaHandle& a) {
        return "<statepool.Arena id=" + std::to_string(a.arena->id()) +
               " pages=" + std::to_string(a.arena->page_count()) +
               " page_bytes=" + std::to_string(a.arena->page_bytes()) +
               " backend=" + a.arena->backend() + ">";
      });

  // --- the fused decode step --------------------------------------------------------------
  py::class_<kernels::StepResult>(m, "StepResult", "What one fused step could not store.")
      .def_readonly("rejected_heads", &kernels::StepResult::rejected_heads,
                    "Heads whose new state was not finite (their page bytes are unchanged).")
      .def_readonly("first_rejected_request", &kernels::StepResult::first_rejected_request,
                    "The batch index of the first rejected (request, head), when "
                    "rejected_heads > 0.")
      .def_readonly("first_rejected_head", &kernels::StepResult::first_rejected_head,
                    "The head of the first rejected (request, head), when rejected_heads > 0.")
      .def_property_readonly("ok", &kernels::StepResult::ok, "No head was rejected.")
      .def("__bool__", &kernels::StepResult::ok, "ok.");
  py::class_<DecodeStepHandle>(m, "DecodeStep", R"doc(
The fused gated-delta-rule step on an arena's pages, run here every token without the daemon
(docs/client.md, "The fused decode step"): one call advances one layer of a batch of requests
by one token, unpacking, updating and repacking each request's compressed page in place.
Host arenas only (the host backend). Keeps the arena mapped while it exists.)doc")
      .def(py::init([](const ArenaHandle& a, unsigned threads) {
             DecodeStepHandle h;
             h.arena = a.arena;
             h.step = std::make_unique<client::DecodeStep>(*a.arena,
                                                           client::DecodeStep::Options{threads});
             return h;
           }),
           py::arg("arena"), py::arg("threads") = 0,
           "``threads``: 0 = every core, 1 = the calling thread only. RuntimeError when the "
           "arena is not host memory mapped here, or was not opened from a registered layout.")
      .def_property_readonly(
          "threads", [](const DecodeStepHandle& h) { return h.step->threads(); },
          "Threads a call uses, the caller's included.")
      .def_property_readonly(
          "codec",
          [](const DecodeStepHandle& h) {
            return std::make_shared<kernels::PageCodec>(h.step->codec().layout());
          },
          "The arena's page format.")
      .def(
          "run",
          [](DecodeStepHandle& h, std::uint32_t layer, const std::vector<py::object>& slots,
             const py::object& q, const py::object& k, const py::object& v,
             const py::object& log_decay, const py::object& beta, const py::object& out,
             std::uint32_t qk_heads) {
            std::vector<client::SlotId> ids;
            ids.reserve(slots.size());
            for (const py::object& slot : slots) ids.push_back(slot_in(*h.arena, slot));
            const Borrowed bq(q, false, "q"), bk(k, false, "k"), bv(v, false, "v"),
                bg(log_decay, false, "log_decay"), bb(beta, false, "beta"), bo(out, true, "out");
            kernels::StepInputs in{static_cast<std::uint32_t>(ids.size()),
                                   qk_heads,
                                   floats(bq, "q"),
                                   floats(bk, "k"),
                                   floats(bv, "v"),
                                   floats(bg, "log_decay"),
                                   floats(bb, "beta"),
                                   floats(bo, "out")};
            ReleaseGil release;
            return h.step->run(layer, ids, in);
          },
          py::arg("layer"), py::arg("slots"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("log_decay"), py::arg("beta"), py::arg("out"), py::kw_only(),
          py::arg("qk_heads") = 0, R"doc(
One step of ``layer`` for the requests whose pages are ``slots`` (Slot objects or ids, in
batch order). float32 C-contiguous buffers (numpy arrays, CPU tensors): q and k
[batch][qk_heads][K] (L2-normalised, q scaled by 1/sqrt(K)), v [batch][H][V], log_decay
[batch][H] (GDN) or [batch][H][K] (KDA), beta [batch][H], out [batch][H][V] (written).
``qk_heads`` 0 means H. ValueError when a size does not fit (nothing written); a head whose
new state is not finite keeps its old bytes and is counted in the StepResult.)doc");

  // --- connection ------------------------------------------------------------------------
  py::class_<ConnectionHandle>(m, "Connection", R"doc(
One connection to statepoold, with its lease (statepool.connect()). Every method that talks to
the daemon releases the GIL; several threads may share one connection (its requests are
serialized). Daemon refusals raise a statepool.DaemonError subclass (QuotaExceeded, ...);
transport failures raise statepool.TransportError, after which the connection is unusable.)doc")
      .def_property_readonly("lease_token",
                             [](const ConnectionHandle& c) {
                               return call(c, [&](Connection& conn) { return conn.lease_token(); });
                             })
      .def_property_readonly("lease_resumed",
                             [](const ConnectionHandle& c) {
                               return call(c,
                                           [&](Connection& conn) { return conn.lease_resumed(); });
                             })
      .def_property_readonly("resumed_slots",
                             [](const ConnectionHandle& c) {
                               return call(c,
                                           [&](Connection& conn) { return conn.resumed_slots(); });
                             })
      .def_property_readonly(
          "grace_period",
          [](const ConnectionHandle& c) {
            return std::chrono::duration<double>(c.get()->grace_period()).count();
          },
          "Seconds the daemon keeps this lease's slots after the connection drops.")
      .def_property_readonly("protocol_version",
                             [](const ConnectionHandle& c) {
                               return call(
                                   c, [&](Connection& conn) { return conn.protocol_version(); });
                             })
      .def_property_readonly("server",
                             [](const ConnectionHandle& c) {
                               return call(c, [&](Connection& conn) { return conn.server(); });
                             })
      .def_property_readonly("max_frame_bytes",
                             [](const ConnectionHandle& c) {
                               return call(
                                   c, [&](Connection& conn) { return conn.max_frame_bytes(); });
                             })
      .def_property_readonly(
          "healthy",
          [](const ConnectionHandle& c) {
            return c.conn && call(c, [](Connection& conn) { return conn.healthy(); });
          },
          "False once the connection is broken (after a TransportError, or after the daemon "
          "answered protocol_error / not_hello / unsupported_version) or closed.")
      .def(
          "register_layout",
          [](const ConnectionHandle& c, const kernels::StateLayout& l) {
            return call(c, [&](Connection& conn) { return conn.register_layout(l); });
          },
          py::arg("layout"),
          "Registers (or finds) a layout; installs a stepquant layout's plan first if needed.")
      .def(
          "install_plan",
          [](const ConnectionHandle& c, const kernels::stepquant::Plan& p) {
            return call(c, [&](Connection& conn) { return conn.install_plan(p); });
          },
          py::arg("plan"), "Sends a STEPQuant plan (idempotent).")
      .def(
          "open_arena",
          [](const ConnectionHandle& c, const client::LayoutInfo& l, std::uint32_t pages) {
            return ArenaHandle{call(c, [&](Connection& conn) {
              return std::make_shared<client::Arena>(conn.open_arena(l, pages));
            })};
          },
          py::arg("layout"), py::arg("pages") = 0, R"doc(
Opens (or creates) an arena of the tenant for a layout with at least ``pages`` pages and maps
it; 0 takes any existing one or the daemon's default size.)doc")
      .def(
          "open_arena",
          [](const ConnectionHandle& c, client::LayoutId id, std::uint32_t pages) {
            return ArenaHandle{call(c, [&](Connection& conn) {
              return std::make_shared<client::Arena>(conn.open_arena(id, pages));
            })};
          },
          py::arg("layout_id"), py::arg("pages") = 0)
      .def(
          "close_arena",
          [](const ConnectionHandle& c, ArenaHandle& a) {
            refuse_if_viewed(a.arena.use_count(), "arena");
            static_cast<void>(c.get());  // a closed connection: TransportError, still mapped
            client::Arena closing = std::move(*a.arena);  // with the GIL: others read *a.arena
            return call(c, [&](Connection& conn) { return conn.close_arena(std::move(closing)); });
          },
          py::arg("arena"), R"doc(
Gives an arena's memory back to the daemon: its bytes leave the tenant's quota and the pool,
its unpinned snapshots are dropped, and its id is never used again (later calls naming it
raise NotFound). The arena is unmapped here first, whatever the daemon answers (after an
error it still exists in the daemon: retry by id, or open_arena() maps it again).
BufferError, before anything is sent, while views, a DecodeStep or a device decoder of it
are alive. InUse while a lease holds one of its pages (free every Slot first), while it
holds a pinned snapshot or one being read or published, or while another connection that
opened it is still connected.)doc")
      .def(
          "close_arena",
          [](const ConnectionHandle& c, client::ArenaId arena) {
            return call(c, [&](Connection& conn) { return conn.close_arena(arena); });
          },
          py::arg("arena_id"),
          "close_arena() by id, for an arena this process has not mapped (or has unmapped).")
      .def(
          "open_staging",
          [](const ConnectionHandle& c, std::uint64_t bytes) {
            return StagingHandle{call(c, [&](Connection& conn) {
              return std::make_shared<client::Staging>(conn.open_staging(bytes));
            })};
          },
          py::arg("bytes"), "Opens a staging buffer of at least ``bytes`` bytes.")
      .def(
          "allocate",
          [](const ConnectionHandle& c, const ArenaHandle& a, std::uint32_t count) {
            std::vector<client::Slot> slots =
                call(c, [&](Connection& conn) { return conn.allocate(*a.arena, count); });
            py::list out;
            for (auto& s : slots)
              out.append(
                  py::cast(new SlotHandle(std::move(s)), py::return_value_policy::take_ownership));
            return out;
          },
          py::arg("arena"), py::arg("count") = 1,
          "Allocates ``count`` slots of an arena, all or none (PoolExhausted when full).")
      .def(
          "allocate",
          [](const ConnectionHandle& c, client::ArenaId arena, std::uint32_t count) {
            std::vector<client::Slot> slots =
                call(c, [&](Connection& conn) { return conn.allocate(arena, count); });
            py::list out;
            for (auto& s : slots)
              out.append(
                  py::cast(new SlotHandle(std::move(s)), py::return_value_policy::take_ownership));
            return out;
          },
          py::arg("arena_id"), py::arg("count") = 1)
      .def(
          "adopt",
          [](const ConnectionHandle& c, client::ArenaId arena, client::SlotId slot) {
            return new SlotHandle(c.get()->adopt(arena, slot));  // sends nothing
          },
          py::arg("arena_id"), py::arg("slot_id"), py::return_value_policy::take_ownership,
          "Takes ownership of a slot this lease holds (released, or back with a resumed lease).")
      .def(
          "free",
          [](const ConnectionHandle& c, const std::vector<SlotHandle*>& slots) {
            std::vector<client::Slot> batch;
            batch.reserve(slots.size());
            for (SlotHandle* s : slots) {
              if (s != nullptr && s->slot.valid()) batch.push_back(std::move(s->slot));
            }
            return call(c, [&](Connection& conn) { return conn.free(batch); });
          },
          py::arg("slots"), "Frees Slot objects, one request per arena; returns how many.")
      .def(
          "free",
          [](const ConnectionHandle& c, client::ArenaId arena,
             const std::vector<client::SlotId>& ids) {
            return call(c, [&](Connection& conn) { return conn.free(arena, ids); });
          },
          py::arg("arena_id"), py::arg("slot_ids"), "Frees slot ids of one arena (released ones).")
      .def(
          "compress",
          [](const ConnectionHandle& c, const SlotHandle& s, const StagingHandle& st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const client::Slot& slot = slot_of(s);
            const client::Staging& staging = staging_of(st);
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.compress(slot, staging, offset, dtype, event);
            });
          },
          py::arg("slot"), py::arg("staging"), py::arg("offset") = 0, py::arg("dtype") = DType::f32,
          py::kw_only(), py::arg("after") = py::none(),
          R"doc(
page[slot] <- the state staged at staging[offset:]. Returns the page bytes written. NotFinite
(the page unchanged) when the state holds NaN or Inf. ``after`` (cuda backend): the 64-byte
IPC handle of an interprocess event recorded on the engine's stream after it wrote the state
(``torch.cuda.Event(interprocess=True)``, ``.record()``, ``.ipc_handle()``); the daemon's
stream waits for it. The same ``after`` exists on decompress, copy and their _async forms.)doc")
      .def(
          "compress",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId s, client::StagingId st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const auto event = after_event(after);
            return call(
                c, [&](Connection& conn) { return conn.compress(a, s, st, offset, dtype, event); });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none())
      .def(
          "decompress",
          [](const ConnectionHandle& c, const SlotHandle& s, const StagingHandle& st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const client::Slot& slot = slot_of(s);
            const client::Staging& staging = staging_of(st);
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.decompress(slot, staging, offset, dtype, event);
            });
          },
          py::arg("slot"), py::arg("staging"), py::arg("offset") = 0, py::arg("dtype") = DType::f32,
          py::kw_only(), py::arg("after") = py::none(),
          "staging[offset:] <- the state of page[slot]. Returns the state bytes written.")
      .def(
          "decompress",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId s, client::StagingId st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.decompress(a, s, st, offset, dtype, event);
            });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none())
      .def(
          "copy",
          [](const ConnectionHandle& c, const SlotHandle& src, const SlotHandle& dst,
             const py::object& after) {
            const client::Slot& from = slot_of(src);
            const client::Slot& to = slot_of(dst);
            const auto event = after_event(after);
            call(c, [&](Connection& conn) { conn.copy(from, to, event); });
          },
          py::arg("src"), py::arg("dst"), py::kw_only(), py::arg("after") = py::none(),
          "Copies a whole page (both slots of one arena).")
      .def(
          "copy",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId src, client::SlotId dst,
             const py::object& after) {
            const auto event = after_event(after);
            call(c, [&](Connection& conn) { conn.copy(a, src, dst, event); });
          },
          py::arg("arena_id"), py::arg("src_id"), py::arg("dst_id"), py::kw_only(),
          py::arg("after") = py::none())
      .def(
          "compress_async",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId s, client::StagingId st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.compress_async(a, s, st, offset, dtype, event);
            });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none(),
          "compress() without waiting for the device (cuda backend): see Pending.")
      .def(
          "decompress_async",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId s, client::StagingId st,
             std::uint64_t offset, DType dtype, const py::object& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.decompress_async(a, s, st, offset, dtype, event);
            });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none())
      .def(
          "copy_async",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId src, client::SlotId dst,
             const py::object& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) { return conn.copy_async(a, src, dst, event); });
          },
          py::arg("arena_id"), py::arg("src_id"), py::arg("dst_id"), py::kw_only(),
          py::arg("after") = py::none())
      .def(
          "stats",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.stats(); });
          },
          "The daemon's arenas, tenants, leases and pool.")
      .def(
          "plan_capacity",
          [](const ConnectionHandle& c, const std::string& model_config, std::uint32_t weight_bits,
             const std::string& kv, const std::vector<kernels::CodecId>& codecs,
             std::uint32_t slots, std::uint64_t context, std::uint64_t gpu_memory,
             std::optional<double> reserved, std::uint32_t tp,
             std::optional<std::uint64_t> concurrency) {
            client::PlanRequest r{model_config, weight_bits, kv,       codecs, slots,
                                  context,      gpu_memory,  reserved, tp,     concurrency};
            const std::string report =
                call(c, [&](Connection& conn) { return conn.plan_capacity(r); });
            return py::module_::import("json").attr("loads")(report);
          },
          py::arg("model_config"), py::kw_only(), py::arg("weight_bits") = 0, py::arg("kv") = "",
          py::arg("codecs") = std::vector<kernels::CodecId>{}, py::arg("slots") = 0,
          py::arg("context") = 0, py::arg("gpu_memory") = 0, py::arg("reserved") = py::none(),
          py::arg("tp") = 0, py::arg("concurrency") = py::none(), R"doc(
The daemon's capacity plan for a model (the text of its config.json), as the dict of
docs/capacity.md (what ``statepoolctl plan --json`` prints, plus "fits_now"). Zero/empty/None
arguments take the planner's defaults.)doc")
      .def(
          "put_snapshot",
          [](const ConnectionHandle& c, const SlotHandle& slot, const PrefixArg& prefix,
             std::uint64_t position, const std::optional<kernels::KvBlocks>& kv,
             const StagingHandle* kv_staging, std::uint64_t kv_offset, DType kv_dtype) {
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
             const std::optional<kernels::KvBlocks>& kv, const StagingHandle* kv_staging,
             std::uint64_t kv_offset, DType kv_dtype) {
            const std::optional<client::SnapshotKv> with =
                snapshot_kv(kv, kv_staging, kv_offset, kv_dtype);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(
                c, [&](Connection& conn) { return conn.put_snapshot(arena, slot, key, with); });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("prefix"), py::arg("position"),
          py::arg("kv") = py::none(), py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16)
      .def(
          "get_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             const SlotHandle& slot, const StagingHandle* kv_staging, std::uint64_t kv_offset,
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
             client::ArenaId arena, client::SlotId slot, const StagingHandle* kv_staging,
             std::uint64_t kv_offset, DType kv_dtype) {
            const std::optional<client::KvStaging> range =
                kv_range(kv_staging, kv_offset, kv_dtype);
            client::SnapshotKey key{prefix_bytes(prefix), position};
            return call(
                c, [&](Connection& conn) { return conn.get_snapshot(key, arena, slot, range); });
          },
          py::arg("prefix"), py::arg("position"), py::arg("arena_id"), py::arg("slot_id"),
          py::arg("kv_staging") = py::none(), py::arg("kv_offset") = 0,
          py::arg("kv_dtype") = DType::bf16)
      .def(
          "export_snapshot",
          [](const ConnectionHandle& c, const PrefixArg& prefix, std::uint64_t position,
             const StagingHandle* staging, std::uint64_t offset, const std::string& layout_digest) {
            if (staging == nullptr && offset != 0) {
              throw py::value_error("offset without staging: name the staging buffer");
            }
            const client::Staging* into = staging == nullptr ? nullptr : &staging_of(*staging);
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
          "``limit`` (0 = 1000).")
      .def(
          "fits_now",
          [](const ConnectionHandle& c, const client::LayoutInfo& l, std::uint32_t slots,
             const std::vector<kernels::CodecId>& codecs) {
            return call(c, [&](Connection& conn) { return conn.fits_now(l, slots, codecs); });
          },
          py::arg("layout"), py::arg("slots") = 1,
          py::arg("codecs") = std::vector<kernels::CodecId>{},
          "How many more requests of this state shape fit now, per codec.")
      .def(
          "ping",
          [](const ConnectionHandle& c) {
            return std::chrono::duration<double>(
                       call(c, [](Connection& conn) { return conn.ping(); }))
                .count();
          },
          "One round trip; returns its duration in seconds.")
      .def(
          "drain",
          [](const ConnectionHandle& c) { call(c, [](Connection& conn) { conn.drain(); }); },
          "Asks the daemon to drain and exit (the daemon's uid or root only).")
      .def("close", &ConnectionHandle::close, R"doc(
Closes the connection (slots and staging buffers still alive keep the socket open until they
go; a call in flight on another thread finishes first). Later calls raise
TransportError(kind='closed').)doc")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](ConnectionHandle& c, const py::args&) { c.close(); })
      .def("__repr__", [](const ConnectionHandle& c) {
        const bool healthy = c.conn && call(c, [](Connection& conn) { return conn.healthy(); });
        return std::string("<statepool.Connection ") + (healthy ? "healthy" : "closed") + ">";
      });

  auto make_options = [](std::string socket_path, std::string tenant, std::string lease_token,
                         std::string client_name, double timeout, std::uint32_t max_reply_bytes,
                         bool map_device_memory, bool legacy_ipc) {
    client::Options o;
    o.socket_path = std::move(socket_path);
    o.tenant = std::move(tenant);
    o.lease_token = std::move(lease_token);
    o.client_name = std::move(client_name);
    o.timeout = to_ms(timeout);
    o.max_reply_bytes = max_reply_bytes;
    o.map_device_memory = map_device_memory;
    o.legacy_ipc = legacy_ipc;
    return o;
  };
  m.def(
      "connect",
      [make_options](std::string socket_path, std::string tenant, std::string lease_token,
                     std::string client_name, double timeout, std::uint32_t max_reply_bytes,
                     bool map_device_memory, bool legacy_ipc) {
        client::Options o = make_options(std::move(socket_path), std::move(tenant),
                                         std::move(lease_token), std::move(client_name), timeout,
                                         max_reply_bytes, map_device_memory, legacy_ipc);
        ReleaseGil release;
        return ConnectionHandle{std::make_shared<Connection>(Connection::connect(o))};
      },
      py::arg("socket_path") = client::kDefaultSocketPath, py::kw_only(), py::arg("tenant") = "",
      py::arg("lease_token") = "", py::arg("client_name") = "", py::arg("timeout") = 10.0,
      py::arg("max_reply_bytes") = 16u << 20, py::arg("map_device_memory") = true,
      py::arg("legacy_ipc") = false, R"doc(
Connects to statepoold and says Hello. ``socket_path``: the daemon's Unix socket ('@name' for an
abstract one); ``tenant``: '' for the daemon's default; ``lease_token``: from an earlier
connection's lease_token, to get its slots back within the grace period; ``timeout``: seconds
each call may take (0 waits forever). TransportError when the daemon cannot be reached.)doc");
  m.def(
      "connect_fd",
      [make_options](int fd, std::string tenant, std::string lease_token, std::string client_name,
                     double timeout) {
        client::Options o = make_options("", std::move(tenant), std::move(lease_token),
                                         std::move(client_name), timeout, 16u << 20, true, false);
        ReleaseGil release;
        return ConnectionHandle{std::make_shared<Connection>(Connection::from_fd(fd, o))};
      },
      py::arg("fd"), py::kw_only(), py::arg("tenant") = "", py::arg("lease_token") = "",
      py::arg("client_name") = "", py::arg("timeout") = 10.0,
      "Says Hello on an already connected stream socket (e.g. socket.detach() of one end "
      "of a socketpair); the descriptor is owned from then on.");
}

}  // namespace statepool::python
