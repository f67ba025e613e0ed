// statepool._core: the C++ client library for Python. The package statepool/ re-exports it
// with the exception classes (statepool/errors.py) and the engine adapter.
#include <exception>
#include <string>

#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/codec.hpp"
#include "views.hpp"

namespace statepool::python {
namespace {

// Raises the statepool.errors class for `status` (TransportError when `kind` is given).
void raise(Status status, const char* message, const char* kind = nullptr) {
  py::object errors = py::module_::import("statepool.errors");
  py::object kind_name = py::none();
  if (kind != nullptr) kind_name = py::str(kind);
  py::object exc = errors.attr("_make")(status, message, kind_name);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

void translate(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const client::ConnectionError& e) {
    raise(e.status(), e.what(), client::to_string(e.kind()));
  } catch (const StatusError& e) {  // client::Error and the kernels' own
    raise(e.status(), e.what());
  } catch (const kernels::NonFiniteError& e) {
    raise(Status::not_finite, e.what());
  }
}

}  // namespace
}  // namespace statepool::python

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  using namespace statepool::python;
  m.doc() = "statepool's C++ client library (use the statepool package, which re-exports it)";
  py::enum_<statepool::Status>(m, "Status", "Reply status of the daemon (protocol/statepool.fbs).")
      .value("ok", statepool::Status::ok, "Success.")
      .value("invalid_argument", statepool::Status::invalid_argument,
             "A field is out of range or inconsistent (statepool.InvalidArgument).")
      .value("not_found", statepool::Status::not_found,
             "Unknown layout, arena, staging buffer or plan (statepool.NotFound).")
      .value("quota_exceeded", statepool::Status::quota_exceeded,
             "A per-tenant or per-connection limit would be exceeded (statepool.QuotaExceeded).")
      .value("pool_exhausted", statepool::Status::pool_exhausted,
             "No capacity left: the pool, the arena's free pages, or the staging capacity "
             "(statepool.PoolExhausted).")
      .value("not_owner", statepool::Status::not_owner,
             "The slot is allocated to another lease (statepool.NotOwner).")
      .value("unsupported_version", statepool::Status::unsupported_version,
             "No common protocol version (statepool.UnsupportedVersion).")
      .value("protocol_error", statepool::Status::protocol_error,
             "The daemon found a malformed frame or message (statepool.ProtocolError).")
      .value("lease_busy", statepool::Status::lease_busy,
             "The lease token is held by another live connection (statepool.LeaseBusy).")
      .value("unknown_tenant", statepool::Status::unknown_tenant,
             "The tenant is not configured in the daemon (statepool.UnknownTenant).")
      .value("permission_denied", statepool::Status::permission_denied,
             "Not allowed: peer uid, tenant, another tenant's arena, or Drain by a non-operator "
             "(statepool.PermissionDenied).")
      .value("draining", statepool::Status::draining,
             "The daemon is draining (statepool.Draining).")
      .value("not_finite", statepool::Status::not_finite,
             "A state to compress holds NaN or Inf; the page is unchanged (statepool.NotFinite).")
      .value("internal", statepool::Status::internal,
             "A bug or an operating-system failure in the daemon (statepool.Internal).")
      .value("not_hello", statepool::Status::not_hello,
             "The first request of a connection must be Hello (statepool.NotHello).")
      .value("too_many_connections", statepool::Status::too_many_connections,
             "The daemon, the uid or the tenant has no connection left "
             "(statepool.TooManyConnections).")
      .value("in_use", statepool::Status::in_use,
             "close_arena(): the arena still has held pages, pinned or busy snapshots, or other "
             "connections that opened it (statepool.InUse).");
  bind_views(m);
  bind_kernels(m);
  bind_client(m);
  bind_cuda(m);
  py::register_exception_translator(&translate);
}
