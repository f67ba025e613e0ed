#include "dispatch_harness.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "handlers/handlers.hpp"
#include "memory/limiting.hpp"
#include "memory/tracking.hpp"
#include "pool/pool.hpp"
#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::fuzz {
namespace {

namespace asio = boost::asio;
namespace protocol = statepool::protocol;
using service::Clock;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "statepool fuzz_frame: invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

service::Config harness_config() {
  service::Config c;
  c.backend = "host";
  c.metrics_address.clear();
  c.api_address.clear();
  c.max_frame_bytes = HarnessLimits::kMaxFrameBytes;
  c.max_staging_bytes = HarnessLimits::kMaxStagingBytes;
  c.staging_capacity = HarnessLimits::kStagingCapacity;
  c.pool.capacity_bytes = HarnessLimits::kPoolCapacity;
  c.pool.default_arena_pages = HarnessLimits::kDefaultArenaPages;
  c.pool.max_arena_pages = HarnessLimits::kMaxArenaPages;
  c.pool.grace_period = std::chrono::milliseconds(1000);
  service::TenantConfig open;
  open.name = "default";
  service::TenantConfig small;
  small.name = "small";
  small.quota_bytes = HarnessLimits::kSmallTenantQuota;
  small.limits.max_staging_bytes = HarnessLimits::kSmallTenantStaging;
  service::TenantConfig locked;
  locked.name = "locked";
  locked.uids = {HarnessLimits::kLockedTenantUid};
  locked.gids = {HarnessLimits::kLockedTenantUid};
  c.pool.tenants = {open, small, locked};
  c.workers = 2;
  return c;
}

/// Checks one reply as the peer would receive it (the session sends result.builder as is).
void check_reply(const flatbuffers::FlatBufferBuilder& builder, std::uint64_t id, Status status,
                 const char* request, wire::RequestBody type, int fd) {
  const std::string what = std::string("reply to ") + request;
  if (builder.GetSize() == 0) fail(what + ": no reply was built");
  const std::span<const std::byte> bytes{
      reinterpret_cast<const std::byte*>(builder.GetBufferPointer()), builder.GetSize()};
  // The peer gets the reply in a buffer of its own (aligned as any allocation).
  const std::vector<std::byte> copy(bytes.begin(), bytes.end());
  protocol::FrameError error = protocol::FrameError::none;
  const wire::Reply* reply = protocol::verify_reply(copy, error);
  if (reply == nullptr) fail(what + ": the reply does not verify");
  if (reply->id() != id) fail(what + ": the reply id is not the request's");
  if (protocol::from_wire(reply->status()) != status)
    fail(what + ": the reply status is not the handler's");
  if (status == Status::internal) {
    fail(what + ": internal error: " + (reply->message() ? reply->message()->str() : ""));
  }
  if (status == Status::ok) {
    if (static_cast<int>(reply->body_type()) != static_cast<int>(type))
      fail(what + ": a successful reply of another type");
    const bool may_attach =
        type == wire::RequestBody::OpenArena || type == wire::RequestBody::OpenStaging;
    if (fd >= 0 && !may_attach) fail(what + ": a descriptor attached to it");
  } else {
    if (reply->message() == nullptr || reply->message()->size() == 0)
      fail(what + ": an error reply without a message");
    if (fd >= 0) fail(what + ": a descriptor attached to an error reply");
  }
}

}  // namespace

struct DispatchHarness::State {
  /// STATEPOOL_FUZZ_TRACE=1: every request and its reply's status on stderr (to see what
  /// an input does when reproducing it).
  bool trace = std::getenv("STATEPOOL_FUZZ_TRACE") != nullptr;
  service::Config config = harness_config();
  support::WorkerPool workers{config.workers};
  service::Backend backend = service::make_backend({config.backend}, workers);
  service::TrackingResource staging_memory{*backend.memory};
  // As the server builds them (server/server.cpp): the daemon's staging capacity, and
  // each tenant's staging budget over it.
  service::LimitingResource staging_capacity{
      staging_memory, config.staging_capacity, Status::pool_exhausted,
      service::LimitText{"staging capacity of the daemon", "held", " (--staging-capacity)"}};
  std::map<std::string, std::unique_ptr<service::LimitingResource>> tenant_staging = [this] {
    std::map<std::string, std::unique_ptr<service::LimitingResource>> out;
    for (const service::TenantConfig& t : config.pool.tenants) {
      out.emplace(t.name, std::make_unique<service::LimitingResource>(
                              staging_capacity, t.limits.max_staging_bytes, Status::quota_exceeded,
                              service::LimitText{"staging limit of tenant '" + t.name + "'"}));
    }
    return out;
  }();

