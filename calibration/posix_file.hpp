#pragma once
// Small POSIX file helpers shared by the calibration sources (internal). Descriptors are
// owned by support::UniqueFd, files are written with support::AtomicFileWriter.

#include <cstddef>
#include <cstdint>
#include <span>

namespace statepool::calibration::detail {

/// Reads exactly bytes.size() bytes at `offset`; false on error or end of file
/// (errno 0 then).
[[nodiscard]] bool pread_all(int fd, std::span<std::byte> bytes, std::uint64_t offset) noexcept;

}  // namespace statepool::calibration::detail
