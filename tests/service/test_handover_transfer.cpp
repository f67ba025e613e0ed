// The hand-over conversation (service/handover/transfer.hpp) over a socket pair: a state
// with more descriptors than one message carries arrives whole and in order; and what
// arrives is input, so a peer that sends garbage, too much, descriptors where none belong,
// or nothing at all gets a HandoverError naming it, and no descriptor leaks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "handover/transfer.hpp"
#include "statepool/support/fd_passing.hpp"
#include "statepool/testing/fds.hpp"

namespace statepool::service::handover {
namespace {

using namespace std::chrono_literals;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

struct Pair {
  support::UniqueFd a;
  support::UniqueFd b;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

Deadline soon() {
  return steady_clock::now() + 5s;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const HandoverError& e) {
    return e.what();
  }
  return "no error";
}

ino_t inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(HandoverTransfer, AStateWithManyDescriptorsArrivesWholeAndInOrder) {
  Pair pair;
  std::vector<support::UniqueFd> memfds;
  std::vector<NamedFd> named;
  for (int i = 0; i < 40; ++i) {  // three descriptors messages
    memfds.emplace_back(::memfd_create("transfer-test", MFD_CLOEXEC));
    named.push_back({"arena " + std::to_string(i + 1), memfds.back().get()});
  }
  std::vector<std::byte> image(300000);
  for (std::size_t i = 0; i < image.size(); ++i) image[i] = static_cast<std::byte>(i * 7);
  std::thread sender([&] { send_state(pair.a.get(), named, image, soon()); });
  const ReceivedState got = receive_state(pair.b.get(), 64, 1 << 20, soon());
  sender.join();
  EXPECT_EQ(got.image, image);
  ASSERT_EQ(got.fds.size(), named.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(got.fds[i].first, named[i].name);
    EXPECT_EQ(inode(got.fds[i].second.get()), inode(named[i].fd)) << named[i].name;
  }
}

TEST(HandoverTransfer, ARefusalCarriesThePredecessorsReason) {
  Pair pair;
  send_text(pair.a.get(), MessageKind::refusal, "another hand-over is under way", soon());
  EXPECT_THAT(error_of([&] { (void)receive_state(pair.b.get(), 8, 1024, soon()); }),
              HasSubstr("refused to hand over: another hand-over is under way"));
}

TEST(HandoverTransfer, WhatIsNotAMessageIsRefusedAndLeaksNoDescriptor) {
  const std::size_t fds = testing::open_fd_count();
  {
    Pair pair;
    const std::string junk = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::write(pair.a.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    EXPECT_THAT(error_of([&] { (void)receive_message(pair.b.get(), 1024, soon()); }),
                HasSubstr("does not speak the hand-over protocol"));
  }
  {
    Pair pair;
    std::array<std::byte, 16> header{std::byte{'S'}, std::byte{'P'}, std::byte{'H'}, std::byte{'O'},
                                     std::byte{9}};
    ASSERT_EQ(::write(pair.a.get(), header.data(), header.size()), 16);
    EXPECT_THAT(error_of([&] { (void)receive_message(pair.b.get(), 1024, soon()); }),
                HasSubstr("unknown kind 9"));
  }
  {
    Pair pair;
    const std::vector<std::byte> big(2048);
    send_message(pair.a.get(), MessageKind::state, big, {}, soon());
    EXPECT_THAT(error_of([&] { (void)receive_message(pair.b.get(), 1024, soon()); }),
                HasSubstr("state message of 2048 bytes, more than the 1024 allowed"));
  }
  {
    // Descriptors on a message that carries none: refused, and closed here.
    Pair pair;
    support::UniqueFd memfd(::memfd_create("transfer-test", MFD_CLOEXEC));
    const std::array<std::byte, 16> header{
        std::byte{'S'}, std::byte{'P'}, std::byte{'H'}, std::byte{'O'},
        std::byte{static_cast<unsigned char>(MessageKind::verdict)}};
    const int attached[] = {memfd.get()};
    ASSERT_EQ(support::send_with_fds(pair.a.get(), header, attached, MSG_NOSIGNAL), 16);
    memfd.reset();
    EXPECT_THAT(error_of([&] { (void)receive_message(pair.b.get(), 64, soon()); }),
                HasSubstr("descriptors attached to a hand-over verdict message"));
  }
  {
    // Names that do not match the descriptors.
    Pair pair;
    support::UniqueFd memfd(::memfd_create("transfer-test", MFD_CLOEXEC));
    const int attached[] = {memfd.get()};
    const std::string names = "arena 1\narena 2\n";
    send_message(pair.a.get(), MessageKind::descriptors, std::as_bytes(std::span(names)), attached,
                 soon());
    EXPECT_THAT(error_of([&] { (void)receive_state(pair.b.get(), 8, 1024, soon()); }),
                HasSubstr("1 descriptors arrived with 2 names"));
  }
  {
    // More descriptors than the successor takes.
    Pair pair;
    std::vector<support::UniqueFd> memfds;
    std::vector<NamedFd> named;
    for (int i = 0; i < 5; ++i) {
      memfds.emplace_back(::memfd_create("transfer-test", MFD_CLOEXEC));
      named.push_back({"arena " + std::to_string(i), memfds.back().get()});
    }
    send_state(pair.a.get(), named, {}, soon());
    EXPECT_THAT(error_of([&] { (void)receive_state(pair.b.get(), 4, 1024, soon()); }),
                HasSubstr("more than 4 descriptors offered"));
  }
  EXPECT_EQ(testing::open_fd_count(), fds) << "a descriptor that arrived was not closed";
}

TEST(HandoverTransfer, SilenceAndAClosedPeerEndWithAClearError) {
  {
    Pair pair;
    const auto start = steady_clock::now();
    EXPECT_THAT(
        error_of([&] { (void)receive_message(pair.b.get(), 64, steady_clock::now() + 200ms); }),
        HasSubstr("timed out"));
    EXPECT_LT(steady_clock::now() - start, 3s);
  }
  {
    Pair pair;
    std::array<std::byte, 16> header{std::byte{'S'}, std::byte{'P'}, std::byte{'H'},
                                     std::byte{'O'}, std::byte{3},   std::byte{0},
                                     std::byte{0},   std::byte{0},   std::byte{100}};
    ASSERT_EQ(::write(pair.a.get(), header.data(), header.size()), 16);
    pair.a.reset();  // gone half-way through the body
    EXPECT_THAT(error_of([&] { (void)receive_message(pair.b.get(), 1024, soon()); }),
                HasSubstr("closed the hand-over connection"));
  }
  EXPECT_THAT(error_of([] { (void)connect("/nonexistent/statepool.sock.handover"); }),
              HasSubstr("no statepoold hands over on /nonexistent/statepool.sock.handover"));
}

}  // namespace
}  // namespace statepool::service::handover
