#include "statepool/support/version.hpp"

namespace statepool::support {

const char* version() noexcept {
  return STATEPOOL_VERSION;  // support/CMakeLists.txt defines it from the project's version
}

}  // namespace statepool::support
