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
#include "statepool/protocol/messages.hpp"
#include "transport.hpp"

namespace statepool::client::detail {

struct Impl {
  Impl(UniqueFd fd, const Options& options);

  /// Serializes requests (call() takes it); guards everything below except the immutable
  /// Hello results and `codecs` (own mutex).
  std::mutex mutex;
  UniqueFd socket;
  bool broken = false;
  std::string broken_reason;
  std::uint64_t next_id = 1;
  std::chrono::milliseconds timeout;
  std::uint32_t max_reply_bytes;
  bool map_device_memory;
  bool legacy_ipc;
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
  std::uint32_t max_batch_keys = 0;  ///< protocol version 2; 0 before
  std::uint64_t max_batch_bytes = 0;

  /// Page formats of the layouts registered through this connection.
  std::mutex codecs_mutex;
  std::map<LayoutId, std::shared_ptr<const kernels::PageCodec>> codecs;

  /// One request and its reply: the one typed call every request wrapper uses.
  /// Locks `mutex`, lets build(builder) build the body (it returns the request table's
  /// offset), sends it, waits for the reply of the matching type and returns
  /// read(reply_table) — read runs under the lock, while the reply's buffer is valid. The
  /// reply table pointer is null only for the empty reply tables (CopyReply, ...), which
  /// a daemon may leave out. Throws Error for a status other than ok and ConnectionError
  /// for transport failures (then the connection is broken). When `fd_out` is not null, a
  /// descriptor the reply carries (FD_ATTACHED) is moved there; any other descriptor
  /// received is closed. `fd_in` (>= 0): a descriptor sent with the request
  /// (FD_ATTACHED; RegisterMemory), not taken.
  template <class Request, class Build, class Read>
  auto call(Build&& build, Read&& read, UniqueFd* fd_out = nullptr, int fd_in = -1) {
    using Reply = protocol::ReplyFor<Request>;
    const std::lock_guard lock(mutex);
    builder.Clear();
    const flatbuffers::Offset<Request> body = build(builder);
    const wire::Reply& reply = roundtrip(protocol::kRequestType<Request>, body.Union(),
                                         protocol::kReplyType<Reply>, fd_out, fd_in);
    return read(reply.template body_as<Reply>());
  }

  /// Locks, checks health, and returns whether a best-effort request should be tried.
  [[nodiscard]] bool healthy();
  /// Frees slot ids of one arena; returns the count freed. This and close_staging are
  /// requests/memory.cpp's, for Slot's and Staging's destructors too.
  std::uint32_t free_slots(ArenaId arena, std::span<const SlotId> slots);
  void close_staging(StagingId id);

  [[nodiscard]] std::shared_ptr<const kernels::PageCodec> codec_for(LayoutId id);

 private:
  /// Sends the request whose body was just built into `builder` and returns its reply
  /// (valid until the next round trip; caller holds `mutex`). See call().
  const wire::Reply& roundtrip(wire::RequestBody type, flatbuffers::Offset<void> body,
                               wire::ReplyBody expected, UniqueFd* fd_out, int fd_in);
  void mark_broken(const std::string& reason) noexcept;
  void check_usable() const;
};

}  // namespace statepool::client::detail
