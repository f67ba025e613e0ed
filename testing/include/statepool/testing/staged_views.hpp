#pragma once
// Header-only: staged states as engines keep them (kernels/staged_view.hpp), built from
// statepool's packed layout for tests and benchmarks: every head transposed ([K][V] ->
// [V][K], a value-major view).

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace statepool::testing {

/// Every head of `in` ([rows][cols] matrices of `width`-byte values, back to back)
/// transposed; bytes after the last whole head are not copied (zero).
inline std::vector<std::byte> transpose_heads(std::span<const std::byte> in, std::size_t rows,
                                              std::size_t cols, std::size_t width) {
  std::vector<std::byte> out(in.size());
  const std::size_t head = rows * cols * width;
  for (std::size_t h = 0; h < in.size() / head; ++h) {
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < cols; ++c) {
        std::memcpy(out.data() + h * head + (c * rows + r) * width,
                    in.data() + h * head + (r * cols + c) * width, width);
      }
    }
  }
  return out;
}

}  // namespace statepool::testing
