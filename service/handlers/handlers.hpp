#pragma once
// Request handlers: one per request type (an overload of handle() for each table of the
// RequestBody union), grouped by concern:
//
//   session.cpp    Hello, Ping, Drain, Stats
//   layouts.cpp    RegisterLayout, InstallPlan
//   memory.cpp     OpenArena, CloseArena, OpenStaging, CloseStaging, RegisterMemory,
//                  Allocate, Free
//   data.cpp       Compress, Decompress, Copy            (on the Executor)
//   capacity.cpp   PlanCapacity, FitsNow (live_capacity.hpp: the planner against the pool,
//                  shared with the HTTP API)
//   snapshots.cpp  PutSnapshot, GetSnapshot (copies on the Executor), DeleteSnapshot,
//                  PinSnapshot, ListSnapshots, ExportSnapshot, ImportSnapshot
//   snapshot_batches.cpp  LookupSnapshots, PutSnapshots, GetSnapshots (N keys at once)
//   dispatch.cpp   handle_request(): verified Request in, Reply (and maybe a descriptor) out
//
// Handlers are coroutines on the connection's strand. Anything heavy leaves the I/O
// thread: codec work and copies go to the Executor, allocations and other blocking calls
// to the WorkerPool (exec/async.hpp); the handler awaits them and then builds its reply.
// No socket I/O happens here, so handlers are tested without sockets. A handler reports
// a refusal by throwing StatusError; dispatch turns it into the error reply.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <flatbuffers/flatbuffers.h>
#include <sys/types.h>
#include <boost/asio/awaitable.hpp>

#include "config/config.hpp"
#include "exec/executor.hpp"
#include "memory/limiting.hpp"
#include "memory/resource.hpp"
#include "pool/pool.hpp"
#include "statepool/protocol/messages.hpp"
#include "statepool/support/unique_fd.hpp"
#include "statepool/support/worker_pool.hpp"
#include "statepool_generated.h"
#include "store/tiers.hpp"

namespace statepool::service {

/// What one connection knows about its peer; owned by its session, touched only on the
/// session's strand (and by the handler it is running).
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
  /// This connection's staging budget (--max-staging-bytes), over its tenant's budget
  /// (ServerContext::tenant_staging); set by Hello.
  std::unique_ptr<LimitingResource> staging_limit;
  std::map<std::uint32_t, std::shared_ptr<Allocation>> staging;
  std::uint32_t next_staging_id = 1;
  /// The descriptor that came with the request being handled (RegisterMemory takes it);
  /// the session closes it after the request if the handler did not.
  support::UniqueFd received_fd;
};

/// Server-wide facts and services the handlers use.
struct ServerContext {
  const Config& config;
  Pool& pool;
  support::WorkerPool& workers;  ///< blocking calls
  Executor& executor;            ///< compress / decompress / copy
  std::chrono::steady_clock::time_point started;
  std::function<std::uint32_t()> clients_connected;
  std::function<void(const std::string& why)> request_drain;
  /// The staging budget all connections of a tenant share (max-staging-bytes), over the
  /// daemon's (--staging-capacity). The tenant must exist.
  std::function<MemoryResource&(const std::string& tenant)> tenant_staging;
  /// The prefix-state store's tiers below the pool; null when none is configured.
  SnapshotTiers* tiers = nullptr;
  /// Hand-overs since the pool was created (Server::set_generation, before serving).
  std::uint64_t generation = 0;
};

/// Staging buffers one connection may hold at once: each holds a descriptor in the
/// daemon, so their number is bounded as well as their bytes.
inline constexpr std::size_t kMaxStagingBuffers = 64;

struct HandlerResult {
  flatbuffers::FlatBufferBuilder builder;
  Status status = Status::ok;
  /// Memory whose share descriptor is sent with the reply (SCM_RIGHTS), if any; held until
  /// the reply is written.
  std::shared_ptr<const Allocation> attach;
  bool close_after = false;  ///< close the connection after sending the reply
  /// The descriptor to send, or -1.
  [[nodiscard]] int fd() const noexcept { return attach ? attach->info().fd : -1; }
  /// Ready for the next request; the builder keeps its buffer.
  void reset() noexcept {
    builder.Clear();
    status = Status::ok;
    attach.reset();
    close_after = false;
  }
};

