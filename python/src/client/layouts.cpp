// Layouts: Connection.register_layout() and install_plan(), with their results LayoutInfo and
// PlanInfo (service/handlers/layouts.cpp serves RegisterLayout and InstallPlan).
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"

namespace statepool::python {

namespace {

using client::Connection;
using kernels::DType;

}  // namespace

void bind_layouts(py::module_& m, ConnectionClass& connection) {
  py::class_<client::LayoutInfo>(m, "LayoutInfo", "A layout registered with the daemon.")
      .def_readonly("id", &client::LayoutInfo::id, "The daemon's id of the layout.")
      .def_readonly("page_bytes", &client::LayoutInfo::page_bytes, "Exact bytes of one page.")
      .def_readonly("fp32_bytes", &client::LayoutInfo::fp32_bytes,
                    "Bytes of the same state with every value in float32.")
      .def_readonly("state_bytes_f32", &client::LayoutInfo::state_bytes_f32,
                    "Bytes of a staged state, recurrent part in float32.")
      .def_readonly("state_bytes_bf16", &client::LayoutInfo::state_bytes_bf16,
                    "Bytes of a staged state, recurrent part in bfloat16.")
      .def_readonly("layout", &client::LayoutInfo::layout, "What was registered.")
      .def_property_readonly("compression_ratio", &client::LayoutInfo::compression_ratio,
                             "fp32_bytes / page_bytes (0 if page_bytes is 0).")
      .def("state_bytes", &client::LayoutInfo::state_bytes, py::arg("dtype") = DType::f32,
           "state_bytes_f32 or state_bytes_bf16 (0 for f16: the daemon does not accept f16 "
           "staging).")
      .def(
          "__repr__",
          [](const client::LayoutInfo& l) {
            return "<statepool.LayoutInfo id=" + std::to_string(l.id) +
                   " page_bytes=" + std::to_string(l.page_bytes) +
                   " fp32_bytes=" + std::to_string(l.fp32_bytes) + ">";
          },
          "'<statepool.LayoutInfo id=... page_bytes=... fp32_bytes=...>'.");
  py::class_<client::PlanInfo>(m, "PlanInfo", "A STEPQuant plan the daemon holds.")
      .def_readonly("digest", &client::PlanInfo::digest,
                    "What layouts name the plan by (16 hex characters).")
      .def_readonly("units", &client::PlanInfo::units, "Heads (GDN) or key rows (KDA).")
      .def_readonly("pivots", &client::PlanInfo::pivots, "FP16 pivot units.")
      .def_readonly("average_bits", &client::PlanInfo::average_bits,
                    "Nominal bits per value over the units.")
      .def_readonly("created", &client::PlanInfo::created, "False when the daemon had it already.");

  connection
      .def(
          "register_layout",
          [](const ConnectionHandle& c, const kernels::StateLayout& l) {
            return call(c, [&](Connection& conn) { return conn.register_layout(l); });
          },
          py::arg("layout"),
          "Registers (or finds) a layout; installs a stepquant layout's plan first if needed.")
      .def(
          "install_plan",
          [](const ConnectionHandle& c, const kernels::stepquant::Plan& p) {
            return call(c, [&](Connection& conn) { return conn.install_plan(p); });
          },
          py::arg("plan"), "Sends a STEPQuant plan (idempotent).");
}

}  // namespace statepool::python
