#include "http/api.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <boost/url.hpp>

#include "log.hpp"
#include "server/capacity.hpp"
#include "statepool/planner/fits.hpp"
#include "statepool/planner/planner.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace urls = boost::urls;
using asio::ip::tcp;

namespace {

/// Warnings of the API come at most this often; the others are counted.
constexpr std::chrono::seconds kWarningInterval{10};
/// After an error reply the connection is closed; what the client still sends (a body
/// over the limit) is read and dropped, up to this much, so that closing does not reset
/// the connection before the client has read the reply.
constexpr std::size_t kLingerBytes = 8u << 20;
/// Longest name or value quoted back in an error message.
constexpr std::size_t kQuoteChars = 64;

/// A request the API refuses, with the HTTP status to answer.
class ApiError : public std::runtime_error {
 public:
  ApiError(unsigned status, const std::string& message, std::string allow = {})
      : std::runtime_error(message), status_(status), allow_(std::move(allow)) {}
  [[nodiscard]] unsigned status() const noexcept { return status_; }
  [[nodiscard]] const std::string& allow() const noexcept { return allow_; }

 private:
  unsigned status_;
  std::string allow_;
};

std::string clip(std::string_view text, std::size_t limit = kQuoteChars) {
  if (text.size() <= limit) return std::string(text);
  return std::string(text.substr(0, limit)) + "...";
}

// Length of the valid UTF-8 sequence at s[i] (lead byte >= 0x80), or 0 when it is not one
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  const unsigned lead = at(0);
  const auto cont = [](unsigned c) { return c >= 0x80 && c <= 0xbf; };
  if (lead >= 0xc2 && lead <= 0xdf) return cont(at(1)) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    const unsigned lo = lead == 0xe0 ? 0xa0 : 0x80;
    const unsigned hi = lead == 0xed ? 0x9f : 0xbf;
    return at(1) >= lo && at(1) <= hi && cont(at(2)) ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    const unsigned lo = lead == 0xf0 ? 0x90 : 0x80;
    const unsigned hi = lead == 0xf4 ? 0x8f : 0xbf;
    return at(1) >= lo && at(1) <= hi && cont(at(2)) && cont(at(3)) ? 4 : 0;
  }
  return 0;
}

// `text` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD:
// messages quote client input, and a JSON reply must stay valid UTF-8.
std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = static_cast<unsigned char>(text[i]) < 0x80 ? 1 : utf8_length(text, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string json_error(std::string_view message) {
  boost::json::object body;
  body["error"] = valid_utf8(message);
  return boost::json::serialize(body) + "\n";
}

// "%7C" for '|': how a byte is written in a URL.
std::string percent_escape(unsigned char byte) {
  char escape[4];
  std::snprintf(escape, sizeof escape, "%%%02X", static_cast<unsigned>(byte));
  return escape;
}

// The request target as origin-form (RFC 9112 3.2.1: an absolute path and an optional
// query), parsed by Boost.URL; a target it refuses is answered 400 with the reason.
urls::url_view parse_target(std::string_view target) {
  if (target.empty() || target.front() != '/')
    throw ApiError(400, "request target '" + clip(target) + "' is not a path such as /v1");
  const auto parsed = urls::parse_origin_form(target);
  if (parsed) return *parsed;
  // Boost.URL says what is wrong but not where: find the culprit to quote it.
  for (std::size_t i = target.find('%'); i != std::string_view::npos; i = target.find('%', i + 1)) {
    if (i + 2 >= target.size() || !urls::grammar::hexdig_chars(target[i + 1]) ||
        !urls::grammar::hexdig_chars(target[i + 2])) {
      throw ApiError(400, "malformed percent escape '" + clip(target.substr(i, 3)) +
                              "' in the request target: '%' must be followed by two hex "
                              "digits (write %25 for a literal '%')");
    }
  }
  constexpr auto allowed = urls::pchars + '/' + '?' + '%';
  const char* bad =
      urls::grammar::find_if_not(target.data(), target.data() + target.size(), allowed);
  if (bad != target.data() + target.size()) {
    const auto byte = static_cast<unsigned char>(*bad);
    const std::string escape = percent_escape(byte);
    const std::string what = byte > 0x20 && byte < 0x7f ? "'" + std::string(1, *bad) + "'"
                                                        : "a byte outside printable ASCII";
    throw ApiError(400, "request target '" + clip(target) + "' has " + what +
                            ", which must be percent-encoded (as " + escape + ")");
  }
  throw ApiError(400, "request target '" + clip(target) +
                          "' is not a path with an optional query: " + parsed.error().message());
}

// Decoded control characters are refused: names and values end up in messages and logs.
void refuse_control_characters(std::string_view text) {
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) continue;
    throw ApiError(400, "control character '" + percent_escape(byte) + "' in the query string");
  }
}

