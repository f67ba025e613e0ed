// The fused decode step: DecodeStep, the gated-delta-rule step on a host arena's pages run
// here without the daemon (statepool/decode_step.hpp), and its StepResult.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/decode_step.hpp"
#include "typing.hpp"
#include "views.hpp"

namespace statepool::python {

namespace {

// A DecodeStep shares its arena object, so Arena.close() refuses while one exists.
struct DecodeStepHandle {
  std::shared_ptr<client::Arena> arena;
  std::unique_ptr<client::DecodeStep> step;
};

// A float32 buffer for the fused step: its bytes as floats (4-byte multiple and aligned).
std::span<float> floats(const Borrowed& b, const char* what) {
  const std::span<std::byte> bytes = b.bytes();
  if (bytes.size() % sizeof(float) != 0 ||
      reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) != 0) {
    throw py::value_error(std::string(what) + " must be an aligned float32 buffer");
  }
  return {reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float)};
}

}  // namespace

kernels::StepPolicy step_policy(kernels::StepMode mode, std::uint32_t full_every) {
  kernels::StepPolicy policy;
  policy.mode = mode;
  policy.full_every = full_every;
  return policy;
}

void bind_decode_step(py::module_& m) {
  py::enum_<kernels::StepMode>(m, "StepMode",
                               "How the fused step re-encodes a head (docs/codecs.md, \"Step "
                               "modes\").")
      .value("full", kernels::StepMode::full, "The codec's full encode (STEPQuant's whole fit).")
      .value("light", kernels::StepMode::light,
             "STEPQuant heads without the refit, but a full fit every full_every steps.");
  py::class_<kernels::StepResult>(m, "StepResult",
                                  "What one fused step could not store, and how it stored.")
      .def_readonly("rejected_heads", &kernels::StepResult::rejected_heads,
                    "Heads whose new state was not finite (their page bytes are unchanged).")
      .def_readonly("first_rejected_request", &kernels::StepResult::first_rejected_request,
                    "The batch index of the first rejected (request, head), when "
                    "rejected_heads > 0.")
      .def_readonly("first_rejected_head", &kernels::StepResult::first_rejected_head,
                    "The head of the first rejected (request, head), when rejected_heads > 0.")
      .def_readonly("light_heads", &kernels::StepResult::light_heads,
                    "Heads stored with a light fit (StepMode.light).")
      .def_readonly("fallback_heads", &kernels::StepResult::fallback_heads,
                    "Heads whose light fit fell back to the full fit.")
      .def_property_readonly("ok", &kernels::StepResult::ok, "No head was rejected.")
      .def("__bool__", &kernels::StepResult::ok, "ok.");
  py::class_<DecodeStepHandle>(m, "DecodeStep", R"doc(
The fused gated-delta-rule step on an arena's pages, run here every token without the daemon
(docs/client.md, "The fused decode step"): one call advances one layer of a batch of requests
by one token, unpacking, updating and repacking each request's compressed page in place.
Host arenas only (the host backend). Keeps the arena mapped while it exists.)doc")
      .def(py::init([](const ArenaHandle& a, unsigned threads) {
             DecodeStepHandle h;
             h.arena = a.arena;
             h.step = std::make_unique<client::DecodeStep>(*a.arena,
                                                           client::DecodeStep::Options{threads});
             return h;
           }),
           py::arg("arena"), py::arg("threads") = 0,
           "``threads``: 0 = every core, 1 = the calling thread only. RuntimeError when the "
           "arena is not host memory mapped here, or was not opened from a registered layout.")
      .def_property_readonly(
          "threads", [](const DecodeStepHandle& h) { return h.step->threads(); },
          "Threads a call uses, the caller's included.")
      .def_property_readonly(
          "codec",
          [](const DecodeStepHandle& h) {
            return std::make_shared<kernels::PageCodec>(h.step->codec().layout());
          },
          "The arena's page format.")
      .def_property_readonly(
          "default_mode", [](const DecodeStepHandle& h) { return h.step->default_policy().mode; },
          "The codec's measured step mode, what run() uses by default: StepMode.light (a full "
          "fit every 16 steps of a page) for stepquant6, StepMode.full for every other codec.")
      .def(
          "steps",
          [](const DecodeStepHandle& h, const SlotOrId& slot, std::uint32_t layer) {
            return h.step->steps(slot_in(*h.arena, slot), layer);
          },
          py::arg("slot"), py::arg("layer"),
          "Steps of ``layer`` this DecodeStep has run on ``slot``: the numbers that decide its "
          "light and full steps.")
      .def(
          "run",
          [](DecodeStepHandle& h, std::uint32_t layer, const std::vector<SlotOrId>& slots,
             const py::object& q, const py::object& k, const py::object& v,
             const py::object& log_decay, const py::object& beta, const py::object& out,
             std::uint32_t qk_heads, std::optional<kernels::StepMode> mode,
             std::uint32_t full_every) {
            std::vector<client::SlotId> ids;
            ids.reserve(slots.size());
            for (const SlotOrId& slot : slots) ids.push_back(slot_in(*h.arena, slot));
            const Borrowed bq(q, false, "q"), bk(k, false, "k"), bv(v, false, "v"),
                bg(log_decay, false, "log_decay"), bb(beta, false, "beta"), bo(out, true, "out");
            kernels::StepInputs in{static_cast<std::uint32_t>(ids.size()),
                                   qk_heads,
                                   floats(bq, "q"),
                                   floats(bk, "k"),
                                   floats(bv, "v"),
                                   floats(bg, "log_decay"),
                                   floats(bb, "beta"),
                                   floats(bo, "out")};
            const kernels::StepPolicy policy = mode ? step_policy(*mode, full_every)
                                                    : h.step->default_policy();
            ReleaseGil release;
            return h.step->run(layer, ids, in, policy);
          },
          py::arg("layer"), py::arg("slots"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("log_decay"), py::arg("beta"), py::arg("out"), py::kw_only(),
          py::arg("qk_heads") = 0, py::arg("mode") = py::none(), py::arg("full_every") = 16,
          R"doc(
One step of ``layer`` for the requests whose pages are ``slots`` (Slot objects or ids, in
batch order). float32 C-contiguous buffers (numpy arrays, CPU tensors): q and k
[batch][qk_heads][K] (L2-normalised, q scaled by 1/sqrt(K)), v [batch][H][V], log_decay
[batch][H] (GDN) or [batch][H][K] (KDA), beta [batch][H], out [batch][H][V] (written).
``qk_heads`` 0 means H. ``mode``: None for the codec's measured mode (default_mode), or a
StepMode; a light step is one whose number (this DecodeStep's count of the slot's steps of
the layer, steps()) is not a multiple of ``full_every`` (0: never a full fit). ValueError
when a size does not fit (nothing written); a head whose new state is not finite keeps its
old bytes and is counted in the StepResult.)doc");
}

}  // namespace statepool::python
