#pragma once
// The C++ owners behind statepool.Connection, Arena, Slot and Staging, shared by the client's
// bindings (client/*.cpp, which register them and add their methods) and bind_cuda.cpp (whose
// device decoder and step hold arenas too).
//
// The Python objects own their C++ counterparts through these handles. Views share the
// staging/arena object (shared_ptr), so close() can tell whether any are alive.
// Destruction (which talks to the daemon for slots and staging) keeps the GIL (gil.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "gil.hpp"
#include "statepool/client.hpp"

namespace statepool::python {

namespace py = pybind11;

/// BufferError naming `what` when views of it (beyond the owner's own reference) are alive.
inline void refuse_if_viewed(long use_count, const char* what) {
  if (use_count > 1) {
    throw py::buffer_error(std::string("cannot close the ") + what + ": " +
                           std::to_string(use_count - 1) +
                           " view(s) of it (or arrays/tensors made from them) are alive");
  }
}

/// statepool.Connection. Calls take their own reference to the connection (with the GIL held)
/// before they release the GIL (call()), so close() on another thread only drops the handle's
/// reference: a call in flight finishes on a live connection, and later calls find none
/// (TransportError 'closed').
struct ConnectionHandle {
  std::shared_ptr<client::Connection> conn;
  /// Needs the GIL.
  [[nodiscard]] std::shared_ptr<client::Connection> get() const {
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
  const std::shared_ptr<client::Connection> conn = c.get();
  ReleaseGil release;
  return f(*conn);
}

/// statepool.Staging.
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

/// The staging buffer of a Staging object; ValueError once it is closed.
inline const client::Staging& staging_of(const StagingHandle& s) {
  if (!s.staging || !s.staging->valid()) throw py::value_error("the staging buffer is closed");
  return *s.staging;
}

/// An optional Staging argument, None by default (``Optional[Staging]`` in signatures; needs
/// pybind11/stl.h). No copy of the handle: close() on it still sees only its own views.
using OptionalStaging = std::optional<std::reference_wrapper<const StagingHandle>>;

/// statepool.Arena. Views, DecodeStep, DeviceDecoder and DeviceDecodeStep share the arena
/// object, so Arena.close() can refuse while any of them is alive (use_count).
struct ArenaHandle {
  std::shared_ptr<client::Arena> arena;
};

/// statepool.Slot.
struct SlotHandle {
  client::Slot slot;
  explicit SlotHandle(client::Slot s) : slot(std::move(s)) {}
  SlotHandle(const SlotHandle&) = delete;
  SlotHandle& operator=(const SlotHandle&) = delete;
  ~SlotHandle() = default;  // frees the slot (with the GIL: gil.hpp)
};

/// The slot of a Slot object; ValueError once it was freed, released or closed.
inline const client::Slot& slot_of(const SlotHandle& s) {
  if (!s.slot.valid()) throw py::value_error("the slot was freed, released or closed");
  return s.slot;
}

/// The id of a page of `arena` an argument names: a Slot of that arena, or an id.
inline client::SlotId slot_in(const client::Arena& arena, const py::handle& slot) {
  if (!py::isinstance<SlotHandle>(slot)) return slot.cast<client::SlotId>();
  const client::Slot& s = slot_of(slot.cast<const SlotHandle&>());
  if (s.arena_id() != arena.id()) {
    throw py::value_error("slot " + std::to_string(s.id()) + " is a slot of arena " +
                          std::to_string(s.arena_id()) + ", not of arena " +
                          std::to_string(arena.id()));
  }
  return s.id();
}

/// Arena.decode() on an arena in device memory (bind_cuda.cpp): page `slot` -> `out` (device
/// memory on the arena's device, the staged state's bytes in `dtype`), on CUDA stream
/// `stream` (0: the legacy default stream), waiting until it is done. Needs the GIL (it
/// releases it while the device works). RuntimeError in a module built without CUDA.
void decode_on_device(const std::shared_ptr<client::Arena>& arena, client::SlotId slot,
                      const py::object& out, kernels::DType dtype, std::uintptr_t stream);

}  // namespace statepool::python
