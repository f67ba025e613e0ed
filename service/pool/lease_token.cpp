#include "pool/lease_token.hpp"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <system_error>

#include "statepool/support/status.hpp"

namespace statepool::service {

std::string make_lease_token() {
  std::array<unsigned char, kLeaseTokenChars / 2> raw{};
  std::size_t filled = 0;
  while (filled < raw.size()) {
    // Blocking mode (flags 0): waits only until the pool is initialised at boot.
    const ssize_t n = ::getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw StatusError(Status::internal, "getrandom: " + std::generic_category().message(errno));
    }
    filled += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(kLeaseTokenChars);
  for (const unsigned char byte : raw) {
    token.push_back(kHex[byte >> 4]);
    token.push_back(kHex[byte & 0x0f]);
  }
  return token;
}

bool is_lease_token(std::string_view token) noexcept {
  if (token.size() != kLeaseTokenChars) return false;
  for (const char c : token) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace statepool::service
