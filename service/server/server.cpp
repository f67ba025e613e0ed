#include "server/server.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "http/api.hpp"
#include "http/metrics_endpoint.hpp"
#include "http/server.hpp"
#include "server/session.hpp"
#include "server/systemd.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/log.hpp"

namespace statepool::service {

ProtocolLabels protocol_labels() {
  ProtocolLabels labels;
  labels.version = protocol::kMaxProtocolVersion;
  for (auto type = static_cast<std::size_t>(wire::RequestBody::MIN);
       type <= static_cast<std::size_t>(wire::RequestBody::MAX); ++type)
    labels.request_types.emplace_back(protocol::request_name(static_cast<wire::RequestBody>(type)));
  return labels;
}
namespace asio = boost::asio;
using asio::use_awaitable;
using local = asio::local::stream_protocol;

namespace {

// True when something accepts connections on `path` (a live daemon).
bool socket_is_live(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return live;
}

}  // namespace

Server::Server(const Config& config, Pool& pool, Metrics* metrics, MemoryResource& staging_memory,
               support::WorkerPool& workers, Executor& executor, SnapshotTiers* tiers)
    : config_(config),
      pool_(pool),
      metrics_(metrics),
      staging_memory_(staging_memory),
      workers_(workers),
      executor_(executor),
      staging_capacity_(
          staging_memory, config.staging_capacity, Status::pool_exhausted,
          LimitText{"staging capacity of the daemon", "held", " (--staging-capacity)"}),
      context_{config,
               pool,
               workers,
               executor,
               std::chrono::steady_clock::now(),
               [this] { return clients_connected(); },
               [this](const std::string& why) { drain(why); },
               [this](const std::string& tenant) -> MemoryResource& {
                 return *tenant_staging_.at(tenant);
               },
               tiers},
      unattached_(config.max_unattached_connections),
      session_host_{context_, metrics, listener_closed_, unattached_,
                    [this](std::uint64_t id) { session_ended(id); }},
      control_(asio::make_strand(io_)),
      acceptor_(control_),
      reclaim_timer_(control_),
      drain_timer_(control_),
      handover_acceptor_(control_) {
  for (unsigned i = 1; i < config_.threads; ++i)
    loops_.push_back(std::make_unique<asio::io_context>(1));
  for (const TenantConfig& t : pool_.config().tenants) {
    tenant_staging_.emplace(
        t.name, std::make_unique<LimitingResource>(
                    staging_capacity_, t.limits.max_staging_bytes, Status::quota_exceeded,
                    LimitText{"staging limit of tenant '" + t.name + "'", "held",
                              " (max-staging-bytes, default --tenant-max-staging-bytes)"}));
  }
}

Server::~Server() {
  if (handover_thread_.joinable()) handover_thread_.join();
  std::error_code ignored;
  if (owns_socket_file_) std::filesystem::remove(config_.socket_path, ignored);
  if (owns_handover_file_) std::filesystem::remove(config_.handover_socket, ignored);
}

void Server::bind(support::UniqueFd passed) {
  if (passed) {
    boost::system::error_code bec;
    acceptor_.assign(local(), passed.get(), bec);
    if (bec) {
      throw std::runtime_error("cannot serve the socket systemd passed for " + config_.socket_path +
                               ": " + bec.message());
    }
    LOG_INFO("server", "serving the socket systemd passed for ", config_.socket_path,
             " (socket activation: its mode and group are the socket unit's)");
    (void)passed.release();  // the acceptor's now
    socket_unit_ = true;
  } else {
    bind_socket_file(acceptor_, config_.socket_path, "--socket");
  }
  if (!config_.handover_socket.empty()) {
    bind_socket_file(handover_acceptor_, config_.handover_socket, "--handover-socket");
    owns_handover_file_ = true;
    boost::system::error_code bec;
    handover_acceptor_.listen(4, bec);
    if (bec) {
      throw std::runtime_error("cannot listen on " + config_.handover_socket + ": " +
                               bec.message());
    }
  }
  // The HTTP listeners come before the Unix socket: once a client can connect to the
  // socket (the daemon looks ready), the API and the metrics are there too.
  bind_http({}, {});
  // Kept for the moment the process runs out of descriptors: closing it makes room to
  // accept one connection and tell it so (accept_loop).
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (socket_unit_) return;  // systemd listens, with the socket unit's mode and group
  boost::system::error_code bec;
  acceptor_.listen(asio::socket_base::max_listen_connections, bec);
  if (bec)
    throw std::runtime_error("cannot listen on " + config_.socket_path + ": " + bec.message());
  if (::chmod(config_.socket_path.c_str(), static_cast<mode_t>(config_.socket_mode)) != 0) {
    throw std::runtime_error("chmod " + config_.socket_path + ": " + std::strerror(errno));
  }
  if (!config_.socket_group.empty()) {
    const group* g = ::getgrnam(config_.socket_group.c_str());
    if (g == nullptr ||
        ::chown(config_.socket_path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      throw std::runtime_error("cannot give " + config_.socket_path + " to group " +
                               config_.socket_group + ": " + std::strerror(errno));
    }
  }
}

void Server::bind_http(support::UniqueFd api, support::UniqueFd metrics) {
  if (!config_.api_address.empty()) {
    api_service_ = std::make_unique<HttpApi>(config_, pool_);
    api_ = std::make_unique<HttpServer>(io_, config_.api_address, "--api-address",
                                        config_.io_timeout, *api_service_, draining_);
    api_->listen(std::move(api));
  }
  if (metrics_ != nullptr && !config_.metrics_address.empty()) {
    metrics_service_ = std::make_unique<MetricsEndpoint>(*metrics_);
    metrics_http_ = std::make_unique<HttpServer>(io_, config_.metrics_address, "--metrics-address",
                                                 config_.io_timeout, *metrics_service_, draining_);
    metrics_http_->listen(std::move(metrics));
  }
}

void Server::bind_socket_file(local::acceptor& acceptor, const std::string& socket_path,
                              const char* flag) {
  namespace fs = std::filesystem;
  const fs::path path(socket_path);
  std::error_code ec;
  if (path.has_parent_path() && !fs::exists(path.parent_path(), ec)) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      throw std::runtime_error("cannot create socket directory " + path.parent_path().string() +
                               ": " + ec.message());
    }
  }
  if (fs::exists(fs::symlink_status(path, ec))) {
    if (socket_is_live(socket_path)) {
      throw std::runtime_error("another daemon is already serving " + socket_path +
                               " (stop it, or pass a different " + flag + ")");
    }
    if (!fs::is_socket(fs::symlink_status(path, ec))) {
      throw std::runtime_error(socket_path + " exists and is not a socket; refusing to replace it");
    }
    LOG_INFO("server", "removing stale socket ", socket_path);
    fs::remove(path, ec);
  }
  // Create the socket file with no permissions for others until chmod in bind().
  const mode_t old_mask = ::umask(0177);
  boost::system::error_code bec;
  acceptor.open(local(), bec);
  if (!bec) acceptor.bind(local::endpoint(socket_path), bec);
  ::umask(old_mask);
  if (bec) throw std::runtime_error("cannot bind " + socket_path + ": " + bec.message());
  if (&acceptor == &acceptor_) owns_socket_file_ = true;
}

