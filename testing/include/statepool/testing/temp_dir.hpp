#pragma once
// A private temporary directory and whole-file I/O, for tests and fixtures.
//
// Errors throw (std::runtime_error naming the path): an exception in a test is a failure
// with its message, so no GoogleTest is needed here.
//
// Thread-safety: a TempDir belongs to one owner; the functions are independent.

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace statepool::testing {

/// mkdtemp(prefix + "-XXXXXX"), removed with its contents at destruction. The default
/// prefix is <temp_directory_path>/statepool-test; fixtures that bind Unix sockets inside
/// pass a short absolute one ("/tmp/...": sun_path holds 108 bytes).
class TempDir {
 public:
  TempDir() : TempDir((std::filesystem::temp_directory_path() / "statepool-test").string()) {}
  explicit TempDir(const std::string& prefix) {
    std::string pattern = prefix + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// path()/name.
  [[nodiscard]] std::string file(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }

 private:
  std::string path_;
};

/// Writes `bytes` to `path` (created or truncated); throws when that fails.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    throw std::runtime_error("cannot write " + path);
  }
}

/// The whole file ("" when it cannot be read).
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline bool exists(const std::string& path) {
  return std::filesystem::exists(path);
}

/// Files beside `path` whose name is path's name plus a suffix ("plan.spqp.tmp.123.ab"):
/// what an interrupted atomic write (support::AtomicFileWriter) would leave behind.
inline std::vector<std::string> leftovers_of(const std::string& path) {
  const std::filesystem::path target(path);
  const std::string prefix = target.filename().string() + ".";
  std::vector<std::string> out;
  std::error_code ec;
  const auto dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

}  // namespace statepool::testing
