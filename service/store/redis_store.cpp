// The Redis client behind make_redis_store (store/redis_store.hpp): nodes (one blocking
// hiredis connection each, behind a mutex), and the store that routes keys to them
// (standalone, or Redis Cluster with a slot map). Without hiredis only the stubs at the end
// are built.
//
// Thread-safety: a Node serializes its calls with its mutex; the store's topology (mode,
// nodes, slot map) sits behind a shared mutex that is never held during I/O, and one
// refresh of it runs at a time (refresh_mutex_). Lock order: refresh_mutex_, then a
// node's mutex, then topology_mutex_.

#include "store/redis_store.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#if STATEPOOL_HAVE_HIREDIS

// hiredis 0.14's sds.h has no extern "C" of its own (hiredis.h includes it before its
// own), so its functions would get C++ names: include it first, with C linkage.
extern "C" {
#include <hiredis/sds.h>
}
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstddef>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string_view>
#include <system_error>
#include <vector>

namespace statepool::service {
namespace {

using Clock = std::chrono::steady_clock;

struct ContextFree {
  void operator()(redisContext* context) const noexcept { redisFree(context); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

struct ReplyFree {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// Key and value bytes of one SET, leaving room for the protocol's framing in an int.
constexpr std::size_t kMaxCommandBytes = (std::size_t{1} << 31) - 4096;

// A read buffer larger than this is given back after each reply (see trim_reader_locked).
constexpr std::size_t kKeptReadBuffer = std::size_t{1} << 20;

timeval to_timeval(std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  return tv;
}

std::string_view text_of(const redisReply& reply) {
  return {reply.str, reply.len};
}

// hiredis writes with write(2): a peer that has gone away raises SIGPIPE, which kills a
// process that has not ignored it (statepoold ignores it; a test or a tool may not). The
// signal is blocked on this thread while hiredis runs, and one it raised is consumed.
class SigpipeBlock {
 public:
  SigpipeBlock() noexcept {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &set_, &previous_) == 0;
  }
  ~SigpipeBlock() {
    if (!blocked_) return;
    const int saved_errno = errno;
    sigset_t pending;
    sigemptyset(&pending);
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&set_, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    errno = saved_errno;
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t set_{};
  sigset_t previous_{};
  bool was_pending_ = false;
  bool blocked_ = false;
};

// One command: its words (binary-safe: hiredis gets lengths, never C strings) and its
// name for messages.
class Command {
 public:
  Command(const char* name, std::initializer_list<std::string_view> words) : name_(name) {
    for (const std::string_view word : words) {
      argv_[argc_] = word.empty() ? "" : word.data();  // never a null pointer for hiredis
      lengths_[argc_] = word.size();
      ++argc_;
    }
  }
  [[nodiscard]] const char* name() const noexcept { return name_; }
  [[nodiscard]] int argc() const noexcept { return static_cast<int>(argc_); }
  [[nodiscard]] const char** argv() noexcept { return argv_.data(); }
  [[nodiscard]] const std::size_t* lengths() const noexcept { return lengths_.data(); }

 private:
  static constexpr std::size_t kMaxWords = 5;  // SET key value PX ms
  const char* name_;
  std::array<const char*, kMaxWords> argv_{};
  std::array<std::size_t, kMaxWords> lengths_{};
  std::size_t argc_ = 0;
};

// Why a command's I/O failed, from the context's error and the errno right after it.
std::string io_reason(const redisContext& context, int saved_errno,
                      std::chrono::milliseconds timeout) {
  if (context.err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK)) {
    return "timed out after " + std::to_string(timeout.count()) + " ms";
  }
  if (context.err == REDIS_ERR_EOF) return "connection closed by the server";
  return context.errstr;
}

// One server: its endpoint, one connection made on demand, and the reconnect rate limit.
class Node {
 public:
  Node(RedisEndpoint endpoint, std::chrono::milliseconds timeout, std::string password)
      : endpoint_(std::move(endpoint)),
        address_(to_string(endpoint_)),
        label_("redis " + address_),
        timeout_(timeout),
        password_(std::move(password)) {}

  [[nodiscard]] const RedisEndpoint& endpoint() const noexcept { return endpoint_; }
  /// "127.0.0.1:6379"
  [[nodiscard]] const std::string& address() const noexcept { return address_; }
  /// "redis 127.0.0.1:6379": how messages name it.
  [[nodiscard]] const std::string& label() const noexcept { return label_; }
  /// Whether it has a connection now (a hint for choosing whom to ask first).
  [[nodiscard]] bool connected() const noexcept { return connected_.load(); }

  /// Sends `command` (preceded by ASKING when `asking`) and returns its reply, error
  /// replies included. Throws RemoteError when the node cannot be reached or the I/O
  /// fails (the connection is then dropped).
  Reply run(Command& command, bool asking) {
    const std::lock_guard lock(mutex_);
    const SigpipeBlock sigpipe;
    for (int attempt = 0;; ++attempt) {
      const bool reused = context_ != nullptr;
      if (!reused) connect_locked();
      int saved_errno = 0;
      Reply reply = issue_locked(command, asking, saved_errno);
      if (reply) {
        trim_reader_locked();
        return reply;
      }
      const int error = context_->err;
      const std::string reason = io_reason(*context_, saved_errno, timeout_);
      drop_locked(reason);
      // A connection that the server closed while it sat idle (a restart, the server's
      // `timeout` setting) is made again at once, once: SET, GET and DEL can be repeated.
      const bool closed =
          error == REDIS_ERR_EOF ||
          (error == REDIS_ERR_IO && (saved_errno == EPIPE || saved_errno == ECONNRESET));
      if (reused && closed && attempt == 0 && may_connect_locked(Clock::now())) continue;
      throw RemoteError(label_ + ": " + command.name() + " failed: " + reason);
    }
  }

 private:
  [[nodiscard]] bool may_connect_locked(Clock::time_point now) const {
    return !attempted_ || now - last_attempt_ >= timeout_;
  }

  void connect_locked() {
    const Clock::time_point now = Clock::now();
    if (!may_connect_locked(now)) throw RemoteError(label_ + " unreachable: " + last_error_);
    attempted_ = true;
    last_attempt_ = now;
    const timeval tv = to_timeval(timeout_);
    Context context(redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, tv));
    if (!context) {
      last_error_ = "cannot allocate a connection";
      throw RemoteError(label_ + " unreachable: " + last_error_);
    }
    if (context->err != 0) {
      last_error_ = context->errstr;
      throw RemoteError(label_ + " unreachable: " + last_error_);
    }
    // hiredis 0.14 uses the connect timeout for connecting only: reads and writes get it
    // here (SO_RCVTIMEO / SO_SNDTIMEO).
    if (redisSetTimeout(context.get(), tv) != REDIS_OK) {
      last_error_ = std::string("cannot set the timeout: ") + context->errstr;
      throw RemoteError(label_ + " unreachable: " + last_error_);
    }
    (void)redisEnableKeepAlive(context.get());  // best effort: finds half-dead peers
    if (!password_.empty()) {
      const char* argv[] = {"AUTH", password_.data()};
      const std::size_t lengths[] = {4, password_.size()};
      Reply reply(static_cast<redisReply*>(redisCommandArgv(context.get(), 2, argv, lengths)));
      if (!reply) {
        last_error_ = "AUTH: " + io_reason(*context, errno, timeout_);
        throw RemoteError(label_ + " unreachable: " + last_error_);
      }
      if (reply->type == REDIS_REPLY_ERROR) {
        last_error_ = "AUTH failed: " + std::string(text_of(*reply));
        throw RemoteError(label_ + ": " + last_error_);
      }
    }
    context_ = std::move(context);
    connected_ = true;
  }

  Reply issue_locked(Command& command, bool asking, int& saved_errno) {
    redisContext* context = context_.get();
    if (asking && redisAppendCommand(context, "ASKING") != REDIS_OK) {
      saved_errno = errno;
      return nullptr;
    }
    if (redisAppendCommandArgv(context, command.argc(), command.argv(), command.lengths()) !=
        REDIS_OK) {
      saved_errno = errno;
      return nullptr;
    }
    void* raw = nullptr;
    if (asking) {
      // An error answer to ASKING shows in the command's own answer.
      if (redisGetReply(context, &raw) != REDIS_OK) {
        saved_errno = errno;
        return nullptr;
      }
      const Reply asking_reply(static_cast<redisReply*>(raw));
      raw = nullptr;
    }
    if (redisGetReply(context, &raw) != REDIS_OK) {
      saved_errno = errno;
      return nullptr;
    }
    return Reply(static_cast<redisReply*>(raw));
  }

  // hiredis's reader frees a large empty buffer only when the next reply arrives
  // (maxbuf), so a 150 MB GET would keep 150 MB per node until the next call; give it
  // back now. The reader's fields are public in hiredis 0.14 (its sds names change in 1.x).
  void trim_reader_locked() {
#if HIREDIS_MAJOR == 0
    redisReader* reader = context_->reader;
    if (reader->buf != nullptr && reader->pos == reader->len &&
        sdsalloc(reader->buf) > kKeptReadBuffer) {
      sds fresh = sdsempty();
      if (fresh == nullptr) return;
      sdsfree(reader->buf);
      reader->buf = fresh;
      reader->pos = 0;
      reader->len = 0;
    }
#endif
  }

  void drop_locked(const std::string& reason) {
    context_.reset();
    connected_ = false;
    last_error_ = reason;
  }

  const RedisEndpoint endpoint_;
  const std::string address_;
  const std::string label_;
  const std::chrono::milliseconds timeout_;
  const std::string password_;

  std::mutex mutex_;
  Context context_;
  std::atomic<bool> connected_{false};
  bool attempted_ = false;
  Clock::time_point last_attempt_{};
  std::string last_error_;
};

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
      update_topology_locked();
    } catch (const RemoteError&) {
      // All seeds down: the first call says so, and later calls try again.
    }
  }