std::uint64_t Server::prepare_descriptor_limit(const Config& config) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  const std::uint64_t needed = std::uint64_t{config.max_connections} + kDescriptorHeadroom;
  // Daemons may use the hard limit; the soft one is often a shell's 1024.
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
    throw ConfigError(support::cat("--max-connections ", config.max_connections, " needs at least ",
                                   needed, " file descriptors (one per connection and ",
                                   kDescriptorHeadroom,
                                   " for arenas, listeners and HTTP connections); the "
                                   "limit is ",
                                   limit.rlim_cur, " (hard limit ", limit.rlim_max,
                                   "). Raise it (ulimit -n, systemd LimitNOFILE=) or lower "
                                   "--max-connections"));
  }
  return limit.rlim_cur == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max()
                                         : static_cast<std::uint64_t>(limit.rlim_cur);
}

sigset_t Server::handled_signals() noexcept {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  return set;
}

std::uint16_t Server::api_port() const noexcept {
  return api_ ? api_->port() : 0;
}

std::uint16_t Server::metrics_port() const noexcept {
  return metrics_http_ ? metrics_http_->port() : 0;
}

std::size_t Server::run() {
  asio::co_spawn(control_, accept_loop(), asio::detached);
  if (api_) api_->start();
  if (metrics_http_) metrics_http_->start();
  asio::co_spawn(control_, reclaim_loop(), asio::detached);
  if (handover_acceptor_.is_open()) asio::co_spawn(control_, handover_loop(), asio::detached);

  // SIGTERM/SIGINT are blocked in every thread (main blocks them before starting any) and
  // taken here with sigtimedwait: a signal arriving at any moment, also a second one while
  // the process is already exiting, starts (or is absorbed by) the drain and never kills
  // the daemon with the default action.
  std::atomic<bool> stopped{false};
  std::thread signal_waiter([this, &stopped] {
    const sigset_t set = handled_signals();
    while (!stopped.load()) {
      const timespec tick{0, 50'000'000};
      const int signal = ::sigtimedwait(&set, nullptr, &tick);
      if (signal == SIGUSR2) {
        start_successor();
      } else if (signal == SIGTERM || signal == SIGINT) {
        if (draining_.load())
          LOG_INFO("server", signal == SIGTERM ? "SIGTERM" : "SIGINT", " while draining: ignored");
        drain(signal == SIGTERM ? "SIGTERM" : "SIGINT");
      }
    }
  });

  // The other loops run until io_ stops (finish_if_drained), idle or not.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> keep;
  std::vector<std::thread> threads;
  for (auto& loop : loops_) {
    keep.push_back(asio::make_work_guard(*loop));
    threads.emplace_back([&loop] { loop->run(); });
  }
  io_.run();
  for (auto& loop : loops_) loop->stop();
  keep.clear();
  for (auto& t : threads) t.join();
  // Work started for sessions that were cut at the drain timeout may still run; its
  // completions go to the stopped io_context and are dropped with it.
  executor_.wait_idle();
  workers_.wait_idle();
  stopped.store(true);
  signal_waiter.join();
  if (handover_thread_.joinable()) handover_thread_.join();
  return forced_closes_;
}

