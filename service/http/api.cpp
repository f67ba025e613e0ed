#include "http/api.hpp"

#include <exception>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>
#include <boost/url.hpp>

#include "handlers/live_capacity.hpp"
#include "statepool/planner/fits.hpp"
#include "statepool/planner/planner.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace beast = boost::beast;
namespace urls = boost::urls;

namespace {

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

std::size_t HttpApi::max_body() const noexcept {
  return kMaxModelConfigBytes;
}

HttpReply HttpApi::refusal(unsigned status, const std::string& message) const {
  HttpReply reply;
  reply.status = status;
  if (status == 401) {
    reply.body = json_error(
        "this API needs 'Authorization: Bearer TOKEN' with the token of the daemon's "
        "--api-token-file");
  } else if (status == 413) {
    reply.body = json_error(message + " (a model's config.json is a few KiB)");
  } else {
    reply.body = json_error(message);
  }
  return reply;
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

HttpReply HttpApi::handle(std::string_view method, std::string_view target,
                          std::string_view body) const {
  HttpReply reply;
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
            in_use += support::cat(", and ", names.size() - listed, " more");
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
