#pragma once
// Text of an errno value for messages: thread-safe and allocation-free (strerrordesc_np),
// so destructors and signal-adjacent code may call it.

namespace statepool::support {

[[nodiscard]] const char* errno_text(int err) noexcept;

}  // namespace statepool::support
