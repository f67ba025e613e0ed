// support::AtomicFileWriter and write_file_atomic: readers see the old file or the whole
// new one; a failure leaves the old file, no temporary and no open descriptor behind.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/support/atomic_file.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::support {
namespace {

namespace fs = std::filesystem;

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span<const char>(text));
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::size_t open_descriptors() {
  return static_cast<std::size_t>(
      std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
}

// The message of the std::runtime_error that `write` throws ("" if none).
template <typename Write>
std::string failure(Write write) {
  try {
    write();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_.emplace();
    dir_ = tmp_->path();
    fds_ = open_descriptors();
  }
  void TearDown() override {
    EXPECT_EQ(open_descriptors(), fds_) << "a descriptor leaked";
    fs::permissions(dir_, fs::perms::owner_all);
    tmp_.reset();
  }
  [[nodiscard]] std::string file(const std::string& name) const { return dir_ + "/" + name; }
  // Names in the directory: what a failed or finished write leaves there.
  [[nodiscard]] std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      names.insert(entry.path().filename().string());
    return names;
  }

  std::optional<statepool::testing::TempDir> tmp_;
  std::string dir_;
  std::size_t fds_ = 0;
};

TEST_F(AtomicFile, WritesAndReplaces) {
  const std::string path = file("plan.spqp");
  write_file_atomic(path, bytes_of("first version"));
  EXPECT_EQ(contents(path), "first version");
  write_file_atomic(path, bytes_of("second"));
  EXPECT_EQ(contents(path), "second");
  write_file_atomic(path, {});
  EXPECT_EQ(contents(path), "");
  EXPECT_EQ(entries(), std::set<std::string>{"plan.spqp"});
}

TEST_F(AtomicFile, RelativePathWritesInTheWorkingDirectory) {
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  write_file_atomic("relative.txt", bytes_of("here"));
  fs::current_path(before);
  EXPECT_EQ(contents(file("relative.txt")), "here");
  EXPECT_EQ(entries(), std::set<std::string>{"relative.txt"});
}

