#pragma once
// A frame fuzzer input is what one connection sends: request frames back to back (header,
// then `length` payload bytes), possibly followed by bytes that make no whole frame. This
// splits such an input into frames and joins frames back, for the structure-aware
// mutator of fuzz_frame.cpp (mutate one payload and fix its length, drop, repeat or swap
// whole frames) and for the seed generator.
//
// Thread-safety: pure functions.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "statepool/protocol/frame.hpp"

namespace statepool::fuzz {

struct RawFrame {
  std::array<std::uint8_t, protocol::kHeaderBytes> header{};  ///< as sent, length included
  std::vector<std::uint8_t> payload;
};

struct SplitInput {
  std::vector<RawFrame> frames;
  std::vector<std::uint8_t> tail;  ///< what follows the last whole frame
};

/// Splits by the header's length field only (whatever the other fields say): a header
/// whose payload does not fit in what follows starts the tail.
inline SplitInput split_frames(std::span<const std::uint8_t> input) {
  SplitInput out;
  std::size_t at = 0;
  while (input.size() - at >= protocol::kHeaderBytes) {
    RawFrame frame;
    std::memcpy(frame.header.data(), input.data() + at, protocol::kHeaderBytes);
    std::uint32_t length = 0;
    std::memcpy(&length, frame.header.data() + 12, sizeof length);
    if (input.size() - at - protocol::kHeaderBytes < length) break;
    const auto* payload = input.data() + at + protocol::kHeaderBytes;
    frame.payload.assign(payload, payload + length);
    out.frames.push_back(std::move(frame));
    at += protocol::kHeaderBytes + length;
  }
  out.tail.assign(input.begin() + static_cast<std::ptrdiff_t>(at), input.end());
  return out;
}

/// Joins frames and tail back, writing each frame's length field from its payload.
inline std::vector<std::uint8_t> join_frames(const SplitInput& in) {
  std::vector<std::uint8_t> out;
  for (const RawFrame& frame : in.frames) {
    std::array<std::uint8_t, protocol::kHeaderBytes> header = frame.header;
    const auto length = static_cast<std::uint32_t>(frame.payload.size());
    std::memcpy(header.data() + 12, &length, sizeof length);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), frame.payload.begin(), frame.payload.end());
  }
  out.insert(out.end(), in.tail.begin(), in.tail.end());
  return out;
}

}  // namespace statepool::fuzz
