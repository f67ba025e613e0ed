#pragma once
// The one way statepool writes a file that others may be reading (plan files, calibration
// outputs, reports): readers see the old file or the whole new one, never a part.
//
// How: the bytes go to a new temporary file in the target's directory (rename(2) is atomic
// only within one file system), named "<path>.tmp.<pid>.<8 hex digits>" and created with
// O_CREAT | O_EXCL | O_CLOEXEC (so it never follows a planted link and is not inherited by
// child processes). commit() fsyncs and closes it, renames it over `path` and fsyncs the
// directory, so that the new name survives a crash too.
//
// Failure: every error before the rename removes the temporary file and throws
// std::runtime_error "<path>: <what failed> <temporary>: <errno text>"; `path` is left as
// it was (absent, or the complete old file). Syncing the directory after the rename is
// best effort: by then readers already see the complete new file, and if the sync fails a
// crash can at worst bring back the complete old one, so that is not reported as failure.
//
// Thread-safety: one AtomicFileWriter belongs to one thread; distinct writers (even for
// the same path: the last commit wins) may run concurrently.

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>

#include "statepool/support/unique_fd.hpp"

namespace statepool::support {

/// Streams bytes into the temporary file; publishes it at `path` on commit().
class AtomicFileWriter {
 public:
  /// Creates the temporary file; `mode` as for open(2) (the umask applies). Throws
  /// std::runtime_error (e.g. the directory is missing or not writable).
  explicit AtomicFileWriter(std::string path, mode_t mode = 0644);
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  AtomicFileWriter(AtomicFileWriter&&) = delete;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;

  /// Appends all of `bytes` (short writes and EINTR are retried). Throws std::runtime_error
  /// after a failure (the temporary file is then removed and the writer is done), or when
  /// the writer is already done.
  void write(std::span<const std::byte> bytes);
  /// fsync, close, rename over `path`, fsync the directory. Throws std::runtime_error as
  /// above, leaving `path` untouched. Afterwards the writer is done.
  void commit();
  /// Removes the temporary file now (also what the destructor does). Never throws.
  void discard() noexcept;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::string& temporary_path() const noexcept { return temporary_; }
  /// True until commit(), discard() or a failure.
  [[nodiscard]] bool open() const noexcept { return fd_.valid(); }

 private:
  [[noreturn]] void fail(const char* what, int err);

  std::string path_;
  std::string temporary_;
  UniqueFd fd_;
};

/// The whole file at once: AtomicFileWriter(path, mode), write(bytes), commit().
void write_file_atomic(const std::string& path, std::span<const std::byte> bytes,
                       mode_t mode = 0644);

}  // namespace statepool::support