  /// One connection's session loop over `input` (Session::run / read_frame without the
  /// socket; see the header).
  asio::awaitable<void> serve(service::ServerContext& server, service::ConnectionState& c,
                              std::span<const std::uint8_t> input, const bool& draining) {
    std::size_t at = 0;
    std::vector<std::byte> payload;
    while (!draining) {
      if (input.size() - at < protocol::kHeaderBytes) co_return;  // EOF or a cut header
      std::array<std::byte, protocol::kHeaderBytes> head{};
      std::memcpy(head.data(), input.data() + at, head.size());
      at += head.size();
      const protocol::FrameHeader header = protocol::decode_header(head);
      protocol::FrameError error =
          protocol::check_header(header, protocol::FrameType::request, config.max_frame_bytes);
      flatbuffers::FlatBufferBuilder refusal;
      if (error != protocol::FrameError::none) {
        service::build_error(refusal, 0, Status::protocol_error, protocol::to_string(error));
        check_reply(refusal, 0, Status::protocol_error, "a bad header", wire::RequestBody::NONE,
                    -1);
        co_return;
      }
      if (input.size() - at < header.length) co_return;  // the rest never arrives
      payload.assign(reinterpret_cast<const std::byte*>(input.data() + at),
                     reinterpret_cast<const std::byte*>(input.data() + at + header.length));
      at += header.length;
      const wire::Request* request = protocol::verify_request(payload, error);
      if (request == nullptr || header.flags != protocol::kFlagNone) {
        service::build_error(refusal, 0, Status::protocol_error,
                             request == nullptr ? protocol::to_string(error) : "fd flag");
        check_reply(refusal, 0, Status::protocol_error, "a refused frame", wire::RequestBody::NONE,
                    -1);
        co_return;
      }
      service::HandlerResult result;
      co_await service::handle_request(server, c, *request, result);
      check_reply(result.builder, request->id(), result.status,
                  protocol::request_name(request->body_type()), request->body_type(), result.fd());
      if (trace) {
        const wire::Reply* reply =
            flatbuffers::GetRoot<wire::Reply>(result.builder.GetBufferPointer());
        std::fprintf(stderr, "fuzz_frame: %s (id %llu) -> %s%s%s\n",
                     protocol::request_name(request->body_type()),
                     static_cast<unsigned long long>(request->id()), status_name(result.status),
                     reply->message() ? ": " : "",
                     reply->message() ? reply->message()->c_str() : "");
      }
      if (result.close_after) co_return;
    }
  }

  void run(std::span<const std::uint8_t> input) {
    service::Pool pool(config.pool, backend.memory);
    bool draining = false;
    service::ServerContext server{config,
                                  pool,
                                  workers,
                                  *backend.executor,
                                  std::chrono::steady_clock::now(),
                                  [] { return 1u; },
                                  [&draining](const std::string&) { draining = true; },
                                  [this](const std::string& tenant) -> service::MemoryResource& {
                                    return *tenant_staging.at(tenant);
                                  },
                                  nullptr};  // no snapshot tiers below the pool
    service::ConnectionState connection;
    connection.id = 1;
    connection.pid = ::getpid();
    connection.uid = ::geteuid();  // an operator: Stats shows everything, Drain is allowed
    connection.gid = ::getegid();  // the staging limit comes with Hello
    // Outlives the workers' last tasks of this input (they may still hold a work guard).
    asio::io_context io;
    {
      bool finished = false;
      std::exception_ptr failure;
      asio::co_spawn(io, serve(server, connection, input, draining), [&](std::exception_ptr e) {
        finished = true;
        failure = std::move(e);
      });
      io.run();
      if (failure) {
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& e) {
          fail(std::string("an exception escaped the session loop: ") + e.what());
        } catch (...) {
          fail("an exception escaped the session loop");
        }
      }
      if (!finished) fail("the session loop never finished (an operation was never completed)");
    }
    // The connection ends as ~Session ends it; then its grace period passes.
    for (auto& [id, memory] : connection.staging)
      service::release_later(workers, std::move(memory));
    connection.staging.clear();
    const Clock::time_point now = Clock::now();
    if (connection.hello_done) pool.detach_lease(connection.lease, now);
    pool.reclaim_expired(now + config.pool.grace_period);
    workers.wait_idle();

    const std::vector<std::string> problems = pool.check();
    if (!problems.empty()) fail("Pool::check(): " + problems.front());
    const service::PoolStats stats = pool.stats();
    for (const service::ArenaInfo& arena : stats.arenas) {
      // Prefix-state snapshots outlive their publisher's connection (docs/prefix-store.md);
      // every other page must be back.
      if (arena.pages_used != arena.snapshot_pages)
        fail("arena " + std::to_string(arena.id) + " still has " +
             std::to_string(arena.pages_used - arena.snapshot_pages) +
             " slot pages used after the grace period");
    }
    if (stats.leases_active != 0 || stats.leases_orphaned != 0)
      fail("a lease survived its connection and its grace period");
    if (connection.staging_limit != nullptr && connection.staging_limit->used() != 0)
      fail("staging bytes still charged to the ended connection");
    for (const auto& [name, limit] : tenant_staging) {
      if (limit->used() != 0) fail("staging bytes still charged to tenant " + name);
    }
    if (staging_capacity.used() != 0 || staging_memory.usage().live_bytes != 0)
      fail("staging memory still allocated after its connection ended");
  }
};

DispatchHarness::DispatchHarness() {
  support::set_log_level(support::LogLevel::error);
  state_ = std::make_unique<State>();
}

DispatchHarness::~DispatchHarness() = default;

void DispatchHarness::run(std::span<const std::uint8_t> input) {
  state_->run(input);
}

}  // namespace statepool::fuzz
