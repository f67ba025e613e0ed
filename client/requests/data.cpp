// Compress, Decompress, Copy. Each has a waiting form (the daemon replies once the work is
// done) and an *_async form (it replies once the work is on its device stream, with an IPC
// event that completes with it): one request, told apart by its `event` flag, built and
// read once below for both.
#include <cstring>
#include <optional>
#include <string>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::Impl;
using detail::inconsistent;

void require_valid(const Slot& slot, const char* call) {
  if (!slot.valid()) {
    throw Error(Status::invalid_argument,
                std::string(call) + ": the Slot is not valid (moved from, freed or released)");
  }
}

void require_valid(const Staging& staging, const char* call) {
  if (!staging.valid()) {
    throw Error(Status::invalid_argument,
                std::string(call) + ": the Staging buffer is not valid (moved from or closed)");
  }
}

/// The request's `after` field: the event's bytes, or none.
flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> after_to_wire(
    flatbuffers::FlatBufferBuilder& b, const std::optional<IpcEventBytes>& after) {
  if (!after) return 0;
  return b.CreateVector(reinterpret_cast<const std::uint8_t*>(after->data()), after->size());
}

std::optional<IpcEventBytes> event_of(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return std::nullopt;
  if (bytes->size() != IpcEventBytes{}.size()) {
    inconsistent("an IPC event of " + std::to_string(bytes->size()) + " bytes (expected " +
                 std::to_string(IpcEventBytes{}.size()) + ")");
  }
  IpcEventBytes out;
  std::memcpy(out.data(), bytes->data(), out.size());
  return out;
}

/// The bytes a data request wrote, as its reply says (Copy: none).
std::uint64_t done_bytes(const wire::CompressReply* r) {
  return r->page_bytes();
}
std::uint64_t done_bytes(const wire::DecompressReply* r) {
  return r->state_bytes();
}
std::uint64_t done_bytes(const wire::CopyReply*) {
  return 0;
}

/// One data request, waiting (`early` false) or *_async (`early` true, the request's
/// `event` flag). create(builder, after) builds the request table from the `after` field
/// built first. The reply's event is read only for the *_async form; a CopyReply may be
/// left out (Pending{}).
template <class Request, class Create>
Pending data_request(Impl& impl, bool early, const std::optional<IpcEventBytes>& after,
                     Create&& create) {
  return impl.call<Request>(
      [&](auto& b) { return create(b, after_to_wire(b, after)); },
      [&](const protocol::ReplyFor<Request>* r) {
        if (r == nullptr) return Pending{};
        return Pending{done_bytes(r), early ? event_of(r->event()) : std::nullopt};
      });
}

/// Compress and Decompress: the same fields, for the state in a slot and a staging range.
template <class Request, auto create>
Pending state_request(Impl& impl, bool early, ArenaId arena, SlotId slot, StagingId staging,
                      std::uint64_t offset, kernels::DType dtype,
                      const std::optional<IpcEventBytes>& after) {
  return data_request<Request>(impl, early, after, [&](auto& b, auto event) {
    return create(b, arena, slot, staging, offset, protocol::to_wire(dtype), early, event);
  });
}

constexpr auto compress_request = &state_request<wire::Compress, &wire::CreateCompress>;
constexpr auto decompress_request = &state_request<wire::Decompress, &wire::CreateDecompress>;

Pending copy_request(Impl& impl, bool early, ArenaId arena, SlotId src, SlotId dst,
                     const std::optional<IpcEventBytes>& after) {
  return data_request<wire::Copy>(impl, early, after, [&](auto& b, auto event) {
    return wire::CreateCopy(b, arena, src, dst, early, event);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Compress

std::uint64_t Connection::compress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                                   kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  require_valid(slot, "compress");
  require_valid(staging, "compress");
  return compress(slot.arena_id(), slot.id(), staging.id(), offset, dtype, after);
}

std::uint64_t Connection::compress(ArenaId arena, SlotId slot, StagingId staging,
                                   std::uint64_t offset, kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  return compress_request(impl(), /*early=*/false, arena, slot, staging, offset, dtype, after)
      .bytes;
}

Pending Connection::compress_async(ArenaId arena, SlotId slot, StagingId staging,
                                   std::uint64_t offset, kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  return compress_request(impl(), /*early=*/true, arena, slot, staging, offset, dtype, after);
}

// ---------------------------------------------------------------------------------------
// Decompress

std::uint64_t Connection::decompress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                                     kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  require_valid(slot, "decompress");
  require_valid(staging, "decompress");
  return decompress(slot.arena_id(), slot.id(), staging.id(), offset, dtype, after);
}

std::uint64_t Connection::decompress(ArenaId arena, SlotId slot, StagingId staging,
                                     std::uint64_t offset, kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  return decompress_request(impl(), /*early=*/false, arena, slot, staging, offset, dtype, after)
      .bytes;
}

Pending Connection::decompress_async(ArenaId arena, SlotId slot, StagingId staging,
                                     std::uint64_t offset, kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  return decompress_request(impl(), /*early=*/true, arena, slot, staging, offset, dtype, after);
}

// ---------------------------------------------------------------------------------------
// Copy

void Connection::copy(const Slot& src, const Slot& dst, const std::optional<IpcEventBytes>& after) {
  require_valid(src, "copy");
  require_valid(dst, "copy");
  if (src.arena_id() != dst.arena_id()) {
    throw Error(Status::invalid_argument, "copy: the slots belong to different arenas (" +
                                              std::to_string(src.arena_id()) + " and " +
                                              std::to_string(dst.arena_id()) +
                                              "); pages are copied within one arena");
  }
  copy(src.arena_id(), src.id(), dst.id(), after);
}

void Connection::copy(ArenaId arena, SlotId src, SlotId dst,
                      const std::optional<IpcEventBytes>& after) {
  (void)copy_request(impl(), /*early=*/false, arena, src, dst, after);
}

Pending Connection::copy_async(ArenaId arena, SlotId src, SlotId dst,
                               const std::optional<IpcEventBytes>& after) {
  return copy_request(impl(), /*early=*/true, arena, src, dst, after);
}

}  // namespace statepool::client