/// One request being handled.
struct Call {
  ServerContext& server;
  ConnectionState& connection;
  std::uint64_t id = 0;  ///< the request's id, echoed in the reply
  HandlerResult& result;

  /// Finishes the reply with `body`, which must be the reply table of `Request`.
  template <class Request>
  void reply(flatbuffers::Offset<protocol::ReplyFor<Request>> body) {
    result.builder.Finish(wire::CreateReply(result.builder, id, wire::Status::ok, 0,
                                            protocol::kReplyType<protocol::ReplyFor<Request>>,
                                            body.Union()));
  }
  [[nodiscard]] flatbuffers::FlatBufferBuilder& builder() noexcept { return result.builder; }
};

using Handled = boost::asio::awaitable<void>;

void handle(Call& call, const wire::Hello& request);
void handle(Call& call, const wire::Ping& request);
void handle(Call& call, const wire::Drain& request);
void handle(Call& call, const wire::Stats& request);
Handled handle(Call& call, const wire::RegisterLayout& request);
Handled handle(Call& call, const wire::InstallPlan& request);
Handled handle(Call& call, const wire::OpenArena& request);
Handled handle(Call& call, const wire::CloseArena& request);
Handled handle(Call& call, const wire::OpenStaging& request);
void handle(Call& call, const wire::CloseStaging& request);
void handle(Call& call, const wire::Allocate& request);
void handle(Call& call, const wire::Free& request);
Handled handle(Call& call, const wire::Compress& request);
Handled handle(Call& call, const wire::Decompress& request);
Handled handle(Call& call, const wire::Copy& request);
void handle(Call& call, const wire::PlanCapacity& request);
void handle(Call& call, const wire::FitsNow& request);
Handled handle(Call& call, const wire::PutSnapshot& request);
Handled handle(Call& call, const wire::GetSnapshot& request);
Handled handle(Call& call, const wire::DeleteSnapshot& request);
void handle(Call& call, const wire::PinSnapshot& request);
void handle(Call& call, const wire::ListSnapshots& request);
Handled handle(Call& call, const wire::ExportSnapshot& request);
Handled handle(Call& call, const wire::ImportSnapshot& request);
Handled handle(Call& call, const wire::RegisterMemory& request);
Handled handle(Call& call, const wire::LookupSnapshots& request);
Handled handle(Call& call, const wire::PutSnapshots& request);
Handled handle(Call& call, const wire::GetSnapshots& request);

/// [offset, offset + bytes) of the connection's staging buffer `id`, and in `owner` the
/// buffer's memory (to keep alive while an operation uses the range). not_found for an
/// unknown id, invalid_argument for a range past its end (overflow-safe). data.cpp.
kernels::BufferRef staging_range(const ConnectionState& connection, std::uint32_t id,
                                 std::uint64_t offset, std::size_t bytes,
                                 std::shared_ptr<const Allocation>& owner);

/// Handles one verified request. Never throws: errors become error replies (internal ones
/// logged). Requests other than Hello before Hello are refused (not_hello) and close the
/// connection, as do a failed Hello and malformed requests.
Handled handle_request(ServerContext& server, ConnectionState& connection,
                       const wire::Request& request, HandlerResult& result);
/// The same without a coroutine for requests whose handler answers at once (ping,
/// allocate, free, ... : those declared `void handle` above) and for refused ones: true
/// with the reply in `result`. False, having done nothing, for a request that waits for a
/// worker or the executor: handle_request it.
bool handle_request_now(ServerContext& server, ConnectionState& connection,
                        const wire::Request& request, HandlerResult& result);

/// Builds an error reply (also used for frames that never became requests).
void build_error(flatbuffers::FlatBufferBuilder& builder, std::uint64_t id, Status status,
                 const std::string& message);

/// After an operation on `memory`: invalid_argument when some of it is memory a client lent
/// (RegisterMemory) and shrank under the daemon meanwhile (ClientMemory::broken), so the
/// operation read zeros or wrote nowhere. memory.cpp.
void expect_intact(const std::vector<std::shared_ptr<const Allocation>>& memory);

/// Releases memory on a worker: unmapping a multi-GiB buffer must not stall an I/O
/// thread. Safe to call with nullptr; never throws.
void release_later(support::WorkerPool& workers, std::shared_ptr<const Allocation> memory) noexcept;

}  // namespace statepool::service
