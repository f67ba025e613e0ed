#pragma once
// The daemon's server: a Boost.Asio Unix-socket acceptor, one coroutine session per
// connection (each on its own strand), a reclaim timer for expired leases, SIGTERM /
// SIGINT drain, and the HTTP JSON API (--api-address, service/http/api.hpp) on the same
// io_context.
//
// Drain (SIGTERM, SIGINT or a Drain request): take in the connections waiting in the
// listen backlog and stop accepting; then let every session finish the request that has
// arrived (being handled, being received, or with a byte waiting in its socket) and send
// its reply, and close connections with nothing to serve (only after the listener has
// closed, so a client that sees EOF cannot reconnect); then return from run(). Sessions
// still busy when the drain timeout expires are closed forcibly. The
// HTTP API stops accepting at the start of the drain; HTTP connections still open when
// the last session ends are cut.
//
// Hand-over (server/handover.cpp, docs/operations.md "Upgrade without losing state"): a
// successor started with --take-over connects to the hand-over socket; this server then
// stops accepting (connections wait in the listen backlog, for the successor), lets every
// session finish its request and closes them (their clients reconnect with their lease
// tokens), and sends the pool's state with the memory and the listening sockets. When the
// successor says it serves, run() returns (handed_over()), or, with --after-handover=wait,
// keeps only its HTTP listeners (/readyz 503) and returns at SIGTERM; when it refuses or
// fails, this server serves on as before.
//
// Thread-safety: run() is called once; drain() may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <csignal>

#include <boost/asio.hpp>

#include "config/config.hpp"
#include "exec/executor.hpp"
#include "handlers/handlers.hpp"
#include "memory/limiting.hpp"
#include "memory/resource.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"
#include "server/session_host.hpp"
#include "statepool/support/unique_fd.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::service {

class Session;
class CrashJournal;
class HttpApi;
class HttpServer;
class MetricsEndpoint;

/// The request types' names and the protocol version, for the metrics' labels.
[[nodiscard]] ProtocolLabels protocol_labels();

