// Session: statepool.connect(), connect_fd() and the Connection class itself (lease, health,
// ping, drain, stats, close), as service/handlers/session.cpp serves Hello, Ping, Drain and
// Stats. The other concerns add their methods to the class (bindings.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"

namespace statepool::python {

namespace {

using client::Connection;

// A timeout in seconds: 0, negative or inf wait forever (the client's 0); otherwise at
// least 1 ms, so that a small timeout never becomes "forever".
std::chrono::milliseconds to_ms(double seconds) {
  if (std::isnan(seconds)) throw py::value_error("timeout must be a number of seconds, not nan");
  if (seconds <= 0 || std::isinf(seconds) || seconds > 1e12) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(seconds * 1000.0))));
}

}  // namespace

ConnectionClass bind_session(py::module_& m) {
  m.attr("DEFAULT_SOCKET_PATH") = client::kDefaultSocketPath;

  // --- what stats() returns ----------------------------------------------------------------
  py::class_<client::ArenaStats>(m, "ArenaStats", "One arena in stats().")
      .def_readonly("arena_id", &client::ArenaStats::arena_id, "The arena's id.")
      .def_readonly("tenant", &client::ArenaStats::tenant, "The tenant that owns it.")
      .def_readonly("layout_id", &client::ArenaStats::layout_id, "The id of its layout.")
      .def_readonly("layout_name", &client::ArenaStats::layout_name, "The name of its layout.")
      .def_readonly("codec", &client::ArenaStats::codec, "The codec of its pages.")
      .def_readonly("backend", &client::ArenaStats::backend, "'host' or 'cuda'.")
      .def_readonly("page_bytes", &client::ArenaStats::page_bytes, "Exact bytes of one page.")
      .def_readonly("page_stride", &client::ArenaStats::page_stride,
                    "Bytes one page takes in the arena.")
      .def_readonly("pages_total", &client::ArenaStats::pages_total, "Pages in the arena.")
      .def_readonly("pages_used", &client::ArenaStats::pages_used, "Pages allocated.")
      .def_readonly("bytes_total", &client::ArenaStats::bytes_total,
                    "Mapping size, page_count * page_stride.")
      .def_readonly("fp32_bytes_used", &client::ArenaStats::fp32_bytes_used,
                    "FP32-equivalent bytes of the used pages.")
      .def_readonly("snapshot_pages", &client::ArenaStats::snapshot_pages,
                    "Of pages_used, those holding prefix-state snapshots.")
      .def_property_readonly("stored_bytes_used", &client::ArenaStats::stored_bytes_used,
                             "Page bytes of the used pages.")
      .def_property_readonly("compression_ratio", &client::ArenaStats::compression_ratio,
                             "fp32_bytes_used / stored_bytes_used (0 when no page is used).");
  py::class_<client::TenantStats>(m, "TenantStats", "One tenant in stats().")
      .def_readonly("tenant", &client::TenantStats::tenant, "The tenant's name.")
      .def_readonly("quota_bytes", &client::TenantStats::quota_bytes, "0 = unlimited.")
      .def_readonly("reserved_bytes", &client::TenantStats::reserved_bytes,
                    "Arena bytes held (counted against the quota).")
      .def_readonly("pages_used", &client::TenantStats::pages_used, "Pages used in its arenas.")
      .def_readonly("stored_bytes", &client::TenantStats::stored_bytes,
                    "Page bytes of the used pages.")
      .def_readonly("fp32_bytes", &client::TenantStats::fp32_bytes,
                    "FP32-equivalent bytes of the used pages.")
      .def_readonly("snapshots", &client::TenantStats::snapshots,
                    "Prefix-state snapshots it published.")
      .def_readonly("snapshot_bytes", &client::TenantStats::snapshot_bytes,
                    "Page bytes of those snapshots.")
      .def_readonly("pinned_snapshots", &client::TenantStats::pinned_snapshots,
                    "Pinned snapshots it published.")
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
      .def_property_readonly("compression_ratio", &client::TenantStats::compression_ratio,
                             "fp32_bytes / stored_bytes (0 when nothing is stored).");
  py::class_<client::Stats>(m, "Stats", "The daemon's state (the Stats request).")
      .def_readonly("arenas", &client::Stats::arenas, "Every arena.")
      .def_readonly("tenants", &client::Stats::tenants, "Every tenant.")
      .def_readonly("clients_connected", &client::Stats::clients_connected, "Connections open now.")
      .def_readonly("leases_active", &client::Stats::leases_active,
                    "Leases held by a live connection.")
      .def_readonly("leases_orphaned", &client::Stats::leases_orphaned,
                    "Leases whose connection dropped, waiting for the grace period.")
      .def_readonly("pages_reclaimed_total", &client::Stats::pages_reclaimed_total,
                    "Pages freed by grace-period expiry since start.")
      .def_readonly("pool_capacity_bytes", &client::Stats::pool_capacity_bytes,
                    "Bytes of the pool.")
      .def_readonly("pool_reserved_bytes", &client::Stats::pool_reserved_bytes,
                    "Bytes of the pool held by arenas.")
      .def_readonly("uptime_seconds", &client::Stats::uptime_seconds,
                    "Seconds since the daemon started.")
      .def_readonly("generation", &client::Stats::generation,
                    "Hand-overs since the pool was created: 0 for a daemon that started "
                    "fresh, its predecessor's + 1 for one that took the pool over.");

  // --- connection ------------------------------------------------------------------------
  ConnectionClass connection(m, "Connection", R"doc(
One connection to statepoold, with its lease (statepool.connect()). Every method that talks to
the daemon releases the GIL; several threads may share one connection (its requests are
serialized). Daemon refusals raise a statepool.DaemonError subclass (QuotaExceeded, ...);
transport failures raise statepool.TransportError, after which the connection is unusable.)doc");
  connection
      .def_property_readonly(
          "lease_token",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.lease_token(); });
          },
          "The lease's token: connect(lease_token=...) gets its slots back within the grace "
          "period.")
      .def_property_readonly(
          "lease_resumed",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.lease_resumed(); });
          },
          "True when connect()'s lease_token named a lease still within its grace period.")
      .def_property_readonly(
          "resumed_slots",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.resumed_slots(); });
          },
          "Slots that came back with a resumed lease (take them over with adopt()).")
      .def_property_readonly(
          "grace_period",
          [](const ConnectionHandle& c) {
            return std::chrono::duration<double>(c.get()->grace_period()).count();
          },
          "Seconds the daemon keeps this lease's slots after the connection drops.")
      .def_property_readonly(
          "protocol_version",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.protocol_version(); });
          },
          "The protocol version agreed on in Hello.")
      .def_property_readonly(
          "server",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.server(); });
          },
          "Daemon name and version.")
      .def_property_readonly(
          "max_frame_bytes",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.max_frame_bytes(); });
          },
          "Largest frame the daemon accepts, in bytes.")
      .def_property_readonly(
          "healthy",
          [](const ConnectionHandle& c) {
            return c.conn && call(c, [](Connection& conn) { return conn.healthy(); });
          },
          "False once the connection is broken (after a TransportError, or after the daemon "
          "answered protocol_error / not_hello / unsupported_version) or closed.")
      .def(
          "stats",
          [](const ConnectionHandle& c) {
            return call(c, [&](Connection& conn) { return conn.stats(); });
          },
          "The daemon's arenas, tenants, leases and pool.")
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
      .def(
          "__enter__", [](ConnectionHandle& self) -> ConnectionHandle& { return self; },
          py::return_value_policy::reference, "The connection itself.")
      .def(
          "__exit__", [](ConnectionHandle& c, const py::args&) { c.close(); }, "close().")
      .def(
          "__repr__",
          [](const ConnectionHandle& c) {
            const bool healthy = c.conn && call(c, [](Connection& conn) { return conn.healthy(); });
            return std::string("<statepool.Connection ") + (healthy ? "healthy" : "closed") + ">";
          },
          "'<statepool.Connection healthy>' or '<statepool.Connection closed>'.");

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
  return connection;
}

}  // namespace statepool::python