  void put(std::string_view key, std::string_view value) override {
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
    Command command = with_ttl ? Command("SET", {"SET", key, value, "PX", ttl_ms})
                               : Command("SET", {"SET", key, value});
    const auto [reply, node] = execute(key, command);
    if (reply->type != REDIS_REPLY_STATUS) unexpected(*node, command, *reply);
  }

  std::optional<std::string> get(std::string_view key) override {
    Command command("GET", {"GET", key});
    const auto [reply, node] = execute(key, command);
    if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
    if (reply->type != REDIS_REPLY_STRING) unexpected(*node, command, *reply);
    return std::string(text_of(*reply));
  }

  void remove(std::string_view key) override {
    Command command("DEL", {"DEL", key});
    const auto [reply, node] = execute(key, command);
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

  // Runs `command` for `key` where the topology sends it; error replies other than
  // redirects become RemoteError.
  Answer execute(std::string_view key, Command& command) {
    Mode mode = Mode::unknown;
    Node* standalone = nullptr;
    {
      const std::shared_lock lock(topology_mutex_);
      mode = mode_;
      standalone = standalone_;
    }
    if (mode == Mode::unknown) {
      discover();
      const std::shared_lock lock(topology_mutex_);
      mode = mode_;
      standalone = standalone_;
    }
    if (mode == Mode::cluster) return execute_cluster(key, command);
    Reply reply = standalone->run(command, false);
    if (reply->type == REDIS_REPLY_ERROR) {
      throw RemoteError(standalone->label() + ": " + command.name() +
                        " failed: " + std::string(text_of(*reply)));
    }
    return {std::move(reply), standalone};
  }

  Answer execute_cluster(std::string_view key, Command& command) {
    const std::uint16_t slot = redis_key_slot(key);
    Node* node = owner_of(slot);
    if (node == nullptr) {
      refresh_if_due();
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
        reply = node->run(command, asking);
      } catch (const RemoteError&) {
        // The node is down or slow: another may have taken over its slots (a replica
        // promoted). Otherwise only this node's slots fail.
        if (asking || retried_elsewhere) throw;
        refresh_if_due();
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
        refresh_if_due();
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
  void discover() {
    const std::lock_guard lock(refresh_mutex_);
    {
      const std::shared_lock topology(topology_mutex_);
      if (mode_ != Mode::unknown) return;  // another thread found out meanwhile
    }
    update_topology_locked();
  }

  // Cluster map refresh, at most once per `timeout`, and never waiting for one that
  // another thread runs (a call that fails must fail fast). Failures are left for the
  // calls to find (each node's own errors are more precise).
  void refresh_if_due() {
    try {
      const std::unique_lock lock(refresh_mutex_, std::try_to_lock);
      if (!lock.owns_lock()) return;
      if (refreshed_ && Clock::now() - last_refresh_ < options_.timeout) return;
      update_topology_locked();
    } catch (const RemoteError&) {
    }
  }

  // Asks for CLUSTER SLOTS: the nodes of the map with a live connection first, then the
  // other nodes of the map, then the seeds; the first usable answer wins. Holds
  // refresh_mutex_. Throws RemoteError naming every failure when there is no answer.
  void update_topology_locked() {
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
        reply = node->run(command, false);
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
