// parse_redis_url, to_string(RedisEndpoint), redis_crc16 and redis_key_slot: the parts of
// the Redis client that need no hiredis (built with or without it).
//
// The URL is parsed here rather than with Boost.URL: its implementation is compiled once,
// in statepool_service (service/http/boost_url.cpp), which this library sits below, and
// "host:port,host:port" is not an authority Boost.URL accepts anyway (the port would be
// "port,host:port"), so it would only ever see a reassembled first host.
//
// Thread-safety: pure functions.

#include <arpa/inet.h>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "store/redis_store.hpp"

namespace statepool::service {
namespace {

constexpr std::array<std::uint16_t, 256> make_crc16_table() {
  std::array<std::uint16_t, 256> table{};
  for (unsigned byte = 0; byte < 256; ++byte) {
    unsigned crc = byte << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000U) != 0 ? (crc << 1) ^ 0x1021U : crc << 1;
    }
    table[byte] = static_cast<std::uint16_t>(crc & 0xFFFFU);
  }
  return table;
}
constexpr auto kCrc16Table = make_crc16_table();

// The URL as messages show it: the password, if any, replaced by "***".
std::string masked(std::string_view url) {
  const std::size_t start = url.find("://");
  if (start == std::string_view::npos) return std::string(url);
  const std::size_t end = url.find_first_of("/?#", start + 3);
  const std::string_view authority = url.substr(
      start + 3, end == std::string_view::npos ? std::string_view::npos : end - (start + 3));
  const std::size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const std::string_view userinfo = authority.substr(0, at);
  const std::size_t colon = userinfo.find(':');
  if (colon == std::string_view::npos) return std::string(url);
  std::string out(url.substr(0, start + 3));
  out += userinfo.substr(0, colon + 1);
  out += "***";
  out += url.substr(start + 3 + at);
  return out;
}

[[noreturn]] void fail(std::string_view url, const std::string& what) {
  throw std::invalid_argument("redis URL \"" + masked(url) + "\": " + what);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view url, std::string_view text, const char* what) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int high = i + 2 < text.size() ? hex_value(text[i + 1]) : -1;
    const int low = high >= 0 ? hex_value(text[i + 2]) : -1;
    if (low < 0) fail(url, std::string("bad percent-encoding in the ") + what);
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

std::uint16_t parse_port(std::string_view url, std::string_view host_port, std::string_view text) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value == 0 ||
      value > 65535) {
    fail(url, "bad port \"" + std::string(text) + "\" in \"" + std::string(host_port) +
                  "\" (a number from 1 to 65535)");
  }
  return static_cast<std::uint16_t>(value);
}

RedisEndpoint parse_host_port(std::string_view url, std::string_view item) {
  if (item.empty()) fail(url, "empty host (two commas, or a comma at an end?)");
  RedisEndpoint endpoint;
  std::string_view rest;
  if (item.front() == '[') {
    const std::size_t close = item.find(']');
    if (close == std::string_view::npos) {
      fail(url, "\"" + std::string(item) + "\": '[' without ']'");
    }
    endpoint.host = std::string(item.substr(1, close - 1));
    in6_addr address{};
    if (::inet_pton(AF_INET6, endpoint.host.c_str(), &address) != 1) {
      fail(url, "\"" + endpoint.host + "\" is not an IPv6 address");
    }
    rest = item.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') {
      fail(url, "\"" + std::string(item) + "\": expected ':' and a port after ']'");
    }
  } else {
    const std::size_t colon = item.find(':');
    if (colon != std::string_view::npos && item.find(':', colon + 1) != std::string_view::npos) {
      fail(url, "\"" + std::string(item) + "\": an IPv6 address needs brackets ([::1]:6379)");
    }
    endpoint.host = std::string(item.substr(0, colon));
    if (endpoint.host.empty()) fail(url, "\"" + std::string(item) + "\": no host");
    for (const char c : endpoint.host) {
      if (!is_name_char(c)) {
        fail(url, "bad character '" + std::string(1, c) + "' in host \"" + endpoint.host + "\"");
      }
    }
    rest = colon == std::string_view::npos ? std::string_view{} : item.substr(colon);
  }
  if (!rest.empty()) endpoint.port = parse_port(url, item, rest.substr(1));
  return endpoint;
}

}  // namespace

RedisOptions parse_redis_url(std::string_view url) {
  for (const char c : url) {
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7F) {
      fail(url, "spaces, control characters and non-ASCII bytes are not allowed");
    }
  }
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) {
    fail(url, "expected redis://host:port[,host:port...]");
  }
  std::string scheme(url.substr(0, scheme_end));
  for (char& c : scheme) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (scheme == "rediss") {
    fail(url, "TLS (rediss://) is not supported: the hiredis this uses has no TLS");
  }
  if (scheme != "redis") {
    fail(url, "scheme \"" + scheme + "\" is not redis:// (expected redis://host:port)");
  }

  std::string_view rest = url.substr(scheme_end + 3);
  const std::size_t authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  const std::string_view tail =
      authority_end == std::string_view::npos ? std::string_view{} : rest.substr(authority_end);

  RedisOptions options;
  const std::size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const std::size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      fail(url, "a user name without a password; write redis://:PASSWORD@host:port");
    }
    const std::string user = percent_decode(url, userinfo.substr(0, colon), "user name");
    if (!user.empty() && user != "default") {
      fail(url, "user \"" + user +
                    "\": Redis ACL users are not supported, only a password "
                    "(redis://:PASSWORD@host:port)");
    }
    options.password = percent_decode(url, userinfo.substr(colon + 1), "password");
    if (options.password.empty()) fail(url, "empty password after ':'");
  }

  if (!tail.empty()) {
    if (tail.front() != '/') fail(url, "query parameters and fragments are not supported");
    const std::string_view path = tail.substr(1);
    if (path.find_first_of("?#") != std::string_view::npos) {
      fail(url, "query parameters and fragments are not supported");
    }
    if (!path.empty() && path != "0") {
      fail(url, "database \"" + std::string(path) +
                    "\": only database 0 is supported (Redis Cluster has no other)");
    }
  }

  if (authority.empty()) fail(url, "no host (expected redis://host:port)");
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = authority.find(',', start);
    options.seeds.push_back(parse_host_port(url, authority.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return options;
}

std::string to_string(const RedisEndpoint& endpoint) {
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  return (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

std::uint16_t redis_crc16(std::string_view bytes) noexcept {
  unsigned crc = 0;
  for (const char c : bytes) {
    const unsigned index = ((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xFFU;
    crc = ((crc << 8) ^ kCrc16Table[index]) & 0xFFFFU;
  }
  return static_cast<std::uint16_t>(crc);
}

std::uint16_t redis_key_slot(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<std::uint16_t>(redis_crc16(key) % kRedisClusterSlots);
}

}  // namespace statepool::service
