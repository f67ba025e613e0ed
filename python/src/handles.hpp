#pragma once
// The C++ owners behind statepool.Arena and statepool.Slot, shared by bind_client.cpp (which
// registers them) and bind_cuda.cpp (whose device decoder and step hold arenas too).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "statepool/client.hpp"

namespace statepool::python {

namespace py = pybind11;

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
