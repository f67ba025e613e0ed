#pragma once
// The daemon's HTTP listeners: one HttpServer per address, each serving one HttpService
// (http/api.hpp: the JSON API on --api-address; http/metrics_endpoint.hpp: the Prometheus
// exposition on --metrics-address).
//
// Boost.Beast on the Server's io_context: one C++20 coroutine per connection on its own
// strand, HTTP/1.0 and 1.1 with keep-alive, the daemon's --io-timeout for each read and
// write, request bodies up to the service's max_body() (larger ones get 413), at most
// kMaxHttpConnections connections at a time per server. A request whose Authorization
// field the service refuses gets 401 before any body is read. The probes /healthz and
// /readyz (http/health.hpp) are answered by the server itself, before authorization.
// Warnings (accept failures, too many connections, 5xx replies other than a draining
// /readyz) are rate-limited: at most one every 10 s.
//
// Thread-safety: listen() and start() are called once, before the io_context runs;
// stop_accepting() may be called from any thread. The service's functions are called on
// the io_context's threads, concurrently.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "statepool/support/log.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::service {

/// Connections served at once by one server; a connection past it is closed at once (with
/// a warning).
inline constexpr std::uint32_t kMaxHttpConnections = 64;

/// One answer before it becomes an HTTP response.
struct HttpReply {
  unsigned status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::string allow;              ///< the Allow header of a 405 reply
  bool bearer_challenge = false;  ///< a 401: send WWW-Authenticate: Bearer
};

/// What a server serves.
class HttpService {
 public:
  virtual ~HttpService() = default;
  /// How warnings name it ("HTTP API").
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// The largest request body read; larger ones are answered 413.
  [[nodiscard]] virtual std::size_t max_body() const noexcept = 0;
  /// Whether a request with this Authorization field (empty when absent) is served.
  [[nodiscard]] virtual bool authorized(std::string_view authorization) const noexcept = 0;
  /// The reply to a request refused before handle(): 400 (malformed), 401 (not
  /// authorized), 413 (body over max_body()) or 431 (header too large); `message` says why
  /// in general terms, the service may say more.
  [[nodiscard]] virtual HttpReply refusal(unsigned status, const std::string& message) const = 0;
  /// Answers one request.
  [[nodiscard]] virtual HttpReply handle(std::string_view method, std::string_view target,
                                         std::string_view body) const = 0;
};

class HttpServer {
 public:
  /// Serves `service` on `address` (HOST:PORT as validated by the config), named by
  /// `flag` (--api-address) in errors; /readyz answers 503 once `draining` is set.
  /// `service` and `draining` must outlive the server.
  HttpServer(boost::asio::io_context& io, std::string address, std::string flag,
             std::chrono::milliseconds io_timeout, const HttpService& service,
             const std::atomic<bool>& draining);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Opens, binds and listens. Throws std::runtime_error ("cannot listen on HOST:PORT for
  /// --api-address: ...", with a hint when the port is taken). `handed_over`: a listening
  /// socket a predecessor daemon passed (the hand-over), served instead when it listens on
  /// the configured address (else closed, and the address bound anew).
  void listen(support::UniqueFd handed_over = {});
  /// The listening socket (for a hand-over to a successor); -1 before listen().
  [[nodiscard]] int native_handle() noexcept { return acceptor_.native_handle(); }
  /// Spawns the accept loop on the io_context (after listen()).
  void start();
  /// Closes the acceptor; connections being served are left to the io_context. Replies
  /// written afterwards close their connection. Safe from any thread, idempotent.
  void stop_accepting();
  /// The port listened on (the one picked when the configured port is 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

 private:
  boost::asio::awaitable<void> accept_loop();
  boost::asio::awaitable<void> serve(boost::asio::ip::tcp::socket socket,
                                     std::shared_ptr<std::atomic<std::uint32_t>> live);

  boost::asio::io_context& io_;
  std::string address_;
  std::string flag_;
  std::chrono::milliseconds io_timeout_;
  const HttpService& service_;
  const std::atomic<bool>& draining_;
  boost::asio::ip::tcp::acceptor acceptor_;  ///< on a strand of its own
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  /// Connections being served; shared with their coroutines, which may outlive this
  /// object's use but never touch it once the io_context is stopped.
  std::shared_ptr<std::atomic<std::uint32_t>> live_;
  support::RateLimitedLog warnings_;
};

/// `text` cut to `limit` characters, with "..." when cut (for quoting client input back).
[[nodiscard]] std::string clip(std::string_view text, std::size_t limit = 64);

}  // namespace statepool::service