using Params = std::vector<std::pair<std::string, std::string>>;

// "?a=1&b=x%2Cy" -> {{"a", "1"}, {"b", "x,y"}}, percent-decoded by Boost.URL with '+' left a
// plus sign (this is not a form). Empty items ("a=1&&b=2", a trailing '&') are skipped; an
// item without '=' or a name given twice is an error.
Params query_params(const urls::url_view& url) {
  urls::encoding_opts decoding;
  decoding.space_as_plus = false;
  Params params;
  for (const urls::param& item : url.params(decoding)) {
    if (item.key.empty() && !item.has_value) continue;
    refuse_control_characters(item.key);
    refuse_control_characters(item.value);
    if (!item.has_value) {
      throw ApiError(400,
                     "query parameter '" + clip(item.key) + "' has no value (write NAME=VALUE)");
    }
    for (const auto& [seen, unused] : params) {
      if (seen == item.key)
        throw ApiError(400, "query parameter '" + clip(item.key) + "' is given more than once");
    }
    params.emplace_back(item.key, item.value);
  }
  return params;
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (const auto name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

ApiError unknown_parameter(const std::string& name, std::string_view endpoint,
                           const std::vector<std::string_view>& known) {
  return ApiError(400, "unknown query parameter '" + clip(name) + "' for " + std::string(endpoint) +
                           " (known: " + join(known) + ")");
}

std::string tenant_value(const std::string& value) {
  if (value.empty())
    throw ApiError(400, "tenant must not be empty (leave it out for the pool-wide view)");
  return value;
}

unsigned http_status(Status status) {
  switch (status) {
    case Status::invalid_argument:
    case Status::unknown_tenant: return 400;
    case Status::not_found: return 404;
    default: return 500;
  }
}

void require_method(std::string_view method, std::string_view allowed, std::string_view path) {
  if (method == allowed) return;
  throw ApiError(405,
                 "method " + clip(method, 16) + " is not allowed on " + std::string(path) +
                     " (use " + std::string(allowed) + ")",
                 std::string(allowed));
}

const std::vector<std::string_view>& plan_parameters() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> n = planner::plan_input_names();
    n.push_back("tenant");
    return n;
  }();
  return names;
}

const std::vector<std::string_view>& fits_parameters() {
  static const std::vector<std::string_view> names = {"layout", "tenant", "slots", "state-codec"};
  return names;
}

std::string index_json() {
  const auto endpoint = [](std::string_view method, std::string_view path,
                           const std::vector<std::string_view>& parameters,
                           std::string_view description) {
    boost::json::array names;
    for (const auto name : parameters) names.emplace_back(name);
    return boost::json::object{{"method", method},
                               {"path", path},
                               {"parameters", std::move(names)},
                               {"description", description}};
  };
  boost::json::array endpoints;
  endpoints.push_back(endpoint("GET", "/v1", {}, "this index"));
  endpoints.push_back(endpoint(
      "POST", "/v1/plan", plan_parameters(),
      "capacity plan for a model: the body is the text of its Hugging Face config.json; the "
      "reply has the planner's report per state codec and fits_now, what the live pool can "
      "still take of that state (for tenant, or pool-wide without it)"));
  endpoints.push_back(endpoint(
      "GET", "/v1/fits", fits_parameters(),
      "how many more requests of a layout the pool holds arenas of fit now, per state codec "
      "(layout is required; slots per request default 1)"));
  const boost::json::object index{{"endpoints", std::move(endpoints)},
                                  {"documentation", "docs/http-api.md"}};
  return boost::json::serialize(index) + "\n";
}

}  // namespace

