#pragma once
// Request handlers: one verified Request in, one Reply (and maybe one fd) out. No I/O
// here, so every handler can be unit-tested without sockets.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <flatbuffers/flatbuffers.h>
#include <sys/types.h>

#include "backend/memory.hpp"
#include "config/config.hpp"
#include "pool/pool.hpp"
#include "statepool_generated.h"

namespace statepool::service {

/// What one connection knows about its peer; owned by its session, touched only on the
/// session's strand.
struct ConnectionState {
  std::uint64_t id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool hello_done = false;
  std::uint16_t version = 0;
  std::string tenant;
  std::string client_name;
  LeaseId lease = 0;
  std::map<std::uint32_t, std::unique_ptr<Memory>> staging;
  std::uint64_t staging_bytes = 0;
  std::uint32_t next_staging_id = 1;
};

/// Server-wide facts the handlers need.
struct ServerContext {
  const Config& config;
  Pool& pool;
  MemoryBackend& staging_backend;
  std::chrono::steady_clock::time_point started;
  std::function<std::uint32_t()> clients_connected;
  std::function<void(const std::string& why)> request_drain;
};

struct HandlerResult {
  flatbuffers::FlatBufferBuilder builder;
  wire::Status status = wire::Status::ok;
  int fd = -1;               ///< borrowed; sent with the reply when >= 0
  bool close_after = false;  ///< close the connection after sending the reply
};

/// Handles one request. Never throws: errors become error replies.
void handle_request(ServerContext& server, ConnectionState& connection,
                    const wire::Request& request, HandlerResult& result);

/// Builds an error reply (also used for frames that never became requests).
void build_error(flatbuffers::FlatBufferBuilder& builder, std::uint64_t id, wire::Status status,
                 const std::string& message);

}  // namespace statepool::service
