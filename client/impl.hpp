#pragma once
// Internal: the state shared by a Connection and every Slot and Staging made from it.

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "transport.hpp"

namespace statepool::client::detail {

struct Impl {
  Impl(UniqueFd fd, const Options& options);

  /// Serializes requests; guards everything below except the immutable Hello results
  /// and `codecs` (own mutex).
  std::mutex mutex;
  UniqueFd socket;
  bool broken = false;
  std::string broken_reason;
  std::uint64_t next_id = 1;
  std::chrono::milliseconds timeout;
  std::uint32_t max_reply_bytes;
  flatbuffers::FlatBufferBuilder builder{1024};
  std::vector<std::byte> payload;
  std::vector<UniqueFd> received_fds;

  // Hello results: written once by connect, read-only afterwards.
  std::uint16_t version = 0;
  std::string lease_token;
  bool lease_resumed = false;
  std::uint32_t resumed_slots = 0;
  std::string server;
  std::chrono::milliseconds grace_period{0};
  std::uint32_t max_frame_bytes = 0;

  /// Page formats of the layouts registered through this connection.
  std::mutex codecs_mutex;
  std::map<LayoutId, std::shared_ptr<const kernels::PageCodec>> codecs;

  /// The builder, cleared, for the next request's body. Caller holds `mutex`.
  flatbuffers::FlatBufferBuilder& begin();
  /// Sends the request whose body was just built into `builder`, waits for its reply and
  /// returns it (valid until the next round trip; caller holds `mutex`). Throws Error for
  /// a status other than ok and ConnectionError for transport failures (then the
  /// connection is broken). A reply body of another type than `expected` is a bad frame,
  /// except that an absent body is accepted for the empty reply tables. When `fd_out` is
  /// not null the reply must carry a descriptor, which is moved there; any other
  /// descriptor received is closed.
  const wire::Reply& roundtrip(wire::RequestBody type, flatbuffers::Offset<void> body,
                               wire::ReplyBody expected, UniqueFd* fd_out);

  /// Locks, checks health, and returns whether a best-effort request should be tried.
  [[nodiscard]] bool healthy();
  /// Frees slot ids of one arena; returns the count freed.
  std::uint32_t free_slots(ArenaId arena, std::span<const SlotId> slots);
  void close_staging(StagingId id);

  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> codec_for(LayoutId id);

 private:
  void mark_broken(const std::string& reason) noexcept;
  void check_usable() const;
};

}  // namespace statepool::client::detail
