#include "statepool/support/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <utility>

#include "statepool/support/errno_text.hpp"

namespace statepool::support {
namespace {

// Names taken by other writers (or left by a crashed one) are skipped; this many
// collisions in a row mean something else is wrong.
constexpr int kNameAttempts = 16;

std::string temporary_name(const std::string& path) {
  std::random_device random;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp.%d.%08x", static_cast<int>(::getpid()),
                static_cast<unsigned>(random()));
  return path + suffix;
}

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, mode_t mode) : path_(std::move(path)) {
  int err = 0;
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    temporary_ = temporary_name(path_);
    fd_.reset(::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
    if (fd_.valid()) return;
    err = errno;
    if (err != EEXIST) break;
  }
  throw std::runtime_error(path_ + ": cannot create " + temporary_ + ": " + errno_text(err));
}

AtomicFileWriter::~AtomicFileWriter() {
  discard();
}

void AtomicFileWriter::discard() noexcept {
  if (!fd_.valid()) return;
  fd_.reset();
  ::unlink(temporary_.c_str());
}

void AtomicFileWriter::fail(const char* what, int err) {
  fd_.reset();
  ::unlink(temporary_.c_str());
  throw std::runtime_error(path_ + ": " + what + " " + temporary_ + ": " + errno_text(err));
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) {
  if (!fd_.valid()) throw std::runtime_error(path_ + ": write after commit or failure");
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_.get(), bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

void AtomicFileWriter::commit() {
  if (!fd_.valid()) throw std::runtime_error(path_ + ": commit after commit or failure");
  if (::fsync(fd_.get()) != 0) fail("cannot sync", errno);
  // close(2) can report a failed write-back (NFS).
  if (!fd_.close()) fail("cannot close", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) fail("cannot rename", errno);
  // Best effort (see the header): the file is complete under its name either way.
  const UniqueFd dir(::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.valid()) (void)::fsync(dir.get());
}

void write_file_atomic(const std::string& path, std::span<const std::byte> bytes, mode_t mode) {
  AtomicFileWriter writer(path, mode);
  writer.write(bytes);
  writer.commit();
}

}  // namespace statepool::support
