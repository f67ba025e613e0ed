#pragma once
// Real redis-server processes for tests (header-only over statepool::testing; no
// GoogleTest, no hiredis): a standalone server or a Redis Cluster of N masters on free
// loopback ports, each in a private temporary directory, and a minimal RESP client
// (redis_query) to look at them from the side.
//
//   if (!redis_tools_available()) GTEST_SKIP() << redis_tools_missing();
//   RedisServer server;                      // started, PING answered
//   RedisCluster cluster(3);                 // created, cluster_state:ok on every node
//   redis_query(server.port(), {"DBSIZE"}).integer;
//
// Servers run without persistence (--save "" --appendonly no). Each one is killed by the
// destructor (SIGKILL, then reaped), also when a test fails or throws; and because each
// child asks the kernel for SIGKILL when its parent thread ends (PR_SET_PDEATHSIG), a test
// process that crashes leaves no server behind either. So create them on the thread that
// outlives them (the test's own). Cluster nodes run with cluster-require-full-coverage no,
// so a killed node makes only its own slots fail, and an explicit cluster bus port
// (cluster-port, Redis 7), so that no port+10000 arithmetic is needed.
//
// Errors throw std::runtime_error with the server's log: an exception in a test is a
// failure with its message.
//
// Thread-safety: a RedisServer / RedisCluster belongs to one thread; redis_query and the
// free functions may be called from any thread.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "statepool/testing/daemon.hpp"  // free_tcp_port
#include "statepool/testing/temp_dir.hpp"

namespace statepool::testing {

inline constexpr const char* kRedisServerPath = "/usr/bin/redis-server";
inline constexpr const char* kRedisCliPath = "/usr/bin/redis-cli";

/// Whether redis-server and redis-cli are installed (Debian: redis-server, redis-tools).
inline bool redis_tools_available() {
  return ::access(kRedisServerPath, X_OK) == 0 && ::access(kRedisCliPath, X_OK) == 0;
}

/// The skip message of tests that need them.
inline std::string redis_tools_missing() {
  return std::string(kRedisServerPath) + " or " + kRedisCliPath +
         " is not installed (scripts/deps --test installs redis-server and redis-tools)";
}

/// One RESP value as redis_query read it.
struct RespValue {
  char type = 0;          ///< '+' status, '-' error, ':' integer, '$' bulk, '*' array, 0 none
  bool nil = false;       ///< "$-1" / "*-1"
  std::string text;       ///< status, error or bulk bytes
  long long integer = 0;  ///< ':' values
  std::vector<RespValue> elements;
  [[nodiscard]] bool ok() const { return type != 0 && type != '-'; }
};

namespace redis_detail {

// Buffered reads from a socket with a receive timeout; throws on EOF or timeout.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}
  std::string line() {
    while (true) {
      const std::size_t end = buffer_.find("\r\n", pos_);
      if (end != std::string::npos) {
        std::string out = buffer_.substr(pos_, end - pos_);
        pos_ = end + 2;
        return out;
      }
      fill();
    }
  }
  std::string bytes(std::size_t n) {
    while (buffer_.size() - pos_ < n + 2) fill();
    std::string out = buffer_.substr(pos_, n);
    pos_ += n + 2;
    return out;
  }
  RespValue value() {
    RespValue out;
    const std::string head = line();
    if (head.empty()) throw std::runtime_error("redis_query: empty reply line");
    out.type = head[0];
    const std::string rest = head.substr(1);
    switch (out.type) {
      case '+':
      case '-': out.text = rest; break;
      case ':': out.integer = std::stoll(rest); break;
      case '$': {
        const long long n = std::stoll(rest);
        if (n < 0) {
          out.nil = true;
        } else {
          out.text = bytes(static_cast<std::size_t>(n));
        }
        break;
      }
      case '*': {
        const long long n = std::stoll(rest);
        if (n < 0) out.nil = true;
        for (long long i = 0; i < n; ++i) out.elements.push_back(value());
        break;
      }
      default: throw std::runtime_error("redis_query: unexpected reply \"" + head + "\"");
    }
    return out;
  }

