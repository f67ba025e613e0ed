#pragma once
// Little-endian loads and stores on byte buffers (internal to the CPU codecs).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace statepool::kernels::detail {

inline void store_u16_le(std::byte* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::byte>(v & 0xFFu);
  p[1] = static_cast<std::byte>(v >> 8);
}

inline std::uint16_t load_u16_le(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>(std::to_integer<std::uint32_t>(p[0]) |
                                    (std::to_integer<std::uint32_t>(p[1]) << 8));
}

// Hosts are little-endian (static_assert in format.hpp): native loads are LE loads.
inline std::uint32_t load_u32(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store_u32(std::byte* p, std::uint32_t v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

inline std::uint8_t* as_u8(std::byte* p) noexcept {
  return reinterpret_cast<std::uint8_t*>(p);
}
inline const std::uint8_t* as_u8(const std::byte* p) noexcept {
  return reinterpret_cast<const std::uint8_t*>(p);
}

}  // namespace statepool::kernels::detail
