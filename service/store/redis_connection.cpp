// Node (store/redis_connection.hpp): one Redis server, reached over two blocking hiredis
// connections, one for lookups and one for writes, each made on demand behind its own
// mutex and reconnect rate limit. Without hiredis this file is empty.
//
// Thread-safety: the calls of one Use are serialized by that connection's mutex; the
// health state shared by the two connections sits behind health_mutex_, never held during
// I/O. Lock order: a connection's mutex, then health_mutex_.

#include "store/redis_connection.hpp"

#if STATEPOOL_HAVE_HIREDIS

#include <pthread.h>
#include <sys/time.h>

#include <cerrno>
#include <csignal>
#include <ctime>
#include <utility>

namespace statepool::service::redis {
namespace {

// A read buffer larger than this is given back after each reply (see trim_reader_locked).
constexpr std::size_t kKeptReadBuffer = std::size_t{1} << 20;

timeval to_timeval(std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  return tv;
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

// Why a command's I/O failed, from the context's error and the errno right after it.
std::string io_reason(const redisContext& context, int saved_errno,
                      std::chrono::milliseconds timeout) {
  if (context.err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK)) {
    return "timed out after " + std::to_string(timeout.count()) + " ms";
  }
  if (context.err == REDIS_ERR_EOF) return "connection closed by the server";
  return context.errstr;
}

}  // namespace

Reply Node::run(Command& command, bool asking, Use use) {
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

bool Node::may_connect_locked(const Link& link, Clock::time_point now, std::string& why) const {
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

bool Node::broken_since(Clock::time_point since, std::string& why) const {
  const std::lock_guard lock(health_mutex_);
  if (!broken_ || broken_at_ <= since) return false;
  why = broken_reason_;
  return true;
}

void Node::note_broken(const std::string& reason) {
  const std::lock_guard lock(health_mutex_);
  broken_ = true;
  broken_at_ = Clock::now();
  broken_reason_ = reason;
}

void Node::connect_locked(Link& link) {
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

Reply Node::issue_locked(Link& link, Command& command, bool asking, int& saved_errno) {
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

void Node::trim_reader_locked(Link& link) {
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

void Node::drop_locked(Link& link, const std::string& reason) {
  link.context.reset();
  link.connected = false;
  link.last_error = reason;
}

}  // namespace statepool::service::redis

#endif  // STATEPOOL_HAVE_HIREDIS