HttpApi::HttpApi(asio::io_context& io, const Config& config, const Pool& pool)
    : io_(io),
      config_(config),
      pool_(pool),
      acceptor_(asio::make_strand(io)),
      live_(std::make_shared<std::atomic<std::uint32_t>>(0)),
      warnings_(LogLevel::warn, "http", "warnings of the HTTP API", 1, kWarningInterval) {}

HttpApi::~HttpApi() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void HttpApi::listen() {
  boost::system::error_code ec;
  const auto fail = [&](const std::string& why) {
    std::string hint;
    if (ec == asio::error::address_in_use)
      hint =
          " (another process, perhaps another statepoold, listens there: pass a different "
          "--api-address, or 'off')";
    else if (ec == boost::system::errc::address_not_available)
      hint = " (not an address of this host)";
    return std::runtime_error("cannot listen on " + config_.api_address +
                              " for --api-address: " + why + hint);
  };
  ListenAddress where;
  try {
    where = split_listen_address(config_.api_address, "--api-address");
  } catch (const ConfigError& e) {
    throw fail(e.what());
  }
  const asio::ip::address ip = asio::ip::make_address(where.host, ec);
  if (ec) throw fail(ec.message());
  const tcp::endpoint endpoint(ip, where.port);
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

void HttpApi::start() {
  asio::co_spawn(acceptor_.get_executor(), accept_loop(), asio::detached);
}

void HttpApi::stop_accepting() {
  if (stopping_.exchange(true)) return;
  asio::dispatch(acceptor_.get_executor(), [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  });
}

void HttpApi::warn(const std::string& message) {
  warnings_.write(message);
}

asio::awaitable<void> HttpApi::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(io_),
                                                        asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (stopping_.load() || ec == asio::error::operation_aborted || !acceptor_.is_open())
        co_return;
      warn(cat("accept failed on ", config_.api_address, ": ", ec.message()));
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
        // Out of fds: back off instead of spinning.
        asio::steady_timer pause(acceptor_.get_executor(), std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      }
      continue;
    }
    if (live_->load() >= kMaxHttpConnections) {
      warn(cat("more than ", kMaxHttpConnections,
               " HTTP API connections at once: closing a new one"));
      boost::system::error_code ignored;
      socket.close(ignored);
      continue;
    }
    live_->fetch_add(1);
    auto executor = socket.get_executor();
    asio::co_spawn(executor, serve(tcp::socket(std::move(socket)), live_), asio::detached);
  }
}

