#pragma once
// Private to store/ (no other folder includes it): the Redis client's connection and
// command layer, shared by store/redis_connection.cpp, which implements Node, and
// store/redis_store.cpp, the store that routes keys to nodes (standalone, or Redis
// Cluster with a slot map). A node is two blocking hiredis connections, one for lookups
// and one for writes, each behind a mutex. Only with hiredis (STATEPOOL_HAVE_HIREDIS).
//
// Thread-safety: a Node may be used from any number of threads; it serializes the calls of
// one Use with that connection's mutex, and its health state (what one connection learns
// about the server) sits behind a mutex of its own that is never held during I/O.

#if STATEPOOL_HAVE_HIREDIS

// hiredis 0.14's sds.h has no extern "C" of its own (hiredis.h includes it before its
// own), so its functions would get C++ names: include it first, with C linkage.
extern "C" {
#include <hiredis/sds.h>
}
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "store/redis_store.hpp"

namespace statepool::service::redis {

using Clock = std::chrono::steady_clock;

struct ContextFree {
  void operator()(redisContext* context) const noexcept { redisFree(context); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

struct ReplyFree {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

inline std::string_view text_of(const redisReply& reply) {
  return {reply.str, reply.len};
}

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
  Reply run(Command& command, bool asking, Use use);

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
                                        std::string& why) const;

  // Whether the server went away (as one connection found) after `since`.
  [[nodiscard]] bool broken_since(Clock::time_point since, std::string& why) const;

  void note_broken(const std::string& reason);

  void connect_locked(Link& link);

  static Reply issue_locked(Link& link, Command& command, bool asking, int& saved_errno);

  // hiredis's reader frees a large empty buffer only when the next reply arrives
  // (maxbuf), so a 150 MB GET would keep 150 MB per connection until the next call; give
  // it back now. The reader's fields are public in hiredis 0.14 (its sds names change in
  // 1.x).
  static void trim_reader_locked(Link& link);

  static void drop_locked(Link& link, const std::string& reason);

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

}  // namespace statepool::service::redis

#endif  // STATEPOOL_HAVE_HIREDIS
