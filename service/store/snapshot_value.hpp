#pragma once
// The bytes a prefix-state snapshot is kept as outside the pool (the host tier, the
// remote tier; docs/prefix-store.md, "Tiers"): a header naming the snapshot (namespace,
// key, layout digest, page size, KV blocks), a CRC-32 over header and payload, then the
// page bytes as the arena stores them (compressed) and, for a hybrid snapshot, the KV
// blocks of its attention layers (kernels::KvBlocks, encoded). A reader states what it
// expects; a value that is truncated, corrupted, of another version, or for another key
// or layout is refused with the reason, so a bad remote entry is a miss, never wrong data.
//
//   offset  size  field (little-endian)
//   0       8     magic "SPSNAP\r\n"
//   8       2     format version (2)
//   10      2     namespace length n
//   12      2     prefix length p
//   14      1     KV codec + 1 (kernels::KvCodecId; 0: no KV blocks)
//   15      1     STEPQuant page format of the page (kernels::stepquant::kPageFormat;
//                 0 in values of builds before 2026-12-05, whose format was 1)
//   16      4     CRC-32 (boost::crc_32_type) of every byte from offset 20 to the end
//   20      8     position
//   28      8     page bytes m
//   36      16    layout digest (kernels::layout_digest, 16 hex characters)
//   52      4     KV layers          (0 when no KV blocks; likewise the next three)
//   56      4     KV key channels
//   60      4     KV value channels  (0: keys only)
//   64      8     KV tokens
//   72      8     KV bytes k         (kernels::kv_blocks_encoded_bytes of the four above)
//   80      n     namespace
//   80+n    p     prefix
//   80+n+p  m     the page
//   80+n+p+m k    the KV blocks (kernels::kv_encode_blocks bytes)
//
// Version 1 (no KV fields, a 52-byte header) is refused: its remote keys differ too
// (remote_key), so a daemon of the other version simply misses. A value whose page format
// differs from this build's is refused with that reason (the remote key is the same, so
// the reader says why it misses), whatever the layout's codec: the tiers are caches, and
// a miss only costs the engine a prefill.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "statepool/kernels/kv.hpp"

namespace statepool::service {

/// What names a stored snapshot outside one daemon.
struct SnapshotName {
  std::string space;   ///< the snapshot namespace
  std::string prefix;  ///< key bytes
  std::uint64_t position = 0;
  std::string layout_digest;  ///< 16 hex characters
};

/// The header, the page and the KV blocks (if any) in one value. `kv_bytes` is
/// kv_encode_blocks' output for `kv`: exactly kv_blocks_encoded_bytes(*kv) bytes, and
/// empty without `kv`. Throws std::invalid_argument for ill-formed KV blocks
/// (kv_blocks_problem) or KV bytes of another size.
[[nodiscard]] std::string encode_snapshot_value(
    const SnapshotName& name, std::span<const std::byte> page,
    const std::optional<kernels::KvBlocks>& kv = std::nullopt,
    std::span<const std::byte> kv_bytes = {});
/// The same in two steps, for a page (and KV blocks) that arrive by another copy (a device
/// page): a value whose page area (snapshot_value_page) is `page_bytes` zero bytes and
/// whose KV area (snapshot_value_kv) is kv_blocks_encoded_bytes(*kv) zero bytes; then,
/// once both are in place, seal_snapshot_value computes the checksum. Throws
/// std::invalid_argument for ill-formed KV blocks (kv_blocks_problem).
[[nodiscard]] std::string snapshot_value_frame(
    const SnapshotName& name, std::size_t page_bytes,
    const std::optional<kernels::KvBlocks>& kv = std::nullopt);
/// The page area of a value made by snapshot_value_frame (not the KV area).
[[nodiscard]] std::span<std::byte> snapshot_value_page(std::string& value) noexcept;
/// The KV area of a value made by snapshot_value_frame; empty without KV blocks.
[[nodiscard]] std::span<std::byte> snapshot_value_kv(std::string& value) noexcept;
void seal_snapshot_value(std::string& value) noexcept;

/// What a whole value holds; the spans point into the decoded value.
struct SnapshotValueView {
  std::span<const std::byte> page;
  std::optional<kernels::KvBlocks> kv;  ///< null: no KV blocks
  std::span<const std::byte> kv_bytes;  ///< kv_blocks_encoded_bytes(*kv) bytes; empty without
};

/// The page (and the KV blocks beside it, if the value has any) inside `value` when the
/// value is whole and is `expected` with a page of `page_bytes` bytes; otherwise nullopt
/// and `why` says what is wrong ("checksum mismatch", ...). `check_crc` false skips the
/// checksum (values this process wrote itself: the host tier), which is most of the work
/// for a large page. Every length in the header is checked against the value's size
/// without overflow, so any bytes may be passed.
[[nodiscard]] std::optional<SnapshotValueView> decode_snapshot_value(std::string_view value,
                                                                     const SnapshotName& expected,
                                                                     std::size_t page_bytes,
                                                                     std::string& why,
                                                                     bool check_crc = true);

/// What a value says it is, read from its header alone (nothing checked beyond the magic,
/// the version and that the header is there): the name and page size to hand to
/// decode_snapshot_value, which checks the rest. For values whose name the reader does
/// not know beforehand (a file statepoolctl snapshot-put sends). nullopt and `why` when
/// the bytes are no version-2 value.
struct SnapshotValueHeader {
  SnapshotName name;
  std::uint64_t page_bytes = 0;
};
[[nodiscard]] std::optional<SnapshotValueHeader> peek_snapshot_value(std::string_view value,
                                                                     std::string& why);

/// The key of a snapshot in a remote store:
/// "statepool:snap:2:<namespace>:<layout digest>:<position>:<prefix as hex>" (the format
/// version is part of it). Without a Redis Cluster hash tag, so that snapshots spread
/// over every node.
[[nodiscard]] std::string remote_key(const SnapshotName& name);

}  // namespace statepool::service
