// The Redis client behind make_redis_store (store/redis_store.hpp): nodes (two blocking
// hiredis connections each, one for lookups and one for writes, each behind a mutex), and
// the store that routes keys to them (standalone, or Redis Cluster with a slot map).
// Without hiredis only the stubs at the end are built.
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
  static constexpr std::size_t kMaxWords = 6;  // SET key value NX PX ms
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

// What a command is for, which chooses the connection it goes over: lookups (GET, and
// the CLUSTER SLOTS that a lookup asks) never queue behind writes (SET, DEL, and the
// CLUSTER SLOTS the writer asks), whose values may take long to send.
enum class Use : std::size_t { lookup = 0, write = 1 };

// One server: its endpoint, and one connection per Use, each made on demand with its own
// mutex and reconnect rate limit. What one connection learns about the server going away
// (a connect that failed, a connection the server closed) is shared: the other connection
// then fails fast instead of finding out by its own I/O or connect timeout, until a
// connect works again. A timeout is not shared (a slow write says nothing about lookups).
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
  [[nodiscard]] bool connected() const noexcept {
    return std::any_of(links_.begin(), links_.end(),
                       [](const Link& link) { return link.connected.load(); });
  }

  /// Sends `command` (preceded by ASKING when `asking`) over the connection for `use` and
  /// returns its reply, error replies included. Throws RemoteError when the node cannot
  /// be reached or the I/O fails (that connection is then dropped).
  Reply run(Command& command, bool asking, Use use) {
    Link& link = links_[static_cast<std::size_t>(use)];
    const std::lock_guard lock(link.mutex);
    const SigpipeBlock sigpipe;
    // The server went away since this connection was made (the other one found out): it
    // is dead too, whatever came back since.
    if (link.context != nullptr) {
      std::string why;
      if (broken_since(link.last_attempt, why)) drop_locked(link, why);
    }
    for (int attempt = 0;; ++attempt) {
      const bool reused = link.context != nullptr;
      if (!reused) connect_locked(link);
      int saved_errno = 0;
      Reply reply = issue_locked(link, command, asking, saved_errno);
      if (reply) {
        trim_reader_locked(link);
        return reply;
      }
      const int error = link.context->err;
      const std::string reason = io_reason(*link.context, saved_errno, timeout_);
      drop_locked(link, reason);
      // A connection that the server closed while it sat idle (a restart, the server's
      // `timeout` setting) is made again at once, once: SET NX, GET and DEL can be
      // repeated.
      const bool closed =
          error == REDIS_ERR_EOF ||
          (error == REDIS_ERR_IO && (saved_errno == EPIPE || saved_errno == ECONNRESET));
      std::string why;
      if (reused && closed && attempt == 0 && may_connect_locked(link, Clock::now(), why)) {
        continue;
      }
      if (closed) note_broken(reason);  // not a timeout: a slow write says nothing
      throw RemoteError(label_ + ": " + command.name() + " failed: " + reason);
    }
  }

 private:
  // One connection and its reconnect rate limit; everything but `connected` under `mutex`.
  struct Link {
    std::mutex mutex;
    Context context;
    std::atomic<bool> connected{false};
    bool attempted = false;
    Clock::time_point last_attempt{};
    std::string last_error;
  };

  // At most one connect per `timeout` per connection, and none within `timeout` of the
  // server going away unless a connect worked since. `why`: the reason when not.
  [[nodiscard]] bool may_connect_locked(const Link& link, Clock::time_point now,
                                        std::string& why) const {
    if (link.attempted && now - link.last_attempt < timeout_) {
      why = link.last_error;
      return false;
    }
    const std::lock_guard lock(health_mutex_);
    if (broken_ && now - broken_at_ < timeout_ && connected_at_ < broken_at_) {
      why = broken_reason_;
      return false;
    }
    return true;
  }

  // Whether the server went away (as one connection found) after `since`.
  [[nodiscard]] bool broken_since(Clock::time_point since, std::string& why) const {
    const std::lock_guard lock(health_mutex_);
    if (!broken_ || broken_at_ <= since) return false;
    why = broken_reason_;
    return true;
  }

  void note_broken(const std::string& reason) {
    const std::lock_guard lock(health_mutex_);
    broken_ = true;
    broken_at_ = Clock::now();
    broken_reason_ = reason;
  }

  void connect_locked(Link& link) {
    const Clock::time_point now = Clock::now();
    std::string why;
    if (!may_connect_locked(link, now, why)) throw RemoteError(label_ + " unreachable: " + why);
    link.attempted = true;
    link.last_attempt = now;
    // Every failure below is the server's or the network's: the other connection is told.
    const auto refused = [&](std::string reason, const char* how) {
      link.last_error = std::move(reason);
      note_broken(link.last_error);
      return RemoteError(label_ + how + link.last_error);
    };
    const timeval tv = to_timeval(timeout_);
    Context context(redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, tv));
    if (!context) throw refused("cannot allocate a connection", " unreachable: ");
    if (context->err != 0) throw refused(context->errstr, " unreachable: ");
    // hiredis 0.14 uses the connect timeout for connecting only: reads and writes get it
    // here (SO_RCVTIMEO / SO_SNDTIMEO).
    if (redisSetTimeout(context.get(), tv) != REDIS_OK) {
      throw refused(std::string("cannot set the timeout: ") + context->errstr, " unreachable: ");
    }
    (void)redisEnableKeepAlive(context.get());  // best effort: finds half-dead peers
    if (!password_.empty()) {
      const char* argv[] = {"AUTH", password_.data()};
      const std::size_t lengths[] = {4, password_.size()};
      Reply reply(static_cast<redisReply*>(redisCommandArgv(context.get(), 2, argv, lengths)));
      if (!reply) throw refused("AUTH: " + io_reason(*context, errno, timeout_), " unreachable: ");
      if (reply->type == REDIS_REPLY_ERROR) {
        throw refused("AUTH failed: " + std::string(text_of(*reply)), ": ");
      }
    }
    link.context = std::move(context);
    link.connected = true;
    const std::lock_guard lock(health_mutex_);
    connected_at_ = Clock::now();
  }

  static Reply issue_locked(Link& link, Command& command, bool asking, int& saved_errno) {
    redisContext* context = link.context.get();
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
  // (maxbuf), so a 150 MB GET would keep 150 MB per connection until the next call; give
  // it back now. The reader's fields are public in hiredis 0.14 (its sds names change in
  // 1.x).
  static void trim_reader_locked(Link& link) {
#if HIREDIS_MAJOR == 0
    redisReader* reader = link.context->reader;
    if (reader->buf != nullptr && reader->pos == reader->len &&
        sdsalloc(reader->buf) > kKeptReadBuffer) {
      sds fresh = sdsempty();
      if (fresh == nullptr) return;
      sdsfree(reader->buf);
      reader->buf = fresh;
      reader->pos = 0;
      reader->len = 0;
    }
#else
    (void)link;
#endif
  }

  static void drop_locked(Link& link, const std::string& reason) {
    link.context.reset();
    link.connected = false;
    link.last_error = reason;
  }

  const RedisEndpoint endpoint_;
  const std::string address_;
  const std::string label_;
  const std::chrono::milliseconds timeout_;
  const std::string password_;
  std::array<Link, 2> links_;  // by Use

  // Shared by the connections; never held during I/O.
  mutable std::mutex health_mutex_;
  bool broken_ = false;               // the server went away once (a connect failed, or it
  Clock::time_point broken_at_{};     // closed a connection), the last time at broken_at_,
  std::string broken_reason_;         // for this reason
  Clock::time_point connected_at_{};  // the last connect that worked
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
