#include "statepool/testing/service_manager.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace statepool::testing {
namespace {

using support::UniqueFd;

// systemd's NOTIFY_BUFFER_MAX (PIPE_BUF): longer datagrams are ignored.
constexpr std::size_t kMaxMessage = 4096;
// The kernel passes at most SCM_MAX_FD (253) descriptors with one message; room for all of
// them, so that none is cut off (MSG_CTRUNC) and lost unclosed in the sender's view.
constexpr std::size_t kMaxFdsPerMessage = 253;
// systemd's FDNAME_MAX.
constexpr std::size_t kMaxNameLength = 255;

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

/// systemd's fdname_is_valid(): printable ASCII but ':' (the separator of LISTEN_FDNAMES),
/// at most 255 characters; the empty name is valid.
bool valid_fdname(const std::string& name) {
  if (name.size() > kMaxNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= ' ' && u < 127 && c != ':';
  });
}

/// Lines of a datagram as systemd's strv_split_newlines() makes them: split at '\n' and
/// '\r', empty lines dropped.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  for (const char c : text) {
    if (c == '\n' || c == '\r') {
      if (!line.empty()) lines.push_back(std::move(line));
      line.clear();
    } else {
      line.push_back(c);
    }
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

/// The value of the first line starting with `key` (strv_find_startswith()), or nullptr.
const std::string* find_value(const std::vector<std::string>& lines, const std::string& key,
                              std::string& value) {
  for (const auto& line : lines) {
    if (line.rfind(key, 0) == 0) {
      value = line.substr(key.size());
      return &value;
    }
  }
  return nullptr;
}

/// Whether two descriptors are one open file (systemd's same_fd(), through kcmp(2)); false
/// when the kernel cannot tell (no CONFIG_KCMP), which stores a duplicate rather than lose
/// a descriptor.
bool same_open_file(int a, int b) {
  const pid_t self = ::getpid();
  return ::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b) == 0;
}

}  // namespace

ServiceManager::ServiceManager(const std::string& dir, std::size_t fd_store_max)
    : path_(dir + "/notify"), fd_store_max_(fd_store_max) {
  sockaddr_un addr{};
  if (path_.size() >= sizeof addr.sun_path)
    throw std::runtime_error("notify socket path too long for sun_path: " + path_);
  socket_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket_) throw std::runtime_error(errno_text("socket(AF_UNIX, SOCK_DGRAM)"));
  // systemd ignores a message without the sender's credentials; the kernel attaches them
  // (SCM_CREDENTIALS) only to a receiver that asked.
  const int on = 1;
  if (::setsockopt(socket_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0)
    throw std::runtime_error(errno_text("setsockopt SO_PASSCRED"));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ::unlink(path_.c_str());  // a file left by a manager that died with its test
  if (::bind(socket_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error(errno_text(("bind " + path_).c_str()));
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) throw std::runtime_error(errno_text("eventfd"));
  thread_ = std::thread([this] { run(); });
}

ServiceManager::~ServiceManager() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake();
  thread_.join();
  ::unlink(path_.c_str());
  // store_ (and with it every stored descriptor), socket_ and wake_ close as members.
}

void ServiceManager::wake() const {
  const std::uint64_t one = 1;
  // Cannot fail but with the counter at its maximum, which wakes the thread just as well.
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void ServiceManager::run() {
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> ids;  // of the stored descriptors polled, after the first two
  for (;;) {
    fds.assign({{socket_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}});
    ids.clear();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      // systemd watches each stored descriptor for nothing (events 0), which reports only
      // a hang-up or an error; regular files and memfds report neither.
      for (const auto& s : store_) {
        if (!s.poll) continue;
        fds.push_back({s.fd.get(), 0, 0});
        ids.push_back(s.id);
      }
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      std::lock_guard lock(mutex_);
      errors_.push_back(errno_text("poll"));
      return;
    }
    if (fds[1].revents != 0) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_.get(), &count, sizeof count);
    }
    if (fds[0].revents != 0) receive();
    std::lock_guard lock(mutex_);
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLHUP | POLLERR)) == 0) continue;
      // By id: the descriptor polled may have been removed meanwhile (clear_store()), and its
      // number given to another.
      const auto id = ids[i - 2];
      std::erase_if(store_, [&](const Stored& s) { return s.id == id; });
    }
  }
}

