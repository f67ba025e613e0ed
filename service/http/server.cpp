#include "http/server.hpp"

#include <sys/socket.h>

#include <array>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "config/config.hpp"
#include "http/health.hpp"

namespace statepool::service {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

/// Warnings come at most this often; the others are counted.
constexpr std::chrono::seconds kWarningInterval{10};
/// After an error reply the connection is closed; what the client still sends (a body
/// over the limit) is read and dropped, up to this much, so that closing does not reset
/// the connection before the client has read the reply.
constexpr std::size_t kLingerBytes = 8u << 20;

}  // namespace

std::string clip(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + "...";
}

HttpServer::HttpServer(asio::io_context& io, std::string address, std::string flag,
                       std::chrono::milliseconds io_timeout, const HttpService& service,
                       const std::atomic<bool>& draining)
    : io_(io),
      address_(std::move(address)),
      flag_(std::move(flag)),
      io_timeout_(io_timeout),
      service_(service),
      draining_(draining),
      acceptor_(asio::make_strand(io)),
      live_(std::make_shared<std::atomic<std::uint32_t>>(0)),
      warnings_(support::LogLevel::warn, "http", support::cat("warnings of the ", service.name()),
                1, kWarningInterval) {}

HttpServer::~HttpServer() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void HttpServer::listen(support::UniqueFd handed_over) {
  boost::system::error_code ec;
  const auto fail = [&](const std::string& why) {
    std::string hint;
    if (ec == asio::error::address_in_use)
      hint = " (another process, perhaps another statepoold, listens there: pass a different " +
             flag_ + ", or 'off')";
    else if (ec == boost::system::errc::address_not_available)
      hint = " (not an address of this host)";
    return std::runtime_error("cannot listen on " + address_ + " for " + flag_ + ": " + why + hint);
  };
  ListenAddress where;
  try {
    where = split_listen_address(address_, flag_);
  } catch (const ConfigError& e) {
    throw fail(e.what());
  }
  const asio::ip::address ip = asio::ip::make_address(where.host, ec);
  if (ec) throw fail(ec.message());
  const tcp::endpoint endpoint(ip, where.port);
  if (handed_over) {
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(handed_over.get(), reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      tcp::endpoint at;
      if (length <= at.capacity()) {
        std::memcpy(at.data(), &bound, length);
        at.resize(length);
        if (at.address() == ip && (where.port == 0 || at.port() == where.port)) {
          acceptor_.assign(at.protocol(), handed_over.get(), ec);
          if (!ec) {
            (void)handed_over.release();
            port_ = at.port();
            return;
          }
        }
      }
    }
    handed_over.reset();  // another address than configured now: bound anew below
    ec.clear();
  }
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    const auto error = fail(ec.message());
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    throw error;
  }
  port_ = acceptor_.local_endpoint(ec).port();
}

void HttpServer::start() {
  asio::co_spawn(acceptor_.get_executor(), accept_loop(), asio::detached);
}

void HttpServer::stop_accepting() {
  if (stopping_.exchange(true)) return;
  asio::dispatch(acceptor_.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  });
}

asio::awaitable<void> HttpServer::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(io_),
                                                        asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (stopping_.load() || ec == asio::error::operation_aborted || !acceptor_.is_open())
        co_return;
      warnings_.write(
          support::cat("accept failed on ", address_, " (", flag_, "): ", ec.message()));
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
        // Out of fds: back off instead of spinning.
        asio::steady_timer pause(acceptor_.get_executor(), std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      }
      continue;
    }
    if (live_->load() >= kMaxHttpConnections) {
      warnings_.write(support::cat("more than ", kMaxHttpConnections, " ", service_.name(),
                                   " connections at once: closing a new one"));
      boost::system::error_code ignored;
      socket.close(ignored);
      continue;
    }
    live_->fetch_add(1);
    auto executor = socket.get_executor();
    asio::co_spawn(executor, serve(tcp::socket(std::move(socket)), live_), asio::detached);
  }
}

