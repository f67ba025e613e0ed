#pragma once
// The prefix-state snapshot vocabulary that the daemon's pool and the client library
// share (docs/prefix-store.md): a snapshot's key, and one snapshot as a listing reports
// it. The wire's twin is wire::SnapshotEntry; the daemon's handlers and the client
// convert between the two.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::kernels {

/// The longest prefix of a snapshot key, in bytes.
inline constexpr std::size_t kMaxSnapshotPrefixBytes = 256;

/// The name of a prefix-state snapshot: the engine's prefix hash, 1..256 bytes of any
/// values (a hex digest, raw hash bytes, a readable name), and the token position the
/// state is at.
struct SnapshotKey {
  std::string prefix;
  std::uint64_t position = 0;
};

/// One snapshot as a listing (list_snapshots) reports it.
struct SnapshotInfo {
  SnapshotKey key;
  std::uint32_t layout_id = 0;
  std::string layout_name;
  CodecId codec = CodecId::fp32;
  std::string tenant;  ///< the publisher
  std::uint32_t arena_id = 0;
  std::uint64_t page_bytes = 0;
  std::uint64_t fp32_bytes = 0;
  bool pinned = false;
  std::uint64_t hits = 0;
  double age_seconds = 0;      ///< since it was published
  double idle_seconds = 0;     ///< since it was last published or read
  std::optional<KvBlocks> kv;  ///< a hybrid entry's attention KV blocks
  std::uint64_t kv_bytes = 0;  ///< their encoded bytes (in kv_pages more pages)
  std::uint32_t pages = 1;     ///< pages of the arena it holds
  std::string layout_digest;   ///< kernels::layout_digest of its layout: names it across daemons
};

}  // namespace statepool::kernels
