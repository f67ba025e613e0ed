#include "statepool/protocol/frame.hpp"
#include "statepool/support/byte_fields.hpp"

#include <bit>
#include <cstring>

namespace statepool::protocol {
namespace {

static_assert(std::endian::native == std::endian::little,
              "statepool assumes a little-endian host (x86-64, aarch64)");

using support::load_field;
using support::store_field;

flatbuffers::Verifier::Options verifier_options() noexcept {
  flatbuffers::Verifier::Options options;
  options.max_depth = kMaxDepth;
  options.max_tables = kMaxTables;
  options.check_alignment = true;
  return options;
}

}  // namespace

const char* to_string(FrameError error) noexcept {
  switch (error) {
    case FrameError::none: return "ok";
    case FrameError::bad_magic: return "bad magic (not a statepool frame)";
    case FrameError::bad_version: return "unsupported frame version";
    case FrameError::bad_type: return "unexpected frame type";
    case FrameError::bad_flags: return "unknown frame flags";
    case FrameError::empty_payload: return "empty payload";
    case FrameError::too_large: return "frame payload larger than the limit";
    case FrameError::bad_flatbuffer: return "payload is not a valid FlatBuffer message";
  }
  return "unknown frame error";
}

std::array<std::byte, kHeaderBytes> encode_header(const FrameHeader& header) noexcept {
  std::array<std::byte, kHeaderBytes> out{};
  store_field(out.data() + 0, header.magic);
  store_field(out.data() + 4, header.version);
  store_field(out.data() + 6, static_cast<std::uint16_t>(header.type));
  store_field(out.data() + 8, header.flags);
  store_field(out.data() + 12, header.length);
  return out;
}

FrameHeader decode_header(std::span<const std::byte, kHeaderBytes> bytes) noexcept {
  FrameHeader header;
  header.magic = load_field<std::uint32_t>(bytes.data() + 0);
  header.version = load_field<std::uint16_t>(bytes.data() + 4);
  header.type = static_cast<FrameType>(load_field<std::uint16_t>(bytes.data() + 6));
  header.flags = load_field<std::uint32_t>(bytes.data() + 8);
  header.length = load_field<std::uint32_t>(bytes.data() + 12);
  return header;
}

FrameError check_header(const FrameHeader& header, FrameType expected,
                        std::uint32_t max_payload) noexcept {
  if (header.magic != kMagic) return FrameError::bad_magic;
  if (header.version != kFrameVersion) return FrameError::bad_version;
  if (header.type != expected) return FrameError::bad_type;
  if ((header.flags & ~kKnownFlags) != 0) return FrameError::bad_flags;
  if (header.length == 0) return FrameError::empty_payload;
  const std::uint32_t cap = max_payload < kAbsoluteMaxPayload ? max_payload : kAbsoluteMaxPayload;
  if (header.length > cap) return FrameError::too_large;
  return FrameError::none;
}

const wire::Request* verify_request(std::span<const std::byte> payload,
                                    FrameError& error) noexcept {
  const auto* data = reinterpret_cast<const std::uint8_t*>(payload.data());
  flatbuffers::Verifier verifier(data, payload.size(), verifier_options());
  if (payload.empty() || !wire::VerifyRequestBuffer(verifier)) {
    error = FrameError::bad_flatbuffer;
    return nullptr;
  }
  error = FrameError::none;
  return wire::GetRequest(data);
}

const wire::Reply* verify_reply(std::span<const std::byte> payload, FrameError& error) noexcept {
  const auto* data = reinterpret_cast<const std::uint8_t*>(payload.data());
  flatbuffers::Verifier verifier(data, payload.size(), verifier_options());
  if (payload.empty() || !verifier.VerifyBuffer<wire::Reply>(nullptr)) {
    error = FrameError::bad_flatbuffer;
    return nullptr;
  }
  error = FrameError::none;
  return flatbuffers::GetRoot<wire::Reply>(data);
}

std::string make_frame(FrameType type, std::uint32_t flags, std::span<const std::uint8_t> payload) {
  FrameHeader header;
  header.type = type;
  header.flags = flags;
  header.length = static_cast<std::uint32_t>(payload.size());
  const auto head = encode_header(header);
  std::string frame;
  frame.resize(kHeaderBytes + payload.size());
  std::memcpy(frame.data(), head.data(), kHeaderBytes);
  if (!payload.empty()) std::memcpy(frame.data() + kHeaderBytes, payload.data(), payload.size());
  return frame;
}

const char* request_name(wire::RequestBody body) noexcept {
  switch (body) {
    case wire::RequestBody::Hello: return "hello";
    case wire::RequestBody::RegisterLayout: return "register_layout";
    case wire::RequestBody::OpenArena: return "open_arena";
    case wire::RequestBody::Allocate: return "allocate";
    case wire::RequestBody::Free: return "free";
    case wire::RequestBody::OpenStaging: return "open_staging";
    case wire::RequestBody::CloseStaging: return "close_staging";
    case wire::RequestBody::Compress: return "compress";
    case wire::RequestBody::Decompress: return "decompress";
    case wire::RequestBody::Copy: return "copy";
    case wire::RequestBody::Stats: return "stats";
    case wire::RequestBody::Ping: return "ping";
    case wire::RequestBody::Drain: return "drain";
    case wire::RequestBody::InstallPlan: return "install_plan";
    case wire::RequestBody::PlanCapacity: return "plan_capacity";
    case wire::RequestBody::FitsNow: return "fits_now";
    case wire::RequestBody::PutSnapshot: return "put_snapshot";
    case wire::RequestBody::GetSnapshot: return "get_snapshot";
    case wire::RequestBody::DeleteSnapshot: return "delete_snapshot";
    case wire::RequestBody::PinSnapshot: return "pin_snapshot";
    case wire::RequestBody::ListSnapshots: return "list_snapshots";
    case wire::RequestBody::ExportSnapshot: return "export_snapshot";
    case wire::RequestBody::ImportSnapshot: return "import_snapshot";
    case wire::RequestBody::CloseArena: return "close_arena";
    case wire::RequestBody::RegisterMemory: return "register_memory";
    case wire::RequestBody::LookupSnapshots: return "lookup_snapshots";
    case wire::RequestBody::PutSnapshots: return "put_snapshots";
    case wire::RequestBody::GetSnapshots: return "get_snapshots";
    case wire::RequestBody::NONE: break;
  }
  return "unknown";
}

}  // namespace statepool::protocol
