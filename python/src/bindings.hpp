#pragma once
// The pieces of statepool._core, one function per source file (module.cpp calls the first
// three; bind_client.cpp the client's, in client/).

#include <pybind11/pybind11.h>

#include <cstdint>

#include "statepool/kernels/fused_step.hpp"

namespace statepool::python {

namespace py = pybind11;

/// Enums, StateLayout, Plan, PageCodec (bind_kernels.cpp).
void bind_kernels(py::module_& m);
/// connect(), Connection, Arena, Staging, Slot and the result types (bind_client.cpp: the
/// pieces below, by concern, as service/handlers/ serves the requests).
void bind_client(py::module_& m);
/// HAVE_CUDA, Pending.synchronize()/wait(), DeviceDecoder, DeviceDecodeStep (bind_cuda.cpp;
/// after bind_client, whose Pending it extends).
void bind_cuda(py::module_& m);

// --- the client, by concern (python/src/client/) ---------------------------------------------

struct ConnectionHandle;  // handles.hpp
/// statepool.Connection: bind_session creates it, the other concerns add their methods.
using ConnectionClass = py::class_<ConnectionHandle>;

/// DEFAULT_SOCKET_PATH, connect(), connect_fd(), the Connection class with its lease, health,
/// ping(), drain(), stats() (Stats, ArenaStats, TenantStats) and close() (session.cpp).
ConnectionClass bind_session(py::module_& m);
/// LayoutInfo, PlanInfo; register_layout(), install_plan() (layouts.cpp).
void bind_layouts(py::module_& m, ConnectionClass& connection);
/// ArenaClose, Slot, Staging, Arena; open_arena(), close_arena(), open_staging(), allocate(),
/// adopt(), free() (memory.cpp).
void bind_memory(py::module_& m, ConnectionClass& connection);
/// Pending; compress(), decompress(), copy() and their _async forms (data.cpp).
void bind_data(py::module_& m, ConnectionClass& connection);
/// StepMode, StepResult, DecodeStep: the fused decode step on a host arena (decode_step.cpp).
void bind_decode_step(py::module_& m);
/// The StepPolicy of a run()'s mode and full_every arguments (decode_step.cpp; the device
/// step's binding uses it too).
kernels::StepPolicy step_policy(kernels::StepMode mode, std::uint32_t full_every);
/// KvBlocks, the Snapshot* results; put_snapshot(), get_snapshot(), export/import,
/// delete, pin and list (snapshots.cpp).
void bind_snapshots(py::module_& m, ConnectionClass& connection);
/// Protocol version 2: register_memory(), lookup/put/get_snapshots(); StateRange, KvRange,
/// the batch entries and results (snapshot_batches.cpp).
void bind_snapshot_batches(py::module_& m, ConnectionClass& connection);
/// CodecFit, Fits; plan_capacity(), fits_now() (capacity.cpp).
void bind_capacity(py::module_& m, ConnectionClass& connection);

}  // namespace statepool::python
