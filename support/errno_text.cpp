#include "statepool/support/errno_text.hpp"

#include <cstring>

namespace statepool::support {

const char* errno_text(int err) noexcept {
  const char* text = ::strerrordesc_np(err);
  return text != nullptr ? text : "unknown error";
}

}  // namespace statepool::support
