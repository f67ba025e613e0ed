// The fake systemd of the tests (statepool::testing::ServiceManager) against libsystemd's
// own client side: descriptors stored with sd_pid_notify_with_fds(3) FDSTORE=1, removed with
// FDSTOREREMOVE=1, refused past the store's size, barriers (sd_notify_barrier(3)), and the
// hand-back: a process started by spawn_with_fds() finds them as sd_listen_fds(3) expects
// (LISTEN_PID its own pid, names joined with ':', descriptors from 3 and no further). And a
// statepoold started with DaemonOptions::service_manager notifies it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/kcmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "statepool/support/unique_fd.hpp"
#include "statepool/testing/fds.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/service_manager.hpp"
#include "statepool/testing/temp_dir.hpp"

using statepool::support::UniqueFd;
using statepool::testing::DaemonOptions;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using statepool::testing::open_fd_count;
using statepool::testing::ServiceManager;
using statepool::testing::spawn_with_fds;
using statepool::testing::TempDir;
using namespace std::chrono_literals;

namespace {

/// Sets an environment variable for one scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

UniqueFd memfd_with(const std::string& text) {
  UniqueFd fd(::memfd_create("service-manager-test", MFD_CLOEXEC));
  if (!fd) throw std::runtime_error("memfd_create failed");
  // pwrite: the offset stays at 0, for a reader that shares the open file (cat <&3).
  if (::pwrite(fd.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("pwrite failed");
  return fd;
}

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

/// Whether every copy of the pipe's write end is closed: read() sees end of file (the pipe
/// is empty) instead of blocking.
bool writers_gone(const Pipe& p) {
  const int flags = ::fcntl(p.read.get(), F_GETFL);
  ::fcntl(p.read.get(), F_SETFL, flags | O_NONBLOCK);
  char c;
  return ::read(p.read.get(), &c, 1) == 0;
}

/// sd_pid_notify_with_fds() from this process, which the tests point at their manager.
int notify(const std::string& state, std::vector<int> fds = {}) {
  return sd_pid_notify_with_fds(0, 0, state.c_str(), fds.data(), static_cast<unsigned>(fds.size()));
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class ServiceManagerTest : public ::testing::Test {
 protected:
  TempDir dir_{"/tmp/sp-sm"};  // short: the socket's path must fit in sun_path
  ServiceManager manager_{dir_.path(), 8};
  ScopedEnv notify_socket_{"NOTIFY_SOCKET", manager_.notify_socket().c_str()};
};

TEST_F(ServiceManagerTest, StoresDescriptorsUnderTheirName) {
  const UniqueFd memfd = memfd_with("hello");
  const Pipe pipe = make_pipe();
  // > 0: sent (0 would mean no NOTIFY_SOCKET, which libsystemd does not count as an error).
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=a", {memfd.get(), pipe.write.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 2; }, 5s));
  EXPECT_EQ(manager_.stored_names(), (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(manager_.messages(), std::vector<std::string>{"FDSTORE=1\nFDNAME=a"});
  EXPECT_TRUE(manager_.errors().empty());

  // The stored descriptor is the same open file, not a copy: what one writes the other reads.
  const int stored = manager_.stored_fd("a");
  ASSERT_GE(stored, 0);
  EXPECT_NE(stored, memfd.get());
  ASSERT_EQ(::pwrite(stored, "HELLO", 5, 0), 5);
  char buf[5] = {};
  ASSERT_EQ(::pread(memfd.get(), buf, 5, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "HELLO");
  EXPECT_EQ(manager_.stored_fd("b"), -1);
}

TEST_F(ServiceManagerTest, NamesAsSystemdTakesThem) {
  const UniqueFd a = memfd_with("a");
  const UniqueFd b = memfd_with("b");
  const UniqueFd c = memfd_with("c");
  const UniqueFd d = memfd_with("d");
  ASSERT_GT(notify("FDSTORE=1", {a.get()}), 0);  // no FDNAME=: "stored"
  const std::string longest(255, 'x');
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=" + longest, {b.get()}), 0);
  // Not valid (':' is LISTEN_FDNAMES's separator; more than 255 characters): systemd warns
  // and stores them under the default name all the same, it does not refuse them.
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=x:y", {c.get()}), 0);
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=" + longest + "x", {d.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 4; }, 5s));
  EXPECT_EQ(manager_.stored_names(),
            (std::vector<std::string>{"stored", longest, "stored", "stored"}));
  EXPECT_EQ(manager_.errors().size(), 2U);
}

TEST_F(ServiceManagerTest, RemovesAndClosesEveryDescriptorOfAName) {
  Pipe first = make_pipe();
  Pipe second = make_pipe();
  const UniqueFd kept = memfd_with("kept");
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=gone", {first.write.get(), second.write.get()}), 0);
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=kept", {kept.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 3; }, 5s));

  ASSERT_GT(notify("FDSTOREREMOVE=1\nFDNAME=gone"), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 1; }, 5s));
  EXPECT_EQ(manager_.stored_names(), std::vector<std::string>{"kept"});
  // Closed, not only forgotten: with ours gone, no writer is left on either pipe.
  first.write.reset();
  second.write.reset();
  EXPECT_TRUE(writers_gone(first));
  EXPECT_TRUE(writers_gone(second));

  ASSERT_GT(notify("FDSTOREREMOVE=1"), 0);  // no name: ignored, with a warning
  ASSERT_TRUE(eventually([&] { return manager_.errors().size() == 1; }, 5s));
  EXPECT_EQ(manager_.stored_count(), 1U);

  manager_.clear_store();
  EXPECT_EQ(manager_.stored_count(), 0U);
}

TEST_F(ServiceManagerTest, RefusesDescriptorsBeyondTheStoreMax) {
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    owned.push_back(memfd_with(std::to_string(i)));
    fds.push_back(owned.back().get());
  }
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=many", fds), 0);
  ASSERT_TRUE(eventually([&] { return !manager_.errors().empty(); }, 5s));
  EXPECT_EQ(manager_.stored_count(), 8U);  // the fixture's fd_store_max
  EXPECT_NE(manager_.errors().front().find("full"), std::string::npos);
}

TEST_F(ServiceManagerTest, StoresAnOpenFileOnce) {
  // systemd compares with kcmp(2); where the kernel has none the manager stores both.
  const pid_t self = ::getpid();
  const UniqueFd a = memfd_with("a");
  const UniqueFd b = memfd_with("b");
  if (::syscall(SYS_kcmp, self, self, KCMP_FILE, a.get(), a.get()) != 0)
    GTEST_SKIP() << "no kcmp(2) here";
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=one", {a.get()}), 0);
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=two", {a.get(), b.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.messages().size() == 2; }, 5s));
  EXPECT_EQ(manager_.stored_names(), (std::vector<std::string>{"one", "two"}));
  EXPECT_TRUE(manager_.errors().empty());
}

TEST_F(ServiceManagerTest, DropsAStoredDescriptorThatHangsUpUnlessFdpollIsOff) {
  Pipe polled = make_pipe();
  Pipe unpolled = make_pipe();
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=polled", {polled.read.get()}), 0);
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=unpolled\nFDPOLL=0", {unpolled.read.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 2; }, 5s));
  polled.write.reset();  // POLLHUP on the stored read end
  unpolled.write.reset();
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 1; }, 5s));
  EXPECT_EQ(manager_.stored_names(), std::vector<std::string>{"unpolled"});
}

TEST_F(ServiceManagerTest, AnswersBarriers) {
  EXPECT_EQ(sd_notify_barrier(0, 5'000'000), 1);  // 5 s; -ETIMEDOUT unanswered
  EXPECT_TRUE(has(manager_.messages(), "BARRIER=1"));
  EXPECT_TRUE(manager_.errors().empty());
  EXPECT_EQ(manager_.stored_count(), 0U);
  {
    // Without a service manager sd_notify_barrier() succeeds at once (0): a test that
    // asserts >= 0 proves nothing.
    const ScopedEnv none("NOTIFY_SOCKET", nullptr);
    EXPECT_EQ(sd_notify_barrier(0, 5'000'000), 0);
  }
}

TEST_F(ServiceManagerTest, ClosesDescriptorsSentWithOtherMessages) {
  Pipe pipe = make_pipe();
  ASSERT_GT(notify("READY=1\nSTATUS=up", {pipe.write.get()}), 0);
  ASSERT_EQ(sd_notify_barrier(0, 5'000'000), 1);  // after the message above
  pipe.write.reset();
  EXPECT_TRUE(writers_gone(pipe));
  EXPECT_EQ(manager_.messages(), (std::vector<std::string>{"READY=1\nSTATUS=up", "BARRIER=1"}));
  EXPECT_EQ(manager_.errors().size(), 1U);
  EXPECT_EQ(manager_.stored_count(), 0U);
}

/// Runs `script` with sh through spawn_with_fds(); returns its stdout.
std::string run_under(const ServiceManager& manager, const TempDir& dir, const std::string& script,
                      pid_t* pid_out = nullptr) {
  const pid_t pid =
      spawn_with_fds({"/bin/sh", "-c", script}, manager, dir.file("out.txt"), dir.file("err.txt"));
  if (pid_out != nullptr) *pid_out = pid;
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << statepool::testing::read_bytes(dir.file("err.txt"));
  return statepool::testing::read_bytes(dir.file("out.txt"));
}

TEST_F(ServiceManagerTest, HandsTheStoreBackAsSystemdDoes) {
  const UniqueFd first = memfd_with("one");
  const UniqueFd second = memfd_with("two");
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=first", {first.get()}), 0);
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=second", {second.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 2; }, 5s));
  // systemd prepends to its store: the newest first.
  ASSERT_EQ(manager_.handed_back_names(), (std::vector<std::string>{"second", "first"}));

  // Inherited values of the protocol's variables must not reach the child.
  const ScopedEnv stale_fds("LISTEN_FDS", "9");
  const ScopedEnv stale_pid("LISTEN_PID", "1");
  const std::size_t fds_before = open_fd_count();
  pid_t pid = -1;
  const std::string out = run_under(manager_, dir_,
                                    "echo \"$LISTEN_FDS $LISTEN_FDNAMES $LISTEN_PID $$\"; "
                                    "cat <&3; echo; cat <&4; echo; "
                                    "if [ -e /proc/$$/fd/5 ]; then echo 5-open; "
                                    "else echo 5-closed; fi; echo \"$NOTIFY_SOCKET\"",
                                    &pid);
  const std::string p = std::to_string(pid);
  EXPECT_EQ(out, "2 second:first " + p + " " + p + "\ntwo\none\n5-closed\n" +
                     manager_.notify_socket() + "\n");
  // The store keeps them (a restart hands them back again); the temporaries are closed.
  EXPECT_EQ(manager_.stored_count(), 2U);
  EXPECT_EQ(open_fd_count(), fds_before);
}

TEST_F(ServiceManagerTest, TheHandBackSurvivesAWrapperThatExecs) {
  // As DaemonOptions::descriptor_limit starts the daemon: prlimit execs it, same pid.
  if (::access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/prlimit";
  const UniqueFd memfd = memfd_with("x");
  ASSERT_GT(notify("FDSTORE=1\nFDNAME=m", {memfd.get()}), 0);
  ASSERT_TRUE(eventually([&] { return manager_.stored_count() == 1; }, 5s));
  const pid_t pid =
      spawn_with_fds({"/usr/bin/prlimit", "--nofile=64:64", "--", "/bin/sh", "-c",
                      "echo \"$LISTEN_FDS $LISTEN_FDNAMES $LISTEN_PID $$ $(ulimit -n)\"; cat <&3"},
                     manager_, dir_.file("out.txt"), dir_.file("err.txt"));
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << statepool::testing::read_bytes(dir_.file("err.txt"));
  const std::string p = std::to_string(pid);
  EXPECT_EQ(statepool::testing::read_bytes(dir_.file("out.txt")), "1 m " + p + " " + p + " 64\nx");
}

TEST_F(ServiceManagerTest, PassesNoListenVariablesWithAnEmptyStore) {
  const ScopedEnv stale("LISTEN_FDS", "1");
  const std::string out = run_under(
      manager_, dir_, "echo \"${LISTEN_FDS-unset} ${LISTEN_FDNAMES-unset} ${LISTEN_PID-unset}\"");
  EXPECT_EQ(out, "unset unset unset\n");
}

TEST(ServiceManager, ClosesEverythingAtDestruction) {
  const std::size_t before = open_fd_count();
  {
    const TempDir dir("/tmp/sp-sm");
    const ServiceManager manager(dir.path());
    const ScopedEnv env("NOTIFY_SOCKET", manager.notify_socket().c_str());
    const UniqueFd memfd = memfd_with("x");
    Pipe pipe = make_pipe();
    ASSERT_GT(notify("FDSTORE=1", {memfd.get(), pipe.write.get()}), 0);
    ASSERT_TRUE(eventually([&] { return manager.stored_count() == 2; }, 5s));
  }
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(ServiceManagerTest, DaemonNotifiesItsServiceManager) {
  // Not inherited from this process: the daemon must get the socket from the options.
  const ScopedEnv none("NOTIFY_SOCKET", nullptr);
  DaemonOptions options;
  options.service_manager = &manager_;
  DaemonProcess daemon({}, options);
  // READY=1 comes once its socket listens; with the fixture's manager, not this process's.
  ASSERT_TRUE(eventually(
      [&] {
        for (const auto& m : manager_.messages()) {
          if (m.rfind("READY=1\n", 0) == 0) return true;
        }
        return false;
      },
      10s))
      << daemon.log();
  EXPECT_TRUE(manager_.errors().empty());
  EXPECT_EQ(daemon.stop(SIGKILL, 5s), 128 + SIGKILL);  // kill -9
}

}  // namespace
