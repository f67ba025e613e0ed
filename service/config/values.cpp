// Value parsers shared by the options: sizes, durations, fractions, counts, id lists, and
// listen addresses ("IP:port").
#include "config/config.hpp"
#include "config/config_internal.hpp"

#include "statepool/support/size.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include <boost/asio/ip/address.hpp>

namespace statepool::service {

namespace config_detail {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// "0.8" (a decimal point and no unit) or "80%": a fraction; anything else is not one
// (a plain "1" is one byte, as parse_size reads it).
std::optional<double> parse_fraction(const std::string& text) {
  const std::string t = trim(text);
  const bool percent = !t.empty() && t.back() == '%';
  const std::string number = percent ? trim(t.substr(0, t.size() - 1)) : t;
  if (number.empty() || (!percent && number.find('.') == std::string::npos)) return std::nullopt;
  if (!std::all_of(number.begin(), number.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '.';
      }))
    return std::nullopt;
  if (std::count(number.begin(), number.end(), '.') > 1) return std::nullopt;
  const double value = std::stod(number);
  return percent ? value / 100.0 : value;
}

std::uint32_t to_u32(std::uint64_t value, const std::string& what) {
  if (value > 0xffffffffull) throw ConfigError(what + " is too large: " + std::to_string(value));
  return static_cast<std::uint32_t>(value);
}

std::uint64_t parse_count(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  if (t.empty() ||
      !std::all_of(t.begin(), t.end(), [](unsigned char c) { return std::isdigit(c) != 0; }) ||
      t.size() > 18) {
    throw ConfigError("invalid " + what + " '" + text + "': expected a whole number");
  }
  return std::stoull(t);
}

std::vector<std::uint32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<std::uint32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (trim(item).empty()) continue;
    ids.push_back(to_u32(parse_count(item, what), what));
  }
  return ids;
}

/// A count limit from `value`, which must lie in [1, max]; `what` names where it came from.
std::uint32_t count_limit(std::uint64_t value, std::uint64_t max, const std::string& what) {
  if (value < 1 || value > max) {
    throw ConfigError(what + " must be between 1 and " + std::to_string(max) + ", got " +
                      std::to_string(value));
  }
  return static_cast<std::uint32_t>(value);
}

}  // namespace config_detail

using namespace config_detail;

namespace {

// Splits "12.5GiB" into number and unit.
void split_number(const std::string& text, double& number, std::string& unit, bool& ok) {
  const std::string t = trim(text);
  std::size_t pos = 0;
  while (pos < t.size() && (std::isdigit(static_cast<unsigned char>(t[pos])) != 0 || t[pos] == '.'))
    ++pos;
  ok = pos > 0;
  if (!ok) return;
  try {
    std::size_t used = 0;
    number = std::stod(t.substr(0, pos), &used);
    ok = used == pos && std::isfinite(number) && number >= 0;
  } catch (const std::exception&) {
    ok = false;
  }
  unit = lower(trim(t.substr(pos)));
}

// "host:port" -> host (brackets kept) and port, checking the form and the port's range.
std::pair<std::string, std::uint16_t> split_host_port(const std::string& address,
                                                      const std::string& option) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ConfigError("invalid " + option + " '" + address + "': expected host:port");
  const std::uint64_t port = parse_count(address.substr(colon + 1), option + " port");
  if (port > 65535) throw ConfigError(option + " port must be at most 65535");
  return {address.substr(0, colon), static_cast<std::uint16_t>(port)};
}

}  // namespace

std::uint64_t parse_size(const std::string& text, const std::string& what) {
  try {
    return support::parse_size(text);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("invalid " + what + ": " + e.what());
  }
}

std::chrono::milliseconds parse_duration(const std::string& text, const std::string& what) {
  double number = 0;
  std::string unit;
  bool ok = false;
  split_number(text, number, unit, ok);
  static const std::map<std::string, double> kUnits = {
      {"ms", 1.0}, {"s", 1000.0}, {"m", 60000.0}, {"min", 60000.0}, {"h", 3600000.0}};
  auto it = kUnits.find(unit);
  if (ok && unit.empty() && number == 0) it = kUnits.find("ms");
  if (!ok || it == kUnits.end()) {
    throw ConfigError("invalid " + what + " '" + text +
                      "': expected a duration such as 500ms, 30s or 2m");
  }
  const double ms = number * it->second;
  if (ms > 1e12) throw ConfigError(what + " '" + text + "' is too long");
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

ListenAddress split_listen_address(const std::string& address, const std::string& option) {
  auto [host, port] = split_host_port(address, option);
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    throw ConfigError("invalid " + option + " '" + address +
                      "': write an IPv6 address in brackets, as in [::1]:" + std::to_string(port));
  }
  boost::system::error_code ec;
  const auto ip = boost::asio::ip::make_address(host, ec);
  if (ec || bracketed != ip.is_v6()) {
    throw ConfigError("invalid " + option + " '" + address + "': '" + host +
                      "' is not an IP address (host names are not resolved; use e.g. "
                      "127.0.0.1, 0.0.0.0 or [::1])");
  }
  return ListenAddress{host, port};
}

}  // namespace statepool::service
