#pragma once
// Lease tokens: the secret a client presents to resume its lease after a reconnect.

#include <string>
#include <string_view>

namespace statepool::service {

inline constexpr std::size_t kLeaseTokenChars = 32;  ///< 128 random bits, lowercase hex

/// 32 lowercase hex characters from getrandom(2). Throws StatusError(internal) if the
/// kernel's CSPRNG cannot be read.
[[nodiscard]] std::string make_lease_token();

/// True when `token` has the shape make_lease_token() produces.
[[nodiscard]] bool is_lease_token(std::string_view token) noexcept;

}  // namespace statepool::service
