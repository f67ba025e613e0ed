#include "store/snapshot_value.hpp"

#include <cstring>
#include <limits>
#include <stdexcept>

#include <boost/algorithm/hex.hpp>
#include <boost/crc.hpp>

#include "statepool/kernels/stepquant/format.hpp"

namespace statepool::service {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'S', 'N', 'A', 'P', '\r', '\n'};
constexpr std::uint16_t kVersion = 2;
constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kCodecOffset = 14;
constexpr std::size_t kPageFormatOffset = 15;
constexpr std::size_t kCrcOffset = 16;
constexpr std::size_t kPageBytesOffset = 28;
constexpr std::size_t kDigestOffset = 36;
constexpr std::size_t kDigestBytes = 16;
constexpr std::size_t kKvLayersOffset = 52;
constexpr std::size_t kKvKeyChannelsOffset = 56;
constexpr std::size_t kKvValueChannelsOffset = 60;
constexpr std::size_t kKvTokensOffset = 64;
constexpr std::size_t kKvBytesOffset = 72;
constexpr std::size_t kFixedBytes = 80;
constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

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

/// The checks every reader starts with: the magic, this format's version, and the fixed
/// header there. False and `why` otherwise.
bool fixed_header(std::string_view value, std::string& why) {
  if (value.size() < kVersionOffset + 2 || std::memcmp(value.data(), kMagic, sizeof kMagic) != 0) {
    why = "not a snapshot value (" + std::to_string(value.size()) + " bytes)";
    return false;
  }
  if (const std::uint64_t version = get_le(value, kVersionOffset, 2); version != kVersion) {
    why = "snapshot value format version " + std::to_string(version) + ", this daemon reads " +
          std::to_string(kVersion);
    return false;
  }
  if (value.size() < kFixedBytes) {
    why = "truncated: " + std::to_string(value.size()) + " bytes, the header alone is " +
          std::to_string(kFixedBytes);
    return false;
  }
  if (const std::uint64_t format = get_le(value, kPageFormatOffset, 1);
      format != kernels::stepquant::kPageFormat) {
    why = "the page is in STEPQuant page format " + std::to_string(format) +
          (format == 0 ? " (written before 2026-12-05 as format 1)" : "") +
          ", this daemon reads format " + std::to_string(kernels::stepquant::kPageFormat) +
          " (a miss: the next put of this prefix stores it again)";
    return false;
  }
  return true;
}

std::size_t header_bytes(std::string_view value) noexcept {
  return kFixedBytes + get_le(value, 10, 2) + get_le(value, 12, 2);
}

}  // namespace

std::string snapshot_value_frame(const SnapshotName& name, std::size_t page_bytes,
                                 const std::optional<kernels::KvBlocks>& kv) {
  std::uint64_t kv_bytes = 0;
  if (kv) {
    if (const char* problem = kernels::kv_blocks_problem(*kv)) {
      throw std::invalid_argument(std::string("snapshot value: ") + problem);
    }
    kv_bytes = kernels::kv_blocks_encoded_bytes(*kv);  // well formed: no overflow
  }
  const std::size_t header = kFixedBytes + name.space.size() + name.prefix.size();
  if (page_bytes > kMax - header || kv_bytes > kMax - header - page_bytes) {
    throw std::invalid_argument("snapshot value: a page and KV blocks too large for one value");
  }
  std::string out(header + page_bytes + kv_bytes, '\0');
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_le(out, kVersionOffset, kVersion, 2);
  put_le(out, kPageFormatOffset, kernels::stepquant::kPageFormat, 1);
  put_le(out, 10, name.space.size(), 2);
  put_le(out, 12, name.prefix.size(), 2);
  put_le(out, 20, name.position, 8);
  put_le(out, kPageBytesOffset, page_bytes, 8);
  std::string digest = name.layout_digest;
  digest.resize(kDigestBytes, '\0');
  std::memcpy(out.data() + kDigestOffset, digest.data(), kDigestBytes);
  if (kv) {
    put_le(out, kCodecOffset, static_cast<std::uint64_t>(kv->codec) + 1, 1);
    put_le(out, kKvLayersOffset, kv->layers, 4);
    put_le(out, kKvKeyChannelsOffset, kv->key_channels, 4);
    put_le(out, kKvValueChannelsOffset, kv->value_channels, 4);
    put_le(out, kKvTokensOffset, kv->tokens, 8);
    put_le(out, kKvBytesOffset, kv_bytes, 8);
  }
  std::memcpy(out.data() + kFixedBytes, name.space.data(), name.space.size());
  std::memcpy(out.data() + kFixedBytes + name.space.size(), name.prefix.data(), name.prefix.size());
  return out;
}

std::span<std::byte> snapshot_value_page(std::string& value) noexcept {
  if (value.size() < kFixedBytes) return {};
  return {reinterpret_cast<std::byte*>(value.data()) + header_bytes(value),
          get_le(value, kPageBytesOffset, 8)};
}

std::span<std::byte> snapshot_value_kv(std::string& value) noexcept {
  if (value.size() < kFixedBytes) return {};
  const std::size_t at = header_bytes(value) + get_le(value, kPageBytesOffset, 8);
  return {reinterpret_cast<std::byte*>(value.data()) + at, get_le(value, kKvBytesOffset, 8)};
}

void seal_snapshot_value(std::string& value) noexcept {
  put_le(value, kCrcOffset, crc_from(value, kCrcOffset + 4), 4);
}

