#pragma once
// FNV-1a 64 over a canonical little-endian encoding, and its 16-hex-digit form: the
// content digests of plans (docs/plans.md) and layouts (layout_digest). Internal to the
// kernels library.
//
// Thread-safety: a value type; pure functions.

#include <cstddef>
#include <cstdint>
#include <string>

namespace statepool::kernels {

class Fnv1a {
 public:
  void bytes(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      h_ = (h_ ^ p[i]) * 0x100000001B3ull;
    }
  }
  void u8(std::uint8_t v) noexcept { bytes(&v, 1); }
  void u32(std::uint32_t v) noexcept {
    const unsigned char b[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                                static_cast<unsigned char>(v >> 16),
                                static_cast<unsigned char>(v >> 24)};
    bytes(b, 4);
  }
  void u64(std::uint64_t v) noexcept {
    u32(static_cast<std::uint32_t>(v));
    u32(static_cast<std::uint32_t>(v >> 32));
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 0xCBF29CE484222325ull;
};

/// `v` as 16 lowercase hex digits, most significant first.
inline std::string hex64(std::uint64_t v) {
  std::string out(16, '0');
  constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    out[static_cast<std::size_t>(15 - i)] = kHex[(v >> (4 * i)) & 0xFu];
  }
  return out;
}

}  // namespace statepool::kernels
