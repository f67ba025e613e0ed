// The CUDA side of the client (statepool/client_cuda.hpp) for Python: Pending.synchronize()
// and Pending.wait(stream), Arena.decode() on device arenas, DeviceDecoder and
// DeviceDecodeStep. The names exist in every build, so that the module, its stub and the
// code that uses it are the same everywhere; a module built without CUDA (HAVE_CUDA False)
// raises RuntimeError where device work would be needed. CUDA streams are ints: the
// cudaStream_t handle (torch.cuda.Stream.cuda_stream), 0 the legacy default stream.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "gil.hpp"
#include "handles.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/page.hpp"
#include "typing.hpp"

#if STATEPOOL_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include "statepool/client_cuda.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/fused_step.hpp"
#endif

namespace statepool::python {

namespace {

using kernels::DType;

#if STATEPOOL_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;

[[noreturn]] void no_cuda(const std::string& what) {
  throw std::runtime_error(what +
                           ": this statepool module was built without CUDA (statepool.HAVE_CUDA "
                           "is False); build it where nvcc is found (docs/python.md, Installing)");
}
#endif

/// An arena DeviceDecoder and DeviceDecodeStep can work on: mapped device memory with a page
/// format. ValueError otherwise (a host arena, or device memory not mapped here).
const std::shared_ptr<client::Arena>& device_arena(const ArenaHandle& a, const char* who) {
  const client::Arena& arena = *a.arena;
  if (arena.device_data() == nullptr) {
    throw py::value_error(
        std::string(who) + " needs an arena in device memory mapped in this " +
        "process (the cuda backend, connect(map_device_memory=True)); arena " +
        std::to_string(arena.id()) + " is " +
        (arena.mapped() ? "host memory: use Arena.decode() / DecodeStep" : "not mapped here"));
  }
  if (!arena.has_codec()) {
    throw py::value_error(std::string(who) + " needs the arena's page format: open the arena " +
                          "from the LayoutInfo of register_layout()");
  }
  return a.arena;
}

#if STATEPOOL_HAVE_CUDA

cudaStream_t as_stream(std::uintptr_t stream) {
  return reinterpret_cast<cudaStream_t>(stream);  // NOLINT(performance-no-int-to-ptr)
}

[[noreturn]] void cuda_failed(const std::string& what, cudaError_t status) {
  throw client::Error(Status::internal,
                      what + " failed: " + kernels::cuda::handled_error_text(status));
}

/// The element types device buffers are checked against.
enum class Want : std::uint8_t {
  any,       ///< only the size counts (a staged state: float32 or bfloat16 plus its conv part)
  float32,   ///< q, k, v, log_decay, beta, out
  slot_ids,  ///< int32 or uint32
  bytes,     ///< uint8 or int8 (rejected)
};

void delete_managed(void* tensor) {
  auto* managed = static_cast<DLManagedTensor*>(tensor);
  if (managed->deleter != nullptr) managed->deleter(managed);
}

/// A caller's device buffer, borrowed for one call: through DLPack (torch CUDA tensors,
/// device Views; the producer orders its stream before `stream`, as the DLPack protocol
/// says) or __cuda_array_interface__ (CuPy, Numba). C-contiguous, of the element type asked
/// for, in device memory of `device`. Needs the GIL to build and to destroy.
class DeviceBuffer {
 public:
  DeviceBuffer(const py::object& object, const char* what, Want want, int device,
               std::uintptr_t stream)
      : what_(what) {
    if (py::hasattr(object, "__dlpack_device__") && py::hasattr(object, "__dlpack__")) {
      from_dlpack(object, stream);
    } else if (py::hasattr(object, "__cuda_array_interface__")) {
      from_cuda_array_interface(object.attr("__cuda_array_interface__"));
    } else {
      throw py::type_error(what_ +
                           " must be device memory: a CUDA tensor (DLPack) or an object with "
                           "__cuda_array_interface__, got " +
                           py::repr(object.get_type()).cast<std::string>());
    }
    check_element(want);
    check_device(device);
  }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return count_ * item_bytes_; }

  /// ValueError unless the buffer holds exactly `expected` elements.
  void expect_count(std::size_t expected, const char* shape) const {
    if (count_ != expected) {
      throw py::value_error(what_ + " must have " + std::to_string(expected) + " elements (" +
                            shape + "), got " + std::to_string(count_));
    }
  }

