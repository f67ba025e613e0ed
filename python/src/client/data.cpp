// Data: Connection.compress(), decompress(), copy() and their _async forms, which return a
// Pending (service/handlers/data.cpp serves Compress, Decompress and Copy). bind_cuda.cpp
// adds Pending.synchronize() and wait().
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "typing.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;

BuiltinBytesOrNone pending_event(const client::Pending& p) {
  if (!p.event) return py::none();
  return py::bytes(reinterpret_cast<const char*>(p.event->data()), p.event->size());
}

/// The `after` argument: None, or the 64 bytes of an IPC event handle (bytes-like, as
/// torch.cuda.Event(interprocess=True).ipc_handle() returns). ValueError otherwise.
std::optional<client::IpcEventBytes> after_event(const IpcEventArg& after) {
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

}  // namespace

void bind_data(py::module_& m, ConnectionClass& connection) {
  py::class_<client::Pending>(m, "Pending", "An operation the daemon may still run on its device.")
      .def_readonly("bytes", &client::Pending::bytes,
                    "As compress() / decompress() return (0 for copy).")
      .def_property_readonly("event", &pending_event,
                             "The 64 bytes of a cudaIpcEventHandle_t that completes with the "
                             "work, or None when the work was done already (host backend).");

  connection
      .def(
          "compress",
          [](const ConnectionHandle& c, const SlotHandle& s, const StagingHandle& st,
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
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
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
            const auto event = after_event(after);
            return call(
                c, [&](Connection& conn) { return conn.compress(a, s, st, offset, dtype, event); });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none(),
          "compress() by ids: arena, slot and staging buffer.")
      .def(
          "decompress",
          [](const ConnectionHandle& c, const SlotHandle& s, const StagingHandle& st,
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
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
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.decompress(a, s, st, offset, dtype, event);
            });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none(),
          "decompress() by ids: arena, slot and staging buffer.")
      .def(
          "copy",
          [](const ConnectionHandle& c, const SlotHandle& src, const SlotHandle& dst,
             const IpcEventArg& after) {
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
             const IpcEventArg& after) {
            const auto event = after_event(after);
            call(c, [&](Connection& conn) { conn.copy(a, src, dst, event); });
          },
          py::arg("arena_id"), py::arg("src_id"), py::arg("dst_id"), py::kw_only(),
          py::arg("after") = py::none(), "copy() by ids: the arena and its two slots.")
      .def(
          "compress_async",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId s, client::StagingId st,
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
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
             std::uint64_t offset, DType dtype, const IpcEventArg& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) {
              return conn.decompress_async(a, s, st, offset, dtype, event);
            });
          },
          py::arg("arena_id"), py::arg("slot_id"), py::arg("staging_id"), py::arg("offset") = 0,
          py::arg("dtype") = DType::f32, py::kw_only(), py::arg("after") = py::none(),
          "decompress() without waiting for the device (cuda backend): see Pending.")
      .def(
          "copy_async",
          [](const ConnectionHandle& c, client::ArenaId a, client::SlotId src, client::SlotId dst,
             const IpcEventArg& after) {
            const auto event = after_event(after);
            return call(c, [&](Connection& conn) { return conn.copy_async(a, src, dst, event); });
          },
          py::arg("arena_id"), py::arg("src_id"), py::arg("dst_id"), py::kw_only(),
          py::arg("after") = py::none(),
          "copy() without waiting for the device (cuda backend): see Pending.");
}

}  // namespace statepool::python
