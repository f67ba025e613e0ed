#pragma once
// Sizes with units: the one parser and the one formatter for every flag, config key, HTTP
// query and message in statepool (daemon, planner, tools). docs/operations.md, "Sizes".
//
// The convention (one for all of statepool):
//   - no unit, or B                  bytes
//   - KiB MiB GiB TiB PiB            binary: powers of 1024 (1 GiB = 1,073,741,824 B)
//   - K M G T P                      binary too: short for KiB ... PiB (the daemon's
//                                    flags always read `1G` as 1 GiB)
//   - kB MB GB TB PB                 decimal: powers of 1000 (1 GB = 1,000,000,000 B)
// Units are case-insensitive (`gib`, `GIB`, `kb`, `KB`); the `i` alone decides binary
// versus decimal for the two-letter forms. Spaces or tabs may stand around the text and
// between the number and its unit ("1.5 GiB"), not inside either.
//
// Numbers are decimal digits with an optional fractional part ("1.5GiB", ".5MiB", "2.");
// no sign, exponent or digit separators. The value is computed exactly (no floating
// point) and a result that is not a whole number of bytes is rounded DOWN to one
// ("1.5" = 1 B, "0.3KiB" = 307 B, "1.1GB" = 1,100,000,000 B): a limit or a capacity
// never grows by rounding.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

namespace statepool::support {

/// Bytes that `text` names, by the convention above. 0 is a size like any other (callers
/// check their own ranges). Throws std::invalid_argument for an empty, negative or
/// non-numeric text, an unknown unit, or a value above 2^64 - 1 bytes; the message quotes
/// the text and lists the accepted units, e.g. "unknown size unit 'XB' in '80XB' (...)".
[[nodiscard]] std::uint64_t parse_size(std::string_view text);

/// The units parse_size() accepts, for help texts and messages:
/// "B; KiB MiB GiB TiB PiB or K M G T P (powers of 1024); kB MB GB TB PB (powers of 1000)".
[[nodiscard]] std::string_view size_units_text() noexcept;

/// Bytes for people, in binary units: "0 B", "512 B", "4.0 KiB", "9.5 MiB", "512 MiB",
/// "1.2 GiB". One decimal below 10 of the unit, none from 10 up; rounded to nearest, and a
/// value that rounds up to 1024 of a unit is written in the next one ("1.0 MiB", never
/// "1024 KiB"). Not a round trip of parse_size(): it is for messages, not for exact bytes.
[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

}  // namespace statepool::support