class Server {
 public:
  /// `staging_memory` gives the connections' staging buffers (each through its own
  /// --max-staging-bytes limit); `workers` run blocking calls, `executor` codec work.
  /// `tiers`: the prefix-state store below the pool, or null. All must outlive the server
  /// (and `tiers` the workers, which finish its publications).
  Server(const Config& config, Pool& pool, Metrics* metrics, MemoryResource& staging_memory,
         support::WorkerPool& workers, Executor& executor, SnapshotTiers* tiers = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Creates the socket file (mode, group), refusing to steal the socket of a live
  /// daemon, or serves the one a systemd socket unit passed (server/systemd.hpp); and
  /// listens on --api-address and --metrics-address (with `metrics`) unless they are off.
  /// Throws std::runtime_error with an actionable message.
  void bind(support::UniqueFd passed_socket = {});
  /// The listening sockets a successor takes over (server/takeover.hpp): the Unix socket,
  /// the hand-over socket, and the HTTP listeners when the predecessor had them.
  struct Listeners {
    support::UniqueFd socket;
    support::UniqueFd handover;
    support::UniqueFd api;
    support::UniqueFd metrics;
    /// `socket` is a systemd socket unit's (socket activation): its file is the unit's,
    /// never removed by the daemon.
    bool socket_unit = false;
  };
  /// bind() for a successor: serves `listeners` instead of binding anew (an HTTP listener
  /// that was not handed over, or listens on another port than configured, is bound as
  /// bind() binds it). The socket files stay the predecessor's until own_socket_files():
  /// a successor that fails before its predecessor lets go must not remove them.
  void bind_handed_over(Listeners listeners);
  /// The socket files are this server's: removed when it exits (not after a hand-over).
  void own_socket_files() noexcept;
  /// True when run() ended because a successor took over (then the socket files stay).
  [[nodiscard]] bool handed_over() const noexcept { return handed_over_.load(); }
  /// The daemon's generation: 0 for a daemon that started fresh, one more than its
  /// predecessor's for one that took over. Set before run().
  void set_generation(std::uint64_t generation) noexcept {
    generation_ = generation;
    context_.generation = generation;
  }
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  /// The crash journal a hand-over pauses and passes to the successor (null: none).
  void set_crash_journal(CrashJournal* journal) noexcept { crash_journal_ = journal; }
  /// Serves until drained, then waits for the executor and the workers to finish what
  /// they had (nothing they run refers to the server afterwards). Returns the number of
  /// sessions that had to be closed forcibly.
  /// SIGTERM, SIGINT and SIGUSR2 (handled_signals()) must be blocked in every thread of the process
  /// before any thread is started (pthread_sigmask in main); run() takes them with
  /// sigtimedwait on a thread of its own and drains.
  std::size_t run();
  /// Descriptors kept beyond one per connection: arenas' memfds, the listening sockets,
  /// the metrics endpoint's and the API's connections, the event loop's own.
  static constexpr std::uint64_t kDescriptorHeadroom = 64;
  /// Raises the soft descriptor limit to the hard one, then checks that it leaves room
  /// for --max-connections connections plus kDescriptorHeadroom. Returns the limit in
  /// effect; throws ConfigError (naming both numbers and how to fix it) when too low.
  static std::uint64_t prepare_descriptor_limit(const Config& config);
  /// What a drain may take beyond --drain-timeout before the process exits (work cut at
  /// the deadline finishing on the workers, the exit check): asked of systemd with
  /// STOPPING=1 (server/systemd.hpp).
  static constexpr std::chrono::seconds kStopMargin{30};
  /// The signals the daemon takes on a thread of its own: SIGTERM and SIGINT drain it,
  /// SIGUSR2 starts a successor that takes the pool over (set_successor()).
  [[nodiscard]] static sigset_t handled_signals() noexcept;
  /// What SIGUSR2 starts: `argv` (argv[0] the binary's path as installed, so that an
  /// upgraded binary is the one started), to which --take-over is added. Empty: SIGUSR2
  /// is logged and ignored. Set before run().
  void set_successor(std::vector<std::string> argv) { successor_argv_ = std::move(argv); }
  /// Starts draining; safe from any thread, idempotent.
  void drain(const std::string& why);

  [[nodiscard]] std::uint32_t clients_connected() const noexcept { return sessions_live_.load(); }
  /// The port the HTTP API listens on after bind() (the one picked for port 0); 0 when
  /// --api-address is off.
  [[nodiscard]] std::uint16_t api_port() const noexcept;
  /// The same for the Prometheus endpoint (--metrics-address).
  [[nodiscard]] std::uint16_t metrics_port() const noexcept;

 private:
  /// Binds a new socket file at `path` on `acceptor`, replacing a stale one (not yet
  /// listening); `flag` names the option in errors.
  void bind_socket_file(boost::asio::local::stream_protocol::acceptor& acceptor,
                        const std::string& path, const char* flag);
  /// The HTTP listeners of bind(); `api` and `metrics`: handed-over sockets, or invalid.
  void bind_http(support::UniqueFd api, support::UniqueFd metrics);
  // The hand-over (server/handover.cpp).
  /// What begin_handover() answers the hand-over thread: a refusal, or the listening
  /// sockets to send once every session has ended.
  struct Pause {
    std::string refusal;
    std::vector<std::pair<std::string, int>> listeners;  // borrowed
  };
  boost::asio::awaitable<void> handover_loop();
  /// The conversation with one successor, on a thread of its own.
  void hand_over(support::UniqueFd peer);
  void begin_handover(std::shared_ptr<std::promise<Pause>> paused);  // on control_
  /// The sessions have ended: hands the listeners to the waiting hand-over thread.
  void check_paused();                                   // on control_
  void end_handover(bool done, const std::string& why);  // on control_
  /// SIGUSR2: spawns the successor (set_successor()), which asks for the pool.
  void start_successor();
  boost::asio::awaitable<void> accept_loop();
  /// The loop the next accepted connection runs on (on control_).
  boost::asio::any_io_executor next_session_executor();
  /// Registers and starts the session of an accepted connection.
  void start_session(boost::asio::local::stream_protocol::socket socket);
  enum class Refusal { refused, none_waiting, failed };
  /// Out of descriptors: accepts the waiting connection on the spare descriptor, replies
  /// too_many_connections and closes it (logged at most every 10 s, counted as
  /// refused{reason="descriptors"}). none_waiting when no connection waits after all.
  Refusal refuse_for_descriptors();
  /// The end of the accept loop in a drain: takes in the connections waiting in the
  /// listen backlog, logs the drain and closes the acceptor (on control_).
  void stop_accepting();
  boost::asio::awaitable<void> reclaim_loop();
  void begin_drain(const std::string& why);  // on the io_context
  /// Closes the sessions still busy when --drain-timeout has passed (on control_).
  void arm_drain_timer();
  void session_ended(std::uint64_t id);
  void finish_if_drained();

  const Config& config_;
  Pool& pool_;
  Metrics* metrics_;
  MemoryResource& staging_memory_;
  support::WorkerPool& workers_;
  Executor& executor_;
  // Staging budgets: the daemon's (--staging-capacity) over staging_memory_, and one per
  // tenant over it; each connection's own (Hello) sits over its tenant's.
  LimitingResource staging_capacity_;
  std::map<std::string, std::unique_ptr<LimitingResource>, std::less<>> tenant_staging_;
  ServerContext context_;
  // Before io_: the sessions' coroutines, which io_ destroys, use these to the end.
  std::atomic<bool> draining_{false};
  // Set in the drain once the listener is closed: from then on sessions close when they
  // have nothing to serve (never before, or a client could reconnect during the drain).
  std::atomic<bool> listener_closed_{false};
  UnattachedBudget unattached_;
  SessionHost session_host_;
  // The first I/O thread's loop: the acceptor, the timers, the drain, the HTTP listeners,
  // and connections. io_context per thread: a connection stays on the loop it was
  // accepted onto (round robin), so its requests never hop threads; one loop shared by
  // several threads hands every readiness event from thread to thread (futex, eventfd),
  // which cost more than the request itself.
  boost::asio::io_context io_{1};
  // The other I/O threads' loops (--threads - 1), one thread each, connections only.
  // After io_: destroyed before it (their connections' coroutines use what io_ serves).
  std::vector<std::unique_ptr<boost::asio::io_context>> loops_;
  std::size_t next_loop_ = 0;  // on control_: the loop of the next connection
  // Serializes the acceptor, the timers and the drain (accept_loop, reclaim_loop,
  // begin_drain, finish_if_drained).
  boost::asio::strand<boost::asio::io_context::executor_type> control_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer reclaim_timer_;
  boost::asio::steady_timer drain_timer_;
  // After io_: destroyed before it. Their connection coroutines, which io_ destroys, do
  // not touch them once io_ has stopped. The services outlive their servers.
  std::unique_ptr<HttpApi> api_service_;
  std::unique_ptr<MetricsEndpoint> metrics_service_;
  std::unique_ptr<HttpServer> api_;
  std::unique_ptr<HttpServer> metrics_http_;
  std::mutex sessions_mutex_;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions_;
  std::atomic<std::uint32_t> sessions_live_{0};
  std::uint64_t next_session_id_ = 1;
  std::string drain_reason_;        // on control_: what began the drain
  bool accepting_stopped_ = false;  // on control_: stop_accepting() has run
  bool accept_loop_done_ = false;   // on control_: accept_loop() has returned
  bool owns_socket_file_ = false;   // removed at exit: not a socket unit's
  bool socket_unit_ = false;        // the socket is a systemd socket unit's
  support::UniqueFd spare_fd_;      // on control_: see refuse_for_descriptors()
  std::uint64_t descriptor_refusals_ = 0;
  std::chrono::steady_clock::time_point descriptor_warned_{};
  std::size_t forced_closes_ = 0;
  // The hand-over: its listener (on control_), the conversation's thread, and its state.
  boost::asio::local::stream_protocol::acceptor handover_acceptor_;
  bool owns_handover_file_ = false;
  std::thread handover_thread_;
  std::atomic<bool> handover_busy_{false};       // a conversation runs (any thread)
  bool handing_over_ = false;                    // on control_: paused for a successor
  std::shared_ptr<std::promise<Pause>> paused_;  // on control_: until check_paused()
  std::string deferred_drain_;                   // on control_: a drain asked for meanwhile
  std::atomic<bool> handed_over_{false};
  std::uint64_t generation_ = 0;
  CrashJournal* crash_journal_ = nullptr;
  std::vector<std::string> successor_argv_;
};

}  // namespace statepool::service
