#include "statepool/calibration/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "posix_file.hpp"
#include "statepool/support/errno_text.hpp"

namespace statepool::calibration {
namespace {

constexpr std::array<unsigned char, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
// numpy refuses headers above 10000 bytes unless told otherwise; we allow more, bounded.
constexpr std::size_t kMaxHeaderBytes = 1u << 16;
constexpr std::size_t kWriteSlice = 1u << 20;

[[noreturn]] void fail(const std::string& what, const std::string& message) {
  throw NpyError(what + ": " + message);
}

// Runs an AtomicFileWriter call, reporting its failures as NpyError (their messages
// already start with the path).
template <typename Call>
decltype(auto) npy_io(Call&& call) {
  try {
    return call();
  } catch (const std::runtime_error& e) {
    throw NpyError(e.what());
  }
}

// A strict parser of the Python dictionary literal numpy writes as the header, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  std::vector<std::uint64_t> parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<std::vector<std::uint64_t>> shape;
    skip_ws();
    expect('{', "header must be a dictionary starting with '{'");
    skip_ws();
    while (peek() != '}') {
      const std::string key = parse_string("dictionary key");
      skip_ws();
      expect(':', "expected ':' after key '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (descr) fail(what_, "header repeats key 'descr'");
        descr = parse_string("value of 'descr'");
      } else if (key == "fortran_order") {
        if (fortran) fail(what_, "header repeats key 'fortran_order'");
        fortran = parse_bool();
      } else if (key == "shape") {
        if (shape) fail(what_, "header repeats key 'shape'");
        shape = parse_shape();
      } else {
        fail(what_, "unexpected header key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != '}') {
        fail(what_, "expected ',' or '}' in the header dictionary");
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != text_.size()) {
      fail(what_, "unexpected text after the header dictionary");
    }
    if (!descr) fail(what_, "header has no 'descr'");
    if (!fortran) fail(what_, "header has no 'fortran_order'");
    if (!shape) fail(what_, "header has no 'shape'");
    if (*descr != "<f4") {
      fail(what_, "dtype '" + *descr +
                      "' is not supported: only '<f4' (little-endian float32) is accepted");
    }
    if (*fortran) {
      fail(what_, "Fortran-order arrays are not supported: write C-order (np.ascontiguousarray)");
    }
    return std::move(*shape);
  }

 private:
  [[nodiscard]] char peek() const {
    if (pos_ >= text_.size()) {
      fail(what_, "header ends inside the dictionary");
    }
    return text_[pos_];
  }

  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c, const std::string& message) {
    if (peek() != c) {
      fail(what_, message);
    }
    ++pos_;
  }

  std::string parse_string(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') {
      fail(what_, "expected a quoted string as " + what);
    }
    ++pos_;
    std::string out;
    while (peek() != quote) {
      if (peek() == '\\') {
        fail(what_, "escapes are not supported in header strings");
      }
      out.push_back(text_[pos_++]);
    }
    ++pos_;
    return out;
  }

