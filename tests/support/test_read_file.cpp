// support::read_file: the whole file, or an error that names the path and the problem.

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "statepool/support/atomic_file.hpp"
#include "statepool/support/read_file.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::support {
namespace {

namespace fs = std::filesystem;

class ReadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_.emplace("/tmp/statepool-read");
    dir_ = tmp_->path();
  }
  void TearDown() override { tmp_.reset(); }
  std::string error_of(const std::string& path, std::size_t max_bytes = 1 << 20) {
    try {
      (void)read_file(path, max_bytes);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "no error";
  }
  std::optional<statepool::testing::TempDir> tmp_;
  std::string dir_;
};

TEST_F(ReadFile, ReturnsTheWholeFileBinaryIncluded) {
  std::string text = "line one\n";
  text.push_back('\0');
  text += std::string(100000, 'x');
  write_file_atomic(dir_ + "/f", std::as_bytes(std::span<const char>(text)));
  EXPECT_EQ(read_file(dir_ + "/f", text.size()), text);
  write_file_atomic(dir_ + "/empty", {});
  EXPECT_EQ(read_file(dir_ + "/empty", 0), "");
}

TEST_F(ReadFile, EachProblemIsNamedWithThePath) {
  EXPECT_EQ(error_of(dir_ + "/missing"), dir_ + "/missing: cannot open: No such file or directory");
  EXPECT_EQ(error_of(dir_), dir_ + ": is a directory");
  const std::string big(2048, 'b');
  write_file_atomic(dir_ + "/big", std::as_bytes(std::span<const char>(big)));
  EXPECT_EQ(error_of(dir_ + "/big", 1024),
            dir_ + "/big: file of 2048 bytes is larger than the limit of 1024");
  // A socket is neither a directory nor a regular file.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = dir_ + "/sock";
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(error_of(sock), sock + ": cannot open: No such device or address");
  ::close(fd);
}

}  // namespace
}  // namespace statepool::support
