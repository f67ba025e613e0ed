#pragma once
// The one whole-file reader in statepool (model configs, calibration manifests and page
// files, the daemon's token file). Files are written with write_file_atomic
// (atomic_file.hpp).
//
// Thread-safety: a pure function (distinct paths may be read concurrently).

#include <cstddef>
#include <string>

namespace statepool::support {

/// The whole file. Throws std::runtime_error naming the path and what is wrong: "PATH:
/// cannot open: No such file or directory", "PATH: is a directory", "PATH: not a regular
/// file", "PATH: file of N bytes is larger than the limit of M", or a read error.
[[nodiscard]] std::string read_file(const std::string& path, std::size_t max_bytes);

}  // namespace statepool::support
