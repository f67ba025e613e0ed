#pragma once
// The memory-resource conformance suite: one contract, every implementation.
//
// A test executable includes this header once and instantiates the suite for its
// implementations:
//
//   using Implementations = ::testing::Types<HostTraits, ...>;
//   INSTANTIATE_TYPED_TEST_SUITE_P(Host, MemoryResourceConformance, Implementations,
//                                  ImplementationNames);
//
// (tests/service/test_memory_resource.cpp for the host memfd resource and the adaptors
// over it, tests/gpu/test_cuda_memory_gpu.cpp for the CUDA resource.)
//
// A traits type owns a resource (and its upstream) and says how to use its memory:
//
//   static std::string unavailable();   why the implementation cannot run here (no GPU),
//                                       or empty; the tests skip with it. Checked before
//                                       the traits object is made.
//   MemoryResource& resource();
//   std::size_t refused_bytes();        a size the resource refuses with pool_exhausted
//   auto refuse();                      ... while the returned guard lives (may be null)
//   void fill(const Allocation&, std::byte);       sets every byte
//   bool all(const Allocation&, std::byte);        every byte has the value
//   int share_with_child(const Allocation&, std::byte expect, std::byte reply);
//                                       a second process maps the allocation as a client
//                                       would, checks that every byte is `expect`, writes
//                                       `reply` everywhere; 0 on success
//   static constexpr const char* kName;            the resource's name()
//
// The functions may be static; the suite calls them through the traits object.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memory/resource.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/unique_fd.hpp"
#include "statepool/testing/fds.hpp"

namespace statepool::service {
namespace {  // included once per test executable

using testing::open_fd_count;

template <class Traits>
class MemoryResourceConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = Traits::unavailable(); !why.empty()) GTEST_SKIP() << why;
    traits_ = std::make_unique<Traits>();
  }
  Traits& traits() { return *traits_; }
  MemoryResource& resource() { return traits_->resource(); }

 private:
  std::unique_ptr<Traits> traits_;  // made in SetUp, after the availability check
};

TYPED_TEST_SUITE_P(MemoryResourceConformance);

TYPED_TEST_P(MemoryResourceConformance, AllocatesZeroedMemoryDescribedByTheResource) {
  MemoryResource& r = this->resource();
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{4095}, std::size_t{1} << 20}) {
    const auto a = r.allocate(bytes, "conformance-zeroed");
    ASSERT_NE(a, nullptr);
    const AllocationInfo& info = a->info();
    EXPECT_EQ(info.bytes, r.allocation_size(bytes));
    EXPECT_GE(info.bytes, bytes);
    EXPECT_EQ(info.bytes % r.granularity(), 0u);
    EXPECT_NE(info.data, nullptr);
    EXPECT_EQ(info.where.space, r.space());
    EXPECT_EQ(info.where.device, r.device());
    EXPECT_EQ(info.where.granularity, r.granularity());
    EXPECT_EQ(a->buffer().data, info.data);
    EXPECT_EQ(a->buffer().size, info.bytes);
    EXPECT_EQ(r.name(), TypeParam::kName);
    EXPECT_TRUE(this->traits().all(*a, std::byte{0})) << bytes << " bytes";
  }
}

TYPED_TEST_P(MemoryResourceConformance, HandleIsACloseOnExecDescriptorWhenItIsOne) {
  const auto a = this->resource().allocate(8192, "conformance-handle");
  const AllocationInfo& info = a->info();
  if (!info.where.handle_is_fd()) {
    EXPECT_EQ(info.fd, -1);
    return;
  }
  ASSERT_GE(info.fd, 0);
  EXPECT_EQ(::fcntl(info.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TYPED_TEST_P(MemoryResourceConformance, ASecondProcessSeesTheSameBytes) {
  const auto a = this->resource().allocate(64 << 10, "conformance-peer");
  this->traits().fill(*a, std::byte{0x5a});
  EXPECT_EQ(this->traits().share_with_child(*a, std::byte{0x5a}, std::byte{0xc3}), 0);
  EXPECT_TRUE(this->traits().all(*a, std::byte{0xc3})) << "the peer's writes are not visible here";
}

TYPED_TEST_P(MemoryResourceConformance, ExhaustionIsACleanPoolExhaustedThatLeaksNothing) {
  MemoryResource& r = this->resource();
  const std::size_t fds = open_fd_count();
  {
    [[maybe_unused]] const auto guard = this->traits().refuse();  // RAII; may be null
    try {
      (void)r.allocate(this->traits().refused_bytes(), "conformance-refused");
      FAIL() << "expected StatusError(pool_exhausted)";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::pool_exhausted) << e.what();
      EXPECT_NE(std::string(e.what()), "") << "the message says what was refused";
    }
  }
  EXPECT_EQ(open_fd_count(), fds);
  // And the resource still works afterwards.
  EXPECT_NE(r.allocate(4096, "conformance-after"), nullptr);
}

TYPED_TEST_P(MemoryResourceConformance, ZeroBytesIsInvalidArgument) {
  try {
    (void)this->resource().allocate(0, "conformance-zero");
    FAIL() << "expected StatusError(invalid_argument)";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("conformance-zero"), std::string::npos) << e.what();
  }
}

TYPED_TEST_P(MemoryResourceConformance, ReleaseReturnsTheMemoryAndItsDescriptor) {
  MemoryResource& r = this->resource();
  const std::size_t fds = open_fd_count();
  int fd = -1;
  {
    auto a = r.allocate(1 << 20, "conformance-release");
    fd = a->info().fd;
    if (a->info().where.handle_is_fd()) {
      EXPECT_GT(open_fd_count(), fds);
    }
    // A second holder keeps it alive (what an executor does while it works).
    auto holder = a;
    a.reset();
    EXPECT_TRUE(this->traits().all(*holder, std::byte{0}));
  }
  EXPECT_EQ(open_fd_count(), fds);
  if (fd >= 0) {
    errno = 0;
    EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
    EXPECT_EQ(errno, EBADF);
  }
  // Many cycles leave nothing behind.
  for (int i = 0; i < 200; ++i) (void)r.allocate(4096, "conformance-cycle");
  EXPECT_EQ(open_fd_count(), fds);
}

TYPED_TEST_P(MemoryResourceConformance, ConcurrentAllocationsAreDistinctAndIndependent) {
  MemoryResource& r = this->resource();
  auto& traits = this->traits();
  constexpr int kThreads = 4;
  constexpr int kEach = 16;
  std::vector<std::shared_ptr<Allocation>> got(kThreads * kEach);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        auto a = r.allocate(8192, "conformance-concurrent");
        traits.fill(*a, static_cast<std::byte>(t * kEach + i));
        got[static_cast<std::size_t>(t * kEach + i)] = std::move(a);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<const std::byte*> addresses;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NE(got[i], nullptr);
    addresses.insert(got[i]->info().data);
    EXPECT_TRUE(traits.all(*got[i], static_cast<std::byte>(i))) << "allocation " << i;
  }
  EXPECT_EQ(addresses.size(), got.size());
}

