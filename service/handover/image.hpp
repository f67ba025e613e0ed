#pragma once
// The hand-over image: PoolState (pool/pool_state.hpp) and the writer's ImageMeta as one
// versioned, checksummed byte string, what an old statepoold sends its successor over a
// Unix socket during an upgrade (docs/operations.md). The arenas' memory is not in it:
// their descriptors travel beside the image, one per arena in arena order.
//
// An image is a fixed 32-byte header, then the payload, a FlatBuffer of image.fbs:
//
//   offset  size  field (little-endian)
//   0       8     magic "SPHOVER\0"
//   8       4     image version (kImageVersion)
//   12      4     flags (none are defined: must be 0)
//   16      8     payload length n (at most kMaxImagePayloadBytes)
//   24      4     CRC-32C of the payload
//   28      4     CRC-32C of bytes 0..27 (the header before this field)
//   32      n     the payload
//
// Magic and version come first and stay where they are in every version, so a reader
// names a version it does not read (any but its own: it never guesses) before looking at
// the rest of a header whose layout may differ.
//
// The image is input: decode_image checks the header, both checksums, the FlatBuffer
// (flatbuffers::Verifier, depth and table limits) and every field before it returns
// anything, and refuses anything else with an ImageError naming what is wrong, never with
// undefined behaviour. Entries with an id (layouts, arenas, leases) are named by their id
// ("arena 3: handle kind 9 unknown"), the others (plans, snapshots, tenants) by their
// position in the image, from 0 ("plan 2: ..."). What it does not check: references
// between the tables (a lease's slot names an arena, owners agree with leases, ...), which
// Pool::restore_state() does.
//
// CRC-32C: Castagnoli, reflected, initial value and final xor ~0 (boost::crc_optimal).
//
// Thread-safety: pure functions; concurrent calls are fine.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pool/pool_state.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service::handover {

/// The image version this build writes, and the only one it reads.
inline constexpr std::uint32_t kImageVersion = 1;
inline constexpr std::size_t kImageHeaderBytes = 32;
/// The header's fields (see the table above).
inline constexpr std::size_t kImageVersionOffset = 8;
inline constexpr std::size_t kImageFlagsOffset = 12;
inline constexpr std::size_t kImageLengthOffset = 16;
inline constexpr std::size_t kImagePayloadCrcOffset = 24;
inline constexpr std::size_t kImageHeaderCrcOffset = 28;
/// The largest payload written or read (far above a pool of a million pages: its slot
/// owners are 8 MB).
inline constexpr std::uint64_t kMaxImagePayloadBytes = std::uint64_t{1} << 30;
/// Verifier limits: nesting depth, and tables (one per plan, layout, arena, lease,
/// snapshot and tenant, and two more; a lease or snapshot holds at least one page, so a
/// pool of up to four million pages fits twice over).
inline constexpr std::uint32_t kMaxImageDepth = 16;
inline constexpr std::uint32_t kMaxImageTables = 1u << 23;
/// Longest string of an image (names, tokens, the namespace, the daemon version, ...);
/// a snapshot's prefix is at most kernels::kMaxSnapshotPrefixBytes, a plan digest at
/// most kMaxPlanDigestBytes.
inline constexpr std::size_t kMaxImageStringBytes = 4096;
inline constexpr std::size_t kMaxPlanDigestBytes = 64;

/// The daemon that wrote an image.
struct ImageMeta {
  std::uint64_t generation = 0;  ///< as the writer sets it; not interpreted here
  std::string daemon_version;
  std::string backend;  ///< the --backend name
  int device = -1;      ///< CUDA device ordinal; -1 for host memory
};

/// Why an image was refused (or could not be written): Status::invalid_argument, the
/// message "hand-over image: " followed by what is wrong.
class ImageError : public StatusError {
 public:
  /// `what` without the "hand-over image: " prefix, which the constructor adds.
  explicit ImageError(const std::string& what);
};

/// The image of `state` and `meta`. Each arena's `memory` and `fd` are not encoded; plans
/// are written with kernels::stepquant::to_bytes, a layout's plan by its `plan_digest`.
/// Throws ImageError for a state it cannot write: a null or invalid plan, or a payload
/// larger than kMaxImagePayloadBytes. Checks nothing else (the reader does).
[[nodiscard]] std::vector<std::byte> encode_image(const PoolState& state, const ImageMeta& meta);

struct DecodedImage {
  PoolState state;
  ImageMeta meta;
};

/// Reads an image; `bytes` may have any alignment (a misaligned payload is copied).
/// Each arena's `memory` is null and `fd` -1; each plan is decoded with
/// kernels::stepquant::from_bytes, and each layout's `plan` is the decoded plan whose
/// recomputed digest is its `plan_digest` (null for an empty digest). Throws ImageError
/// naming what is wrong: the header ("bad magic", "version 2, this statepoold reads
/// version 1 only", "header checksum mismatch", "payload length N but M bytes received",
/// "payload checksum mismatch"), the FlatBuffer ("malformed (FlatBuffers verifier)"), or
/// a field ("arena 3: handle kind 9 unknown", "plan 2: <from_bytes' message>",
/// "layout 4: <kernels::validate's message>", "layout 4: plan digest 'abc' unknown").
[[nodiscard]] DecodedImage decode_image(std::span<const std::byte> bytes);

/// Empty when a pool that `meta`'s daemon wrote may be restored by a daemon on `backend`
/// (its --backend) and CUDA `device` (-1: host memory, any device matches), else what
/// differs: "backend cuda device 1, this one's backend host device -1".
[[nodiscard]] std::string backend_mismatch(const ImageMeta& meta, std::string_view backend,
                                           int device);

/// CRC-32C of `bytes`, as the header holds it.
[[nodiscard]] std::uint32_t image_crc32c(std::span<const std::byte> bytes) noexcept;

/// An image of `payload` as it is, with a header of `version` (and correct lengths and
/// checksums). For tests and tools that craft payloads with the generated builder
/// (image_generated.h); encode_image is wrap_payload of its own payload. Throws
/// ImageError for a payload larger than kMaxImagePayloadBytes.
[[nodiscard]] std::vector<std::byte> wrap_payload(std::span<const std::byte> payload,
                                                  std::uint32_t version = kImageVersion);

}  // namespace statepool::service::handover