void Server::drain(const std::string& why) {
  asio::post(control_, [this, why] { begin_drain(why); });
}

void Server::begin_drain(const std::string& why) {
  if (handed_over_.load()) {
    // Waiting after a hand-over (--after-handover wait): nothing is left to drain.
    LOG_INFO("server", why, " after the hand-over: exiting");
    io_.stop();
    return;
  }
  if (handing_over_) {
    // Paused for a successor: if it takes over, this process exits anyway; if not, the
    // drain begins then (end_handover).
    LOG_INFO("server", why, " during a hand-over: draining if the hand-over fails");
    deferred_drain_ = why;
    return;
  }
  if (draining_.exchange(true)) return;
  if (metrics_ != nullptr) metrics_->set_draining(true);
  // A Type=notify unit is stopping from here on; the drain and the exit check may outlast
  // the unit's TimeoutStopSec=, so ask for the drain deadline and a margin.
  const auto stop_budget =
      std::chrono::duration_cast<std::chrono::microseconds>(config_.drain_timeout + kStopMargin);
  systemd::notify(support::cat("STOPPING=1\nSTATUS=draining (", why,
                               ")\nEXTEND_TIMEOUT_USEC=", stop_budget.count()));
  drain_reason_ = why;
  // The accept loop stops: it takes the connections the kernel has already completed,
  // also one its pending accept may hold, and closes the acceptor (stop_accepting()).
  if (accept_loop_done_) {
    stop_accepting();  // the loop had ended on an error: nothing to wait for
  } else {
    boost::system::error_code ignored;
    acceptor_.cancel(ignored);
  }
  if (api_) api_->stop_accepting();
  // The metrics endpoint serves on until io_ stops: a scrape during the drain sees it.
  reclaim_timer_.cancel();
  // Idle connections are closed by stop_accepting(), once the listener is closed: a
  // client that sees EOF and reconnects at once must find it closed, not be served.
  arm_drain_timer();
  finish_if_drained();
}

