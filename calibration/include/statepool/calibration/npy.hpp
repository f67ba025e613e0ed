#pragma once
// A strict reader and writer of NumPy .npy files holding little-endian float32 arrays in
// C order: the one format calibration traces and state files use (docs/calibration.md).
//
// Accepted: format versions 1.0, 2.0 and 3.0 (3.0 differs from 2.0 only in the header's
// text encoding), a header dictionary with exactly the keys 'descr', 'fortran_order' and
// 'shape', descr '<f4' (little-endian float32; nothing else), fortran_order False, and a data
// section of exactly prod(shape) * 4 bytes. Everything else is refused with an NpyError naming the
// file and the problem: other dtypes, Fortran order, malformed or truncated headers, missing or
// trailing data.
//
// Memory: NpyReader reads row ranges on demand (pread), so a file of any size is read
// with a buffer of the caller's choosing. NpyWriter streams rows to a temporary file next
// to <path> (support::AtomicFileWriter) and renames it to <path> only when the promised
// number of values was written, so a failed or interrupted write never leaves a file that
// looks complete, and an older file at <path> stays until then.
//
// Thread-safety: an NpyReader may be read from several threads at once (pread has no
// shared file position); an NpyWriter belongs to one thread.

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/support/atomic_file.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::calibration {

/// Any problem with a .npy file (format, shape, I/O). The message names the path.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Largest number of dimensions accepted (numpy's own limit is 64).
inline constexpr std::size_t kNpyMaxRank = 32;

/// What a header says, once parsed.
struct NpyHeader {
  std::uint8_t major = 1;
  std::uint8_t minor = 0;
  std::vector<std::uint64_t> shape;
  std::size_t data_offset = 0;  ///< bytes before the first value
  /// prod(shape): number of float32 values (1 for a 0-d array).
  [[nodiscard]] std::uint64_t values() const noexcept;
};

/// Parses the header at the start of `bytes` (the first bytes of a file; it may hold more
/// than the header). Throws NpyError("<what>: ...") on anything but '<f4' C-order data;
/// `what` names the source in messages.
[[nodiscard]] NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& what);

/// Bytes of a version 1.0 header (padded to a multiple of 64 as numpy does) followed by
/// nothing: what NpyWriter writes before the values.
[[nodiscard]] std::vector<std::byte> make_npy_header(std::span<const std::uint64_t> shape);

/// "[32, 128, 128]" for messages.
[[nodiscard]] std::string shape_text(std::span<const std::uint64_t> shape);

class NpyReader {
 public:
  /// Opens and checks the file (header and exact size). Throws NpyError.
  explicit NpyReader(std::string path);
  ~NpyReader() = default;
  NpyReader(NpyReader&& other) noexcept = default;
  NpyReader& operator=(NpyReader&& other) noexcept = default;
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::vector<std::uint64_t>& shape() const noexcept { return header_.shape; }
  /// Extent of the first dimension (1 for a 0-d array).
  [[nodiscard]] std::uint64_t rows() const noexcept;
  /// Values per row: product of the other dimensions.
  [[nodiscard]] std::uint64_t row_values() const noexcept;

  /// Reads rows [first, first + count) into `out` (count * row_values() floats).
  /// Throws NpyError on a range past the end, a wrong buffer size or an I/O error.
  void read_rows(std::uint64_t first, std::uint64_t count, std::span<float> out) const;

 private:
  std::string path_;
  NpyHeader header_;
  support::UniqueFd fd_;
};

class NpyWriter {
 public:
  /// Creates the temporary file and writes the header. Throws NpyError.
  NpyWriter(std::string path, std::vector<std::uint64_t> shape);
  /// Removes the temporary file unless finish() succeeded.
  ~NpyWriter() = default;
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  /// Appends values (any number; the total must not pass prod(shape)).
  void append(std::span<const float> values);
  /// Checks that exactly prod(shape) values were written, then syncs and renames the
  /// temporary file to `path`.
  void finish();

  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }
  [[nodiscard]] std::uint64_t expected() const noexcept { return expected_; }

 private:
  std::string path_;
  std::uint64_t expected_ = 0;
  std::uint64_t written_ = 0;
  support::AtomicFileWriter file_;
  bool finished_ = false;
};

/// A whole array in memory.
struct NpyArray {
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};

/// Reads a whole file; refuses files of more than `max_values` values (a guard against
/// loading a huge trace tensor by mistake).
[[nodiscard]] NpyArray read_npy(const std::string& path, std::uint64_t max_values = 1ull << 30);
/// Writes a whole array (through NpyWriter: atomic). `values.size()` must equal prod(shape).
void write_npy(const std::string& path, std::span<const std::uint64_t> shape,
               std::span<const float> values);

}  // namespace statepool::calibration