 private:
  void from_dlpack(const py::object& object, std::uintptr_t stream) {
    const auto device = object.attr("__dlpack_device__")().cast<py::tuple>();
    const int type = device[0].cast<int>();
    if (type != kDLCUDA && type != kDLCUDAManaged) {
      throw py::type_error(what_ + " must be in device memory (a CUDA tensor), not DLPack " +
                           "device type " + std::to_string(type));
    }
    // DLPack's stream argument: 1 is the legacy default stream (0 is not allowed for CUDA).
    const std::uintptr_t consumer = stream == 0 ? 1 : stream;
    py::object capsule = object.attr("__dlpack__")(py::arg("stream") = consumer);
    auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (tensor == nullptr) throw py::error_already_set();
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    dlpack_ = {tensor, delete_managed};
    const DLTensor& t = tensor->dl_tensor;
    std::int64_t expected = 1;
    count_ = 1;
    for (std::int32_t i = t.ndim; i-- > 0;) {
      if (t.strides != nullptr && t.shape[i] > 1 && t.strides[i] != expected) {
        throw py::value_error(what_ + " must be C-contiguous");
      }
      expected *= t.shape[i];
      count_ *= static_cast<std::size_t>(t.shape[i]);
    }
    item_bytes_ = static_cast<std::size_t>(t.dtype.bits) * t.dtype.lanes / 8;
    kind_ = t.dtype.code == kDLFloat  ? 'f'
            : t.dtype.code == kDLInt  ? 'i'
            : t.dtype.code == kDLUInt ? 'u'
                                      : '?';
    data_ = static_cast<std::byte*>(t.data) + t.byte_offset;
  }

  void from_cuda_array_interface(const py::object& interface) {
    const auto cai = interface.cast<py::dict>();
    const auto data = cai["data"].cast<py::tuple>();
    data_ = reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr)
        data[0].cast<std::uintptr_t>());
    if (data[1].cast<bool>()) throw py::value_error(what_ + " is read-only");
    const auto typestr = cai["typestr"].cast<std::string>();
    if (typestr.size() < 3 || (typestr[0] != '<' && typestr[0] != '|')) {
      throw py::value_error(what_ + ": unsupported __cuda_array_interface__ typestr " + typestr);
    }
    kind_ = typestr[1];
    item_bytes_ = std::stoul(typestr.substr(2));
    const auto shape = cai["shape"].cast<std::vector<std::int64_t>>();
    count_ = 1;
    for (const std::int64_t d : shape) count_ *= static_cast<std::size_t>(d);
    if (cai.contains("strides") && !cai["strides"].is_none()) {
      const auto strides = cai["strides"].cast<std::vector<std::int64_t>>();
      std::int64_t expected = static_cast<std::int64_t>(item_bytes_);
      for (std::size_t i = shape.size(); i-- > 0;) {
        if (shape[i] > 1 && strides.at(i) != expected) {
          throw py::value_error(what_ + " must be C-contiguous");
        }
        expected *= shape[i];
      }
    }
  }

  void check_element(Want want) const {
    bool ok = true;
    const char* name = "";
    switch (want) {
      case Want::any: break;
      case Want::float32:
        ok = kind_ == 'f' && item_bytes_ == 4;
        name = "float32";
        break;
      case Want::slot_ids:
        ok = (kind_ == 'i' || kind_ == 'u') && item_bytes_ == 4;
        name = "int32 or uint32";
        break;
      case Want::bytes:
        ok = (kind_ == 'i' || kind_ == 'u') && item_bytes_ == 1;
        name = "uint8";
        break;
    }
    if (!ok) {
      throw py::type_error(what_ + " must be " + name + ", got a " + std::to_string(item_bytes_) +
                           "-byte element of kind '" + kind_ + "'");
    }
  }

  // A host pointer handed to a kernel would be a fault that poisons the CUDA context: the
  // runtime says where the memory is before anything is launched.
  void check_device(int device) const {
    if (count_ == 0) return;
    cudaPointerAttributes attributes{};
    if (const cudaError_t s = cudaPointerGetAttributes(&attributes, data_); s != cudaSuccess) {
      cuda_failed("cudaPointerGetAttributes (" + what_ + ")", s);
    }
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      throw py::value_error(what_ + " is not device memory");
    }
    if (attributes.device != device) {
      throw py::value_error(what_ + " is memory of CUDA device " +
                            std::to_string(attributes.device) + ", the arena is on device " +
                            std::to_string(device));
    }
  }

  std::string what_;
  void* data_ = nullptr;
  std::size_t count_ = 0;
  std::size_t item_bytes_ = 1;
  char kind_ = '?';
  std::unique_ptr<void, void (*)(void*)> dlpack_{nullptr, nullptr};
};

