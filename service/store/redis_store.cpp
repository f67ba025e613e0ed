// The Redis client behind make_redis_store (store/redis_store.hpp): the store that routes
// keys to nodes (standalone, or Redis Cluster with a slot map, MOVED and ASK), and the
// parsing of the cluster's replies. A node, two blocking hiredis connections each behind
// a mutex, is in store/redis_connection.{hpp,cpp}. Without hiredis only the stubs at the
// end are built.
//
// Thread-safety: a Node serializes the calls of one Use with that connection's mutex; the
// store's topology (mode, nodes, slot map) sits behind a shared mutex that is never held
// during I/O, and one refresh of it runs at a time (refresh_mutex_). Lock order:
// refresh_mutex_, then a node connection's mutex, then topology_mutex_.

#include "store/redis_store.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#if STATEPOOL_HAVE_HIREDIS

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string_view>
#include <system_error>
#include <vector>

#include "store/redis_connection.hpp"

namespace statepool::service {
namespace {

using redis::Clock;
using redis::Command;
using redis::Node;
using redis::Reply;
using redis::text_of;
using redis::Use;

// Key and value bytes of one SET, leaving room for the protocol's framing in an int.
constexpr std::size_t kMaxCommandBytes = (std::size_t{1} << 31) - 4096;

// A MOVED or ASK error reply: "MOVED 3999 127.0.0.1:6381".
struct Redirect {
  bool ask = false;
  std::uint16_t slot = 0;
  RedisEndpoint target;
};

std::optional<Redirect> parse_redirect(std::string_view text, const RedisEndpoint& from) {
  Redirect redirect;
  if (text.starts_with("MOVED ")) {
    text.remove_prefix(6);
  } else if (text.starts_with("ASK ")) {
    text.remove_prefix(4);
    redirect.ask = true;
  } else {
    return std::nullopt;
  }
  const std::size_t space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  unsigned slot = 0;
  const auto [slot_end, slot_ec] = std::from_chars(text.data(), text.data() + space, slot);
  if (slot_ec != std::errc() || slot_end != text.data() + space || slot >= kRedisClusterSlots) {
    return std::nullopt;
  }
  redirect.slot = static_cast<std::uint16_t>(slot);
  const std::string_view address = text.substr(space + 1);
  const std::size_t colon = address.rfind(':');  // IPv6 addresses come without brackets
  if (colon == std::string_view::npos) return std::nullopt;
  unsigned port = 0;
  const std::string_view port_text = address.substr(colon + 1);
  const auto [port_end, port_ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_ec != std::errc() || port_end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return std::nullopt;
  }
  redirect.target.host = std::string(address.substr(0, colon));
  // An empty host: the same host as the node that answered (unknown endpoint).
  if (redirect.target.host.empty()) redirect.target.host = from.host;
  if (redirect.target.host == "?") return std::nullopt;
  redirect.target.port = static_cast<std::uint16_t>(port);
  return redirect;
}

// A standalone server's answer to CLUSTER SLOTS ("ERR This instance has cluster support
// disabled"; Dragonfly: "Cluster is disabled"; proxies that do not know it: "unknown
// command"). Other errors (NOAUTH, LOADING) are failures, not evidence of a standalone.
bool says_standalone(std::string_view error) {
  std::string lower(error);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  return (lower.find("cluster") != std::string::npos &&
          lower.find("disabled") != std::string::npos) ||
         lower.find("unknown command") != std::string::npos;
}

struct SlotRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  RedisEndpoint master;
};

// CLUSTER SLOTS: [[first, last, [ip, port, id, ...], replicas...], ...]. Ranges whose
// master has no known endpoint (ip NULL) are left out. nullopt when it is malformed.
std::optional<std::vector<SlotRange>> parse_cluster_slots(const redisReply& reply,
                                                          const RedisEndpoint& from) {
  if (reply.type != REDIS_REPLY_ARRAY) return std::nullopt;
  std::vector<SlotRange> ranges;
  for (std::size_t i = 0; i < reply.elements; ++i) {
    const redisReply& entry = *reply.element[i];
    if (entry.type != REDIS_REPLY_ARRAY || entry.elements < 3) return std::nullopt;
    const redisReply& first = *entry.element[0];
    const redisReply& last = *entry.element[1];
    const redisReply& master = *entry.element[2];
    if (first.type != REDIS_REPLY_INTEGER || last.type != REDIS_REPLY_INTEGER ||
        first.integer < 0 || last.integer < first.integer || last.integer >= kRedisClusterSlots ||
        master.type != REDIS_REPLY_ARRAY || master.elements < 2 ||
        master.element[1]->type != REDIS_REPLY_INTEGER || master.element[1]->integer <= 0 ||
        master.element[1]->integer > 65535) {
      return std::nullopt;
    }
    const redisReply& ip = *master.element[0];
    if (ip.type == REDIS_REPLY_NIL) continue;
    if (ip.type != REDIS_REPLY_STRING) return std::nullopt;
    SlotRange range;
    range.first = static_cast<std::uint16_t>(first.integer);
    range.last = static_cast<std::uint16_t>(last.integer);
    range.master.host = ip.len == 0 ? from.host : std::string(text_of(ip));
    if (range.master.host == "?") continue;
    range.master.port = static_cast<std::uint16_t>(master.element[1]->integer);
    ranges.push_back(std::move(range));
  }
  return ranges;
}

class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisOptions options) : options_(std::move(options)) {
    for (const RedisEndpoint& seed : options_.seeds) seeds_.push_back(node_for(seed));
    try {
      const std::lock_guard lock(refresh_mutex_);
      update_topology_locked(Use::lookup);
    } catch (const RemoteError&) {
      // All seeds down: the first call says so, and later calls try again.
    }
  }

  bool put(std::string_view key, std::string_view value) override {
    // hiredis 0.14 formats a command into a buffer whose length is an int.
    if (key.size() + value.size() > kMaxCommandBytes) {
      throw RemoteError(describe() + ": SET of " + std::to_string(value.size()) +
                        " bytes: more than hiredis can send in one command (2 GiB)");
    }
    std::string ttl_ms;
    const bool with_ttl = options_.ttl.count() > 0;
    if (with_ttl) {
      ttl_ms = std::to_string(std::chrono::milliseconds(options_.ttl).count());
    }
    // NX: a key keeps its first value (RemoteStore). Answered +OK when stored, nil when
    // the key was there.
    Command command = with_ttl ? Command("SET", {"SET", key, value, "NX", "PX", ttl_ms})
                               : Command("SET", {"SET", key, value, "NX"});
    const auto [reply, node] = execute(key, command, Use::write);
    if (reply->type == REDIS_REPLY_NIL) return false;
    if (reply->type != REDIS_REPLY_STATUS) unexpected(*node, command, *reply);
    return true;
  }

  std::optional<std::string> get(std::string_view key) override {
    Command command("GET", {"GET", key});
    const auto [reply, node] = execute(key, command, Use::lookup);
    if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
    if (reply->type != REDIS_REPLY_STRING) unexpected(*node, command, *reply);
    return std::string(text_of(*reply));
  }

  bool exists(std::string_view key) override {
    Command command("EXISTS", {"EXISTS", key});
    const auto [reply, node] = execute(key, command, Use::lookup);
    if (reply->type != REDIS_REPLY_INTEGER) unexpected(*node, command, *reply);
    return reply->integer > 0;
  }

  void remove(std::string_view key) override {
    Command command("DEL", {"DEL", key});
    const auto [reply, node] = execute(key, command, Use::write);
    if (reply->type != REDIS_REPLY_INTEGER) unexpected(*node, command, *reply);
  }

  [[nodiscard]] std::string describe() const override {
    const std::shared_lock lock(topology_mutex_);
    switch (mode_) {
      case Mode::standalone: return standalone_->label();
      case Mode::cluster: {
        std::set<std::string> masters;
        for (const Node* node : slots_) {
          if (node != nullptr) masters.insert(node->address());
        }
        std::string out = "redis cluster of " + std::to_string(masters.size()) +
                          (masters.size() == 1 ? " node (" : " nodes (");
        bool first = true;
        for (const std::string& address : masters) {
          out += (first ? "" : ", ") + address;
          first = false;
        }
        return out + ")";
      }
      case Mode::unknown: break;
    }
    std::string out = "redis ";
    for (std::size_t i = 0; i < seeds_.size(); ++i) {
      out += (i == 0 ? "" : ", ") + seeds_[i]->address();
    }
    return out + " (not reached yet)";
  }

 private:
  enum class Mode { unknown, standalone, cluster };

  struct Answer {
    Reply reply;
    Node* node;
  };

  [[noreturn]] static void unexpected(const Node& node, const Command& command,
                                      const redisReply& reply) {
    throw RemoteError(node.label() + ": " + command.name() + ": unexpected reply of type " +
                      std::to_string(reply.type));
  }

  // The node of `endpoint`, made on first use. Nodes are never forgotten, so the raw
  // pointers of slots_ stay valid for the store's life.
  Node* node_for(const RedisEndpoint& endpoint) {
    const std::string address = to_string(endpoint);
    const std::unique_lock lock(topology_mutex_);
    auto it = nodes_.find(address);
    if (it == nodes_.end()) {
      it = nodes_
               .emplace(address,
                        std::make_unique<Node>(endpoint, options_.timeout, options_.password))
               .first;
    }
    return it->second.get();
  }

  // Runs `command` for `key` where the topology sends it, over the nodes' connections for
  // `use`; error replies other than redirects become RemoteError.
  Answer execute(std::string_view key, Command& command, Use use) {
    Mode mode = Mode::unknown;
    Node* standalone = nullptr;
    {
      const std::shared_lock lock(topology_mutex_);
      mode = mode_;
      standalone = standalone_;
    }
    if (mode == Mode::unknown) {
      discover(use);
      const std::shared_lock lock(topology_mutex_);
      mode = mode_;
      standalone = standalone_;
    }
    if (mode == Mode::cluster) return execute_cluster(key, command, use);
    Reply reply = standalone->run(command, false, use);
    if (reply->type == REDIS_REPLY_ERROR) {
      throw RemoteError(standalone->label() + ": " + command.name() +
                        " failed: " + std::string(text_of(*reply)));
    }
    return {std::move(reply), standalone};
  }

  Answer execute_cluster(std::string_view key, Command& command, Use use) {
    const std::uint16_t slot = redis_key_slot(key);
    Node* node = owner_of(slot);
    if (node == nullptr) {
      refresh_if_due(use);
      node = owner_of(slot);
      if (node == nullptr) {
        throw RemoteError("redis cluster: no node serves slot " + std::to_string(slot) + " (" +
                          describe() + ")");
      }
    }
    bool asking = false;
    bool retried_elsewhere = false;
    int redirects = 0;
    while (true) {
      Reply reply;
      try {
        reply = node->run(command, asking, use);
      } catch (const RemoteError&) {
        // The node is down or slow: another may have taken over its slots (a replica
        // promoted). Otherwise only this node's slots fail.
        if (asking || retried_elsewhere) throw;
        refresh_if_due(use);
        Node* owner = owner_of(slot);
        if (owner == nullptr || owner == node) throw;
        node = owner;
        retried_elsewhere = true;
        continue;
      }
      asking = false;
      if (reply->type != REDIS_REPLY_ERROR) return {std::move(reply), node};
      const std::string_view text = text_of(*reply);
      const std::optional<Redirect> redirect = parse_redirect(text, node->endpoint());
      if (!redirect) {
        throw RemoteError(node->label() + ": " + command.name() + " failed: " + std::string(text));
      }
      if (++redirects > kMaxRedisRedirects) {
        throw RemoteError(node->label() + ": " + command.name() +
                          " failed: too many redirects (the last: " + std::string(text) + ")");
      }
      Node* target = node_for(redirect->target);
      if (redirect->ask) {
        asking = true;  // this once, for this key only
      } else {
        set_owner(redirect->slot, target);
        refresh_if_due(use);
      }
      node = target;
    }
  }

  [[nodiscard]] Node* owner_of(std::uint16_t slot) const {
    const std::shared_lock lock(topology_mutex_);
    return slots_.empty() ? nullptr : slots_[slot];
  }

  void set_owner(std::uint16_t slot, Node* node) {
    const std::unique_lock lock(topology_mutex_);
    if (!slots_.empty()) slots_[slot] = node;
  }

  // Mode unknown: ask the seeds now (each one's reconnect rate limit keeps this fast when
  // they are down). Throws RemoteError when none answers.
  void discover(Use use) {
    const std::lock_guard lock(refresh_mutex_);
    {
      const std::shared_lock topology(topology_mutex_);
      if (mode_ != Mode::unknown) return;  // another thread found out meanwhile
    }
    update_topology_locked(use);
  }

  // Cluster map refresh, at most once per `timeout`, and never waiting for one that
  // another thread runs (a call that fails must fail fast). Failures are left for the
  // calls to find (each node's own errors are more precise).
  void refresh_if_due(Use use) {
    try {
      const std::unique_lock lock(refresh_mutex_, std::try_to_lock);
      if (!lock.owns_lock()) return;
      if (refreshed_ && Clock::now() - last_refresh_ < options_.timeout) return;
      update_topology_locked(use);
    } catch (const RemoteError&) {
    }
  }

  // Asks for CLUSTER SLOTS: the nodes of the map with a live connection first, then the
  // other nodes of the map, then the seeds; the first usable answer wins, asked over the
  // connections for `use` (the caller's). Holds refresh_mutex_. Throws RemoteError naming
  // every failure when there is no answer.
  void update_topology_locked(Use use) {
    refreshed_ = true;
    last_refresh_ = Clock::now();
    std::vector<Node*> candidates;
    Mode mode = Mode::unknown;
    {
      const std::shared_lock lock(topology_mutex_);
      mode = mode_;
      std::set<Node*> masters(slots_.begin(), slots_.end());
      masters.erase(nullptr);
      for (Node* node : masters) {
        if (node->connected()) candidates.push_back(node);
      }
      for (Node* node : masters) {
        if (!node->connected()) candidates.push_back(node);
      }
    }
    for (Node* seed : seeds_) {
      if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end()) {
        candidates.push_back(seed);
      }
    }

    std::vector<std::string> failures;
    for (Node* node : candidates) {
      Command command("CLUSTER SLOTS", {"CLUSTER", "SLOTS"});
      Reply reply;
      try {
        reply = node->run(command, false, use);
      } catch (const RemoteError& error) {
        failures.emplace_back(error.what());
        continue;
      }
      if (reply->type == REDIS_REPLY_ERROR) {
        if (mode == Mode::unknown && says_standalone(text_of(*reply))) {
          const std::unique_lock lock(topology_mutex_);
          mode_ = Mode::standalone;
          standalone_ = node;
          return;
        }
        failures.push_back(node->label() +
                           ": CLUSTER SLOTS failed: " + std::string(text_of(*reply)));
        continue;
      }
      const std::optional<std::vector<SlotRange>> ranges =
          parse_cluster_slots(*reply, node->endpoint());
      if (!ranges) {
        failures.push_back(node->label() + ": CLUSTER SLOTS: unexpected reply");
        continue;
      }
      std::vector<Node*> slots(kRedisClusterSlots, nullptr);
      for (const SlotRange& range : *ranges) {
        Node* master = node_for(range.master);
        std::fill(slots.begin() + range.first, slots.begin() + range.last + 1, master);
      }
      const std::unique_lock lock(topology_mutex_);
      mode_ = Mode::cluster;
      slots_ = std::move(slots);
      return;
    }
    if (failures.size() == 1) throw RemoteError(failures.front());
    std::string message = "redis: no node answered (";
    for (std::size_t i = 0; i < failures.size(); ++i) {
      message += (i == 0 ? "" : "; ") + failures[i];
    }
    throw RemoteError(message + ")");
  }

  const RedisOptions options_;
  std::vector<Node*> seeds_;  // set in the constructor, then read-only

  mutable std::shared_mutex topology_mutex_;
  Mode mode_ = Mode::unknown;
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // by address; never erased
  Node* standalone_ = nullptr;
  std::vector<Node*> slots_;  // kRedisClusterSlots owners (nullptr: none), cluster only

  std::mutex refresh_mutex_;
  bool refreshed_ = false;  // under refresh_mutex_, as last_refresh_
  Clock::time_point last_refresh_{};
};

void check(const RedisOptions& options) {
  if (options.seeds.empty()) throw std::invalid_argument("redis store: no seed node");
  if (options.timeout.count() <= 0) {
    throw std::invalid_argument("redis store: the timeout must be positive");
  }
  if (options.ttl.count() < 0) throw std::invalid_argument("redis store: negative ttl");
  for (const RedisEndpoint& seed : options.seeds) {
    if (seed.host.empty() || seed.port == 0) {
      throw std::invalid_argument("redis store: bad seed \"" + to_string(seed) + "\"");
    }
  }
}

}  // namespace

bool redis_available() noexcept {
  return true;
}

std::unique_ptr<RemoteStore> make_redis_store(RedisOptions options) {
  check(options);
  return std::make_unique<RedisStore>(std::move(options));
}

}  // namespace statepool::service

#else  // no hiredis

namespace statepool::service {

bool redis_available() noexcept {
  return false;
}

std::unique_ptr<RemoteStore> make_redis_store(RedisOptions /*options*/) {
  throw RemoteError(
      "statepoold was built without hiredis (Debian package libhiredis-dev): no remote "
      "snapshot tier");
}

}  // namespace statepool::service

#endif
