// statepool.connect() and the objects of a connection. Every call that talks to the daemon
// releases the GIL, so Python threads may share one Connection (the C++ client serializes
// its requests) and other threads run while a call waits.
//
// The binding is split by concern in client/, as service/handlers/ is (bindings.hpp):
//
//   session.cpp      connect(), connect_fd(), Connection (lease, ping, drain, stats, close)
//   layouts.cpp      register_layout(), install_plan(); LayoutInfo, PlanInfo
//   memory.cpp       open_arena(), close_arena(), open_staging(), allocate(), adopt(), free();
//                    Arena, Slot, Staging, ArenaClose
//   data.cpp         compress(), decompress(), copy() and their _async forms; Pending
//   decode_step.cpp  DecodeStep, StepResult (the fused step, without the daemon)
//   snapshots.cpp    put/get/export/import/delete/pin/list_snapshot(s); KvBlocks, Snapshot*
//   snapshot_batches.cpp  register_memory(), lookup/put/get_snapshots() (protocol version 2);
//                    StateRange, KvRange, SnapshotPutEntry, SnapshotGetEntry, their results
//   capacity.cpp     plan_capacity(), fits_now(); Fits, CodecFit
//
// Each registers its classes before the methods that take or return them, so that
// pybind11's signatures name the Python classes.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "handles.hpp"

namespace statepool::python {

void bind_client(py::module_& m) {
  ConnectionClass connection = bind_session(m);
  bind_layouts(m, connection);
  bind_memory(m, connection);
  bind_data(m, connection);
  bind_decode_step(m);
  bind_snapshots(m, connection);
  bind_snapshot_batches(m, connection);
  bind_capacity(m, connection);
}

}  // namespace statepool::python