/// Synchronous decode into a borrowed device buffer (the GIL released while the device works).
void decode_into(const client::DeviceDecoder& decoder, const client::Arena& arena,
                 client::SlotId slot, const DeviceBuffer& out, std::uintptr_t stream, bool wait) {
  ReleaseGil release;
  const kernels::cuda::DeviceGuard on(arena.memory().device);
  decoder.decode(slot, out.data(), as_stream(stream));
  if (!wait) return;
  if (const cudaError_t s = cudaStreamSynchronize(as_stream(stream)); s != cudaSuccess) {
    cuda_failed("cudaStreamSynchronize (Arena.decode)", s);
  }
}

using Decoder = client::DeviceDecoder;
using Step = client::DeviceDecodeStep;

#else  // no CUDA: the types exist, nothing constructs them

struct Decoder {};
struct Step {};

#endif

struct DeviceDecoderHandle {
  std::shared_ptr<client::Arena> arena;  // Arena.close() refuses while this exists
  std::unique_ptr<Decoder> decoder;
  DType dtype = DType::f32;
};

struct DeviceDecodeStepHandle {
  std::shared_ptr<client::Arena> arena;
  std::unique_ptr<Step> step;
};

}  // namespace

void decode_on_device(const std::shared_ptr<client::Arena>& arena, client::SlotId slot,
                      const py::object& out, DType dtype, std::uintptr_t stream) {
#if STATEPOOL_HAVE_CUDA
  const client::Arena& a = *arena;
  if (!a.has_codec()) {
    throw py::value_error(
        "Arena.decode() needs the arena's page format: open the arena from the "
        "LayoutInfo of register_layout()");
  }
  const DeviceBuffer buffer(out, "out", Want::any, a.memory().device, stream);
  if (buffer.bytes() != a.codec().staged_bytes(dtype)) {
    throw py::value_error("out must be " + std::to_string(a.codec().staged_bytes(dtype)) +
                          " bytes (codec.staged_bytes(dtype)), got " +
                          std::to_string(buffer.bytes()));
  }
  std::unique_ptr<client::DeviceDecoder> decoder;
  {
    ReleaseGil release;  // uploads the page format's tables
    decoder = std::make_unique<client::DeviceDecoder>(a, dtype);
  }
  decode_into(*decoder, a, slot, buffer, stream, true);
#else
  (void)arena, (void)slot, (void)out, (void)dtype, (void)stream;
  no_cuda("Arena.decode() of an arena in device memory");
#endif
}