// A successor daemon takes an arena's memory over from its descriptor (the hand-over,
// docs/operations.md): the same bytes, both ways, and nothing leaked once both go.
TYPED_TEST_P(MemoryResourceConformance, AdoptTakesOverTheSameMemoryFromItsDescriptor) {
  MemoryResource& r = this->resource();
  const std::size_t fds = open_fd_count();
  for (const HandleKind kind : r.handle_kinds()) {
    SCOPED_TRACE(kernels::to_string(kind));
    auto a = r.allocate(1 << 20, "conformance-adopt", kind);
    if (!a->info().where.handle_is_fd()) {
      // Legacy IPC handles cannot change owners: refused, whatever the descriptor.
      try {
        (void)r.adopt(support::duplicate(0), a->size(), "conformance-adopt-ipc", kind);
        FAIL() << "expected StatusError(invalid_argument)";
      } catch (const StatusError& e) {
        EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
      }
      continue;
    }
    this->traits().fill(*a, std::byte{0x3c});
    auto b = r.adopt(support::duplicate(a->info().fd), a->size(), "conformance-adopted", kind);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->size(), a->size());
    EXPECT_EQ(b->info().where.space, a->info().where.space);
    EXPECT_EQ(b->info().where.handle_kind, kind);
    EXPECT_GE(b->info().fd, 0);
    EXPECT_TRUE(this->traits().all(*b, std::byte{0x3c})) << "the adopted memory has other bytes";
    this->traits().fill(*b, std::byte{0x77});
    EXPECT_TRUE(this->traits().all(*a, std::byte{0x77})) << "the adopted memory is a copy";
    a.reset();  // the first owner goes (the old daemon exits): the bytes stay
    EXPECT_TRUE(this->traits().all(*b, std::byte{0x77}));
  }
  EXPECT_EQ(open_fd_count(), fds);
}

TYPED_TEST_P(MemoryResourceConformance, AdoptRefusesWhatIsNotItsMemoryAndClosesIt) {
  MemoryResource& r = this->resource();
  const auto a = r.allocate(1 << 20, "conformance-adopt-bad");
  const HandleKind kind = a->info().where.handle_kind;
  const std::size_t fds = open_fd_count();
  const auto refused = [&](support::UniqueFd fd, std::size_t bytes, const char* what) {
    SCOPED_TRACE(what);
    try {
      (void)r.adopt(std::move(fd), bytes, "conformance-adopt-bad", kind);
      ADD_FAILURE() << "expected StatusError(invalid_argument)";
    } catch (const StatusError& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
      EXPECT_NE(std::string(e.what()).find("conformance-adopt-bad"), std::string::npos) << e.what();
    }
  };
  refused(support::UniqueFd(), a->size(), "no descriptor");
  if (a->info().where.handle_is_fd()) {
    refused(support::duplicate(a->info().fd), 0, "zero bytes");
    refused(support::duplicate(a->info().fd), a->size() + r.granularity(), "too long");
    if (r.granularity() > 1) {
      refused(support::duplicate(a->info().fd), a->size() - 1, "not a granularity multiple");
    }
  }
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  support::UniqueFd write_end(ends[1]);
  refused(support::UniqueFd(ends[0]), a->size(), "a pipe");
  write_end.reset();
  EXPECT_EQ(open_fd_count(), fds) << "a refused descriptor was not closed";
}

REGISTER_TYPED_TEST_SUITE_P(MemoryResourceConformance, AllocatesZeroedMemoryDescribedByTheResource,
                            HandleIsACloseOnExecDescriptorWhenItIsOne,
                            ASecondProcessSeesTheSameBytes,
                            ExhaustionIsACleanPoolExhaustedThatLeaksNothing,
                            ZeroBytesIsInvalidArgument, ReleaseReturnsTheMemoryAndItsDescriptor,
                            ConcurrentAllocationsAreDistinctAndIndependent,
                            AdoptTakesOverTheSameMemoryFromItsDescriptor,
                            AdoptRefusesWhatIsNotItsMemoryAndClosesIt);

}  // namespace
}  // namespace statepool::service