asio::awaitable<void> HttpApi::serve(tcp::socket socket,
                                     std::shared_ptr<std::atomic<std::uint32_t>> live) {
  struct Release {
    std::shared_ptr<std::atomic<std::uint32_t>> count;
    ~Release() { count->fetch_sub(1); }
  } release{std::move(live)};
  boost::system::error_code ec;
  const tcp::endpoint remote = socket.remote_endpoint(ec);
  const std::string peer = ec ? std::string("?") : cat(remote);
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  const auto io = asio::as_tuple(asio::use_awaitable);
  bool linger = false;  // close after an error: drop what the client still sends first
  try {
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(kMaxModelConfigBytes);
      stream.expires_after(config_.io_timeout);
      std::tie(ec, std::ignore) = co_await http::async_read_header(stream, buffer, parser, io);
      // Authenticate before reading a body: a client without the token costs a header.
      const bool denied = !ec && !authorized(parser.get()[http::field::authorization]);
      if (!ec && !denied && !parser.is_done()) {
        const auto expect = parser.get()[http::field::expect];
        if (parser.get().version() >= 11 && beast::iequals(expect, "100-continue")) {
          http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
          stream.expires_after(config_.io_timeout);
          std::tie(ec, std::ignore) = co_await http::async_write(stream, go_on, io);
          if (ec) break;
        }
        stream.expires_after(config_.io_timeout);
        std::tie(ec, std::ignore) = co_await http::async_read(stream, buffer, parser, io);
      }

      ApiReply reply;
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
          reply.status = 413;
          reply.body = json_error(cat("request body larger than ", kMaxModelConfigBytes,
                                      " bytes (a model's config.json is a few KiB)"));
        } else if (ec == http::error::header_limit) {
          reply.status = 431;
          reply.body = json_error("request header too large");
        } else {
          reply.status = 400;
          reply.body = json_error("malformed HTTP request: " + ec.message());
        }
        linger = true;
      } else if (denied) {
        const auto& request = parser.get();
        version = request.version();
        method = std::string(request.method_string());
        target = std::string(request.target());
        reply.status = 401;
        reply.body = json_error(
            "this API needs 'Authorization: Bearer TOKEN' with the token of the daemon's "
            "--api-token-file");
        reply.bearer_challenge = true;
        warn(cat("HTTP API request from ", peer, " without the right bearer token: 401"));
        linger = !parser.is_done();
      } else {
        const auto& request = parser.get();
        version = request.version();
        method = std::string(request.method_string());
        target = std::string(request.target());
        reply = handle(method, target, request.body());
        keep_alive = request.keep_alive() && !stopping_.load();
      }

      http::response<http::string_body> response;
      response.version(version);
      response.result(reply.status);
      response.set(http::field::server, "statepoold");
      response.set(http::field::content_type, "application/json");
      if (!reply.allow.empty()) response.set(http::field::allow, reply.allow);
      if (reply.bearer_challenge)
        response.set(http::field::www_authenticate, "Bearer realm=\"statepool\"");
      if (method != "HEAD") response.body() = std::move(reply.body);
      response.keep_alive(keep_alive);
      response.prepare_payload();
      stream.expires_after(config_.io_timeout);
      std::tie(ec, std::ignore) = co_await http::async_write(stream, response, io);
      LOG_DEBUG("http", clip(method, 16), " ", clip(target, 200), " -> ", reply.status, " (", peer,
                ")");
      if (reply.status >= 500)
        warn(cat(clip(method, 16), " ", clip(target, 200), " -> ", reply.status, ": ",
                 response.body()));
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
      stream.expires_after(config_.io_timeout);
      while (dropped < kLingerBytes) {
        std::size_t n = 0;
        std::tie(ec, n) = co_await stream.async_read_some(asio::buffer(sink), io);
        if (ec) break;
        dropped += n;
      }
    }
  } catch (const std::exception& e) {
    warn(cat("HTTP API connection from ", peer, " failed: ", e.what()));
  }
  stream.socket().close(ec);
}

