#pragma once
// The bytes a prefix-state snapshot is kept as outside the pool (the host tier, the
// remote tier; docs/prefix-store.md, "Tiers"): a header naming the snapshot (namespace,
// key, layout digest, page size), a CRC-32 over header and page, then the page bytes as
// the arena stores them (compressed). A reader states what it expects; a value that is
// truncated, corrupted, of another version, or for another key or layout is refused with
// the reason, so a bad remote entry is a miss, never wrong data.
//
//   offset  size  field (little-endian)
//   0       8     magic "SPSNAP\r\n"
//   8       2     format version (1)
//   10      2     namespace length n
//   12      2     prefix length p
//   14      2     0
//   16      4     CRC-32 (boost::crc_32_type) of every byte from offset 20 to the end
//   20      8     position
//   28      8     page bytes m
//   36      16    layout digest (kernels::layout_digest, 16 hex characters)
//   52      n     namespace
//   52+n    p     prefix
//   52+n+p  m     the page
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace statepool::service {

/// What names a stored snapshot outside one daemon.
struct SnapshotName {
  std::string space;   ///< the snapshot namespace
  std::string prefix;  ///< key bytes
  std::uint64_t position = 0;
  std::string layout_digest;  ///< 16 hex characters
};

/// The header and the page in one value.
[[nodiscard]] std::string encode_snapshot_value(const SnapshotName& name,
                                                std::span<const std::byte> page);
/// The same in two steps, for a page that arrives by another copy (a device page): a value
/// whose page area (snapshot_value_page) is `page_bytes` zero bytes, then, once the page
/// is in place, seal_snapshot_value computes the checksum.
[[nodiscard]] std::string snapshot_value_frame(const SnapshotName& name, std::size_t page_bytes);
[[nodiscard]] std::span<std::byte> snapshot_value_page(std::string& value) noexcept;
void seal_snapshot_value(std::string& value) noexcept;

/// The page inside `value` when the value is whole and is `expected` with `page_bytes`
/// bytes; otherwise nullopt and `why` says what is wrong ("checksum mismatch", ...).
/// `check_crc` false skips the checksum (values this process wrote itself: the host tier),
/// which is most of the work for a large page.
[[nodiscard]] std::optional<std::span<const std::byte>> decode_snapshot_value(
    std::string_view value, const SnapshotName& expected, std::size_t page_bytes, std::string& why,
    bool check_crc = true);

/// The key of a snapshot in a remote store:
/// "statepool:snap:1:<namespace>:<layout digest>:<position>:<prefix as hex>". Without a
/// Redis Cluster hash tag, so that snapshots spread over every node.
[[nodiscard]] std::string remote_key(const SnapshotName& name);

}  // namespace statepool::service