 private:
  void fill() {
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) throw std::runtime_error("redis_query: connection closed or timed out");
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
  int fd_;
  std::string buffer_;
  std::size_t pos_ = 0;
};

inline std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : " ") + word;
  return out;
}

// fork + exec with stdout and stderr appended to `log`, the child killed when the calling
// thread ends. Everything the child needs is prepared before fork (only async-signal-safe
// calls after it: the parent may have threads).
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const std::string& arg : argv) cargv.push_back(const_cast<char*>(arg.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (out < 0 || null < 0) ::_exit(127);
    ::dup2(null, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits up to `timeout` for `pid`; returns its exit code, or -1 (then it is killed).
inline int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace redis_detail

/// Sends one command (binary-safe words) to 127.0.0.1:port over a fresh connection and
/// reads its reply. Throws std::runtime_error when the server cannot be reached or does
/// not answer within `timeout`; error replies come back as type '-'.
inline RespValue redis_query(int port, const std::vector<std::string>& words,
                             std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("redis_query: cannot connect to 127.0.0.1:" + std::to_string(port) +
                             ": " + std::strerror(errno));
  }
  std::string request = "*" + std::to_string(words.size()) + "\r\n";
  for (const std::string& word : words) {
    request += "$" + std::to_string(word.size()) + "\r\n" + word + "\r\n";
  }
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("redis_query: send failed: " + redis_detail::join(words));
    sent += static_cast<std::size_t>(n);
  }
  redis_detail::Reader reader(fd);
  return reader.value();
}

/// Whether 127.0.0.1:port answers PING now (PONG, or NOAUTH from a server with a
/// password: it is up, and says so).
inline bool redis_pings(int port) {
  try {
    const RespValue reply = redis_query(port, {"PING"}, std::chrono::milliseconds(500));
    return (reply.type == '+' && reply.text == "PONG") ||
           (reply.type == '-' && reply.text.rfind("NOAUTH", 0) == 0);
  } catch (const std::runtime_error&) {
    return false;
  }
}

struct RedisServerOptions {
  bool cluster = false;                 ///< --cluster-enabled yes (a node of a RedisCluster)
  std::vector<std::string> extra_args;  ///< more redis-server arguments ("--requirepass", "x")
  /// Where the server's files go (its log, nodes.conf); "" = a directory of its own.
  std::string dir;
  /// The port to listen on; 0 = a free one (taken ports are then retried with others).
  int port = 0;
};

/// One redis-server on 127.0.0.1, started by the constructor.
class RedisServer {
 public:
  /// Starts it (on free ports unless options.port is set) and waits (up to 10 s) until
  /// PING answers; a free port taken in the meantime is retried with other ports. Throws
  /// std::runtime_error with its log.
  explicit RedisServer(RedisServerOptions options = {}) : options_(std::move(options)) {
    if (options_.dir.empty()) {
      own_dir_ = std::make_unique<TempDir>("/tmp/statepool-redis");
      options_.dir = own_dir_->path();
    }
    if (options_.port != 0) {
      port_ = options_.port;
      if (options_.cluster) bus_port_ = free_tcp_port();
      start();
      return;
    }
    std::string failure;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_tcp_port();
      if (options_.cluster) bus_port_ = free_tcp_port();
      try {
        start();
        return;
      } catch (const std::runtime_error& error) {
        failure = error.what();
      }
    }
    throw std::runtime_error(failure);
  }
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  /// "127.0.0.1:PORT"
  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// "redis://127.0.0.1:PORT"
  [[nodiscard]] std::string url() const { return "redis://" + address(); }
  [[nodiscard]] const std::string& dir() const noexcept { return options_.dir; }
  [[nodiscard]] std::string log_path() const {
    return options_.dir + "/redis-" + std::to_string(port_) + ".log";
  }
  /// Everything the server wrote so far.
  [[nodiscard]] std::string log() const { return read_bytes(log_path()); }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  /// Kills it with SIGKILL (a crash, as far as clients can tell) and reaps it.
  void kill() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  /// SIGSTOP: a hung server (the kernel still accepts connections; nothing answers).
  void pause() noexcept {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  /// SIGCONT after pause().
  void resume() noexcept {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  /// Starts it again on the same ports and directory (a cluster node rejoins with its
  /// nodes.conf); waits for PING. Throws std::runtime_error when it does not come up.
  void restart() {
    kill();
    start();
  }

  /// redis_query on this server.
  [[nodiscard]] RespValue query(const std::vector<std::string>& words) const {
    return redis_query(port_, words);
  }

 private:
  void start() {
    std::vector<std::string> argv = {kRedisServerPath,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     options_.dir,
                                     "--daemonize",
                                     "no"};
    if (options_.cluster) {
      const std::string conf = options_.dir + "/nodes-" + std::to_string(port_) + ".conf";
      argv.insert(argv.end(),
                  {"--cluster-enabled", "yes", "--cluster-config-file", conf, "--cluster-port",
                   std::to_string(bus_port_), "--cluster-node-timeout", "5000",
                   "--cluster-require-full-coverage", "no"});
    }
    argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
    pid_ = redis_detail::spawn(argv, log_path());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      if (redis_pings(port_)) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server on port " + std::to_string(port_) +
                                 " exited at start; its log:\n" + log());
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        kill();
        throw std::runtime_error("redis-server on port " + std::to_string(port_) +
                                 " did not answer PING within 10 s; its log:\n" + log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  RedisServerOptions options_;
  std::unique_ptr<TempDir> own_dir_;
  int port_ = 0;
  int bus_port_ = 0;
  pid_t pid_ = -1;
};

/// A Redis Cluster of `masters` masters (no replicas) on 127.0.0.1, made with
/// `redis-cli --cluster create`; the constructor returns when CLUSTER INFO says
/// cluster_state:ok on every node (up to 30 s).
class RedisCluster {
 public:
  explicit RedisCluster(int masters = 3) : dir_("/tmp/statepool-redis-cluster") {
    for (int i = 0; i < masters; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>(RedisServerOptions{true, {}, dir_.path(), 0}));
    }
    std::vector<std::string> argv = {kRedisCliPath, "--cluster", "create"};
    for (const auto& node : nodes_) argv.push_back(node->address());
    argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    const std::string log = dir_.file("cluster-create.log");
    const int code =
        redis_detail::wait_exit(redis_detail::spawn(argv, log), std::chrono::seconds(60));
    if (code != 0) {
      throw std::runtime_error("redis-cli --cluster create failed (exit " + std::to_string(code) +
                               "):\n" + read_bytes(log));
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!all_ok()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("the redis cluster did not reach cluster_state:ok in 30 s:\n" +
                                 read_bytes(log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }
  [[nodiscard]] RedisServer& node(std::size_t i) { return *nodes_.at(i); }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_.path(); }
  /// "redis://127.0.0.1:A,127.0.0.1:B,..."
  [[nodiscard]] std::string url() const {
    std::string out = "redis://";
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      out += (i == 0 ? "" : ",") + nodes_[i]->address();
    }
    return out;
  }
  /// The index of the node that serves `slot` (by CLUSTER SLOTS of the first running
  /// node); throws when none does.
  [[nodiscard]] std::size_t owner_of(int slot) const {
    for (const auto& asked : nodes_) {
      if (!asked->running()) continue;
      const RespValue slots = asked->query({"CLUSTER", "SLOTS"});
      for (const RespValue& range : slots.elements) {
        if (range.elements.size() < 3 || slot < range.elements[0].integer ||
            slot > range.elements[1].integer) {
          continue;
        }
        const long long port = range.elements[2].elements.at(1).integer;
        for (std::size_t i = 0; i < nodes_.size(); ++i) {
          if (nodes_[i]->port() == port) return i;
        }
      }
      break;
    }
    throw std::runtime_error("no cluster node serves slot " + std::to_string(slot));
  }
  /// Whether every running node says cluster_state:ok.
  [[nodiscard]] bool all_ok() const {
    for (const auto& node : nodes_) {
      if (!node->running()) continue;
      try {
        const RespValue info = node->query({"CLUSTER", "INFO"});
        if (info.text.find("cluster_state:ok") == std::string::npos) return false;
      } catch (const std::runtime_error&) {
        return false;
      }
    }
    return true;
  }

 private:
  TempDir dir_;  // declared first: destroyed after the nodes that write into it
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace statepool::testing
