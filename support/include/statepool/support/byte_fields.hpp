#pragma once
// Fixed-width fields at offsets in byte buffers (the frame header, the hand-over image's
// and the crash journal's headers), copied with memcpy so that any alignment is fine.
// Host byte order: the formats that use them are little-endian, and say so with a
// static_assert where they are defined.

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace statepool::support {

template <class T>
void store_field(std::byte* dst, T value) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(dst, &value, sizeof(T));
}

template <class T>
[[nodiscard]] T load_field(const std::byte* src) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, src, sizeof(T));
  return value;
}

}  // namespace statepool::support
