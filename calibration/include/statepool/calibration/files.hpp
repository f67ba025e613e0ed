#pragma once
// Whole-file helpers of the calibration tools. Files are written with
// support::write_file_atomic (statepool/support/atomic_file.hpp).
//
// Thread-safety: pure functions (distinct paths may be used concurrently).

#include <cstddef>
#include <string>

namespace statepool::calibration {

/// The whole file, refusing one larger than max_bytes or not a regular file. Throws
/// std::runtime_error naming the path.
[[nodiscard]] std::string read_file(const std::string& path, std::size_t max_bytes);

}  // namespace statepool::calibration
