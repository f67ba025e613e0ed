// connect, from_fd and Hello (with what it said), Ping, Drain, Stats.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"

namespace statepool::client {
namespace {

/// How long connect() retries a Hello refused with lease_busy (see connect()).
constexpr std::chrono::milliseconds kLeaseBusyRetry{2000};

using detail::Impl;
using detail::inconsistent;
using detail::reply_codec;
using detail::str;
using detail::UniqueFd;
using Kind = ConnectionError::Kind;

std::string default_client_name() {
  std::string name;
  std::ifstream comm("/proc/self/comm");
  if (comm) std::getline(comm, name);
  if (name.empty()) name = "client";
  return name + "[" + std::to_string(::getpid()) + "]";
}

Stats stats_of(const wire::StatsReply* r) {
  Stats out;
  if (const auto* arenas = r->arenas()) {
    out.arenas.reserve(arenas->size());
    for (const auto* a : *arenas) {
      ArenaStats s;
      s.arena_id = a->arena_id();
      s.tenant = str(a->tenant());
      s.layout_id = a->layout_id();
      s.layout_name = str(a->layout_name());
      s.codec = reply_codec(a->codec());
      s.backend = str(a->backend());
      s.page_bytes = a->page_bytes();
      s.page_stride = a->page_stride();
      s.pages_total = a->pages_total();
      s.pages_used = a->pages_used();
      s.bytes_total = a->bytes_total();
      s.fp32_bytes_used = a->fp32_bytes_used();
      s.snapshot_pages = a->snapshot_pages();
      out.arenas.push_back(std::move(s));
    }
  }
  if (const auto* tenants = r->tenants()) {
    out.tenants.reserve(tenants->size());
    for (const auto* t : *tenants) {
      TenantStats s;
      s.tenant = str(t->tenant());
      s.quota_bytes = t->quota_bytes();
      s.reserved_bytes = t->reserved_bytes();
      s.pages_used = t->pages_used();
      s.stored_bytes = t->stored_bytes();
      s.fp32_bytes = t->fp32_bytes();
      s.snapshots = t->snapshots();
      s.snapshot_bytes = t->snapshot_bytes();
      s.pinned_snapshots = t->pinned_snapshots();
      s.snapshot_hits = t->snapshot_hits();
      s.snapshot_misses = t->snapshot_misses();
      s.snapshot_evictions = t->snapshot_evictions();
      s.snapshot_demotions = t->snapshot_demotions();
      s.snapshot_hits_host = t->snapshot_hits_host();
      s.snapshot_hits_remote = t->snapshot_hits_remote();
      out.tenants.push_back(std::move(s));
    }
  }
  out.clients_connected = r->clients_connected();
  out.leases_active = r->leases_active();
  out.leases_orphaned = r->leases_orphaned();
  out.pages_reclaimed_total = r->pages_reclaimed_total();
  out.pool_capacity_bytes = r->pool_capacity_bytes();
  out.pool_reserved_bytes = r->pool_reserved_bytes();
  out.uptime_seconds = r->uptime_seconds();
  out.generation = r->generation();
  return out;
}

}  // namespace

Connection Connection::connect(const Options& options) {
  // A client that resumes its lease right after its previous connection closed can reach
  // the daemon before the daemon has seen that close: the lease is still attached and
  // Hello answers lease_busy. That state lasts microseconds, so retry for a short while.
  using Clock = std::chrono::steady_clock;
  const auto retry_for = std::min<std::chrono::milliseconds>(
      options.timeout.count() > 0 ? options.timeout : kLeaseBusyRetry, kLeaseBusyRetry);
  const auto give_up = Clock::now() + retry_for;
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    UniqueFd fd = detail::connect_unix(options.socket_path, options.timeout);
    auto impl = std::make_shared<Impl>(std::move(fd), options);
    Connection connection(std::move(impl));
    try {
      connection.say_hello(options);
      return connection;
    } catch (const Error& e) {
      if (e.status() != Status::lease_busy || options.lease_token.empty() ||
          Clock::now() + pause >= give_up)
        throw;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

Connection Connection::from_fd(int fd, const Options& options) {
  UniqueFd owned(fd);
  if (!owned) throw ConnectionError(Kind::connect_failed, "Connection::from_fd: invalid fd");
  detail::prepare_socket(owned.get());
  auto impl = std::make_shared<Impl>(std::move(owned), options);
  Connection connection(std::move(impl));
  connection.say_hello(options);
  return connection;
}

void Connection::say_hello(const Options& options) {
  Impl& i = impl();
  const std::string name =
      options.client_name.empty() ? default_client_name() : options.client_name;
  i.call<wire::Hello>(
      [&](auto& b) {
        return wire::CreateHelloDirect(b, protocol::kMinProtocolVersion,
                                       protocol::kMaxProtocolVersion, options.tenant.c_str(),
                                       options.lease_token.c_str(), name.c_str());
      },
      [&](const wire::HelloReply* hello) {
        if (hello->version() < protocol::kMinProtocolVersion ||
            hello->version() > protocol::kMaxProtocolVersion) {
          throw Error(Status::unsupported_version,
                      "statepoold chose protocol version " + std::to_string(hello->version()) +
                          ", this client speaks " + std::to_string(protocol::kMinProtocolVersion) +
                          ".." + std::to_string(protocol::kMaxProtocolVersion) +
                          "; upgrade the client library");
        }
        i.version = hello->version();
        i.lease_token = str(hello->lease_token());
        i.lease_resumed = hello->lease_resumed();
        i.resumed_slots = hello->resumed_slots();
        i.server = str(hello->server());
        i.grace_period = std::chrono::milliseconds(hello->grace_period_ms());
        i.max_frame_bytes = hello->max_frame_bytes();
        i.max_batch_keys = hello->max_batch_keys();
        i.max_batch_bytes = hello->max_batch_bytes();
        if (i.version >= 2 && (i.max_batch_keys == 0 || i.max_batch_bytes == 0))
          inconsistent("protocol version 2 without the batch caps in the Hello reply");
      });
}

// --- what Hello said ---------------------------------------------------------------------

const std::string& Connection::lease_token() const {
  return impl().lease_token;
}
bool Connection::lease_resumed() const {
  return impl().lease_resumed;
}
std::uint32_t Connection::resumed_slots() const {
  return impl().resumed_slots;
}
std::chrono::milliseconds Connection::grace_period() const {
  return impl().grace_period;
}
std::uint16_t Connection::protocol_version() const {
  return impl().version;
}
const std::string& Connection::server() const {
  return impl().server;
}
std::uint32_t Connection::max_frame_bytes() const {
  return impl().max_frame_bytes;
}

// ---------------------------------------------------------------------------------------
// Ping, Drain, Stats

std::chrono::nanoseconds Connection::ping() {
  const auto start = detail::Clock::now();
  impl().call<wire::Ping>([](auto& b) { return wire::CreatePing(b); },
                          [](const wire::PingReply*) {});
  return std::chrono::duration_cast<std::chrono::nanoseconds>(detail::Clock::now() - start);
}

void Connection::drain() {
  impl().call<wire::Drain>([](auto& b) { return wire::CreateDrain(b); },
                           [](const wire::DrainReply*) {});
}

Stats Connection::stats() {
  return impl().call<wire::Stats>([](auto& b) { return wire::CreateStats(b); }, stats_of);
}

double ArenaStats::compression_ratio() const noexcept {
  const std::uint64_t stored = stored_bytes_used();
  return stored == 0 ? 0.0 : static_cast<double>(fp32_bytes_used) / static_cast<double>(stored);
}

double TenantStats::compression_ratio() const noexcept {
  return stored_bytes == 0 ? 0.0
                           : static_cast<double>(fp32_bytes) / static_cast<double>(stored_bytes);
}

}  // namespace statepool::client