std::string encode_snapshot_value(const SnapshotName& name, std::span<const std::byte> page,
                                  const std::optional<kernels::KvBlocks>& kv,
                                  std::span<const std::byte> kv_bytes) {
  if (!kv && !kv_bytes.empty()) {
    throw std::invalid_argument("snapshot value: " + std::to_string(kv_bytes.size()) +
                                " KV bytes without KV blocks");
  }
  std::string out = snapshot_value_frame(name, page.size(), kv);
  const std::span<std::byte> kv_area = snapshot_value_kv(out);
  if (kv_bytes.size() != kv_area.size()) {
    throw std::invalid_argument("snapshot value: " + describe(*kv) + " are " +
                                std::to_string(kv_area.size()) + " encoded bytes, got " +
                                std::to_string(kv_bytes.size()));
  }
  if (!page.empty()) std::memcpy(snapshot_value_page(out).data(), page.data(), page.size());
  if (!kv_bytes.empty()) std::memcpy(kv_area.data(), kv_bytes.data(), kv_bytes.size());
  seal_snapshot_value(out);
  return out;
}

std::optional<SnapshotValueView> decode_snapshot_value(std::string_view value,
                                                       const SnapshotName& expected,
                                                       std::size_t page_bytes, std::string& why,
                                                       bool check_crc) {
  const auto refuse = [&why](std::string reason) {
    why = std::move(reason);
    return std::nullopt;
  };
  if (!fixed_header(value, why)) return std::nullopt;

  // The KV fields: all zero without a codec, else well formed and consistent with k.
  const std::uint64_t codec = get_le(value, kCodecOffset, 1);
  const std::uint64_t kv_bytes = get_le(value, kKvBytesOffset, 8);
  std::optional<kernels::KvBlocks> kv;
  if (codec == 0) {
    if (get_le(value, kKvLayersOffset, 4) != 0 || get_le(value, kKvKeyChannelsOffset, 4) != 0 ||
        get_le(value, kKvValueChannelsOffset, 4) != 0 || get_le(value, kKvTokensOffset, 8) != 0 ||
        kv_bytes != 0) {
      return refuse("KV fields set without a KV codec");
    }
  } else {
    kernels::KvBlocks b;
    b.codec = static_cast<kernels::KvCodecId>(codec - 1);
    if (kernels::kv_code_bits(b.codec) == 0) {
      return refuse("unknown KV codec byte " + std::to_string(codec));
    }
    b.layers = static_cast<std::uint32_t>(get_le(value, kKvLayersOffset, 4));
    b.key_channels = static_cast<std::uint32_t>(get_le(value, kKvKeyChannelsOffset, 4));
    b.value_channels = static_cast<std::uint32_t>(get_le(value, kKvValueChannelsOffset, 4));
    b.tokens = get_le(value, kKvTokensOffset, 8);
    if (const char* problem = kernels::kv_blocks_problem(b)) {
      return refuse(std::string("ill-formed KV fields: ") + problem);
    }
    const std::uint64_t want = kernels::kv_blocks_encoded_bytes(b);  // well formed: no overflow
    if (kv_bytes != want) {
      return refuse(std::to_string(kv_bytes) + " KV bytes, " + describe(b) + " are " +
                    std::to_string(want));
    }
    kv = b;
  }

  // The lengths, each checked against what is left so that no sum can overflow.
  const std::size_t header = header_bytes(value);
  const std::uint64_t page = get_le(value, kPageBytesOffset, 8);
  const auto sizes = [&] {
    return std::to_string(value.size()) + " bytes for a " + std::to_string(header) +
           "-byte header, a " + std::to_string(page) + "-byte page and " +
           std::to_string(kv_bytes) + " KV bytes";
  };
  if (header > value.size()) return refuse("truncated: " + sizes());
  const std::uint64_t rest = value.size() - header;
  if (page > rest || kv_bytes > rest - page) return refuse("truncated: " + sizes());
  if (page + kv_bytes != rest) return refuse("trailing bytes: " + sizes());

  if (check_crc && get_le(value, kCrcOffset, 4) != crc_from(value, kCrcOffset + 4)) {
    return refuse("checksum mismatch");
  }
  const std::string_view digest(value.data() + kDigestOffset, kDigestBytes);
  const std::string_view space_text(value.data() + kFixedBytes, get_le(value, 10, 2));
  const std::string_view prefix_text(value.data() + kFixedBytes + space_text.size(),
                                     get_le(value, 12, 2));
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
  const auto* data = reinterpret_cast<const std::byte*>(value.data() + header);
  return SnapshotValueView{std::span<const std::byte>(data, page), kv,
                           std::span<const std::byte>(data + page, kv_bytes)};
}

std::optional<SnapshotValueHeader> peek_snapshot_value(std::string_view value, std::string& why) {
  if (!fixed_header(value, why)) return std::nullopt;
  if (header_bytes(value) > value.size()) {
    why = "truncated: " + std::to_string(value.size()) + " bytes, shorter than its header";
    return std::nullopt;
  }
  SnapshotValueHeader out;
  const std::size_t space = get_le(value, 10, 2);
  out.name.space.assign(value.data() + kFixedBytes, space);
  out.name.prefix.assign(value.data() + kFixedBytes + space, get_le(value, 12, 2));
  out.name.position = get_le(value, 20, 8);
  out.name.layout_digest.assign(value.data() + kDigestOffset, kDigestBytes);
  out.page_bytes = get_le(value, kPageBytesOffset, 8);
  return out;
}

std::string remote_key(const SnapshotName& name) {
  std::string key = "statepool:snap:2:" + name.space + ":" + name.layout_digest + ":" +
                    std::to_string(name.position) + ":";
  boost::algorithm::hex_lower(name.prefix, std::back_inserter(key));
  return key;
}

}  // namespace statepool::service
