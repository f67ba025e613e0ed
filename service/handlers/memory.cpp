// OpenArena, CloseArena, OpenStaging, CloseStaging (allocations and releases, on a worker),
// Allocate, Free (slot tables only: inline).
#include <algorithm>
#include <optional>
#include <vector>

#include <boost/asio/use_awaitable.hpp>

#include "exec/async.hpp"
#include "handlers/handlers.hpp"
#include "memory/client_memory.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

constexpr std::uint32_t kMaxSlotsPerRequest = 65536;

/// How the request wants its memory shared: unset is the backend's default.
std::optional<HandleKind> requested_handle(bool legacy_ipc) {
  if (!legacy_ipc) return std::nullopt;
  return HandleKind::cuda_ipc;
}

}  // namespace

Handled handle(Call& call, const wire::OpenArena& in) {
  ServerContext& s = call.server;
  const std::string& tenant = call.connection.tenant;
  ArenaInfo a;
  co_await async_run(
      s.workers,
      [&] {
        a = s.pool.open_arena(tenant, in.layout_id(), in.pages(), requested_handle(in.legacy_ipc()),
                              call.connection.lease);
      },
      boost::asio::use_awaitable);
  if (a.created) {
    LOG_INFO("pool", "arena ", a.id, " created for tenant '", a.tenant, "', layout '",
             a.layout_name, "' (", kernels::to_string(a.codec), "): ", a.page_count, " pages of ",
             a.page_bytes, " B, ", support::format_bytes(a.bytes), " of ", a.backend, " memory");
  }
  auto& b = call.builder();
  const auto memory = protocol::to_wire(b, a.memory->info().where);
  const auto backend = b.CreateString(a.backend);
  call.reply<wire::OpenArena>(wire::CreateOpenArenaReply(
      b, a.id, a.bytes, a.page_bytes, a.page_stride, a.page_count, backend, a.created, memory));
  if (a.memory->info().where.handle_is_fd()) call.result.attach = a.memory;
}

Handled handle(Call& call, const wire::CloseArena& in) {
  ServerContext& s = call.server;
  const ConnectionState& c = call.connection;
  ClosedArena closed;
  // Releasing the memory (munmap, cuMemRelease) takes a while for a large arena.
  co_await async_run(
      s.workers, [&] { closed = s.pool.close_arena(c.tenant, in.arena_id(), c.lease); },
      boost::asio::use_awaitable);
  LOG_INFO("pool", "arena ", closed.id, " of tenant '", c.tenant, "', layout '", closed.layout_name,
           "' closed by connection ", c.id, " (pid ", c.pid,
           "): ", support::format_bytes(closed.bytes), " given back",
           closed.snapshots_dropped > 0
               ? support::cat(", ", closed.snapshots_dropped, " snapshots dropped")
               : std::string());
  call.reply<wire::CloseArena>(
      wire::CreateCloseArenaReply(call.builder(), closed.bytes, closed.snapshots_dropped));
}

Handled handle(Call& call, const wire::OpenStaging& in) {
  ServerContext& s = call.server;
  ConnectionState& c = call.connection;
  STATEPOOL_EXPECTS(in.bytes() > 0, Status::invalid_argument, "staging bytes must be positive");
  STATEPOOL_EXPECTS(c.staging.size() < kMaxStagingBuffers, Status::quota_exceeded,
                    support::cat("this connection holds ", c.staging.size(),
                                 " staging buffers, the most one connection may hold; close one "
                                 "(CloseStaging) first"));
  const std::uint32_t staging_id = c.next_staging_id++;
  std::shared_ptr<Allocation> memory;
  // The connection's budget refuses first, then the tenant's (quota_exceeded), then the
  // daemon's (pool_exhausted); a refusal allocates nothing.
  co_await async_run(
      s.workers,
      [&] {
        memory =
            c.staging_limit->allocate(static_cast<std::size_t>(in.bytes()),
                                      support::cat("statepool-staging-", c.id, "-", staging_id),
                                      requested_handle(in.legacy_ipc()));
      },
      boost::asio::use_awaitable);
  c.staging.emplace(staging_id, memory);
  auto& b = call.builder();
  const auto where = protocol::to_wire(b, memory->info().where);
  call.reply<wire::OpenStaging>(wire::CreateOpenStagingReply(b, staging_id, memory->size(), where));
  if (memory->info().where.handle_is_fd()) call.result.attach = std::move(memory);
}

