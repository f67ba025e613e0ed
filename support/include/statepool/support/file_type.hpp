#pragma once
// What a descriptor that should have been a memfd is instead, for error messages ("the
// descriptor is a pipe, not a memfd"): the client memory checks and the crash journal's.

#include <sys/types.h>

namespace statepool::support {

/// "a directory", "a pipe", "a socket", "a character device", "a block device",
/// "a symbolic link", else "not a regular file" (st_mode of fstat).
[[nodiscard]] const char* file_type_text(mode_t mode) noexcept;

}  // namespace statepool::support
