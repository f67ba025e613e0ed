#pragma once
// The daemon's server: a Boost.Asio Unix-socket acceptor, one coroutine session per
// connection (each on its own strand), a reclaim timer for expired leases, SIGTERM /
// SIGINT drain, and the HTTP JSON API (--api-address, service/http/api.hpp) on the same
// io_context.
//
// Drain (SIGTERM, SIGINT or a Drain request): stop accepting, let every session finish
// the request it is handling and send its reply, close idle connections, then return
// from run(). Sessions still busy when the drain timeout expires are closed forcibly. The
// HTTP API stops accepting at the start of the drain; HTTP connections still open when
// the last session ends are cut.
//
// Thread-safety: run() is called once; drain() may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <csignal>

#include <boost/asio.hpp>

#include "config/config.hpp"
#include "exec/executor.hpp"
#include "exec/worker_pool.hpp"
#include "handlers/handlers.hpp"
#include "memory/resource.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"

namespace statepool::service {

class Session;
class HttpApi;

class Server {
 public:
  /// `staging_memory` gives the connections' staging buffers (each through its own
  /// --max-staging-bytes limit); `workers` run blocking calls, `executor` codec work.
  /// All must outlive the server.
  Server(const Config& config, Pool& pool, Metrics* metrics, MemoryResource& staging_memory,
         WorkerPool& workers, Executor& executor);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Creates the socket file (mode, group), refusing to steal the socket of a live
  /// daemon, and listens on --api-address unless it is off. Throws std::runtime_error
  /// with an actionable message.
  void bind();
  /// Serves until drained, then waits for the executor and the workers to finish what
  /// they had (nothing they run refers to the server afterwards). Returns the number of
  /// sessions that had to be closed forcibly.
  /// SIGTERM and SIGINT (drain_signals()) must be blocked in every thread of the process
  /// before any thread is started (pthread_sigmask in main); run() takes them with
  /// sigtimedwait on a thread of its own and drains.
  std::size_t run();
  /// The signals that drain the daemon: SIGTERM and SIGINT.
  [[nodiscard]] static sigset_t drain_signals() noexcept;
  /// Starts draining; safe from any thread, idempotent.
  void drain(const std::string& why);

  [[nodiscard]] std::uint32_t clients_connected() const noexcept { return sessions_live_.load(); }
  /// The port the HTTP API listens on after bind() (the one picked for port 0); 0 when
  /// --api-address is off.
  [[nodiscard]] std::uint16_t api_port() const noexcept;

 private:
  friend class Session;
  boost::asio::awaitable<void> accept_loop();
  boost::asio::awaitable<void> reclaim_loop();
  void begin_drain(const std::string& why);  // on the io_context
  void session_ended(std::uint64_t id);
  void finish_if_drained();

  const Config& config_;
  Pool& pool_;
  Metrics* metrics_;
  MemoryResource& staging_memory_;
  WorkerPool& workers_;
  Executor& executor_;
  ServerContext context_;
  boost::asio::io_context io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer reclaim_timer_;
  boost::asio::steady_timer drain_timer_;
  // After io_: destroyed before it. Its connection coroutines, which io_ destroys, do not
  // touch it once io_ has stopped.
  std::unique_ptr<HttpApi> api_;
  std::mutex sessions_mutex_;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions_;
  std::atomic<std::uint32_t> sessions_live_{0};
  // Live connections that have not completed Hello, per peer uid (under sessions_mutex_).
  std::map<uid_t, std::uint32_t> unattached_by_uid_;
  std::uint64_t next_session_id_ = 1;
  std::atomic<bool> draining_{false};
  bool bound_ = false;
  std::size_t forced_closes_ = 0;
};

}  // namespace statepool::service
