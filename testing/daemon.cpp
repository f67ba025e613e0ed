#include "statepool/testing/daemon.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "statepool/testing/service_manager.hpp"

extern char** environ;

namespace statepool::testing {
namespace {

bool can_connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free TCP port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string http_raw(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  const timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return {};
  }
  for (std::size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the peer closed (an early error reply): read what it sent
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return response;
}

std::string http_get(int port, const std::string& path) {
  const std::string response =
      http_raw(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

std::string HttpResponse::header(const std::string& name) const {
  const auto lower = [](std::string text) {
    for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  const std::string wanted = lower(name) + ":";
  std::istringstream lines(headers);
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lower(line.substr(0, wanted.size())) != wanted) continue;
    const auto start = line.find_first_not_of(' ', wanted.size());
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

HttpResponse http_request(int port, const std::string& method, const std::string& target,
                          const std::string& body, const std::string& version) {
  std::string request =
      method + " " + target + " HTTP/" + version + "\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST")
    request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  request += "\r\n" + body;
  const std::string raw = http_raw(port, request);
  HttpResponse response;
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || raw.size() < 12) return response;
  response.status = std::atoi(raw.substr(9, 3).c_str());
  response.headers = raw.substr(0, end);
  response.body = raw.substr(end + 4);
  return response;
}

namespace {

/// statepoold: STATEPOOL_DAEMON in the environment (tests built in one place and run in
/// another, scripts/gpu-check --from), else the one built with the tests.
std::string daemon_path() {
  const char* moved = std::getenv("STATEPOOL_DAEMON");
  return moved != nullptr && *moved != '\0' ? moved : STATEPOOL_DAEMON_PATH;
}

/// Starts argv with this process's environment and descriptors (those without FD_CLOEXEC),
/// stdout to /dev/null, stderr to `log_path`.
pid_t spawn_inheriting(std::vector<std::string> argv, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw std::runtime_error(std::string("posix_spawn statepoold: ") + std::strerror(rc));
  return pid;
}

}  // namespace

Exit run_daemon(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> argv = {daemon_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, dir);
}

Exit run_program(const std::vector<std::string>& program_argv, const std::string& dir) {
  std::vector<std::string> argv = program_argv;
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string err = dir + "/stderr.txt";
  const std::string out = dir + "/stdout.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  Exit result;
  if (rc != 0) return result;
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.stdout_text = read_bytes(out);
  result.stderr_text = read_bytes(err);
  return result;
}

Daemon::Daemon(std::vector<std::string> args, DaemonOptions options) {
  const Daemon* predecessor = options.take_over_from;
  socket_ = predecessor != nullptr ? predecessor->socket_path() : dir_.file("statepool.sock");
  std::vector<std::string> argv = {daemon_path(), "--socket", socket_};
  if (predecessor != nullptr) {
    // --take-over, unless `args` say which (--take-over=if-running).
    if (std::none_of(args.begin(), args.end(),
                     [](const std::string& a) { return a.rfind("--take-over", 0) == 0; })) {
      argv.emplace_back("--take-over");
    }
    if (!options.own_ports) {
      metrics_port_ = predecessor->metrics_port();
      api_port_ = predecessor->api_port();
    }
  }
  if (metrics_port_ != 0) {
    argv.insert(argv.end(), {"--metrics-address", "127.0.0.1:" + std::to_string(metrics_port_)});
  } else if (options.metrics) {
    metrics_port_ = free_tcp_port();
    argv.insert(argv.end(), {"--metrics-address", "127.0.0.1:" + std::to_string(metrics_port_)});
  } else {
    argv.insert(argv.end(), {"--metrics-address", "off"});
  }
  if (api_port_ != 0) {
    argv.insert(argv.end(), {"--api-address", "127.0.0.1:" + std::to_string(api_port_)});
  } else if (options.api) {
    api_port_ = free_tcp_port();
    argv.insert(argv.end(), {"--api-address", "127.0.0.1:" + std::to_string(api_port_)});
  } else {
    argv.insert(argv.end(), {"--api-address", "off"});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  if (options.descriptor_limit != 0) {
    // prlimit sets the limit and execs the daemon: same pid, so stop() and pid() hold.
    const std::string limit = std::to_string(options.descriptor_limit);
    argv.insert(argv.begin(), {"/usr/bin/prlimit", "--nofile=" + limit + ":" + limit, "--"});
  }

  const std::string log_path = dir_.file("daemon.log");
  if (options.service_manager != nullptr) {
    pid_ = spawn_with_fds(argv, *options.service_manager, "/dev/null", log_path);
  } else {
    pid_ = spawn_inheriting(argv, log_path);
  }

  const bool ready = eventually(
      [&] {
        if (!running()) return true;
        if (predecessor != nullptr) return log().find("ready on") != std::string::npos;
        return can_connect(socket_);
      },
      std::chrono::seconds(predecessor != nullptr ? 60 : 20));
  if (!ready || !running()) {
    stop(SIGKILL, std::chrono::seconds(5));
    throw DaemonError(log());  // dir_ (and the log file) go with the half-built object
  }
}

Daemon::~Daemon() {
  if (running()) stop(SIGKILL, std::chrono::seconds(5));
}

bool Daemon::running() const {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  auto* self = const_cast<Daemon*>(this);
  if (r == pid_) {
    self->exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    self->pid_ = -1;
  }
  return false;
}

std::string Daemon::log() const {
  return read_bytes(dir_.file("daemon.log"));
}

int Daemon::stop(int signal, std::chrono::milliseconds timeout) {
  if (!running()) return exit_code_;
  ::kill(pid_, signal);
  if (eventually([&] { return !running(); }, timeout)) return exit_code_;
  ::kill(pid_, SIGKILL);
  eventually([&] { return !running(); }, std::chrono::seconds(5));
  return -1;
}

}  // namespace statepool::testing