void ServiceManager::receive() {
  for (;;) {
    char buf[kMaxMessage + 1];
    iovec iov{buf, kMaxMessage};
    alignas(cmsghdr) char
        control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    // MSG_TRUNC: the datagram's real length, to refuse one too long as systemd does.
    const ssize_t n = ::recvmsg(socket_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        std::lock_guard lock(mutex_);
        errors_.push_back(errno_text("recvmsg"));
      }
      return;
    }
    // Own every descriptor first, so that each return below closes them.
    std::vector<UniqueFd> fds;
    bool credentials = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          fds.emplace_back(fd);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(ucred))) {
        credentials = true;
      }
    }
    const std::size_t length = std::min(static_cast<std::size_t>(n), kMaxMessage);
    std::string text(buf, length);
    if (!text.empty() && text.back() == '\0') text.pop_back();  // one trailing NUL is allowed
    std::string refused;
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      refused = "control data truncated (too many descriptors?)";
    } else if (!credentials) {
      refused = "no sender credentials";
    } else if ((msg.msg_flags & MSG_TRUNC) != 0 || static_cast<std::size_t>(n) > kMaxMessage) {
      refused = "longer than " + std::to_string(kMaxMessage) + " bytes";
    } else if (text.find('\0') != std::string::npos) {
      refused = "a NUL byte inside";
    }
    if (!refused.empty()) {
      std::lock_guard lock(mutex_);
      messages_.push_back(text);
      errors_.push_back("message ignored, " + refused + ": " + text);
      continue;
    }
    handle(text, std::move(fds));
  }
}

void ServiceManager::handle(const std::string& text, std::vector<UniqueFd> fds) {
  const std::vector<std::string> lines = split_lines(text);
  std::lock_guard lock(mutex_);
  messages_.push_back(text);
  // manager_process_barrier_fd(): nothing else may come with a barrier; closing its one
  // descriptor (fds going out of scope) is the acknowledgement sd_notify_barrier() waits for.
  if (contains(lines, "BARRIER=1")) {
    if (lines.size() != 1) {
      errors_.push_back("BARRIER=1 with other assignments, message ignored: " + text);
    } else if (fds.size() != 1) {
      errors_.push_back("BARRIER=1 with " + std::to_string(fds.size()) +
                        " descriptors (expected 1), closed");
    }
    return;
  }
  std::string value;
  const std::string* name = find_value(lines, "FDNAME=", value);
  if (contains(lines, "FDSTOREREMOVE=1")) {
    if (name == nullptr || !valid_fdname(*name)) {
      errors_.push_back("FDSTOREREMOVE=1 without a valid FDNAME=, ignored: " + text);
    } else {
      const auto removed = std::erase_if(store_, [&](const Stored& s) { return s.name == *name; });
      if (removed > 0) wake();
    }
  } else if (contains(lines, "FDSTORE=1")) {
    std::string stored_as = "stored";
    if (name != nullptr && valid_fdname(*name)) {
      stored_as = *name;
    } else if (name != nullptr) {
      errors_.push_back("FDNAME= not valid, stored as \"stored\": " + *name);
    }
    store(stored_as, fds, !contains(lines, "FDPOLL=0"));
  }
  if (!fds.empty()) {
    errors_.push_back(std::to_string(fds.size()) +
                      " descriptor(s) that the message did not store, closed: " + text);
  }
}

void ServiceManager::store(const std::string& name, std::vector<UniqueFd>& fds, bool poll) {
  // Called under mutex_. Takes what it stores (or closes as a duplicate) out of fds; what is
  // left there the caller closes.
  std::size_t taken = 0;
  for (; taken < fds.size(); ++taken) {
    if (store_.size() >= fd_store_max_) {
      errors_.push_back("fd store full (" + std::to_string(fd_store_max_) + "), closing " +
                        std::to_string(fds.size() - taken) + " descriptor(s) of \"" + name + "\"");
      for (std::size_t i = taken; i < fds.size(); ++i) fds[i].reset();
      break;
    }
    UniqueFd& fd = fds[taken];
    const bool duplicate = std::any_of(store_.begin(), store_.end(), [&](const Stored& s) {
      return same_open_file(s.fd.get(), fd.get());
    });
    if (duplicate) {
      fd.reset();  // systemd closes it silently: the store already has that open file
      continue;
    }
    store_.push_back(Stored{name, std::move(fd), next_id_++, poll});
  }
  std::erase_if(fds, [](const UniqueFd& fd) { return !fd.valid(); });
  wake();  // the poll set changed
}