asio::awaitable<void> HttpServer::serve(tcp::socket socket,
                                        std::shared_ptr<std::atomic<std::uint32_t>> live) {
  struct Release {
    std::shared_ptr<std::atomic<std::uint32_t>> count;
    ~Release() { count->fetch_sub(1); }
  } release{std::move(live)};
  boost::system::error_code ec;
  const tcp::endpoint remote = socket.remote_endpoint(ec);
  const std::string peer = ec ? std::string("?") : support::cat(remote);
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  const auto io = asio::as_tuple(asio::use_awaitable);
  bool linger = false;  // close after an error: drop what the client still sends first
  try {
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(service_.max_body());
      stream.expires_after(io_timeout_);
      std::tie(ec, std::ignore) = co_await http::async_read_header(stream, buffer, parser, io);
      // Authenticate before reading a body: a client without the token costs a header.
      // Probes need no token.
      const bool probe = !ec && is_probe(parser.get().target());
      const bool denied =
          !ec && !probe && !service_.authorized(parser.get()[http::field::authorization]);
      if (!ec && !denied && !parser.is_done()) {
        const auto expect = parser.get()[http::field::expect];
        if (parser.get().version() >= 11 && beast::iequals(expect, "100-continue")) {
          http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
          stream.expires_after(io_timeout_);
          std::tie(ec, std::ignore) = co_await http::async_write(stream, go_on, io);
          if (ec) break;
        }
        stream.expires_after(io_timeout_);
        std::tie(ec, std::ignore) = co_await http::async_read(stream, buffer, parser, io);
      }

      HttpReply reply;
      std::string method, target;
      unsigned version = 11;
      bool keep_alive = false;
      if (ec) {
        if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
            ec.category() != http::make_error_code(http::error::body_limit).category()) {
          // The client went away, or timed out (beast::error::timeout): nothing to answer.
          if (ec != http::error::end_of_stream)
            LOG_DEBUG("http", "connection from ", peer, " ended: ", ec.message());
          break;
        }
        const auto& partial = parser.get();
        if (partial.version() == 10) version = 10;
        method = std::string(partial.method_string());
        target = std::string(partial.target());
        if (ec == http::error::body_limit) {
          reply = service_.refusal(
              413, support::cat("request body larger than ", service_.max_body(), " bytes"));
        } else if (ec == http::error::header_limit) {
          reply = service_.refusal(431, "request header too large");
        } else {
          reply = service_.refusal(400, "malformed HTTP request: " + ec.message());
        }
        linger = true;
      } else if (denied) {
        const auto& request = parser.get();
        version = request.version();
        method = std::string(request.method_string());
        target = std::string(request.target());
        reply = service_.refusal(401, "this endpoint needs 'Authorization: Bearer TOKEN'");
        reply.bearer_challenge = true;
        warnings_.write(support::cat(service_.name(), " request from ", peer,
                                     " without the right bearer token: 401"));
        linger = !parser.is_done();
      } else {
        const auto& request = parser.get();
        version = request.version();
        method = std::string(request.method_string());
        target = std::string(request.target());
        reply = probe ? probe_reply(method, target, draining_)
                      : service_.handle(method, target, request.body());
        keep_alive = request.keep_alive() && !stopping_.load();
      }

      http::response<http::string_body> response;
      response.version(version);
      response.result(reply.status);
      response.set(http::field::server, "statepoold");
      response.set(http::field::content_type, reply.content_type);
      if (!reply.allow.empty()) response.set(http::field::allow, reply.allow);
      if (reply.bearer_challenge)
        response.set(http::field::www_authenticate, "Bearer realm=\"statepool\"");
      if (method != "HEAD") response.body() = std::move(reply.body);
      response.keep_alive(keep_alive);
      response.prepare_payload();
      stream.expires_after(io_timeout_);
      std::tie(ec, std::ignore) = co_await http::async_write(stream, response, io);
      LOG_DEBUG("http", clip(method, 16), " ", clip(target, 200), " -> ", reply.status, " (", peer,
                ")");
      if (reply.status >= 500 && !probe)
        warnings_.write(support::cat(service_.name(), ": ", clip(method, 16), " ",
                                     clip(target, 200), " -> ", reply.status, ": ",
                                     clip(response.body(), 400)));
      if (ec) {
        LOG_DEBUG("http", "reply to ", peer, " not sent: ", ec.message());
        break;
      }
      if (!keep_alive) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (linger) {
      std::array<char, 16384> sink;
      std::size_t dropped = 0;
      stream.expires_after(io_timeout_);
      while (dropped < kLingerBytes) {
        std::size_t n = 0;
        std::tie(ec, n) = co_await stream.async_read_some(asio::buffer(sink), io);
        if (ec) break;
        dropped += n;
      }
    }
  } catch (const std::exception& e) {
    warnings_.write(
        support::cat(service_.name(), " connection from ", peer, " failed: ", e.what()));
  }
  stream.socket().close(ec);
}

}  // namespace statepool::service