void bind_cuda(py::module_& m) {
  m.attr("HAVE_CUDA") = py::bool_(kHaveCuda);

  // --- waiting for the daemon's device work (the *_async calls) -------------------------
  auto pending = py::reinterpret_borrow<py::class_<client::Pending>>(m.attr("Pending"));
  pending
      .def(
          "synchronize",
          [](const client::Pending& p) {
            if (!p.event) return;  // the work was done when the reply came
#if STATEPOOL_HAVE_CUDA
            ReleaseGil release;
            client::synchronize(p);
#else
            no_cuda("Pending.synchronize() of a device operation");
#endif
          },
          R"doc(
Blocks this thread (the GIL released) until the daemon's device work is done. Returns at once
when there is no event (the host backend: the work was done when the reply came). Call it
before the next request on the connection that returned this Pending. RuntimeError (no event
waited for) in a module built without CUDA.)doc")
      .def(
          "wait",
          [](const client::Pending& p, std::uintptr_t stream) {
            if (!p.event) return;
#if STATEPOOL_HAVE_CUDA
            ReleaseGil release;
            client::wait_on_stream(p, as_stream(stream));
#else
            (void)stream;
            no_cuda("Pending.wait() on a device operation");
#endif
          },
          py::arg("stream"), R"doc(
Makes CUDA stream ``stream`` wait for the daemon's device work, without blocking this thread
(cudaStreamWaitEvent on the daemon's IPC event): an int handle such as
torch.cuda.current_stream().cuda_stream, 0 the legacy default stream. Nothing to do when there
is no event. Call it before the next request on the connection that returned this Pending.
RuntimeError (for an event) in a module built without CUDA.)doc");

  // --- local decode on the device -------------------------------------------------------
  py::class_<DeviceDecoderHandle>(m, "DeviceDecoder", R"doc(
Decodes pages of a device arena (the cuda backend, mapped here) on the engine's CUDA stream
with the daemon's own kernels, without a round trip: byte for byte what the daemon's
decompress() writes. The page format's tables are uploaded once, when it is made; decode()
only enqueues. Keeps the arena mapped while it exists (Arena.close() refuses). Needs a
module built with CUDA (HAVE_CUDA).)doc")
      .def(py::init([](const ArenaHandle& a, DType dtype) -> DeviceDecoderHandle {
             const std::shared_ptr<client::Arena>& arena = device_arena(a, "DeviceDecoder");
#if STATEPOOL_HAVE_CUDA
             DeviceDecoderHandle h{arena, nullptr, dtype};
             ReleaseGil release;
             h.decoder = std::make_unique<client::DeviceDecoder>(*arena, dtype);
             return h;
#else
             (void)arena, (void)dtype;
             no_cuda("DeviceDecoder");
#endif
           }),
           py::arg("arena"), py::arg("dtype") = DType::f32,
           "``dtype``: the staged recurrent part's type (f32 or bf16). ValueError for an arena "
           "that is not device memory mapped here or has no page format.")
      .def_property_readonly(
          "dtype", [](const DeviceDecoderHandle& h) { return h.dtype; },
          "The staged recurrent part's type.")
      .def_property_readonly(
          "staged_bytes",
          [](const DeviceDecoderHandle& h) { return h.arena->codec().staged_bytes(h.dtype); },
          "Bytes decode() writes: the staged state (codec.staged_bytes(dtype)).")
      .def(
          "decode",
          [](const DeviceDecoderHandle& h, const SlotOrId& slot, const py::object& out,
             std::uintptr_t stream) {
            const client::SlotId id = slot_in(*h.arena, slot);
#if STATEPOOL_HAVE_CUDA
            const DeviceBuffer buffer(out, "out", Want::any, h.arena->memory().device, stream);
            const std::size_t expected = h.arena->codec().staged_bytes(h.dtype);
            if (buffer.bytes() != expected) {
              throw py::value_error("out must be " + std::to_string(expected) +
                                    " bytes (staged_bytes), got " + std::to_string(buffer.bytes()));
            }
            decode_into(*h.decoder, *h.arena, id, buffer, stream, false);
#else
            (void)id, (void)out, (void)stream;
            no_cuda("DeviceDecoder.decode");
#endif
          },
          py::arg("slot"), py::arg("out"), py::kw_only(), py::arg("stream") = 0, R"doc(
Enqueues on CUDA stream ``stream`` (an int handle, 0 the legacy default stream): ``out`` <-
the staged state of page ``slot`` (a Slot of the arena or an id). ``out`` is device memory on
the arena's device, C-contiguous, staged_bytes bytes: a CUDA tensor or a device View (DLPack)
or anything with __cuda_array_interface__. Returns without waiting: keep ``out`` and this
decoder alive until the stream has run it. IndexError for a slot outside the arena.)doc");

  // --- the fused decode step on the device ----------------------------------------------
  py::class_<DeviceDecodeStepHandle>(m, "DeviceDecodeStep", R"doc(
The fused gated-delta-rule step on a device arena's pages (the cuda backend, mapped here), on
the engine's CUDA stream, with no round trip to the daemon: one launch per call advances one
layer of a batch of requests by one token, decoding, updating and re-encoding each request's
page in place; bit for bit the host DecodeStep. Keeps the arena mapped while it exists. Needs
a module built with CUDA (HAVE_CUDA).)doc")
      .def(py::init([](const ArenaHandle& a) -> DeviceDecodeStepHandle {
             const std::shared_ptr<client::Arena>& arena = device_arena(a, "DeviceDecodeStep");
#if STATEPOOL_HAVE_CUDA
             DeviceDecodeStepHandle h{arena, nullptr};
             ReleaseGil release;
             h.step = std::make_unique<client::DeviceDecodeStep>(*arena);
             return h;
#else
             (void)arena;
             no_cuda("DeviceDecodeStep");
#endif
           }),
           py::arg("arena"),
           "Uploads the page format's tables to the arena's device. ValueError for an arena that "
           "is not device memory mapped here or has no page format.")
      .def_property_readonly(
          "codec",
          [](const DeviceDecodeStepHandle& h) {
            return std::make_shared<kernels::PageCodec>(h.arena->codec().layout());
          },
          "The arena's page format.")
      .def(
          "run",
          [](const DeviceDecodeStepHandle& h, std::uint32_t layer, const py::object& slots,
             const py::object& q, const py::object& k, const py::object& v,
             const py::object& log_decay, const py::object& beta, const py::object& out,
             const py::object& rejected, std::uint32_t qk_heads, std::uintptr_t stream,
             std::optional<kernels::StepMode> mode, std::uint32_t full_every) {
#if STATEPOOL_HAVE_CUDA
            const kernels::StateLayout& l = h.arena->codec().layout();
            if (const std::string problem = kernels::step_problem(l, layer, qk_heads);
                !problem.empty()) {
              throw py::value_error("DeviceDecodeStep.run: " + problem);
            }
            const int device = h.arena->memory().device;
            const DeviceBuffer ids(slots, "slots", Want::slot_ids, device, stream);
            const std::size_t batch = ids.count();
            const std::size_t qk = qk_heads == 0 ? l.num_heads : qk_heads;
            const std::size_t heads = batch * l.num_heads;
            const DeviceBuffer bq(q, "q", Want::float32, device, stream),
                bk(k, "k", Want::float32, device, stream),
                bv(v, "v", Want::float32, device, stream),
                bg(log_decay, "log_decay", Want::float32, device, stream),
                bb(beta, "beta", Want::float32, device, stream),
                bo(out, "out", Want::float32, device, stream);
            bq.expect_count(batch * qk * l.key_dim, "[batch][qk_heads][K]");
            bk.expect_count(batch * qk * l.key_dim, "[batch][qk_heads][K]");
            bv.expect_count(heads * l.value_dim, "[batch][H][V]");
            if (l.arch == kernels::Arch::kda) {
              bg.expect_count(heads * l.key_dim, "[batch][H][K]");
            } else {
              bg.expect_count(heads, "[batch][H]");
            }
            bb.expect_count(heads, "[batch][H]");
            bo.expect_count(heads * l.value_dim, "[batch][H][V]");
            std::unique_ptr<DeviceBuffer> br;
            if (!rejected.is_none()) {
              br =
                  std::make_unique<DeviceBuffer>(rejected, "rejected", Want::bytes, device, stream);
              br->expect_count(heads, "[batch][H]");
            }
            const client::DeviceStepInputs in{
                .batch = static_cast<std::uint32_t>(batch),
                .qk_heads = qk_heads,
                .slots = static_cast<const client::SlotId*>(ids.data()),
                .q = static_cast<const float*>(bq.data()),
                .k = static_cast<const float*>(bk.data()),
                .v = static_cast<const float*>(bv.data()),
                .log_decay = static_cast<const float*>(bg.data()),
                .beta = static_cast<const float*>(bb.data()),
                .out = static_cast<float*>(bo.data()),
                .rejected = br ? static_cast<std::uint8_t*>(br->data()) : nullptr};
            const kernels::StepPolicy policy =
                mode ? step_policy(*mode, full_every) : h.step->default_policy();
            ReleaseGil release;
            h.step->run(layer, in, as_stream(stream), policy);
#else
            (void)h, (void)layer, (void)slots, (void)q, (void)k, (void)v, (void)log_decay,
                (void)beta, (void)out, (void)rejected, (void)qk_heads, (void)stream, (void)mode,
                (void)full_every;
            no_cuda("DeviceDecodeStep.run");
#endif
          },
          py::arg("layer"), py::arg("slots"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("log_decay"), py::arg("beta"), py::arg("out"), py::kw_only(),
          py::arg("rejected") = py::none(), py::arg("qk_heads") = 0, py::arg("stream") = 0,
          py::arg("mode") = py::none(), py::arg("full_every") = 16, R"doc(
Enqueues one step of ``layer`` on CUDA stream ``stream`` (an int handle, 0 the legacy default
stream) for the requests whose pages are ``slots``: a device array of int32 (or uint32) slot
ids, one per request, distinct. Every other buffer is C-contiguous float32 device memory on
the arena's device (CUDA tensors, or __cuda_array_interface__): q and k [batch][qk_heads][K]
(L2-normalised, q scaled by 1/sqrt(K)), v [batch][H][V], log_decay [batch][H] (GDN) or
[batch][H][K] (KDA), beta [batch][H], out [batch][H][V] (written). ``rejected``: None or a
uint8 device array [batch][H], written with 0 (stored), 1 (a non-finite new state: the head
kept its bytes), 2 (a slot outside the arena: nothing touched) or 3 (an earlier request
of the batch has the slot: only the first is stepped). ``qk_heads`` 0 means H. ``mode``:
None for the codec's measured mode (StepMode.light for stepquant6), or a StepMode; the
device counts each page's steps of each layer itself, and a light step is one whose count
is not a multiple of ``full_every``.
ValueError/TypeError for what the host can check (the layer, a size or type that does not
fit, host memory), before anything is launched. Returns without waiting.)doc");
}

}  // namespace statepool::python
