#pragma once
// Framing of the statepool wire protocol.
//
// A frame is a fixed 16-byte little-endian header followed by `length` bytes holding one
// FlatBuffer (root `statepool::wire::Request` or `statepool::wire::Reply`, see
// protocol/statepool.fbs):
//
//   offset 0  u32 magic    kMagic ("SPL1" in memory order)
//   offset 4  u16 version  kFrameVersion
//   offset 6  u16 type     FrameType
//   offset 8  u32 flags    FrameFlags bits; unknown bits are an error
//   offset 12 u32 length   FlatBuffer bytes that follow; 1 <= length <= the receiver's cap
//
// Nothing here trusts the peer: every header is checked before its length is used, and
// every FlatBuffer is run through flatbuffers::Verifier with size, depth and table caps
// before any field is read, in every build type.
//
// Thread-safety: all functions are pure and may be called concurrently.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "statepool_generated.h"

namespace statepool::protocol {

inline constexpr std::uint32_t kMagic = 0x314C5053;  // bytes 'S' 'P' 'L' '1'
inline constexpr std::uint16_t kFrameVersion = 1;
inline constexpr std::size_t kHeaderBytes = 16;

/// Protocol versions this build speaks (negotiated in Hello).
inline constexpr std::uint16_t kMinProtocolVersion = 1;
inline constexpr std::uint16_t kMaxProtocolVersion = 2;

/// Hard upper bound on any frame payload, whatever a configuration says.
inline constexpr std::uint32_t kAbsoluteMaxPayload = 64u << 20;
/// Default payload cap of the daemon and the client.
inline constexpr std::uint32_t kDefaultMaxPayload = 4u << 20;
/// FlatBuffer verification limits (nesting depth and table count).
inline constexpr std::uint32_t kMaxDepth = 16;
inline constexpr std::uint32_t kMaxTables = 100000;

enum class FrameType : std::uint16_t { request = 1, reply = 2 };

/// Header flag bits.
enum FrameFlags : std::uint32_t {
  kFlagNone = 0,
  /// One file descriptor travels with this frame as SCM_RIGHTS ancillary data, attached
  /// to the frame's first byte.
  kFlagFdAttached = 1u << 0,
};
inline constexpr std::uint32_t kKnownFlags = kFlagFdAttached;

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kFrameVersion;
  FrameType type = FrameType::request;
  std::uint32_t flags = kFlagNone;
  std::uint32_t length = 0;
};

/// Why a header or payload was refused.
enum class FrameError {
  none,
  bad_magic,
  bad_version,
  bad_type,
  bad_flags,
  empty_payload,
  too_large,
  bad_flatbuffer,
};

/// Human-readable text for a FrameError (stable, used in error replies and logs).
[[nodiscard]] const char* to_string(FrameError error) noexcept;

/// Encodes a header into its 16 little-endian bytes.
[[nodiscard]] std::array<std::byte, kHeaderBytes> encode_header(const FrameHeader& header) noexcept;

/// Decodes 16 bytes into a header without judging it.
[[nodiscard]] FrameHeader decode_header(std::span<const std::byte, kHeaderBytes> bytes) noexcept;

/// Checks magic, version, type, flags and length against `max_payload`.
/// `expected` is the frame type the receiver accepts.
[[nodiscard]] FrameError check_header(const FrameHeader& header, FrameType expected,
                                      std::uint32_t max_payload) noexcept;

/// Verifies a payload as a Request / Reply FlatBuffer with the caps above.
/// Returns nullptr (and sets `error`) when the buffer does not verify.
[[nodiscard]] const wire::Request* verify_request(std::span<const std::byte> payload,
                                                  FrameError& error) noexcept;
[[nodiscard]] const wire::Reply* verify_reply(std::span<const std::byte> payload,
                                              FrameError& error) noexcept;

/// Builds a complete frame (header + payload) from a finished FlatBufferBuilder.
[[nodiscard]] std::string make_frame(FrameType type, std::uint32_t flags,
                                     std::span<const std::uint8_t> payload);

/// Name of a request or reply body type ("hello", "allocate", ...), for logs and metric
/// labels. Unknown values give "unknown". (A status's name: statepool::status_name.)
[[nodiscard]] const char* request_name(wire::RequestBody body) noexcept;

}  // namespace statepool::protocol
