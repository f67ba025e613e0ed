// Capacity: Connection.plan_capacity() (the daemon's capacity plan for a model) and
// fits_now() with its results Fits and CodecFit (service/handlers/capacity.cpp serves
// PlanCapacity and FitsNow).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "typing.hpp"

namespace statepool::python {

namespace {

using client::Connection;

}  // namespace

void bind_capacity(py::module_& m, ConnectionClass& connection) {
  py::class_<client::CodecFit>(m, "CodecFit", "How many more requests fit under one codec.")
      .def_readonly("codec", &client::CodecFit::codec, "The codec.")
      .def_readonly("nominal_plan", &client::CodecFit::nominal_plan,
                    "stepquant without an arena: sized with nominal plan bytes.")
      .def_readonly("page_stride", &client::CodecFit::page_stride,
                    "Bytes one slot takes in an arena.")
      .def_readonly("arena_free_pages", &client::CodecFit::arena_free_pages,
                    "Free pages in the tenant's arena(s) of this codec.")
      .def_readonly("new_arena_pages", &client::CodecFit::new_arena_pages,
                    "Pages a new arena could take now.")
      .def_readonly("requests", &client::CodecFit::requests,
                    "(arena_free_pages + new_arena_pages) / slots.")
      .def_readonly("limited_by", &client::CodecFit::limited_by,
                    "arena, pool, quota or max_arena_pages.");
  py::class_<client::Fits>(m, "Fits", "What fits now for this connection's tenant.")
      .def_readonly("tenant", &client::Fits::tenant, "The tenant.")
      .def_readonly("pool_capacity_bytes", &client::Fits::pool_capacity_bytes, "Bytes of the pool.")
      .def_readonly("pool_free_bytes", &client::Fits::pool_free_bytes, "Capacity minus all arenas.")
      .def_readonly("quota_free_bytes", &client::Fits::quota_free_bytes, "None: no quota.")
      .def_readonly("max_arena_pages", &client::Fits::max_arena_pages,
                    "The daemon's limit on pages per arena.")
      .def_readonly("codecs", &client::Fits::codecs, "One entry per codec asked about.");

  connection
      .def(
          "plan_capacity",
          [](const ConnectionHandle& c, const std::string& model_config, std::uint32_t weight_bits,
             const std::string& kv, const std::vector<kernels::CodecId>& codecs,
             std::uint32_t slots, std::uint64_t context, std::uint64_t gpu_memory,
             std::optional<double> reserved, std::uint32_t tp,
             std::optional<std::uint64_t> concurrency) {
            client::PlanRequest r{model_config, weight_bits, kv,       codecs, slots,
                                  context,      gpu_memory,  reserved, tp,     concurrency};
            const std::string report =
                call(c, [&](Connection& conn) { return conn.plan_capacity(r); });
            return JsonObject(py::module_::import("json").attr("loads")(report));
          },
          py::arg("model_config"), py::kw_only(), py::arg("weight_bits") = 0, py::arg("kv") = "",
          py::arg("codecs") = std::vector<kernels::CodecId>{}, py::arg("slots") = 0,
          py::arg("context") = 0, py::arg("gpu_memory") = 0, py::arg("reserved") = py::none(),
          py::arg("tp") = 0, py::arg("concurrency") = py::none(), R"doc(
The daemon's capacity plan for a model (the text of its config.json), as the dict of
docs/capacity.md (what ``statepoolctl plan --json`` prints, plus "fits_now"). Zero/empty/None
arguments take the planner's defaults.)doc")
      .def(
          "fits_now",
          [](const ConnectionHandle& c, const client::LayoutInfo& l, std::uint32_t slots,
             const std::vector<kernels::CodecId>& codecs) {
            return call(c, [&](Connection& conn) { return conn.fits_now(l, slots, codecs); });
          },
          py::arg("layout"), py::arg("slots") = 1,
          py::arg("codecs") = std::vector<kernels::CodecId>{},
          "How many more requests of this state shape fit now, per codec.");
}

}  // namespace statepool::python
