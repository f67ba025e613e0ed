#pragma once
// Descriptor counting for leak checks: tests take the count before and compare after.

#include <cstddef>
#include <filesystem>

namespace statepool::testing {

/// Open descriptors of this process (entries of /proc/self/fd, minus the one used to
/// list them).
inline std::size_t open_fd_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n - 1;
}

}  // namespace statepool::testing
