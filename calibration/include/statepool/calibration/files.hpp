#pragma once
// Whole-file helpers of the calibration tools.
//
// Thread-safety: pure functions (distinct paths may be used concurrently).

#include <cstddef>
#include <span>
#include <string>

namespace statepool::calibration {

/// The whole file, refusing one larger than max_bytes or not a regular file. Throws
/// std::runtime_error naming the path.
[[nodiscard]] std::string read_file(const std::string& path, std::size_t max_bytes);

/// Writes `bytes` to "<path>.partial", then renames it over `path`: readers see the old
/// file or the whole new one, and a failed write leaves nothing behind. Throws
/// std::runtime_error naming the path.
void write_file_atomic(const std::string& path, std::span<const std::byte> bytes);

}  // namespace statepool::calibration
