// statepool.Arch/DType/CodecId/KvCodec/StepQuantVariant, StateLayout, Plan, PageCodec.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "views.hpp"

namespace statepool::python {

namespace {

namespace sq = kernels::stepquant;
using kernels::PageCodec;
using kernels::StateLayout;

std::shared_ptr<sq::Plan> checked(sq::Plan plan) {
  if (const std::string problem = sq::validate(plan); !problem.empty()) {
    throw py::value_error("invalid plan: " + problem);
  }
  return std::make_shared<sq::Plan>(std::move(plan));
}

std::string layout_repr(const StateLayout& l) {
  return "<statepool.StateLayout " + (l.name.empty() ? std::string() : "'" + l.name + "' ") +
         kernels::to_string(l.arch) + " " + std::to_string(l.num_layers) + "x" +
         std::to_string(l.num_heads) + "x" + std::to_string(l.key_dim) + "x" +
         std::to_string(l.value_dim) + " conv " + std::to_string(l.conv_channels) + "x" +
         std::to_string(l.conv_width) + " " + kernels::to_string(l.codec.id) + ">";
}

}  // namespace

void bind_kernels(py::module_& m) {
  py::enum_<kernels::Arch>(m, "Arch",
                           "Gated-delta-rule family: gdn (a gate per head) or kda "
                           "(a gate per key channel).")
      .value("gdn", kernels::Arch::gdn, "Gated DeltaNet: a gate per head.")
      .value("kda", kernels::Arch::kda, "Kimi Delta Attention: a gate per key channel.");
  py::enum_<kernels::DType>(m, "DType", "Element type of full-precision data.")
      .value("f32", kernels::DType::f32, "float32.")
      .value("bf16", kernels::DType::bf16, "bfloat16.")
      .value("f16", kernels::DType::f16, "float16 (conv states only: f16 staging is refused).");
  py::enum_<kernels::CodecId>(m, "CodecId", "Codec of the recurrent state (docs/codecs.md).")
      .value("fp32", kernels::CodecId::fp32, "float32 values: a copy, exact.")
      .value("bf16", kernels::CodecId::bf16, "bfloat16 values (round to nearest even).")
      .value("fp16", kernels::CodecId::fp16, "float16 values (round to nearest even).")
      .value("int4", kernels::CodecId::int4,
             "4-bit codes, symmetric absmax per group of group_size values, fp16 scales.")
      .value("int6", kernels::CodecId::int6,
             "6-bit codes, symmetric absmax per group of group_size values, fp16 scales.")
      .value("int8", kernels::CodecId::int8,
             "8-bit codes, symmetric absmax per group of group_size values, fp16 scales.")
      .value("stepquant4", kernels::CodecId::stepquant4,
             "STEPQuant at a 4-bit budget: per-unit widths from a calibration plan (needs a Plan).")
      .value("stepquant6", kernels::CodecId::stepquant6,
             "STEPQuant at a 6-bit budget: per-unit widths from a calibration plan (needs a Plan).")
      .value("dsq4", kernels::CodecId::dsq4,
             "Dual-scale baseline at 4 bits: fp16 row and column scales per head, no plan.")
      .value("dsq6", kernels::CodecId::dsq6,
             "Dual-scale baseline at 6 bits: fp16 row and column scales per head, no plan.");
  py::enum_<kernels::KvCodecId>(m, "KvCodec",
                                "Codec of a hybrid snapshot's KV blocks (docs/codecs.md, "
                                "\"KV-cache codecs\").")
      .value(
          "bf16", kernels::KvCodecId::bf16,
          "bfloat16, 2 B per value (round to nearest even, saturating at the largest finite bf16).")
      .value("fp8", kernels::KvCodecId::fp8,
             "OCP FP8 E4M3, 1 B per value, saturating at +-448; no per-tensor scale.")
      .value("kivi2", kernels::KvCodecId::kivi2,
             "KIVI at 2 bits: asymmetric groups of 32, keys per channel, values per token; the "
             "newest 128 tokens stay FP16.")
      .value("kivi4", kernels::KvCodecId::kivi4, "KIVI at 4 bits (as kivi2).")
      .value("flexgen4", kernels::KvCodecId::flexgen4,
             "4-bit asymmetric groups of 32 channels of one token, keys and values alike.");
  py::enum_<kernels::StepQuantVariant>(m, "StepQuantVariant",
                                       "STEPQuant ablation: both axes, spatial only, temporal "
                                       "only, both axes without the refit.")
      .value("full", kernels::StepQuantVariant::full, "The codec as calibrated (both axes).")
      .value("spatial_only", kernels::StepQuantVariant::spatial_only,
             "Every non-pivot unit at the budget width, with the impact-weighted fit.")
      .value("temporal_only", kernels::StepQuantVariant::temporal_only,
             "The plan's widths with plain per-row absmax scales, no column scales.")
      .value("no_refit", kernels::StepQuantVariant::no_refit,
             "As calibrated, without the least-squares refit of the column scales.");

  // Both classes exist before either's methods, whose signatures name the other
  // (Plan.nominal(layout), StateLayout(plan=...)).
  py::class_<sq::Plan, std::shared_ptr<sq::Plan>> plan_class(m, "Plan", R"doc(
A STEPQuant calibration plan (docs/plans.md): per-unit bit widths, FP16 pivots and per-row
impact factors for one model shape. Made by ``statepool-quant calibrate`` and loaded with
``Plan.load(path)``, or built from its fields (validated).)doc");
  py::class_<StateLayout> layout_class(m, "StateLayout", R"doc(
The shape of one request's whole recurrent state (every linear-attention layer) and the codec
that stores it; one arena page holds one such state. Staged (full-precision) states are
``[num_layers][num_heads][key_dim][value_dim]`` in float32 or bfloat16, followed by the conv
state ``[num_layers][conv_channels][conv_width]`` in ``conv_dtype``.)doc");
  plan_class
      .def(py::init([](kernels::Arch arch, std::uint32_t num_layers, std::uint32_t num_heads,
                       std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t budget_bits,
                       std::vector<std::uint8_t> widths, std::vector<float> impact,
                       std::string source) {
             sq::Plan plan;
             plan.arch = arch;
             plan.num_layers = num_layers;
             plan.num_heads = num_heads;
             plan.key_dim = key_dim;
             plan.value_dim = value_dim;
             plan.budget_bits = budget_bits;
             plan.widths = std::move(widths);
             plan.impact = std::move(impact);
             plan.source = std::move(source);
             return checked(std::move(plan));
           }),
           py::kw_only(), py::arg("arch"), py::arg("num_layers"), py::arg("num_heads"),
           py::arg("key_dim"), py::arg("value_dim"), py::arg("budget_bits"), py::arg("widths"),
           py::arg("impact"), py::arg("source") = "",
           "Builds a plan; ValueError names the first problem (docs/plans.md lists the rules). "
           "widths: one per unit (GDN: [layer][head], KDA: [layer][head][row]) in the "
           "budget's candidates or 16 (pivot); impact: one > 0 per key row.")
      .def_static(
          "load", [](const std::string& path) { return checked(sq::load(path)); }, py::arg("path"),
          "Reads a plan file; ValueError for a bad file, OSError-like "
          "RuntimeError for an I/O failure, both naming the path.")
      .def_static(
          "from_bytes",
          [](const py::bytes& data) {
            const std::string_view bytes = data;
            return checked(sq::from_bytes(std::as_bytes(std::span(bytes.data(), bytes.size()))));
          },
          py::arg("data"), "Parses a serialized plan (the contents of a plan file).")
      .def_static(
          "nominal",
          [](const StateLayout& layout, std::uint32_t budget_bits) {
            return checked(sq::nominal_plan(layout, budget_bits));
          },
          py::arg("layout"), py::arg("budget_bits"), R"doc(
The nominal plan of a layout's shape (its codec is ignored): every unit at ``budget_bits``
(6 or 4), the default share of FP16 pivots, impact factors 1 — what the capacity planner
sizes pages with. For trying STEPQuant before calibrating; a calibrated plan
(``statepool-quant calibrate``) is what keeps the accuracy.)doc")
      .def(
          "to_bytes",
          [](const sq::Plan& p) {
            const std::vector<std::byte> bytes = sq::to_bytes(p);
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          "The plan file's bytes.")
      .def(
          "save", [](const sq::Plan& p, const std::string& path) { sq::save(p, path); },
          py::arg("path"), "Writes the plan file atomically (temporary file, fsync, rename).")
      .def_readonly("arch", &sq::Plan::arch, "Gated-delta-rule family of the model.")
      .def_readonly("num_layers", &sq::Plan::num_layers, "Linear-attention layers.")
      .def_readonly("num_heads", &sq::Plan::num_heads, "Heads per layer.")
      .def_readonly("key_dim", &sq::Plan::key_dim, "Key dimension (rows of a head's state).")
      .def_readonly("value_dim", &sq::Plan::value_dim,
                    "Value dimension (columns of a head's state).")
      .def_readonly("budget_bits", &sq::Plan::budget_bits,
                    "The bit budget: 6 (stepquant6) or 4 (stepquant4).")
      .def_readonly("widths", &sq::Plan::widths, "Width per unit (a copy).")
      .def_readonly("impact", &sq::Plan::impact, "Impact factor per key row (a copy).")
      .def_readonly("source", &sq::Plan::source, "Free text: model, trace, tool version.")
      .def_readonly("page_format", &sq::Plan::page_format,
                    "STEPQuant page format the plan was calibrated with (1: before 2026-12-05).")
      .def_property_readonly(
          "digest", [](const sq::Plan& p) { return sq::digest(p); },
          "16 hex characters that layouts name the plan by.")
      .def_property_readonly("units", &sq::Plan::units,
                             "Heads (GDN) or key rows (KDA): len(widths) of a valid plan.")
      .def_property_readonly("pivots", &sq::Plan::pivots, "FP16 pivot units (width 16).")
      .def_property_readonly("average_width", &sq::Plan::average_width,
                             "Average nominal bits per value (pivots count 16).")
      .def(
          "__repr__",
          [](const sq::Plan& p) {
            return "<statepool.Plan " + sq::digest(p) + " " + kernels::to_string(p.arch) + " " +
                   std::to_string(p.budget_bits) + "-bit, " + std::to_string(p.units()) +
                   " units, " + std::to_string(p.pivots()) + " pivots>";
          },
          "'<statepool.Plan digest arch N-bit, U units, P pivots>'.");

  layout_class
      .def(py::init([](kernels::Arch arch, std::uint32_t num_layers, std::uint32_t num_heads,
                       std::uint32_t key_dim, std::uint32_t value_dim, std::uint32_t conv_channels,
                       std::uint32_t conv_width, kernels::DType conv_dtype, kernels::CodecId codec,
                       std::uint32_t group_size, kernels::StepQuantVariant variant,
                       std::optional<std::shared_ptr<sq::Plan>> plan, std::string name) {
             StateLayout l;
             l.name = std::move(name);
             l.arch = arch;
             l.num_layers = num_layers;
             l.num_heads = num_heads;
             l.key_dim = key_dim;
             l.value_dim = value_dim;
             l.conv_channels = conv_channels;
             l.conv_width = conv_width;
             l.conv_dtype = conv_dtype;
             l.codec = {codec, group_size, variant};
             l.plan = plan ? std::move(*plan) : nullptr;
             if (const std::string problem = kernels::validate(l); !problem.empty()) {
               throw py::value_error("invalid layout: " + problem);
             }
             return l;
           }),
           py::kw_only(), py::arg("arch") = kernels::Arch::gdn, py::arg("num_layers"),
           py::arg("num_heads"), py::arg("key_dim"), py::arg("value_dim"),
           py::arg("conv_channels") = 0, py::arg("conv_width") = 0,
           py::arg("conv_dtype") = kernels::DType::bf16, py::arg("codec") = kernels::CodecId::fp32,
           py::arg("group_size") = 0, py::arg("variant") = kernels::StepQuantVariant::full,
           py::arg("plan") = nullptr, py::arg("name") = "",
           "Builds and validates a layout (ValueError names the field). stepquant4/6 need a "
           "plan of the same shape; group_size 0 means 128.")
      .def_readonly("name", &StateLayout::name, "The layout's name ('' for none).")
      .def_readonly("arch", &StateLayout::arch, "Gated-delta-rule family.")
      .def_readonly("num_layers", &StateLayout::num_layers, "Linear-attention layers.")
      .def_readonly("num_heads", &StateLayout::num_heads, "Heads per layer.")
      .def_readonly("key_dim", &StateLayout::key_dim, "Key dimension (rows of a head's state).")
      .def_readonly("value_dim", &StateLayout::value_dim,
                    "Value dimension (columns of a head's state).")
      .def_readonly("conv_channels", &StateLayout::conv_channels,
                    "Channels of the conv state per layer (0: none).")
      .def_readonly("conv_width", &StateLayout::conv_width, "Width of the conv state (0: none).")
      .def_readonly("conv_dtype", &StateLayout::conv_dtype,
                    "Element type of the conv state (stored raw).")
      .def_property_readonly(
          "codec", [](const StateLayout& l) { return l.codec.id; }, "Codec of the recurrent state.")
      .def_property_readonly(
          "group_size", [](const StateLayout& l) { return l.codec.group_size; },
          "Group size of the int codecs (0 means 128).")
      .def_property_readonly(
          "variant", [](const StateLayout& l) { return l.codec.variant; },
          "STEPQuant ablation variant.")
      .def_property_readonly(
          "plan",
          [](const StateLayout& l) -> std::optional<std::shared_ptr<sq::Plan>> {
            if (!l.plan) return std::nullopt;
            return std::const_pointer_cast<sq::Plan>(l.plan);
          },
          "The STEPQuant plan, or None.")
      .def(
          "with_codec",
          [](const StateLayout& l, kernels::CodecId codec,
             std::optional<std::shared_ptr<sq::Plan>> plan) {
            StateLayout other = l;
            other.codec = {codec, l.codec.group_size, l.codec.variant};
            other.plan = plan ? std::move(*plan) : nullptr;
            if (const std::string problem = kernels::validate(other); !problem.empty()) {
              throw py::value_error("invalid layout: " + problem);
            }
            return other;
          },
          py::arg("codec"), py::arg("plan") = nullptr, "The same shape stored with another codec.")
      .def(
          "__eq__",
          [](const StateLayout& a, const py::object& other) {
            return py::isinstance<StateLayout>(other) &&
                   a.same_shape_and_codec(other.cast<const StateLayout&>());
          },
          py::arg("other"), "Same shape and codec (plans compared too); False for anything else.")
      .def("__repr__", &layout_repr,
           "\"<statepool.StateLayout 'name' arch LxHxKxV conv CxW codec>\".");

  py::class_<PageCodec, std::shared_ptr<PageCodec>>(m, "PageCodec", R"doc(
The page format of a layout, to encode and decode pages in this process with the same code
as the daemon. Thread-safe; encode/decode release the GIL.)doc")
      .def(py::init<StateLayout>(), py::arg("layout"), "The page codec of ``layout``.")
      .def_property_readonly("layout", &PageCodec::layout, "The layout (a copy).")
      .def_property_readonly("page_bytes", &PageCodec::page_bytes, "Exact bytes of one page.")
      .def_property_readonly("fp32_bytes", &PageCodec::fp32_bytes,
                             "Bytes of the same state with every value in float32.")
      .def_property_readonly("compression_ratio", &PageCodec::compression_ratio,
                             "fp32_bytes / page_bytes.")
      .def_property_readonly("head_count", &PageCodec::head_count, "num_layers * num_heads.")
      .def(
          "head_offset",
          [](const PageCodec& c, std::uint32_t layer, std::uint32_t head) {
            if (layer >= c.layout().num_layers || head >= c.layout().num_heads) {
              throw py::index_error("no head " + std::to_string(head) + " of layer " +
                                    std::to_string(layer) + " in this layout");
            }
            return c.head_offset(layer, head);
          },
          py::arg("layer"), py::arg("head"),
          "Byte offset of the encoded head in a page (heads in layer-major order, then the "
          "conv state at conv_offset).")
      .def_property_readonly("conv_offset", &PageCodec::conv_offset,
                             "Byte offset of the conv state in a page.")
      .def("staged_bytes", &PageCodec::staged_bytes, py::arg("dtype") = kernels::DType::f32,
           "Bytes of a staged state whose recurrent part is in dtype (f32 or bf16).")
      .def(
          "encode",
          [](const PageCodec& c, const py::object& staged, kernels::DType dtype,
             const py::object& page) {
            const Borrowed in(staged, false, "staged");
            const Borrowed out(page, true, "page");
            ReleaseGil release;
            c.encode(in.bytes(), dtype, out.bytes());
          },
          py::arg("staged"), py::arg("dtype"), py::arg("page"),
          "page <- staged. NotFinite (page unchanged) for a NaN/Inf state; ValueError for "
          "wrong sizes. Buffers: numpy arrays, torch CPU tensors, statepool.View, bytearray.")
      .def(
          "decode",
          [](const PageCodec& c, const py::object& page, kernels::DType dtype,
             const py::object& staged) {
            const Borrowed in(page, false, "page");
            const Borrowed out(staged, true, "staged");
            ReleaseGil release;
            c.decode(in.bytes(), dtype, out.bytes());
          },
          py::arg("page"), py::arg("dtype"), py::arg("staged"), "staged <- page.");
}

}  // namespace statepool::python
