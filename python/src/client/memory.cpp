// Memory: arenas, slots and staging buffers. Connection.open_arena(), close_arena(),
// open_staging(), allocate(), adopt() and free() (service/handlers/memory.cpp serves them),
// and the objects they return: Arena, Slot, Staging (with zero-copy views, views.hpp) and
// ArenaClose.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/page.hpp"
#include "typing.hpp"
#include "views.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;
using release_gil = py::call_guard<ReleaseGil>;

// A view's owner: destroying the last one may close a staging buffer on the daemon.
template <class T>
std::shared_ptr<const void> view_owner(const std::shared_ptr<T>& object) {
  return {object.get(), [keep = object](const void*) mutable { keep.reset(); }};
}

// __exit__(type, value, traceback): true when the with block raised.
bool exception_pending(const py::args& exc) {
  return exc.size() > 0 && !exc[0].is_none();
}

/// allocate()'s Slot objects (a list[Slot]; Python owns each).
std::vector<std::unique_ptr<SlotHandle>> slot_objects(std::vector<client::Slot> slots) {
  std::vector<std::unique_ptr<SlotHandle>> out;
  out.reserve(slots.size());
  for (client::Slot& s : slots) out.push_back(std::make_unique<SlotHandle>(std::move(s)));
  return out;
}

std::string memory_space(const kernels::MemoryDescriptor& m) {
  return kernels::to_string(m.space);
}

}  // namespace