TEST_F(AtomicFile, ModeAsForOpenUnderTheUmask) {
  const mode_t mask = ::umask(022);
  write_file_atomic(file("default"), bytes_of("x"));
  write_file_atomic(file("private"), bytes_of("x"), 0600);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(file("default").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat(file("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(AtomicFile, StreamsAndPublishesOnlyOnCommit) {
  const std::string path = file("trace.npy");
  write_file_atomic(path, bytes_of("old"));
  {
    AtomicFileWriter writer(path);
    EXPECT_TRUE(writer.open());
    EXPECT_EQ(writer.path(), path);
    const std::string temporary = fs::path(writer.temporary_path()).filename().string();
    EXPECT_EQ(temporary.rfind("trace.npy.tmp." + std::to_string(::getpid()) + ".", 0), 0u)
        << temporary;
    EXPECT_EQ(fs::path(writer.temporary_path()).parent_path(), fs::path(dir_));
    writer.write(bytes_of("new "));
    writer.write(bytes_of("contents"));
    EXPECT_EQ(contents(path), "old") << "nothing is published before commit()";
    EXPECT_EQ(contents(writer.temporary_path()), "new contents");
    writer.commit();
    EXPECT_FALSE(writer.open());
    EXPECT_NE(failure([&] { writer.write(bytes_of("more")); }).find("after commit"),
              std::string::npos);
    EXPECT_NE(failure([&] { writer.commit(); }).find("after commit"), std::string::npos);
  }
  EXPECT_EQ(contents(path), "new contents");
  EXPECT_EQ(entries(), std::set<std::string>{"trace.npy"});
}

TEST_F(AtomicFile, AbandonedWriterLeavesTheOldFile) {
  const std::string path = file("report.txt");
  write_file_atomic(path, bytes_of("old"));
  {
    AtomicFileWriter writer(path);
    writer.write(bytes_of("half of the new"));
  }
  EXPECT_EQ(contents(path), "old");
  AtomicFileWriter writer(path);
  writer.write(bytes_of("discarded"));
  writer.discard();
  EXPECT_FALSE(writer.open());
  writer.discard();  // twice is harmless
  EXPECT_EQ(contents(path), "old");
  EXPECT_EQ(entries(), std::set<std::string>{"report.txt"});
}

TEST_F(AtomicFile, WritersOfOnePathUseDistinctTemporaries) {
  const std::string path = file("shared");
  AtomicFileWriter a(path);
  AtomicFileWriter b(path);
  EXPECT_NE(a.temporary_path(), b.temporary_path());
  a.write(bytes_of("a"));
  b.write(bytes_of("b"));
  a.commit();
  b.commit();  // the last commit wins
  EXPECT_EQ(contents(path), "b");
  EXPECT_EQ(entries(), std::set<std::string>{"shared"});
}

TEST_F(AtomicFile, TemporaryDescriptorIsCloseOnExec) {
  AtomicFileWriter writer(file("x"));
  int found = -1;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path(), ec) == fs::path(writer.temporary_path()))
      found = std::stoi(entry.path().filename().string());
  }
  ASSERT_GE(found, 0) << "no descriptor open on " << writer.temporary_path();
  EXPECT_EQ(::fcntl(found, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST_F(AtomicFile, MissingDirectoryNamesThePath) {
  const std::string path = file("no/such/dir/plan.spqp");
  const std::string message = failure([&] { write_file_atomic(path, bytes_of("x")); });
  EXPECT_EQ(message.rfind(path + ": cannot create " + path + ".tmp.", 0), 0u) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  EXPECT_TRUE(entries().empty());
}

TEST_F(AtomicFile, PathThatIsADirectoryStaysOne) {
  // The rename is what fails here: after the whole file was written and synced.
  const std::string path = file("taken");
  fs::create_directory(path);
  write_file_atomic(path + "/inside", bytes_of("kept"));
  const std::string message = failure([&] { write_file_atomic(path, bytes_of("x")); });
  EXPECT_EQ(message.rfind(path + ": cannot rename " + path + ".tmp.", 0), 0u) << message;
  EXPECT_NE(message.find("Is a directory"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(contents(path + "/inside"), "kept");
  EXPECT_EQ(entries(), std::set<std::string>{"taken"}) << "the temporary was removed";
}

TEST_F(AtomicFile, UnwritableDirectoryLeavesTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into any directory";
  const std::string path = file("plan.spqp");
  write_file_atomic(path, bytes_of("old"));
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string message = failure([&] { write_file_atomic(path, bytes_of("new")); });
  fs::permissions(dir_, fs::perms::owner_all);
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  EXPECT_EQ(contents(path), "old");
  EXPECT_EQ(entries(), std::set<std::string>{"plan.spqp"});
}

// Lowers RLIMIT_FSIZE (with SIGXFSZ ignored, so write(2) fails with EFBIG instead of the
// signal killing the process) for the scope: a write that fails half way, even as root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lowered);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

TEST_F(AtomicFile, FailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string path = file("big.npy");
  write_file_atomic(path, bytes_of("old"));
  const std::string big(1 << 20, 'x');
  std::string message;
  {
    const FileSizeLimit limit(64 * 1024);
    message = failure([&] { write_file_atomic(path, bytes_of(big)); });
  }
  EXPECT_EQ(message.rfind(path + ": cannot write " + path + ".tmp.", 0), 0u) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_EQ(contents(path), "old");
  EXPECT_EQ(entries(), std::set<std::string>{"big.npy"});
  // A streaming writer is done after a failure.
  AtomicFileWriter writer(path);
  {
    const FileSizeLimit limit(64 * 1024);
    EXPECT_NE(failure([&] { writer.write(bytes_of(big)); }), "");
  }
  EXPECT_FALSE(writer.open());
  EXPECT_NE(failure([&] { writer.write(bytes_of("x")); }).find("after commit or failure"),
            std::string::npos);
  EXPECT_EQ(contents(path), "old");
  EXPECT_EQ(entries(), std::set<std::string>{"big.npy"});
}

}  // namespace
}  // namespace statepool::support