void Server::arm_drain_timer() {
  drain_timer_.expires_after(config_.drain_timeout);
  drain_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    const std::lock_guard lock(sessions_mutex_);
    for (auto& [id, weak] : sessions_) {
      if (auto session = weak.lock()) {
        LOG_WARN("server", "drain timeout: closing busy connection ", id);
        ++forced_closes_;
        session->close_now();
      }
    }
  });
}

void Server::session_ended(std::uint64_t id) {
  {
    const std::lock_guard lock(sessions_mutex_);
    sessions_.erase(id);
  }
  sessions_live_.fetch_sub(1);
  if (metrics_ != nullptr) metrics_->client_disconnected();
  if (draining_.load()) asio::post(control_, [this] { finish_if_drained(); });
}

void Server::finish_if_drained() {
  if (handing_over_) {
    check_paused();
    return;
  }
  if (!draining_.load() || !accepting_stopped_ || sessions_live_.load() != 0) return;
  drain_timer_.cancel();
  LOG_INFO("server", "drained: all connections closed");
  io_.stop();
}

void Server::start_session(local::socket socket) {
  std::shared_ptr<Session> session;
  {
    const std::lock_guard lock(sessions_mutex_);
    const std::uint64_t id = next_session_id_++;
    session = std::make_shared<Session>(session_host_, std::move(socket), id);
    sessions_.emplace(id, session);
  }
  session->claim_unattached();
  sessions_live_.fetch_add(1);
  if (metrics_ != nullptr) metrics_->client_connected();
  auto executor = session->socket_executor();
  // Accepted during the drain (before stop_accepting closes the listener): served like
  // any open connection; stop_accepting() closes it once it has nothing to serve.
  asio::co_spawn(
      executor, [session]() { return session->run(); }, asio::detached);
}

