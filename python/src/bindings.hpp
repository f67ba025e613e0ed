#pragma once
// The pieces of statepool._core, one function per source file (module.cpp calls them).

#include <pybind11/pybind11.h>

namespace statepool::python {

namespace py = pybind11;

/// Enums, StateLayout, Plan, PageCodec (bind_kernels.cpp).
void bind_kernels(py::module_& m);
/// connect(), Connection, Arena, Staging, Slot and the result types (bind_client.cpp).
void bind_client(py::module_& m);
/// HAVE_CUDA, Pending.synchronize()/wait(), DeviceDecoder, DeviceDecodeStep (bind_cuda.cpp;
/// after bind_client, whose Pending it extends).
void bind_cuda(py::module_& m);

}  // namespace statepool::python
