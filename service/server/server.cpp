#include "server/server.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>
#include <vector>

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "http/api.hpp"
#include "log.hpp"
#include "server/session.hpp"

namespace statepool::service {
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
               WorkerPool& workers, Executor& executor)
    : config_(config),
      pool_(pool),
      metrics_(metrics),
      staging_memory_(staging_memory),
      workers_(workers),
      executor_(executor),
      context_{config,
               pool,
               workers,
               executor,
               std::chrono::steady_clock::now(),
               [this] { return clients_connected(); },
               [this](const std::string& why) { drain(why); }},
      acceptor_(io_),
      reclaim_timer_(io_),
      drain_timer_(io_) {}

Server::~Server() {
  if (bound_) {
    std::error_code ignored;
    std::filesystem::remove(config_.socket_path, ignored);
  }
}

void Server::bind() {
  namespace fs = std::filesystem;
  const fs::path path(config_.socket_path);
  std::error_code ec;
  if (path.has_parent_path() && !fs::exists(path.parent_path(), ec)) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      throw std::runtime_error("cannot create socket directory " + path.parent_path().string() +
                               ": " + ec.message());
    }
  }
  if (fs::exists(fs::symlink_status(path, ec))) {
    if (socket_is_live(config_.socket_path)) {
      throw std::runtime_error("another daemon is already serving " + config_.socket_path +
                               " (stop it, or pass a different --socket)");
    }
    if (!fs::is_socket(fs::symlink_status(path, ec))) {
      throw std::runtime_error(config_.socket_path +
                               " exists and is not a socket; refusing to replace it");
    }
    LOG_INFO("server", "removing stale socket ", config_.socket_path);
    fs::remove(path, ec);
  }
  // Create the socket file with no permissions for others until chmod below.
  const mode_t old_mask = ::umask(0177);
  boost::system::error_code bec;
  acceptor_.open(local(), bec);
  if (!bec) acceptor_.bind(local::endpoint(config_.socket_path), bec);
  ::umask(old_mask);
  if (bec) throw std::runtime_error("cannot bind " + config_.socket_path + ": " + bec.message());
  bound_ = true;
  // The API listens before the Unix socket does: once a client can connect to the
  // socket (the daemon looks ready), the API is there too.
  if (!config_.api_address.empty()) {
    api_ = std::make_unique<HttpApi>(io_, config_, pool_);
    api_->listen();
  }
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

sigset_t Server::drain_signals() noexcept {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

std::uint16_t Server::api_port() const noexcept {
  return api_ ? api_->port() : 0;
}

std::size_t Server::run() {
  asio::co_spawn(io_, accept_loop(), asio::detached);
  if (api_) api_->start();
  asio::co_spawn(io_, reclaim_loop(), asio::detached);

  // SIGTERM/SIGINT are blocked in every thread (main blocks them before starting any) and
  // taken here with sigtimedwait: a signal arriving at any moment, also a second one while
  // the process is already exiting, starts (or is absorbed by) the drain and never kills
  // the daemon with the default action.
  std::atomic<bool> stopped{false};
  std::thread signal_waiter([this, &stopped] {
    const sigset_t set = drain_signals();
    while (!stopped.load()) {
      const timespec tick{0, 50'000'000};
      const int signal = ::sigtimedwait(&set, nullptr, &tick);
      if (signal == SIGTERM || signal == SIGINT) {
        if (draining_.load())
          LOG_INFO("server", signal == SIGTERM ? "SIGTERM" : "SIGINT", " while draining: ignored");
        drain(signal == SIGTERM ? "SIGTERM" : "SIGINT");
      }
    }
  });

  std::vector<std::thread> threads;
  for (unsigned i = 1; i < config_.threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
  // Work started for sessions that were cut at the drain timeout may still run; its
  // completions go to the stopped io_context and are dropped with it.
  executor_.wait_idle();
  workers_.wait_idle();
  stopped.store(true);
  signal_waiter.join();
  return forced_closes_;
}

void Server::drain(const std::string& why) {
  asio::post(io_, [this, why] { begin_drain(why); });
}

void Server::begin_drain(const std::string& why) {
  if (draining_.exchange(true)) return;
  if (metrics_ != nullptr) metrics_->set_draining(true);
  LOG_INFO("server", "draining (", why, "): no new connections; ", sessions_live_.load(),
           " open, waiting up to ", config_.drain_timeout.count(), " ms for in-flight requests");
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (api_) api_->stop_accepting();
  reclaim_timer_.cancel();
  {
    const std::lock_guard lock(sessions_mutex_);
    for (auto& [id, weak] : sessions_)
      if (auto session = weak.lock()) session->close_when_idle();
  }
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
  finish_if_drained();
}

void Server::session_ended(std::uint64_t id) {
  {
    const std::lock_guard lock(sessions_mutex_);
    sessions_.erase(id);
  }
  sessions_live_.fetch_sub(1);
  if (metrics_ != nullptr) metrics_->client_disconnected();
  if (draining_.load()) asio::post(io_, [this] { finish_if_drained(); });
}

void Server::finish_if_drained() {
  if (!draining_.load() || sessions_live_.load() != 0) return;
  drain_timer_.cancel();
  LOG_INFO("server", "drained: all connections closed");
  io_.stop();
}

asio::awaitable<void> Server::accept_loop() {
  while (!draining_.load()) {
    auto [ec, socket] =
        co_await acceptor_.async_accept(asio::make_strand(io_), asio::as_tuple(use_awaitable));
    if (ec) {
      if (draining_.load() || ec == asio::error::operation_aborted) break;
      LOG_WARN("server", "accept failed: ", ec.message());
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
        // Out of fds: back off instead of spinning.
        asio::steady_timer pause(io_, std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::as_tuple(use_awaitable));
      }
      continue;
    }
    std::shared_ptr<Session> session;
    {
      const std::lock_guard lock(sessions_mutex_);
      const std::uint64_t id = next_session_id_++;
      session = std::make_shared<Session>(*this, std::move(socket), id);
      sessions_.emplace(id, session);
    }
    sessions_live_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->client_connected();
    auto executor = session->socket_executor();
    asio::co_spawn(
        executor, [session]() { return session->run(); }, asio::detached);
  }
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
