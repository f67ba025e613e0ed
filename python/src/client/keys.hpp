#pragma once
// Snapshot keys as Python gives them (snapshots.cpp, snapshot_batches.cpp): a prefix is
// bytes as they are, or a str as its UTF-8 bytes.

#include <string>
#include <variant>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace statepool::python {

namespace py = pybind11;

/// A snapshot key's prefix: bytes, or str (its UTF-8 bytes).
using PrefixArg = std::variant<py::bytes, std::string>;

inline std::string prefix_bytes(const PrefixArg& prefix) {
  if (const auto* b = std::get_if<py::bytes>(&prefix)) return std::string(*b);
  return std::get<std::string>(prefix);
}

}  // namespace statepool::python