void bind_memory(py::module_& m, ConnectionClass& connection) {
  py::class_<client::ArenaClose>(m, "ArenaClose", "What close_arena() gave back.")
      .def_readonly("bytes", &client::ArenaClose::bytes,
                    "The arena's bytes, charged to no quota any more.")
      .def_readonly("snapshots_dropped", &client::ArenaClose::snapshots_dropped,
                    "Its unpinned snapshots, evicted from the pool.")
      .def(
          "__repr__",
          [](const client::ArenaClose& c) {
            return "ArenaClose(bytes=" + std::to_string(c.bytes) +
                   ", snapshots_dropped=" + std::to_string(c.snapshots_dropped) + ")";
          },
          "ArenaClose(bytes=..., snapshots_dropped=...).");

  // --- slots -----------------------------------------------------------------------------
  py::class_<SlotHandle>(m, "Slot", R"doc(
One allocated page of an arena, owned by this connection's lease. Freed on the daemon when
the object is garbage-collected, when a ``with`` block ends, or by free(); release() keeps it
allocated (to adopt it again after a reconnect with the lease token).)doc")
      .def_property_readonly(
          "id", [](const SlotHandle& s) { return s.slot.id(); },
          "The slot id (the page's index in its arena).")
      .def_property_readonly(
          "arena_id", [](const SlotHandle& s) { return s.slot.arena_id(); }, "The arena's id.")
      .def_property_readonly(
          "valid", [](const SlotHandle& s) { return s.slot.valid(); },
          "False once freed or released.")
      .def(
          "release", [](SlotHandle& s) { return s.slot.release(); },
          "Gives up ownership without freeing; returns the slot id.")
      .def(
          "free", [](SlotHandle& s) { s.slot.free(); }, release_gil(),
          "Frees the slot on the daemon now.")
      .def(
          "__enter__", [](SlotHandle& self) -> SlotHandle& { return self; },
          py::return_value_policy::reference, "The slot itself.")
      .def(
          "__exit__",
          [](SlotHandle& s, const py::args&) {
            if (s.slot.valid()) {
              ReleaseGil release;
              s.slot.free();
            }
          },
          "Frees the slot unless it was freed or released already.")
      .def(
          "__repr__",
          [](const SlotHandle& s) {
            return "<statepool.Slot arena=" + std::to_string(s.slot.arena_id()) +
                   " id=" + std::to_string(s.slot.id()) + (s.slot.valid() ? "" : " (invalid)") +
                   ">";
          },
          "'<statepool.Slot arena=... id=...>'.");

  // --- staging ---------------------------------------------------------------------------
  py::class_<StagingHandle>(m, "Staging", R"doc(
A staging buffer shared with the daemon: full-precision states are written here before
compress() and read from here after decompress(). view() gives zero-copy numpy/PyTorch access.
Closed on the daemon when garbage-collected, when a ``with`` block ends, or by close().)doc")
      .def_property_readonly(
          "id", [](const StagingHandle& s) { return s.staging->id(); },
          "The daemon's id of the buffer.")
      .def_property_readonly(
          "size", [](const StagingHandle& s) { return s.staging->size(); },
          "Bytes (at least what was asked for).")
      .def_property_readonly(
          "fd", [](const StagingHandle& s) { return s.staging->fd(); },
          "The received descriptor (owned by the buffer; dup() it to keep it longer).")
      .def_property_readonly(
          "valid", [](const StagingHandle& s) { return s.staging->valid(); }, "False once closed.")
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
          [](const StagingHandle& s, const py::object& dtype, const ShapeArg& shape,
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
      .def(
          "__enter__", [](StagingHandle& self) -> StagingHandle& { return self; },
          py::return_value_policy::reference, "The buffer itself.")
      .def(
          "__exit__",
          [](StagingHandle& s, const py::args& exc) {
            // With an exception on its way, views may be alive in its frames: leave the
            // buffer to garbage collection rather than hide the exception behind BufferError.
            if (exception_pending(exc) && s.staging.use_count() > 1) return;
            s.close();
          },
          "close() unless closed already (BufferError while views of it are alive).")
      .def(
          "__repr__",
          [](const StagingHandle& s) {
            return "<statepool.Staging id=" + std::to_string(s.staging->id()) +
                   " size=" + std::to_string(s.staging->size()) +
                   (s.staging->valid() ? "" : " (closed)") + ">";
          },
          "'<statepool.Staging id=... size=...>'.");

  // --- arenas ----------------------------------------------------------------------------
  py::class_<ArenaHandle>(m, "Arena", R"doc(
A mapped arena: page_count pages of page_bytes each, page_stride apart. Owns the received
descriptor and the mapping (close() or the end of a ``with`` block unmaps it locally; arenas
live on in the daemon). page(slot) views one page; decode(slot, out) decodes it here.)doc")
      .def_property_readonly(
          "id", [](const ArenaHandle& a) { return a.arena->id(); }, "The arena's id.")
      .def_property_readonly(
          "layout_id", [](const ArenaHandle& a) { return a.arena->layout_id(); },
          "The id of its layout.")
      .def_property_readonly(
          "page_bytes", [](const ArenaHandle& a) { return a.arena->page_bytes(); },
          "Exact bytes of one page.")
      .def_property_readonly(
          "page_stride", [](const ArenaHandle& a) { return a.arena->page_stride(); },
          "Bytes from one page to the next.")
      .def_property_readonly(
          "page_count", [](const ArenaHandle& a) { return a.arena->page_count(); },
          "Pages in the arena.")
      .def_property_readonly(
          "bytes", [](const ArenaHandle& a) { return a.arena->bytes(); },
          "Size of the whole region, page_count * page_stride.")
      .def_property_readonly(
          "backend", [](const ArenaHandle& a) { return a.arena->backend(); }, "'host' or 'cuda'.")
      .def_property_readonly(
          "created", [](const ArenaHandle& a) { return a.arena->created(); },
          "False when an existing arena of the tenant was opened.")
      .def_property_readonly(
          "mapped", [](const ArenaHandle& a) { return a.arena->mapped(); },
          "True when host memory is mapped here.")
      .def_property_readonly(
          "fd", [](const ArenaHandle& a) { return a.arena->fd(); },
          "The received descriptor (owned by the arena; dup() it to keep it longer); -1 when the "
          "handle kind is not a descriptor.")
      .def_property_readonly(
          "memory_space", [](const ArenaHandle& a) { return memory_space(a.arena->memory()); },
          "'host' or 'device'.")
      .def_property_readonly(
          "device_ptr",
          [](const ArenaHandle& a) {
            return reinterpret_cast<std::uintptr_t>(a.arena->device_data());
          },
          "Device address when device memory is mapped here, else 0.")
      .def_property_readonly(
          "has_codec", [](const ArenaHandle& a) { return a.arena->has_codec(); },
          "True when a PageCodec for the layout is available (the layout was registered through "
          "the same Connection, or the arena was opened from a LayoutInfo).")
      .def_property_readonly(
          "codec",
          [](const ArenaHandle& a) {
            return std::make_shared<kernels::PageCodec>(a.arena->codec().layout());
          },
          "The arena's page format (a PageCodec).")
      .def(
          "page",
          [](const ArenaHandle& a, const SlotOrId& slot) {
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
          [](const ArenaHandle& a, const SlotOrId& slot, const py::object& out, DType dtype,
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
      .def(
          "__enter__", [](ArenaHandle& self) -> ArenaHandle& { return self; },
          py::return_value_policy::reference, "The arena itself.")
      .def(
          "__exit__",
          [](ArenaHandle& a, const py::args& exc) {
            if (exception_pending(exc) && a.arena.use_count() > 1) return;  // as Staging.__exit__
            refuse_if_viewed(a.arena.use_count(), "arena mapping");
            *a.arena = client::Arena{};
          },
          "Unmaps the arena here (BufferError while views are alive).")
      .def(
          "__repr__",
          [](const ArenaHandle& a) {
            return "<statepool.Arena id=" + std::to_string(a.arena->id()) +
                   " pages=" + std::to_string(a.arena->page_count()) +
                   " page_bytes=" + std::to_string(a.arena->page_bytes()) +
                   " backend=" + a.arena->backend() + ">";
          },
          "'<statepool.Arena id=... pages=... page_bytes=... backend=...>'.");

  connection
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
          py::arg("layout_id"), py::arg("pages") = 0,
          "open_arena() by the id of a registered layout.")
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
            return slot_objects(
                call(c, [&](Connection& conn) { return conn.allocate(*a.arena, count); }));
          },
          py::arg("arena"), py::arg("count") = 1,
          "Allocates ``count`` slots of an arena, all or none (PoolExhausted when full).")
      .def(
          "allocate",
          [](const ConnectionHandle& c, client::ArenaId arena, std::uint32_t count) {
            return slot_objects(
                call(c, [&](Connection& conn) { return conn.allocate(arena, count); }));
          },
          py::arg("arena_id"), py::arg("count") = 1,
          "allocate() by the arena's id (an arena this process has not opened: the slots are used "
          "by id).")
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
          py::arg("arena_id"), py::arg("slot_ids"), "Frees slot ids of one arena (released ones).");
}

}  // namespace statepool::python