Server::Refusal Server::refuse_for_descriptors() {
  // Give back the spare descriptor to take the waiting connection, tell it why, let it go.
  spare_fd_.reset();
  support::UniqueFd peer(
      ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  const int accept_errno = errno;
  Refusal outcome = Refusal::refused;
  if (peer) {
    flatbuffers::FlatBufferBuilder builder;
    build_error(builder, 0, Status::too_many_connections,
                "the daemon is out of file descriptors; retry later");
    const std::string frame = protocol::make_frame(protocol::FrameType::reply, protocol::kFlagNone,
                                                   {builder.GetBufferPointer(), builder.GetSize()});
    // A fresh socket's buffer holds this small frame; if not, the client sees EOF.
    [[maybe_unused]] const ssize_t sent =
        ::send(peer.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    peer.reset();
  } else {
    // Linux reports EMFILE before it looks at the backlog: with the spare given back,
    // EAGAIN says that no connection is waiting after all.
    outcome = accept_errno == EAGAIN || accept_errno == EWOULDBLOCK ? Refusal::none_waiting
                                                                    : Refusal::failed;
  }
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (outcome != Refusal::refused) return outcome;

  if (metrics_ != nullptr) metrics_->connection_refused("descriptors");
  ++descriptor_refusals_;
  const auto now = std::chrono::steady_clock::now();
  if (descriptor_refusals_ == 1 || now - descriptor_warned_ >= std::chrono::seconds(10)) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    LOG_WARN("server", "out of file descriptors (limit ", limit.rlim_cur,
             "): refusing new connections with too_many_connections; ", descriptor_refusals_,
             " refused so far. Lower --max-connections or raise the limit (LimitNOFILE=)");
    descriptor_warned_ = now;
  }
  return outcome;
}

asio::any_io_executor Server::next_session_executor() {
  const std::size_t loop = next_loop_++ % (loops_.size() + 1);
  if (loop == 0) return io_.get_executor();
  return loops_[loop - 1]->get_executor();
}

asio::awaitable<void> Server::accept_loop() {
  while (!draining_.load()) {
    auto [ec, socket] =
        co_await acceptor_.async_accept(next_session_executor(), asio::as_tuple(use_awaitable));
    if (ec) {
      if (draining_.load() || ec == asio::error::operation_aborted) break;
      const bool out_of_descriptors = ec.value() == EMFILE || ec.value() == ENFILE;
      if (out_of_descriptors && spare_fd_) {
        const Refusal refusal = refuse_for_descriptors();
        if (refusal == Refusal::refused) continue;
        if (refusal == Refusal::none_waiting) {
          // Wait for a connection without trying to accept it: an accept would fail
          // again at once, with nothing to refuse.
          auto [wait_ec] = co_await acceptor_.async_wait(asio::socket_base::wait_read,
                                                         asio::as_tuple(use_awaitable));
          if (wait_ec) break;
          continue;
        }
      }
      LOG_WARN("server", "accept failed: ", ec.message());
      if (out_of_descriptors || ec == asio::error::no_buffer_space) {
        // No spare descriptor to answer with: back off instead of spinning.
        asio::steady_timer pause(control_, std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::as_tuple(use_awaitable));
      }
      continue;
    }
    // Also when the drain has just begun: the kernel had completed this connection, so
    // for its client it is open. It is served like the others.
    start_session(std::move(socket));
  }
  accept_loop_done_ = true;
  if (handing_over_) {
    check_paused();  // the listener stays open: its backlog is the successor's
  } else if (draining_.load()) {
    stop_accepting();  // else begin_drain calls it
  }
}

void Server::stop_accepting() {
  // Connections the kernel has already completed wait in the listen backlog; for their
  // clients they are open, and what they have sent has arrived. Take them in, so that
  // closing the acceptor does not reset them: each is served like any open connection.
  boost::system::error_code accept_ec;
  acceptor_.non_blocking(true, accept_ec);
  std::size_t backlog = 0;
  while (!accept_ec) {
    local::socket socket(next_session_executor());
    acceptor_.accept(socket, accept_ec);
    if (accept_ec) break;
    start_session(std::move(socket));
    ++backlog;
  }
  LOG_INFO("server", "draining (", drain_reason_, "): no new connections; ", sessions_live_.load(),
           " open",
           backlog > 0 ? support::cat(" (", backlog, " taken from the listen backlog)") : "",
           ", waiting up to ", config_.drain_timeout.count(), " ms for in-flight requests");
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accepting_stopped_ = true;
  // Only now, with connect() refused: the connections with nothing to serve close (the
  // others after their reply, Session::run()).
  listener_closed_.store(true);
  {
    const std::lock_guard lock(sessions_mutex_);
    for (auto& [id, weak] : sessions_)
      if (auto session = weak.lock()) session->close_when_idle();
  }
  finish_if_drained();
}

asio::awaitable<void> Server::reclaim_loop() {
  using namespace std::chrono_literals;
  const auto tick =
      std::clamp<std::chrono::milliseconds>(config_.pool.grace_period / 10, 10ms, 1000ms);
  while (!draining_.load()) {
    reclaim_timer_.expires_after(tick);
    auto [ec] = co_await reclaim_timer_.async_wait(asio::as_tuple(use_awaitable));
    if (ec || draining_.load()) break;
    const auto deadline = pool_.next_deadline();
    if (!deadline || *deadline > Clock::now()) continue;
    const std::uint64_t pages = pool_.reclaim_expired(Clock::now());
    if (pages > 0)
      LOG_INFO("pool", "reclaimed ", pages, " pages from leases whose grace period ended");
  }
}

}  // namespace statepool::service
