#include "store/snapshot_value.hpp"

#include <cstring>

#include <boost/algorithm/hex.hpp>
#include <boost/crc.hpp>

namespace statepool::service {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'S', 'N', 'A', 'P', '\r', '\n'};
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kCrcOffset = 16;
constexpr std::size_t kFixedBytes = 52;
constexpr std::size_t kDigestBytes = 16;

void put_le(std::string& out, std::size_t at, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) {
    out[at + i] = static_cast<char>((value >> (8 * i)) & 0xFFu);
  }
}

std::uint64_t get_le(std::string_view in, std::size_t at, std::size_t bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    value |= std::uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  }
  return value;
}

std::uint32_t crc_from(std::string_view value, std::size_t offset) {
  boost::crc_32_type crc;
  crc.process_bytes(value.data() + offset, value.size() - offset);
  return static_cast<std::uint32_t>(crc.checksum());
}

}  // namespace

std::string snapshot_value_frame(const SnapshotName& name, std::size_t page_bytes) {
  std::string out(kFixedBytes + name.space.size() + name.prefix.size() + page_bytes, '\0');
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_le(out, 8, kVersion, 2);
  put_le(out, 10, name.space.size(), 2);
  put_le(out, 12, name.prefix.size(), 2);
  put_le(out, 20, name.position, 8);
  put_le(out, 28, page_bytes, 8);
  std::string digest = name.layout_digest;
  digest.resize(kDigestBytes, '\0');
  std::memcpy(out.data() + 36, digest.data(), kDigestBytes);
  std::memcpy(out.data() + kFixedBytes, name.space.data(), name.space.size());
  std::memcpy(out.data() + kFixedBytes + name.space.size(), name.prefix.data(), name.prefix.size());
  return out;
}

std::span<std::byte> snapshot_value_page(std::string& value) noexcept {
  const std::size_t header = kFixedBytes + get_le(value, 10, 2) + get_le(value, 12, 2);
  return {reinterpret_cast<std::byte*>(value.data()) + header, value.size() - header};
}

void seal_snapshot_value(std::string& value) noexcept {
  put_le(value, kCrcOffset, crc_from(value, kCrcOffset + 4), 4);
}

std::string encode_snapshot_value(const SnapshotName& name, std::span<const std::byte> page) {
  std::string out = snapshot_value_frame(name, page.size());
  if (!page.empty()) std::memcpy(snapshot_value_page(out).data(), page.data(), page.size());
  seal_snapshot_value(out);
  return out;
}

std::optional<std::span<const std::byte>> decode_snapshot_value(std::string_view value,
                                                                const SnapshotName& expected,
                                                                std::size_t page_bytes,
                                                                std::string& why, bool check_crc) {
  const auto refuse = [&why](std::string reason) {
    why = std::move(reason);
    return std::nullopt;
  };
  if (value.size() < kFixedBytes || std::memcmp(value.data(), kMagic, sizeof kMagic) != 0) {
    return refuse("not a snapshot value (" + std::to_string(value.size()) + " bytes)");
  }
  const std::uint64_t version = get_le(value, 8, 2);
  if (version != kVersion) {
    return refuse("snapshot value format " + std::to_string(version) + ", this daemon reads " +
                  std::to_string(kVersion));
  }
  const std::size_t space = get_le(value, 10, 2);
  const std::size_t prefix = get_le(value, 12, 2);
  const std::uint64_t page = get_le(value, 28, 8);
  if (page > value.size() || value.size() != kFixedBytes + space + prefix + page) {
    return refuse("truncated: " + std::to_string(value.size()) + " bytes for a " +
                  std::to_string(page) + "-byte page");
  }
  if (check_crc && get_le(value, kCrcOffset, 4) != crc_from(value, kCrcOffset + 4)) {
    return refuse("checksum mismatch");
  }
  const std::string_view digest(value.data() + 36, kDigestBytes);
  const std::string_view space_text(value.data() + kFixedBytes, space);
  const std::string_view prefix_text(value.data() + kFixedBytes + space, prefix);
  if (space_text != expected.space || prefix_text != expected.prefix ||
      get_le(value, 20, 8) != expected.position) {
    return refuse("the value is another snapshot's");
  }
  if (digest != expected.layout_digest) {
    return refuse("layout digest " + std::string(digest) + ", expected " + expected.layout_digest);
  }
  if (page != page_bytes) {
    return refuse("a page of " + std::to_string(page) + " bytes, expected " +
                  std::to_string(page_bytes));
  }
  const auto* data =
      reinterpret_cast<const std::byte*>(value.data() + kFixedBytes + space + prefix);
  return std::span<const std::byte>(data, page);
}

std::string remote_key(const SnapshotName& name) {
  std::string key = "statepool:snap:1:" + name.space + ":" + name.layout_digest + ":" +
                    std::to_string(name.position) + ":";
  boost::algorithm::hex_lower(name.prefix, std::back_inserter(key));
  return key;
}

}  // namespace statepool::service
