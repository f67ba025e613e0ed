#include "views.hpp"

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "typing.hpp"

namespace statepool::python {

std::size_t element_bytes(Element element) noexcept {
  switch (element) {
    case Element::uint8: return 1;
    case Element::float32: return 4;
    case Element::float16:
    case Element::bfloat16: return 2;
  }
  return 1;
}

const char* to_string(Element element) noexcept {
  switch (element) {
    case Element::uint8: return "uint8";
    case Element::float32: return "float32";
    case Element::float16: return "float16";
    case Element::bfloat16: return "bfloat16";
  }
  return "?";
}

Element element_of(kernels::DType dtype) noexcept {
  switch (dtype) {
    case kernels::DType::f32: return Element::float32;
    case kernels::DType::bf16: return Element::bfloat16;
    case kernels::DType::f16: return Element::float16;
  }
  return Element::float32;
}

namespace {

bool element_from_name(std::string name, Element& out) {
  if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
  static constexpr std::array<std::pair<const char*, Element>, 8> kNames{{
      {"uint8", Element::uint8},
      {"float32", Element::float32},
      {"float", Element::float32},
      {"f32", Element::float32},
      {"float16", Element::float16},
      {"half", Element::float16},
      {"bfloat16", Element::bfloat16},
      {"bf16", Element::bfloat16},
  }};
  for (const auto& [text, element] : kNames) {
    if (name == text) {
      out = element;
      return true;
    }
  }
  return false;
}

DLDataType dl_type(Element element) {
  switch (element) {
    case Element::uint8: return {kDLUInt, 8, 1};
    case Element::float32: return {kDLFloat, 32, 1};
    case Element::float16: return {kDLFloat, 16, 1};
    case Element::bfloat16: return {kDLBfloat, 16, 1};
  }
  return {kDLUInt, 8, 1};
}

// What a DLPack capsule made by a View owns.
struct Exported {
  DLManagedTensor tensor{};
  std::shared_ptr<const void> owner;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
};

void delete_exported(DLManagedTensor* tensor) {
  delete static_cast<Exported*>(tensor->manager_ctx);
}

// A capsule nobody consumed still owns its tensor (consumers rename it "used_dltensor").
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor") != 0) {
    auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (tensor != nullptr && tensor->deleter != nullptr) tensor->deleter(tensor);
  }
}