std::vector<std::string> ServiceManager::messages() const {
  std::lock_guard lock(mutex_);
  return messages_;
}

std::vector<std::string> ServiceManager::errors() const {
  std::lock_guard lock(mutex_);
  return errors_;
}

std::vector<std::string> ServiceManager::stored_names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& s : store_) names.push_back(s.name);
  return names;
}

std::vector<std::string> ServiceManager::handed_back_names() const {
  std::vector<std::string> names = stored_names();
  std::reverse(names.begin(), names.end());
  return names;
}

int ServiceManager::stored_fd(const std::string& name) const {
  std::lock_guard lock(mutex_);
  for (const auto& s : store_) {
    if (s.name == name) return s.fd.get();
  }
  return -1;
}

std::size_t ServiceManager::stored_count() const {
  std::lock_guard lock(mutex_);
  return store_.size();
}

void ServiceManager::clear_store() {
  std::lock_guard lock(mutex_);
  store_.clear();
  wake();
}

ServiceManager::Duplicates ServiceManager::duplicate_store() const {
  std::lock_guard lock(mutex_);
  Duplicates out;
  const int lowest = 3 + static_cast<int>(store_.size());
  for (auto s = store_.rbegin(); s != store_.rend(); ++s) {
    UniqueFd fd(::fcntl(s->fd.get(), F_DUPFD_CLOEXEC, lowest));
    if (!fd) throw std::runtime_error(errno_text(("duplicate stored fd " + s->name).c_str()));
    out.names.push_back(s->name);
    out.fds.push_back(std::move(fd));
  }
  return out;
}

pid_t spawn_with_fds(const std::vector<std::string>& argv, const ServiceManager& manager,
                     const std::string& stdout_path, const std::string& stderr_path) {
  if (argv.empty()) throw std::runtime_error("spawn_with_fds: no program");
  const ServiceManager::Duplicates passed = manager.duplicate_store();
  const std::size_t n = passed.fds.size();

  // The environment: this process's, less what belongs to the service manager's protocol.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const bool ours = entry.rfind("NOTIFY_SOCKET=", 0) == 0 || entry.rfind("LISTEN_PID=", 0) == 0 ||
                      entry.rfind("LISTEN_FDS=", 0) == 0 || entry.rfind("LISTEN_FDNAMES=", 0) == 0;
    if (!ours) env.push_back(entry);
  }
  env.push_back("NOTIFY_SOCKET=" + manager.notify_socket());
  if (n > 0) {
    // Joined by position, not by emptiness: the names "" and "a" give ":a", as systemd
    // passes the (valid) empty name.
    std::string names;
    for (std::size_t i = 0; i < n; ++i) names += (i == 0 ? "" : ":") + passed.names[i];
    env.push_back("LISTEN_FDS=" + std::to_string(n));
    env.push_back("LISTEN_FDNAMES=" + names);
  }

  // LISTEN_PID must be the pid of the process that reads it; posix_spawn gives no way to
  // set the environment after the fork, so a shell exports its own pid and execs the
  // program in its place (same pid). Without descriptors systemd sets no LISTEN_PID either.
  std::vector<std::string> args;
  if (n > 0) args = {"/bin/sh", "-c", "export LISTEN_PID=$$; exec \"$0\" \"$@\""};
  args.insert(args.end(), argv.begin(), argv.end());

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  // The duplicates are all >= 3 + n, so no dup2 onto 3 + i overwrites one not yet passed;
  // and source != target always, which matters: glibc before 2.29 does not clear
  // FD_CLOEXEC for a dup2 of a descriptor onto itself. dup2 clears it on the target.
  for (std::size_t i = 0; i < n; ++i) {
    posix_spawn_file_actions_adddup2(&actions, passed.fds[i].get(), 3 + static_cast<int>(i));
  }
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  // passed's duplicates (FD_CLOEXEC, so not in the child) close here.
  if (rc != 0)
    throw std::runtime_error("posix_spawn " + args[0] + ": " + std::string(std::strerror(rc)));
  return pid;
}

}  // namespace statepool::testing
