#pragma once
// A TCP proxy in front of a real redis-server, for tests that need a Redis command to
// stay in flight for as long as they choose, without timing (header-only over
// statepool::testing; no GoogleTest, no hiredis):
//
//   RedisServer redis;
//   RedisProxy proxy(redis.port());       // clients connect to proxy.url()
//   proxy.hold("SET");                    // the next SET stops at the proxy
//   ... a client sends SET ...
//   proxy.wait_held(10s);                 // the SET is in flight, the server has not seen it
//   ... other connections still flow: GET answers ...
//   proxy.release();                      // the SET goes on, its reply comes back
//
// Every connection accepted on 127.0.0.1:port() is forwarded to 127.0.0.1:target_port, in
// both directions, by a thread of its own. While hold(word) is set, a connection whose
// client sends a command named `word` forwards the bytes before that command and keeps
// the rest (its client's later bytes too) until release(); the server's replies keep
// flowing, and other connections are not affected. A held client that closes its
// connection (a timeout) ends the hold of that connection.
//
// Errors (no free port, a socket call failing) throw std::runtime_error. The destructor
// closes every connection and joins every thread.
//
// Thread-safety: hold, release, wait_held and held may be called from any thread.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace statepool::testing {

class RedisProxy {
 public:
  /// Listens on a free loopback port at once; forwards to 127.0.0.1:target_port.
  explicit RedisProxy(int target_port) : target_port_(target_port) {
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) fail("pipe2");
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0) fail("socket");
    sockaddr_in addr = loopback(0);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("bind");
    if (::listen(listener_, 64) != 0) fail("listen");
    socklen_t length = sizeof addr;
    if (::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      fail("getsockname");
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~RedisProxy() {
    release();
    (void)!::write(stop_pipe_[1], "x", 1);  // wakes every poll(): they all watch the pipe
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : connections_) t.join();
    ::close(listener_);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }
  RedisProxy(const RedisProxy&) = delete;
  RedisProxy& operator=(const RedisProxy&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  /// "redis://127.0.0.1:PORT"
  [[nodiscard]] std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  /// From now on, a command named `word` ("SET", as the client spells it) stops here.
  void hold(const std::string& word) {
    const std::lock_guard lock(mutex_);
    pattern_ = "$" + std::to_string(word.size()) + "\r\n" + word + "\r\n";
  }
  /// Lets every held command go on, and holds no more.
  void release() {
    {
      const std::lock_guard lock(mutex_);
      pattern_.clear();
    }
    changed_.notify_all();
  }
  /// Waits until a connection holds a command back (true), or `timeout` passed (false).
  bool wait_held(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return held_ > 0; });
  }
  /// Connections that hold a command back now.
  [[nodiscard]] int held() const {
    const std::lock_guard lock(mutex_);
    return held_;
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    throw std::runtime_error(std::string("RedisProxy: ") + what + ": " + std::strerror(errno));
  }
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    return addr;
  }
  static bool send_all(int fd, const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  }

  void accept_loop() {
    while (true) {
      pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr = loopback(target_port_);
      if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        if (server >= 0) ::close(server);
        ::close(client);
        continue;
      }
      connections_.emplace_back([this, client, server] { pump(client, server); });
    }
  }

  // Forwards both ways until either side closes or the proxy stops.
  void pump(int client, int server) {
    std::string pending;  // client bytes held back
    bool holding = false;
    char chunk[65536];
    while (true) {
      if (holding) {
        std::unique_lock lock(mutex_);
        if (pattern_.empty()) {
          holding = false;
          --held_;
          lock.unlock();
          changed_.notify_all();
          if (!send_all(server, pending.data(), pending.size())) break;
          pending.clear();
        }
      }
      // While holding, the client is still read (to see it close) but nothing it sends
      // goes on; the poll wakes every 10 ms to look at release().
      pollfd fds[3] = {{client, POLLIN, 0}, {server, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      const int ready = ::poll(fds, 3, holding ? 10 : -1);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      if (fds[2].revents != 0) break;
      if (fds[1].revents != 0) {
        const ssize_t n = ::recv(server, chunk, sizeof chunk, 0);
        if (n <= 0 || !send_all(client, chunk, static_cast<std::size_t>(n))) break;
      }
      if (fds[0].revents != 0) {
        const ssize_t n = ::recv(client, chunk, sizeof chunk, 0);
        if (n <= 0) break;
        const std::string_view data(chunk, static_cast<std::size_t>(n));
        if (holding) {
          pending.append(data);
          continue;
        }
        std::size_t at = std::string_view::npos;
        {
          const std::lock_guard lock(mutex_);
          if (!pattern_.empty()) at = data.find(pattern_);
          if (at != std::string_view::npos) {
            holding = true;
            ++held_;
          }
        }
        if (holding) {
          changed_.notify_all();
          pending.assign(data.substr(at));
          if (!send_all(server, data.data(), at)) break;
        } else if (!send_all(server, data.data(), data.size())) {
          break;
        }
      }
    }
    if (holding) {
      {
        const std::lock_guard lock(mutex_);
        --held_;
      }
      changed_.notify_all();
    }
    ::close(client);
    ::close(server);
  }

  const int target_port_;
  int port_ = 0;
  int listener_ = -1;
  int stop_pipe_[2] = {-1, -1};
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string pattern_;  // the held command's RESP head; empty: nothing held
  int held_ = 0;
  std::thread acceptor_;
  std::list<std::thread> connections_;  // touched by the acceptor only, then joined
};

}  // namespace statepool::testing