  bool parse_bool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail(what_, "'fortran_order' must be True or False");
  }

  std::uint64_t parse_uint() {
    if (peek() < '0' || peek() > '9') {
      fail(what_, "shape entries must be non-negative integers");
    }
    std::uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (value > (std::numeric_limits<std::uint64_t>::max() / 4 - digit) / 10) {
        fail(what_, "shape entry is too large");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    return value;
  }

  std::vector<std::uint64_t> parse_shape() {
    expect('(', "'shape' must be a tuple such as (3, 4) or (3,)");
    std::vector<std::uint64_t> shape;
    bool trailing_comma = false;
    skip_ws();
    while (peek() != ')') {
      shape.push_back(parse_uint());
      if (shape.size() > kNpyMaxRank) {
        fail(what_, "shape has more than " + std::to_string(kNpyMaxRank) + " dimensions");
      }
      skip_ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (peek() != ')') {
        fail(what_, "expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;
    if (shape.size() == 1 && !trailing_comma) {
      fail(what_, "'shape' (n) is not a tuple: a one-dimensional shape is written (n,)");
    }
    return shape;
  }

  std::string_view text_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

std::uint64_t checked_values(std::span<const std::uint64_t> shape, const std::string& what) {
  std::uint64_t values = 1;
  constexpr std::uint64_t kLimit = std::numeric_limits<std::uint64_t>::max() / 8;
  for (const std::uint64_t extent : shape) {
    if (extent != 0 && values > kLimit / extent) {
      fail(what, "shape " + shape_text(shape) + " has too many values");
    }
    values *= extent;
  }
  return values;
}

}  // namespace

std::uint64_t NpyHeader::values() const noexcept {
  std::uint64_t n = 1;
  for (const std::uint64_t extent : shape) {
    n *= extent;
  }
  return n;
}

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return out + "]";
}

NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& what) {
  if (bytes.size() < 10) {
    fail(what, "file is too short to be a .npy file (" + std::to_string(bytes.size()) + " bytes)");
  }
  const auto* u8 = reinterpret_cast<const unsigned char*>(bytes.data());
  if (!std::equal(kMagic.begin(), kMagic.end(), u8)) {
    fail(what, "not a .npy file (missing the \\x93NUMPY magic)");
  }
  NpyHeader header;
  header.major = u8[6];
  header.minor = u8[7];
  std::size_t length = 0;
  std::size_t start = 0;
  if (header.major == 1 && header.minor == 0) {
    length = static_cast<std::size_t>(u8[8]) | (static_cast<std::size_t>(u8[9]) << 8);
    start = 10;
  } else if ((header.major == 2 || header.major == 3) && header.minor == 0) {
    if (bytes.size() < 12) {
      fail(what, "truncated .npy header");
    }
    length = static_cast<std::size_t>(u8[8]) | (static_cast<std::size_t>(u8[9]) << 8) |
             (static_cast<std::size_t>(u8[10]) << 16) | (static_cast<std::size_t>(u8[11]) << 24);
    start = 12;
  } else {
    fail(what, "unsupported .npy format version " + std::to_string(header.major) + "." +
                   std::to_string(header.minor) + " (1.0, 2.0 and 3.0 are supported)");
  }
  if (length > kMaxHeaderBytes) {
    fail(what, "header length " + std::to_string(length) + " is larger than the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (bytes.size() < start + length) {
    fail(what, "truncated .npy header: it declares " + std::to_string(length) +
                   " bytes, the file has " + std::to_string(bytes.size() - start));
  }
  const std::string_view text(reinterpret_cast<const char*>(u8 + start), length);
  if (length == 0 || text.back() != '\n') {
    fail(what, "header does not end with a newline");
  }
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80 || (c < 0x20 && c != '\n' && c != '\t')) {
      fail(what, "header holds a non-printable or non-ASCII byte");
    }
  }
  header.shape = HeaderParser(text, what).parse();
  (void)checked_values(header.shape, what);
  header.data_offset = start + length;
  return header;
}

std::vector<std::byte> make_npy_header(std::span<const std::uint64_t> shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces so that magic + version + length + text is a multiple of 64.
  const std::size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xFFFF) {
    throw NpyError("shape " + shape_text(shape) + " needs a header too long for .npy 1.0");
  }
  std::vector<std::byte> out(10 + dict.size());
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  out[6] = std::byte{1};
  out[7] = std::byte{0};
  out[8] = static_cast<std::byte>(dict.size() & 0xFFu);
  out[9] = static_cast<std::byte>(dict.size() >> 8);
  std::memcpy(out.data() + 10, dict.data(), dict.size());
  return out;
}

// --- NpyReader ---------------------------------------------------------------------------