bool HttpApi::authorized(std::string_view header) const noexcept {
  const std::string& token = config_.api_token;
  if (token.empty()) return true;
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() != kScheme.size() + token.size() ||
      !beast::iequals(header.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  // Constant time in the token's bytes: no early exit on the first difference.
  unsigned char difference = 0;
  const std::string_view given = header.substr(kScheme.size());
  for (std::size_t i = 0; i < token.size(); ++i)
    difference |= static_cast<unsigned char>(given[i] ^ token[i]);
  return difference == 0;
}

ApiReply HttpApi::handle(std::string_view method, std::string_view target,
                         std::string_view body) const {
  ApiReply reply;
  try {
    const urls::url_view url = parse_target(target);
    std::string_view path = url.encoded_path();
    if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);

    if (path == "/v1") {
      require_method(method, "GET", path);
      const Params params = query_params(url);
      if (!params.empty())
        throw ApiError(400, "unknown query parameter '" + clip(params.front().first) +
                                "' for GET /v1 (it takes none)");
      reply.body = index_json();
    } else if (path == "/v1/plan") {
      require_method(method, "POST", path);
      planner::PlanInputs inputs;
      std::string tenant;
      for (const auto& [name, value] : query_params(url)) {
        if (name == "tenant")
          tenant = tenant_value(value);
        else if (!planner::set_plan_input(inputs, name, value))
          throw unknown_parameter(name, "POST /v1/plan", plan_parameters());
      }
      reply.body = plan_capacity_json(pool_, body, inputs, tenant);
    } else if (path == "/v1/fits") {
      require_method(method, "GET", path);
      planner::PlanInputs scratch;  // parses slots and state-codec like POST /v1/plan
      std::string layout, tenant;
      bool has_layout = false;
      for (const auto& [name, value] : query_params(url)) {
        if (name == "layout") {
          if (value.empty()) throw ApiError(400, "layout must not be empty");
          layout = value;
          has_layout = true;
        } else if (name == "tenant") {
          tenant = tenant_value(value);
        } else if (name == "slots" || name == "state-codec") {
          (void)planner::set_plan_input(scratch, name, value);
        } else {
          throw unknown_parameter(name, "GET /v1/fits", fits_parameters());
        }
      }
      if (!has_layout) {
        throw ApiError(400,
                       "missing query parameter 'layout': the name of a layout the pool holds "
                       "arenas of, as in /v1/fits?layout=NAME");
      }
      if (!tenant.empty()) (void)pool_.tenant(tenant);  // unknown_tenant before not found
      const PoolStats stats = pool_.stats();
      const ArenaInfo* found = nullptr;
      std::set<std::string> names;  // what the 404 lists: the tenant's own, when one is named
      for (const ArenaInfo& a : stats.arenas) {
        if (tenant.empty() || a.tenant == tenant) names.insert(a.layout_name);
        if (a.layout_name != layout) continue;
        // The tenant's own arena of that name first: names are per client, not unique.
        if (found == nullptr || (a.tenant == tenant && found->tenant != tenant)) found = &a;
      }
      if (found == nullptr) {
        std::string in_use;
        std::size_t listed = 0;
        for (const auto& name : names) {
          if (listed == 20) {
            in_use += cat(", and ", names.size() - listed, " more");
            break;
          }
          in_use += (listed++ == 0 ? "" : ", ") + clip(name);
        }
        throw ApiError(404, "no layout named '" + clip(layout) + "' in the pool (" +
                                (names.empty() ? std::string("no arenas are open")
                                               : "layouts in use: " + in_use) +
                                (tenant.empty() ? "" : " for tenant '" + tenant + "'") + ")");
      }
      const kernels::StateLayout shape = pool_.layout(found->layout)->layout();
      reply.body =
          planner::format_json(fits_now(pool_, shape, tenant, scratch.slots, scratch.codecs));
    } else {
      throw ApiError(404, "no endpoint at " + clip(path, 200) + " (GET /v1 lists them)");
    }
  } catch (const ApiError& e) {
    reply.status = e.status();
    reply.allow = e.allow();
    reply.body = json_error(e.what());
  } catch (const StatusError& e) {
    reply.status = http_status(e.status());
    reply.body = json_error(e.what());
  } catch (const std::invalid_argument& e) {  // set_plan_input: a bad value
    reply.status = 400;
    reply.body = json_error(e.what());
  } catch (const std::exception& e) {
    reply.status = 500;
    reply.body = json_error(std::string("internal error: ") + e.what());
  }
  if (reply.body.empty() || reply.body.back() != '\n') reply.body += '\n';
  return reply;
}

}  // namespace statepool::service
