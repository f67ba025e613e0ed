#pragma once
// The daemon's HTTP JSON API for capacity planning (docs/http-api.md):
//   GET  /v1        index of the endpoints
//   POST /v1/plan   the planner's report for a model's config.json (the body), with
//                   "fits_now" against the live pool
//   GET  /v1/fits   what fits now for a layout the pool holds arenas of
//
// Boost.Beast on the Server's io_context: one C++20 coroutine per connection on its own
// strand, HTTP/1.0 and 1.1 with keep-alive, --io-timeout for each read and write, request
// bodies up to kMaxModelConfigBytes (1 MiB; larger ones get 413), at most
// kMaxHttpConnections connections at a time. Replies are JSON; errors are
// {"error": "<message>"}.
//
// Who may ask: the API is an operator's tool; it answers about every tenant. It listens
// on loopback by default, and anywhere else only with --api-token-file, whose token
// every request must then carry (Authorization: Bearer TOKEN, 401 otherwise; checked
// after the header, before any body is read). A token may be set on loopback too, where
// every local user could otherwise ask (docs/http-api.md, "Access").
//
// Thread-safety: listen() and start() are called once, before the io_context runs;
// stop_accepting() may be called from any thread; handle() is const and reads the pool
// through its thread-safe snapshots.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "config/config.hpp"
#include "log.hpp"
#include "pool/pool.hpp"

namespace statepool::service {

/// Connections served at once; a connection past it is closed at once (with a warning).
inline constexpr std::uint32_t kMaxHttpConnections = 64;

/// One answer of the API before it becomes an HTTP response.
struct ApiReply {
  unsigned status = 200;
  std::string body;               ///< JSON, ending with "\n"
  std::string allow;              ///< the Allow header of a 405 reply
  bool bearer_challenge = false;  ///< a 401: send WWW-Authenticate: Bearer
};

class HttpApi {
 public:
  HttpApi(boost::asio::io_context& io, const Config& config, const Pool& pool);
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  /// Opens, binds and listens on config.api_address. Throws std::runtime_error
  /// ("cannot listen on HOST:PORT for --api-address: ...").
  void listen();
  /// Spawns the accept loop on the io_context (after listen()).
  void start();
  /// Closes the acceptor (drain); connections being served are left to the io_context.
  /// Replies written afterwards close their connection. Safe from any thread, idempotent.
  void stop_accepting();
  /// The port listened on (the one picked when the configured port is 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  /// True when no --api-token-file is set, or `header` (the Authorization field) is
  /// "Bearer TOKEN" with the right token (compared in constant time).
  [[nodiscard]] bool authorized(std::string_view header) const noexcept;
  /// Answers one request: routing, query parsing, the planner against the pool.
  [[nodiscard]] ApiReply handle(std::string_view method, std::string_view target,
                                std::string_view body) const;

 private:
  boost::asio::awaitable<void> accept_loop();
  boost::asio::awaitable<void> serve(boost::asio::ip::tcp::socket socket,
                                     std::shared_ptr<std::atomic<std::uint32_t>> live);
  /// LOG_WARN at most once every few seconds; the rest are counted and reported with
  /// the next one.
  void warn(const std::string& message);

  boost::asio::io_context& io_;
  const Config& config_;
  const Pool& pool_;
  boost::asio::ip::tcp::acceptor acceptor_;  ///< on a strand of its own
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  /// Connections being served; shared with their coroutines, which may outlive this
  /// object's use but never touch it once the io_context is stopped.
  std::shared_ptr<std::atomic<std::uint32_t>> live_;
  /// At most one warning every 10 s.
  RateLimitedLog warnings_;
};

}  // namespace statepool::service