NpyReader::NpyReader(std::string path) : path_(std::move(path)) {
  support::UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    fail(path_, std::string("cannot open: ") + support::errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    fail(path_, std::string("cannot stat: ") + support::errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    fail(path_, "not a regular file");
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<std::byte> head(
      static_cast<std::size_t>(std::min<std::uint64_t>(file_size, 12 + kMaxHeaderBytes)));
  if (!detail::pread_all(fd.get(), head, 0)) {
    fail(path_, std::string("read failed: ") + support::errno_text(errno));
  }
  header_ = parse_npy_header(head, path_);
  const std::uint64_t data_bytes = header_.values() * 4;
  const std::uint64_t expected = header_.data_offset + data_bytes;
  if (file_size < expected) {
    fail(path_, "truncated data: shape " + shape_text(header_.shape) + " needs " +
                    std::to_string(data_bytes) + " bytes of float32 values, the file holds " +
                    std::to_string(file_size - header_.data_offset));
  }
  if (file_size > expected) {
    fail(path_, std::to_string(file_size - expected) + " unexpected bytes after the " +
                    std::to_string(data_bytes) + " bytes of data for shape " +
                    shape_text(header_.shape));
  }
  fd_ = std::move(fd);
}

std::uint64_t NpyReader::rows() const noexcept {
  return header_.shape.empty() ? 1 : header_.shape.front();
}

std::uint64_t NpyReader::row_values() const noexcept {
  std::uint64_t n = 1;
  for (std::size_t i = 1; i < header_.shape.size(); ++i) {
    n *= header_.shape[i];
  }
  return n;
}

void NpyReader::read_rows(std::uint64_t first, std::uint64_t count, std::span<float> out) const {
  if (first > rows() || count > rows() - first) {
    fail(path_, "rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                    ") are past the end (" + std::to_string(rows()) + " rows)");
  }
  if (out.size() != count * row_values()) {
    fail(path_, "read buffer holds " + std::to_string(out.size()) + " floats, " +
                    std::to_string(count * row_values()) + " needed");
  }
  const std::uint64_t offset = header_.data_offset + first * row_values() * 4;
  if (!detail::pread_all(fd_.get(), std::as_writable_bytes(out), offset)) {
    fail(path_, std::string("read failed: ") +
                    (errno == 0 ? "file shrank while being read" : support::errno_text(errno)));
  }
}

// --- NpyWriter ---------------------------------------------------------------------------

NpyWriter::NpyWriter(std::string path, std::vector<std::uint64_t> shape)
    : path_(std::move(path)),
      expected_(checked_values(shape, path_)),
      file_(npy_io([&] { return support::AtomicFileWriter(path_); })) {
  const std::vector<std::byte> header = make_npy_header(shape);
  npy_io([&] { file_.write(header); });
}

void NpyWriter::append(std::span<const float> values) {
  if (finished_ || !file_.open()) {
    fail(path_, "append after finish() or after a failed write");
  }
  if (values.size() > expected_ - written_) {
    fail(path_, "writing " + std::to_string(written_ + values.size()) +
                    " values into an array of " + std::to_string(expected_));
  }
  npy_io([&] { file_.write(std::as_bytes(values)); });
  written_ += values.size();
}

void NpyWriter::finish() {
  if (finished_) {
    return;
  }
  if (!file_.open()) {
    fail(path_, "finish() after a failed write");
  }
  if (written_ != expected_) {
    fail(path_, "only " + std::to_string(written_) + " of " + std::to_string(expected_) +
                    " values were written");
  }
  npy_io([&] { file_.commit(); });
  finished_ = true;
}

NpyArray read_npy(const std::string& path, std::uint64_t max_values) {
  const NpyReader reader(path);
  NpyArray array;
  array.shape = reader.shape();
  const std::uint64_t values = reader.rows() * reader.row_values();
  if (values > max_values) {
    fail(path, "array of " + std::to_string(values) + " values is larger than the limit of " +
                   std::to_string(max_values));
  }
  array.data.resize(static_cast<std::size_t>(values));
  reader.read_rows(0, reader.rows(), array.data);
  return array;
}

void write_npy(const std::string& path, std::span<const std::uint64_t> shape,
               std::span<const float> values) {
  NpyWriter writer(path, std::vector<std::uint64_t>(shape.begin(), shape.end()));
  if (values.size() != writer.expected()) {
    fail(path, std::to_string(values.size()) + " values given for shape " + shape_text(shape));
  }
  // Large arrays go out in bounded slices (write() may cap one call at ~2 GiB).
  for (std::size_t offset = 0; offset < values.size(); offset += kWriteSlice) {
    writer.append(values.subspan(offset, std::min(kWriteSlice, values.size() - offset)));
  }
  writer.finish();
}

}  // namespace statepool::calibration