void expect_intact(const std::vector<std::shared_ptr<const Allocation>>& memory) {
  for (const auto& allocation : memory) {
    const auto* lent = dynamic_cast<const ClientMemory*>(allocation.get());
    STATEPOOL_EXPECTS(lent == nullptr || !lent->broken(), Status::invalid_argument,
                      "the client shrank memory it registered (RegisterMemory) while the daemon "
                      "used it: the loan is broken; close it and register the memory again");
  }
}

Handled handle(Call& call, const wire::RegisterMemory& in) {
  ServerContext& s = call.server;
  ConnectionState& c = call.connection;
  support::UniqueFd fd = std::move(c.received_fd);
  STATEPOOL_EXPECTS(fd, Status::invalid_argument,
                    "register_memory needs the memory's descriptor attached (FD_ATTACHED)");
  STATEPOOL_EXPECTS(
      s.executor.can_access(MemorySpace::host, -1), Status::invalid_argument,
      support::cat("registered memory is host memory, which this daemon's ", s.executor.name(),
                   " executor cannot read or write; use staging buffers "
                   "(OpenStaging) instead"));
  STATEPOOL_EXPECTS(c.staging.size() < kMaxStagingBuffers, Status::quota_exceeded,
                    support::cat("this connection holds ", c.staging.size(),
                                 " staging buffers and registered memories, the most one "
                                 "connection may hold; close one (CloseStaging) first"));
  const std::string name = in.name() == nullptr ? std::string() : in.name()->str().substr(0, 128);
  std::shared_ptr<ClientMemory> memory;
  // mmap of a large file, on a worker.
  co_await async_run(
      s.workers,
      [&] {
        memory = ClientMemory::map(std::move(fd), in.bytes(),
                                   support::cat("'", name, "' of connection ", c.id));
      },
      boost::asio::use_awaitable);
  const std::uint32_t staging_id = c.next_staging_id++;
  c.staging.emplace(staging_id, memory);
  LOG_INFO("session", "connection ", c.id, " (pid ", c.pid, "): registered ",
           support::format_bytes(memory->size()), " of its memory '", name, "' as staging ",
           staging_id,
           memory->sealed() ? " (sealed against shrinking)"
                            : " (not sealable: guarded; shrinking it breaks the loan)");
  call.reply<wire::RegisterMemory>(wire::CreateRegisterMemoryReply(
      call.builder(), staging_id, memory->size(), memory->sealed()));
}

void handle(Call& call, const wire::CloseStaging& in) {
  ConnectionState& c = call.connection;
  const auto it = c.staging.find(in.staging_id());
  STATEPOOL_EXPECTS(it != c.staging.end(), Status::not_found,
                    support::cat("no staging buffer ", in.staging_id(), " on this connection"));
  release_later(call.server.workers, std::move(it->second));
  c.staging.erase(it);
  call.reply<wire::CloseStaging>(wire::CreateCloseStagingReply(call.builder()));
}

void handle(Call& call, const wire::Allocate& in) {
  STATEPOOL_EXPECTS(in.count() >= 1 && in.count() <= kMaxSlotsPerRequest, Status::invalid_argument,
                    support::cat("allocate count must be between 1 and ", kMaxSlotsPerRequest,
                                 ", got ", in.count()));
  const auto slots = call.server.pool.allocate(call.connection.lease, in.arena_id(), in.count());
  auto& b = call.builder();
  call.reply<wire::Allocate>(wire::CreateAllocateReply(b, b.CreateVector(slots)));
}

void handle(Call& call, const wire::Free& in) {
  STATEPOOL_EXPECTS(in.slots() != nullptr && in.slots()->size() > 0, Status::invalid_argument,
                    "free without slots");
  const std::vector<SlotId> slots(in.slots()->begin(), in.slots()->end());
  const std::uint32_t freed = call.server.pool.free(call.connection.lease, in.arena_id(), slots);
  call.reply<wire::Free>(wire::CreateFreeReply(call.builder(), freed));
}

}  // namespace statepool::service