py::capsule to_dlpack(const View& view) {
  auto exported = std::make_unique<Exported>();
  exported->owner = view.owner;
  exported->shape = view.shape;
  exported->strides.assign(view.shape.size(), 1);
  for (std::size_t i = view.shape.size(); i-- > 1;) {
    exported->strides[i - 1] = exported->strides[i] * view.shape[i];
  }
  DLTensor& t = exported->tensor.dl_tensor;
  t.data = view.data;
  t.device = view.device ? DLDevice{kDLCUDA, view.device_id} : DLDevice{kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(exported->shape.size());
  t.dtype = dl_type(view.element);
  t.shape = exported->shape.data();
  t.strides = exported->strides.data();
  t.byte_offset = 0;
  exported->tensor.manager_ctx = exported.get();
  exported->tensor.deleter = delete_exported;
  PyObject* capsule = PyCapsule_New(&exported->tensor, "dltensor", capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  exported.release();  // the capsule (or its consumer) owns it now
  return py::reinterpret_steal<py::capsule>(capsule);
}

const char* typestr(Element element) {
  switch (element) {
    case Element::uint8: return "|u1";
    case Element::float32: return "<f4";
    case Element::float16: return "<f2";
    case Element::bfloat16: return nullptr;  // no array-interface code for bfloat16
  }
  return nullptr;
}

py::tuple shape_tuple(const View& view) {
  py::tuple shape(view.shape.size());
  for (std::size_t i = 0; i < view.shape.size(); ++i) shape[i] = view.shape[i];
  return shape;
}

// The buffer protocol of View, by hand: pybind11's def_buffer cannot report an error (a
// C++ exception thrown there terminates the process), and a device or bfloat16 view must
// refuse with BufferError.
struct BufferDims {
  std::vector<Py_ssize_t> shape;
  std::vector<Py_ssize_t> strides;
};

const char* buffer_format(Element element) {
  switch (element) {
    case Element::uint8: return "B";
    case Element::float32: return "f";
    case Element::float16: return "e";
    case Element::bfloat16: return nullptr;
  }
  return nullptr;
}

extern "C" int view_getbuffer(PyObject* object, Py_buffer* buffer, int flags) {
  buffer->obj = nullptr;
  const View* view = nullptr;
  try {
    view = &py::handle(object).cast<const View&>();
  } catch (const std::exception&) {
    PyErr_SetString(PyExc_BufferError, "not a statepool.View");
    return -1;
  }
  if (view->device) {
    PyErr_SetString(PyExc_BufferError,
                    "device memory has no buffer protocol: use DLPack "
                    "(torch.from_dlpack) or __cuda_array_interface__");
    return -1;
  }
  const char* format = buffer_format(view->element);
  if (format == nullptr) {
    PyErr_SetString(PyExc_BufferError,
                    "bfloat16 has no buffer-protocol format: use DLPack "
                    "(torch.from_dlpack(view))");
    return -1;
  }
  auto dims = std::make_unique<BufferDims>();
  const auto size = static_cast<Py_ssize_t>(element_bytes(view->element));
  dims->shape.assign(view->shape.begin(), view->shape.end());
  dims->strides.assign(dims->shape.size(), size);
  for (std::size_t i = dims->shape.size(); i-- > 1;) {
    dims->strides[i - 1] = dims->strides[i] * dims->shape[i];
  }
  buffer->buf = view->data;
  buffer->len = static_cast<Py_ssize_t>(view->nbytes());
  buffer->itemsize = size;
  buffer->readonly = 0;
  buffer->format = (flags & PyBUF_FORMAT) != 0 ? const_cast<char*>(format) : nullptr;
  buffer->ndim = static_cast<int>(dims->shape.size());
  buffer->shape = (flags & PyBUF_ND) != 0 ? dims->shape.data() : nullptr;
  buffer->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims->strides.data() : nullptr;
  buffer->suboffsets = nullptr;
  buffer->internal = dims.release();
  buffer->obj = object;
  Py_INCREF(object);
  return 0;
}

extern "C" void view_releasebuffer(PyObject* /*object*/, Py_buffer* buffer) {
  delete static_cast<BufferDims*>(buffer->internal);
}

void enable_buffer(PyHeapTypeObject* type) {
  type->as_buffer.bf_getbuffer = view_getbuffer;
  type->as_buffer.bf_releasebuffer = view_releasebuffer;
}

}  // namespace

Element parse_element(const py::object& dtype) {
  if (py::isinstance<kernels::DType>(dtype)) return element_of(dtype.cast<kernels::DType>());
  Element element{};
  if (py::isinstance<py::str>(dtype)) {
    if (element_from_name(dtype.cast<std::string>(), element)) return element;
  } else if (element_from_name(py::str(dtype).cast<std::string>(), element)) {
    return element;  // torch.float32, ...
  } else {
    try {
      if (element_from_name(py::dtype::from_args(dtype).attr("name").cast<std::string>(),
                            element)) {
        return element;  // numpy dtypes and scalar types
      }
    } catch (const py::error_already_set&) {
      // not a numpy dtype either: reported below
    }
  }
  throw py::value_error("unsupported dtype " + py::repr(dtype).cast<std::string>() +
                        ": use uint8, float32, float16 or bfloat16 (a string, a numpy or "
                        "torch dtype, or statepool.DType)");
}

std::size_t View::count() const noexcept {
  std::size_t n = 1;
  for (const std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;  // make_view checked that this neither overflows nor passes the region
}

View make_view(std::shared_ptr<const void> owner, std::byte* data, std::size_t bytes, bool device,
               int device_id, const py::object& dtype, const py::object& shape,
               std::size_t offset) {
  View view;
  view.owner = std::move(owner);
  view.element = dtype.is_none() ? Element::uint8 : parse_element(dtype);
  view.device = device;
  view.device_id = device_id;
  const std::size_t size = element_bytes(view.element);
  if (offset > bytes) {
    throw py::value_error("offset " + std::to_string(offset) + " is past the end of the " +
                          std::to_string(bytes) + "-byte buffer");
  }
  if (offset % size != 0) {
    throw py::value_error("offset " + std::to_string(offset) + " is not a multiple of the " +
                          std::to_string(size) + "-byte " + to_string(view.element) + " element");
  }
  if (shape.is_none()) {
    view.shape = {static_cast<std::int64_t>((bytes - offset) / size)};
  } else if (py::isinstance<py::int_>(shape)) {
    view.shape = {shape.cast<std::int64_t>()};
  } else {
    view.shape = shape.cast<std::vector<std::int64_t>>();
  }
  std::size_t total = size;  // bytes, checked for overflow dimension by dimension
  for (const std::int64_t d : view.shape) {
    if (d < 0) throw py::value_error("a view's dimensions cannot be negative");
    if (__builtin_mul_overflow(total, static_cast<std::size_t>(d), &total) ||
        total > static_cast<std::size_t>(PY_SSIZE_T_MAX)) {
      total = SIZE_MAX;
      break;
    }
  }
  if (total > bytes - offset) {
    throw py::value_error("a view of shape " + py::repr(py::cast(view.shape)).cast<std::string>() +
                          " " + to_string(view.element) + " at offset " + std::to_string(offset) +
                          " does not fit in the " + std::to_string(bytes) + "-byte buffer");
  }
  view.data = data + offset;
  return view;
}

namespace {
void delete_managed(void* tensor) {
  auto* managed = static_cast<DLManagedTensor*>(tensor);
  if (managed->deleter != nullptr) managed->deleter(managed);
}
}  // namespace

Borrowed::Borrowed(const py::object& object, bool writable, const char* what) {
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  const bool has_dlpack = py::hasattr(object, "__dlpack__");
  if (PyObject_CheckBuffer(object.ptr()) != 0) {
    if (PyObject_GetBuffer(object.ptr(), &buffer_, flags) == 0) {
      have_buffer_ = true;
      bytes_ = {static_cast<std::byte*>(buffer_.buf), static_cast<std::size_t>(buffer_.len)};
      return;
    }
    if (!has_dlpack) throw py::error_already_set();
    PyErr_Clear();  // e.g. a bfloat16 view or a non-contiguous array: try DLPack
  } else if (!has_dlpack) {
    throw py::type_error(std::string(what) +
                         " must be a buffer (numpy array, bytearray, statepool.View) or a "
                         "DLPack tensor (torch.Tensor), got " +
                         py::repr(object.get_type()).cast<std::string>());
  }
  py::object capsule = object.attr("__dlpack__")();
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (tensor == nullptr) throw py::error_already_set();
  // From here on the tensor is ours: rename the capsule so that it does not delete it too.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
  dlpack_ = {tensor, delete_managed};
  const DLTensor& t = tensor->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    throw py::type_error(std::string(what) + " must be in host memory (a CPU tensor)");
  }
  std::size_t count = 1;
  std::int64_t expected = 1;
  bool contiguous = true;
  for (std::int32_t i = t.ndim; i-- > 0;) {
    if (t.strides != nullptr && t.shape[i] > 1 && t.strides[i] != expected) contiguous = false;
    expected *= t.shape[i];
    count *= static_cast<std::size_t>(t.shape[i]);
  }
  if (!contiguous) throw py::value_error(std::string(what) + " must be C-contiguous");
  const std::size_t bits = static_cast<std::size_t>(t.dtype.bits) * t.dtype.lanes;
  bytes_ = {static_cast<std::byte*>(t.data) + t.byte_offset, count * bits / 8};
}

Borrowed::~Borrowed() {
  if (have_buffer_) PyBuffer_Release(&buffer_);
}

void bind_views(py::module_& m) {
  py::class_<View>(m, "View", py::buffer_protocol(), py::custom_type_setup(&enable_buffer),
                   R"doc(
A zero-copy view of memory shared with the daemon: a staging buffer or arena pages.

Host memory offers the buffer protocol (``numpy.asarray(view)``, ``memoryview(view)``) and
DLPack (``torch.from_dlpack(view)``, ``numpy.from_dlpack(view)``); device memory (the cuda
backend) offers DLPack and ``__cuda_array_interface__``. Whatever is made from a view keeps
the memory mapped; the buffer it views cannot be closed while such objects exist.
bfloat16 views have no numpy equivalent: use DLPack (PyTorch) for them.)doc")
      .def_property_readonly(
          "shape", [](const View& v) { return Dims(shape_tuple(v)); }, "Dimensions, C order.")
      .def_property_readonly(
          "dtype", [](const View& v) { return to_string(v.element); },
          "Element type: 'uint8', 'float32', 'float16' or 'bfloat16'.")
      .def_property_readonly("nbytes", &View::nbytes, "Bytes viewed.")
      .def_property_readonly(
          "device",
          [](const View& v) {
            return v.device ? "cuda:" + std::to_string(v.device_id) : std::string("cpu");
          },
          "'cpu' or 'cuda:N'.")
      .def_property_readonly(
          "data_ptr", [](const View& v) { return reinterpret_cast<std::uintptr_t>(v.data); },
          "Address of the first element (a device address for device memory).")
      .def(
          "__len__", [](const View& v) { return v.shape.empty() ? 0 : v.shape[0]; },
          "The first dimension (0 for a view without dimensions).")
      .def(
          "__repr__",
          [](const View& v) {
            std::string dims;
            for (const std::int64_t d : v.shape)
              dims += (dims.empty() ? "" : ", ") + std::to_string(d);
            return "<statepool.View " + std::string(to_string(v.element)) + "[" + dims + "] on " +
                   (v.device ? "cuda:" + std::to_string(v.device_id) : std::string("cpu")) + ">";
          },
          "'<statepool.View dtype[dims] on device>'.")
      .def(
          "__dlpack__",
          [](const View& v, const py::object& /*stream*/) { return Capsule(to_dlpack(v)); },
          py::arg("stream") = py::none(), R"doc(
DLPack capsule of the view (zero-copy). ``stream`` is accepted and ignored: the daemon's
work on this memory is complete when its reply arrives, so there is nothing to order.)doc")
      .def(
          "__dlpack_device__",
          [](const View& v) {
            return v.device ? std::pair<int, int>(kDLCUDA, v.device_id)
                            : std::pair<int, int>(kDLCPU, 0);
          },
          "(device type, device id) as DLPack numbers them: (1, 0) for host memory.")
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const View& v) {
            if (!v.device) {
              throw py::attribute_error(
                  "host memory has no __cuda_array_interface__ (use "
                  "the buffer protocol or DLPack)");
            }
            const char* code = typestr(v.element);
            if (code == nullptr) {
              throw py::attribute_error(
                  "bfloat16 has no __cuda_array_interface__ type: use "
                  "DLPack");
            }
            py::dict cai;
            cai["shape"] = shape_tuple(v);
            cai["typestr"] = code;
            cai["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(v.data), false);
            cai["strides"] = py::none();
            cai["version"] = 3;
            return JsonObject(std::move(cai));
          },
          "CUDA array interface (version 3) of device memory.");
}

}  // namespace statepool::python
