#include "statepool/support/size.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace statepool::support {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

struct Unit {
  std::string_view name;  // lower case
  std::uint64_t bytes;
};

constexpr std::uint64_t kKi = 1024;
constexpr std::uint64_t kK = 1000;
constexpr std::array<Unit, 17> kUnits = {{
    {"", 1},
    {"b", 1},
    {"k", kKi},
    {"kib", kKi},
    {"kb", kK},
    {"m", kKi* kKi},
    {"mib", kKi* kKi},
    {"mb", kK* kK},
    {"g", kKi* kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"gb", kK* kK* kK},
    {"t", kKi* kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"tb", kK* kK* kK* kK},
    {"p", kKi* kKi* kKi* kKi* kKi},
    {"pib", kKi* kKi* kKi* kKi* kKi},
    {"pb", kK* kK* kK* kK* kK},
}};

constexpr std::string_view kUnitsText =
    "B; KiB MiB GiB TiB PiB or K M G T P (powers of 1024); kB MB GB TB PB (powers of 1000)";

bool is_space(char c) noexcept {
  return c == ' ' || c == '\t';
}
bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}

std::string_view trim(std::string_view text) noexcept {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument(what + " (expected a number, fractions allowed, and an optional " +
                              "unit: " + std::string(kUnitsText) + ")");
}

std::string quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

const Unit* find_unit(std::string_view unit) noexcept {
  std::string lower(unit);
  for (char& c : lower)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  for (const Unit& u : kUnits)
    if (u.name == lower) return &u;
  return nullptr;
}

}  // namespace

std::string_view size_units_text() noexcept {
  return kUnitsText;
}

std::uint64_t parse_size(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) refuse("empty size " + quoted(text));
  if (t.front() == '-') refuse("negative size " + quoted(text));

  // Whole part, exactly; `whole_overflow` remembers a part past 2^64 - 1 (too large with
  // any unit, but the unit is checked first so that "99999999999999999999XB" names the
  // unit).
  std::size_t pos = 0;
  std::uint64_t whole = 0;
  bool whole_overflow = false;
  std::size_t digits = 0;
  for (; pos < t.size() && is_digit(t[pos]); ++pos, ++digits) {
    const auto d = static_cast<std::uint64_t>(t[pos] - '0');
    if (whole > (kMax - d) / 10) whole_overflow = true;
    whole = whole_overflow ? kMax : whole * 10 + d;
  }
  std::string_view fraction;
  if (pos < t.size() && t[pos] == '.') {
    const std::size_t first = ++pos;
    while (pos < t.size() && is_digit(t[pos])) ++pos;
    fraction = t.substr(first, pos - first);
    digits += fraction.size();
  }
  if (digits == 0) refuse("not a size: " + quoted(text));
  std::size_t unit_start = pos;
  while (unit_start < t.size() && is_space(t[unit_start])) ++unit_start;
  const std::string_view unit_text = t.substr(unit_start);
  const Unit* unit = find_unit(unit_text);
  if (unit == nullptr) {
    if (!unit_text.empty() && (is_digit(unit_text.front()) || unit_text.front() == '.')) {
      refuse("not a size: " + quoted(text));  // "1.2.3", "12 34"
    }
    refuse("unknown size unit " + quoted(unit_text) + " in " + quoted(text));
  }

  // floor(unit * 0.f1 f2 ... fn), exactly, from the last digit back: with w(n+1) = 0 and
  // w(i) = floor((unit * fi + w(i+1)) / 10), w(1) is the floor, since floor((a + x) / 10)
  // = floor((a + floor(x)) / 10) for whole a. Every w stays below `unit`.
  std::uint64_t part = 0;
  for (auto it = fraction.rbegin(); it != fraction.rend(); ++it)
    part = (unit->bytes * static_cast<std::uint64_t>(*it - '0') + part) / 10;

  if (whole_overflow || whole > (kMax - part) / unit->bytes)
    refuse("size " + quoted(text) + " is too large: more than 18446744073709551615 bytes");
  return whole * unit->bytes + part;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<const char*, 7> kNames = {"B",   "KiB", "MiB", "GiB",
                                                        "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  const long long tenths = std::llround(value * 10.0);
  if (tenths < 100) {
    return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " " + kNames[unit];
  }
  const long long whole = std::llround(value);
  if (whole >= 1024 && unit + 1 < kNames.size()) return std::string("1.0 ") + kNames[unit + 1];
  return std::to_string(whole) + " " + kNames[unit];
}

}  // namespace statepool::support
