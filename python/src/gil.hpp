#pragma once
// Releasing the GIL around blocking work, safely at interpreter exit.
//
// When the interpreter finalizes, CPython 3.11 ends a (daemon) thread that waits to take
// the GIL back with pthread_exit, which unwinds the thread's stack. pybind11's
// gil_scoped_release re-takes the GIL in a noexcept destructor, so that unwinding aborts
// the whole process (an engine parking states from a background thread while the program
// exits). ReleaseGil's destructor lets it through (noexcept(false)); pybind11's dispatcher
// passes it on (abi::__forced_unwind) and the thread ends quietly.
//
// For the same reason nothing releases the GIL inside a destructor (a noexcept context):
// the Python objects' destructors that talk to the daemon (freeing a slot, closing a
// staging buffer) keep the GIL for that one short round trip on the local socket.

#include <pybind11/pybind11.h>

namespace statepool::python {

namespace py = pybind11;

/// RAII: releases the GIL if this thread holds it (a no-op otherwise) and re-takes it on
/// destruction. Usable as py::call_guard<ReleaseGil>. Never use it in a destructor.
class ReleaseGil {
 public:
  ReleaseGil() noexcept {
    if (PyGILState_Check() != 0) state_ = PyEval_SaveThread();
  }
  // noexcept(false): see above; the only "exception" is the thread's forced unwind.
  ~ReleaseGil() noexcept(false) {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

}  // namespace statepool::python
