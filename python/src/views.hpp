#pragma once
// Zero-copy views of mapped memory for Python (statepool.View), and borrowing of the
// caller's buffers (numpy arrays, PyTorch tensors, anything with the buffer protocol or
// DLPack) for the codec calls.
//
// A View shares ownership of what it looks at (a staging buffer's or an arena's mapping),
// so the memory stays mapped while any view, numpy array or tensor made from it is alive;
// Staging.close() and Arena.close() refuse with BufferError while views exist, as
// mmap.mmap.close() does.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "statepool/kernels/layout.hpp"

namespace statepool::python {

namespace py = pybind11;

/// Element types a view can have.
enum class Element : std::uint8_t { uint8, float32, float16, bfloat16 };

[[nodiscard]] std::size_t element_bytes(Element element) noexcept;
[[nodiscard]] const char* to_string(Element element) noexcept;
/// The element type of a staged state's recurrent part.
[[nodiscard]] Element element_of(kernels::DType dtype) noexcept;
/// Parses a dtype argument: a statepool.DType, a string ("float32", "bfloat16", "uint8",
/// "float16"), a numpy dtype or scalar type, or a torch dtype. Throws py::value_error
/// naming what it got.
[[nodiscard]] Element parse_element(const py::object& dtype);

/// Memory shared with the daemon, seen as a C-contiguous array.
struct View {
  std::shared_ptr<const void> owner;  ///< keeps the mapping alive
  std::byte* data = nullptr;
  Element element = Element::uint8;
  std::vector<std::int64_t> shape;
  bool device = false;  ///< CUDA device memory (data is a device address)
  int device_id = -1;

  [[nodiscard]] std::size_t count() const noexcept;
  [[nodiscard]] std::size_t nbytes() const noexcept { return count() * element_bytes(element); }
};

/// Makes a view of `bytes` bytes at `data`, owned by `owner`, as `dtype` elements in
/// `shape` (None: one dimension over the whole region), starting `offset` bytes in.
/// Throws py::value_error when it does not fit or is misaligned.
[[nodiscard]] View make_view(std::shared_ptr<const void> owner, std::byte* data, std::size_t bytes,
                             bool device, int device_id, const py::object& dtype,
                             const py::object& shape, std::size_t offset);

/// A caller's host buffer, borrowed for one call: through the buffer protocol first, else
/// through __dlpack__ (a CPU tensor). Released on destruction (needs the GIL).
class Borrowed {
 public:
  /// Buffer protocol first; when that fails (bfloat16 views, non-contiguous arrays) and
  /// the object has __dlpack__, DLPack.
  /// Throws py::type_error when `object` offers neither or is not host memory, and
  /// ValueError (numpy's, or py::value_error) when it is not C-contiguous or is read-only
  /// while `writable` is asked for.
  Borrowed(const py::object& object, bool writable, const char* what);
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed();

  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return bytes_; }

 private:
  Py_buffer buffer_{};
  bool have_buffer_ = false;
  // The DLManagedTensor, deleted on destruction: a member, so that a constructor that
  // refuses the tensor after taking it still deletes it.
  std::unique_ptr<void, void (*)(void*)> dlpack_{nullptr, nullptr};
  std::span<std::byte> bytes_;
};

/// Registers statepool.View.
void bind_views(py::module_& m);

}  // namespace statepool::python
