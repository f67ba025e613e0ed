#pragma once
// Python types in the signatures pybind11 writes into docstrings (help(), and the stub
// python/generate_stub.py generates from them) for arguments and results the binding holds
// as plain Python objects, which pybind11 would show as `object`. pybind11 2.10 (Debian 12)
// has no py::typing; Typed<Caption> is a py::object that accepts anything, as py::object
// does, and whose signature shows Caption::text: a Python annotation in pybind11's own
// spelling (Union[...], Optional[...], List[...]), naming builtins, typing or the module's
// classes.

#include <utility>

#include <pybind11/pybind11.h>

namespace statepool::python {

namespace py = pybind11;

template <class Caption>
class Typed : public py::object {
 public:
  Typed() = default;
  Typed(py::handle h, borrowed_t) : py::object(h, borrowed_t{}) {}
  Typed(py::handle h, stolen_t) : py::object(h, stolen_t{}) {}
  // NOLINTNEXTLINE(google-explicit-constructor): converts like pybind11's own object types
  Typed(py::object o) : py::object(std::move(o)) {}
  static bool check_(py::handle h) { return h.ptr() != nullptr; }
};

namespace captions {
struct SlotOrId {
  static constexpr char text[] = "Union[Slot, int]";
};
struct IpcEvent {
  static constexpr char text[] = "Optional[bytes]";
};
struct Shape {
  static constexpr char text[] = "Union[int, Sequence[int], None]";
};
// builtins.bytes: in a class with a member called `bytes` (Pending), plain `bytes` would name
// the member in the stub.
struct BuiltinBytesOrNone {
  static constexpr char text[] = "Optional[builtins.bytes]";
};
struct Capsule {
  static constexpr char text[] = "typing.Any";
};
struct Json {
  static constexpr char text[] = "Dict[str, typing.Any]";
};
struct Dims {
  static constexpr char text[] = "Tuple[int, ...]";
};
}  // namespace captions

/// A page named by a Slot of the arena or by its id (slot_in(), handles.hpp).
using SlotOrId = Typed<captions::SlotOrId>;
/// `after`: None or the IPC handle of an interprocess CUDA event (after_event(), data.cpp).
using IpcEventArg = Typed<captions::IpcEvent>;
/// A view's shape: None (the rest of the buffer), a length, or dimensions (make_view()).
using ShapeArg = Typed<captions::Shape>;
/// bytes or None, in a class that has a member called `bytes`.
using BuiltinBytesOrNone = Typed<captions::BuiltinBytesOrNone>;
/// A DLPack capsule (View.__dlpack__; types.CapsuleType only exists from Python 3.13).
using Capsule = Typed<captions::Capsule>;
/// A parsed JSON object (json.loads of a dict).
using JsonObject = Typed<captions::Json>;
/// A tuple of ints of any length (a shape).
using Dims = Typed<captions::Dims>;

}  // namespace statepool::python

namespace pybind11::detail {

template <class Caption>
struct handle_type_name<statepool::python::Typed<Caption>> {
  static constexpr auto name = const_name(Caption::text);
};

}  // namespace pybind11::detail
