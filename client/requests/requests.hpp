#pragma once
// Internal: the Connection's request methods, one file per concern, mirroring the daemon's
// handlers (service/handlers/handlers.hpp), so the client side of a request is found
// under the same name:
//
//   session.cpp    connect, from_fd, Hello (and what it said), Ping, Drain, Stats
//   layouts.cpp    RegisterLayout, InstallPlan
//   memory.cpp     OpenArena, CloseArena, OpenStaging, CloseStaging, Allocate, Free
//                  (also adopt(), and the Impl calls Slot and Staging destructors use)
//   data.cpp       Compress, Decompress, Copy, each waiting and *_async
//   capacity.cpp   PlanCapacity, FitsNow
//   snapshots.cpp  PutSnapshot, GetSnapshot, ExportSnapshot, ImportSnapshot,
//                  DeleteSnapshot, PinSnapshot, ListSnapshots
//   snapshot_batches.cpp  RegisterMemory, LookupSnapshots, PutSnapshots, GetSnapshots
//                  (protocol version 2)
//
// Every request goes through one typed round trip, Impl::call (impl.hpp): a method builds
// the request table, reads the reply table, and checks what the reply says. The round
// trip itself (framing, status, reply type, descriptors) is connection.cpp. Below: what
// more than one of these files needs to read a reply.

#include <flatbuffers/flatbuffers.h>

#include <optional>
#include <string>

#include "impl.hpp"
#include "statepool/client.hpp"

namespace statepool::client::detail {

/// A reply's string; empty when the field is absent.
[[nodiscard]] std::string str(const flatbuffers::String* s);

/// Reply values that cannot be right: not a transport failure, but nothing to build on.
/// Throws Error(internal) naming `what`.
[[noreturn]] void inconsistent(const std::string& what);

/// A codec named in a reply; one this client does not know is an inconsistent reply.
[[nodiscard]] kernels::CodecId reply_codec(wire::CodecId codec);

/// A snapshot key as a request names it.
[[nodiscard]] flatbuffers::Offset<wire::SnapshotKey> key_to_wire(flatbuffers::FlatBufferBuilder& b,
                                                                 const SnapshotKey& key);
/// A reply's KV blocks; an unknown codec (a newer daemon) is an inconsistent reply.
[[nodiscard]] std::optional<kernels::KvBlocks> kv_of(const wire::KvBlocks* kv);

}  // namespace statepool::client::detail
