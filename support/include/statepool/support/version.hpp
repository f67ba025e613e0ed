#pragma once
// The project's version (CMakeLists.txt, project(... VERSION)), one definition for every
// place that says it: `statepoold --version`, the Hello reply's server name, the
// statepool_build_info metric and the hand-over image's writer.

namespace statepool::support {

/// "0.1.0": the version this library was built as.
[[nodiscard]] const char* version() noexcept;

}  // namespace statepool::support
