// The crash journal (service/handover/journal.hpp): the latest hand-over image round-trips,
// writes alternate between the two slots, and a torn write (an image or a record, corrupted
// here through a second mapping of the memfd, or a writer really killed mid-write) reads as
// the previous complete image with the reason in `dropped`. The memfd is input to open():
// every descriptor that is not a journal is refused with its reason, a journal handed back
// (as systemd's store does across a restart) reads as it was written, and no descriptor
// leaks.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "handover/image.hpp"
#include "handover/journal.hpp"
#include "statepool/support/unique_fd.hpp"
#include "statepool/testing/fds.hpp"

namespace statepool::service::handover {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// An image (wrap_payload's header and checksums) of `payload_bytes` bytes from `seed`.
std::vector<std::byte> image_of(std::size_t payload_bytes, unsigned seed) {
  std::vector<std::byte> payload(payload_bytes);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<std::byte>((std::size_t{seed} * 131 + i * 7) & 0xff);
  }
  return wrap_payload(payload);
}

// A second mapping of a journal's memfd, as another process (or a stray write) sees it.
class SecondMapping {
 public:
  explicit SecondMapping(int fd) {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0);
    bytes_ = static_cast<std::size_t>(st.st_size);
    void* addr = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(addr, MAP_FAILED);
    base_ = static_cast<std::byte*>(addr);
  }
  ~SecondMapping() { ::munmap(base_, bytes_); }
  SecondMapping(const SecondMapping&) = delete;
  SecondMapping& operator=(const SecondMapping&) = delete;

  [[nodiscard]] std::size_t bytes() const { return bytes_; }
  std::byte* at(std::size_t offset) { return base_ + offset; }
  std::byte* slot(const Journal& journal, int i) {
    return at(kJournalHeaderBytes + static_cast<std::size_t>(i) * journal.slot_bytes());
  }
  std::byte* record(int i) { return at(kJournalRecordOffsets[i]); }
  std::uint64_t sequence(int i) {
    std::uint64_t s = 0;
    std::memcpy(&s, record(i) + kJournalSequenceField, sizeof s);
    return s;
  }
  void flip(std::byte* b) { *b ^= std::byte{0x5a}; }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

std::string open_refusal(support::UniqueFd fd) {
  try {
    (void)Journal::open(std::move(fd));
  } catch (const JournalError& e) {
    return e.what();
  }
  return "accepted";
}

// What read() throws ("" when it returns).
std::string read_refusal(const Journal& journal, bool* empty = nullptr) {
  try {
    (void)journal.read();
  } catch (const JournalError& e) {
    if (empty != nullptr) *empty = e.empty();
    return e.what();
  }
  return "";
}

support::UniqueFd memfd(std::size_t bytes, unsigned flags, int seals) {
  support::UniqueFd fd(::memfd_create("journal-test", MFD_CLOEXEC | flags));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  if (seals != 0) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

// A journal made by create(), changed with `edit(fd)` through its descriptor, and handed
// to open() as systemd's store would after a restart.
template <class Edit>
std::string open_refusal_after(Edit&& edit) {
  auto journal = Journal::create(256);
  journal.write(image_of(100, 1));
  support::UniqueFd copy = support::duplicate(journal.fd());
  edit(copy.get());
  { [[maybe_unused]] Journal gone = std::move(journal); }
  return open_refusal(std::move(copy));
}

TEST(HandoverJournal, RoundTripOfAnEncodedImage) {
  ImageMeta meta;
  meta.generation = 7;
  meta.daemon_version = "journal-test";
  meta.backend = "host";
  const auto image = encode_image(PoolState{}, meta);

  auto journal = Journal::create(std::size_t{64} << 10);
  EXPECT_EQ(journal.slot_bytes(), 64u * 1024);
  journal.write(image);
  const JournalRead read = journal.read();
  EXPECT_EQ(read.image, image);
  EXPECT_EQ(read.sequence, 1u);
  EXPECT_TRUE(read.dropped.empty());
  EXPECT_GE(read.age, 0ns);
  EXPECT_LT(read.age, 1min);
  EXPECT_EQ(decode_image(read.image).meta.daemon_version, "journal-test");
}

TEST(HandoverJournal, CreateMakesASealedMemfdOfHeaderAndTwoSlots) {
  auto journal = Journal::create(1000);
  struct stat st {};
  ASSERT_EQ(::fstat(journal.fd(), &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), kJournalHeaderBytes + 2000);
  const int seals = ::fcntl(journal.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  EXPECT_EQ(::ftruncate(journal.fd(), 10), -1);
  EXPECT_EQ(::fcntl(journal.fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(HandoverJournal, CreateRefusesAZeroOrHugeCapacity) {
  EXPECT_THROW((void)Journal::create(0), JournalError);
  try {
    (void)Journal::create(kMaxJournalSlotBytes + 1);
    ADD_FAILURE() << "accepted";
  } catch (const JournalError& e) {
    EXPECT_THAT(e.what(), HasSubstr("above the largest image"));
  }
}

TEST(HandoverJournal, TenWritesAlternateSlotsAndReadReturnsTheLast) {
  auto journal = Journal::create(4096);
  SecondMapping view(journal.fd());
  for (unsigned k = 1; k <= 10; ++k) {
    const auto image = image_of(std::size_t{100} * k, k);
    journal.write(image);
    const int slot = static_cast<int>((k - 1) % 2);
    EXPECT_EQ(view.sequence(slot), k) << "write " << k;
    EXPECT_EQ(view.sequence(1 - slot), k - 1) << "write " << k;
    EXPECT_EQ(std::memcmp(view.slot(journal, slot), image.data(), image.size()), 0);
    const JournalRead read = journal.read();
    EXPECT_EQ(read.image, image) << "write " << k;
    EXPECT_EQ(read.sequence, k);
    EXPECT_TRUE(read.dropped.empty());
  }
}

TEST(HandoverJournal, AJournalNeverWrittenIsEmptyNotBroken) {
  auto journal = Journal::create(128);
  bool empty = false;
  EXPECT_THAT(read_refusal(journal, &empty), HasSubstr("empty"));
  EXPECT_TRUE(empty);
}

TEST(HandoverJournal, ATornNewestImageReadsAsThePreviousOne) {
  auto journal = Journal::create(4096);
  const auto first = image_of(1000, 1);
  journal.write(first);
  journal.write(image_of(1000, 2));  // slot 1, sequence 2
  SecondMapping view(journal.fd());
  view.flip(view.slot(journal, 1) + 500);

  const JournalRead read = journal.read();
  EXPECT_EQ(read.image, first);
  EXPECT_EQ(read.sequence, 1u);
  ASSERT_EQ(read.dropped.size(), 1u);
  EXPECT_EQ(read.dropped[0],
            "slot 1 (sequence 2) is torn: payload checksum mismatch; using sequence 1");
}

TEST(HandoverJournal, ATornNewestRecordReadsAsThePreviousOne) {
  auto journal = Journal::create(4096);
  journal.write(image_of(1000, 1));
  const auto second = image_of(1000, 2);
  journal.write(second);             // slot 1
  journal.write(image_of(1000, 3));  // slot 0, sequence 3
  SecondMapping view(journal.fd());
  view.flip(view.record(0) + kJournalRecordCrcField);

  const JournalRead read = journal.read();
  EXPECT_EQ(read.image, second);
  EXPECT_EQ(read.sequence, 2u);
  ASSERT_EQ(read.dropped.size(), 1u);
  EXPECT_THAT(read.dropped[0], HasSubstr("slot 0 is torn: record checksum mismatch"));
  EXPECT_THAT(read.dropped[0], HasSubstr("using sequence 2"));
}

// A record whose fields changed under a correct-looking checksum is caught too (a bit flip
// in the sequence of the record, say).
TEST(HandoverJournal, AChangedRecordFieldIsCaughtByTheRecordChecksum) {
  auto journal = Journal::create(4096);
  const auto first = image_of(10, 1);
  journal.write(first);
  journal.write(image_of(10, 2));
  SecondMapping view(journal.fd());
  view.flip(view.record(1) + kJournalSequenceField);
  const JournalRead read = journal.read();
  EXPECT_EQ(read.image, first);
  ASSERT_EQ(read.dropped.size(), 1u);
  EXPECT_THAT(read.dropped[0], HasSubstr("slot 1 is torn: record checksum mismatch"));
}

// After a torn write the next write goes over the torn slot, never over the complete image.
TEST(HandoverJournal, AWriteAfterATornOneKeepsTheCompleteImage) {
  auto journal = Journal::create(4096);
  const auto first = image_of(1000, 1);
  journal.write(first);
  journal.write(image_of(1000, 2));
  SecondMapping view(journal.fd());
  view.flip(view.slot(journal, 1));

  const auto third = image_of(900, 3);
  journal.write(third);
  EXPECT_EQ(view.sequence(1), 2u);  // slot 0's sequence 1, plus one
  EXPECT_EQ(journal.read().image, third);
  EXPECT_TRUE(journal.read().dropped.empty());
  EXPECT_EQ(std::memcmp(view.slot(journal, 0), first.data(), first.size()), 0);
}

TEST(HandoverJournal, BothSlotsTornIsAnErrorNamingBoth) {
  auto journal = Journal::create(4096);
  journal.write(image_of(1000, 1));
  journal.write(image_of(1000, 2));
  SecondMapping view(journal.fd());
  view.flip(view.slot(journal, 0) + 999);
  view.flip(view.record(1) + kJournalRecordCrcField + 3);

  bool empty = true;
  const std::string error = read_refusal(journal, &empty);
  EXPECT_FALSE(empty);
  EXPECT_THAT(error, HasSubstr("the journal holds no complete image: "));
  EXPECT_THAT(error, HasSubstr("slot 0 (sequence 1) is torn: payload checksum mismatch"));
  EXPECT_THAT(error, HasSubstr("slot 1 is torn: record checksum mismatch"));
}

TEST(HandoverJournal, ARecordLongerThanItsSlotIsCorrupt) {
  auto journal = Journal::create(64);
  journal.write(image_of(10, 1));
  SecondMapping view(journal.fd());
  // A length past the slot under a correct record checksum (a writer's bug, not a tear).
  std::byte* record = view.record(0);
  const std::uint64_t length = 65;
  std::memcpy(record + kJournalLengthField, &length, sizeof length);
  const std::uint32_t crc = image_crc32c({record, kJournalRecordCrcField});
  std::memcpy(record + kJournalRecordCrcField, &crc, sizeof crc);

  EXPECT_THAT(read_refusal(journal),
              HasSubstr("slot 0 (sequence 1) is corrupt: length 65 exceeds the slot's 64 bytes"));
  EXPECT_THAT(read_refusal(journal), HasSubstr("slot 1 was never written"));
}

TEST(HandoverJournal, AnImageTooLargeIsRefusedAndChangesNothing) {
  auto journal = Journal::create(100);
  const std::vector<std::byte> fits(100, std::byte{7});
  journal.write(fits);
  SecondMapping view(journal.fd());
  const std::vector<std::byte> before(view.at(0), view.at(0) + view.bytes());

  try {
    journal.write(std::vector<std::byte>(101, std::byte{8}));
    ADD_FAILURE() << "accepted";
  } catch (const JournalError& e) {
    EXPECT_STREQ(e.what(), "the journal holds images up to 100 bytes; this one is 101");
  }
  EXPECT_EQ(std::memcmp(view.at(0), before.data(), before.size()), 0);
  const JournalRead read = journal.read();
  EXPECT_EQ(read.image, fits);
  EXPECT_EQ(read.sequence, 1u);
}

TEST(HandoverJournal, AgeIsZeroForAWriteTimeAhead) {
  auto journal = Journal::create(64);
  journal.write(image_of(10, 1));
  SecondMapping view(journal.fd());
  std::byte* record = view.record(0);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const std::uint64_t ahead =
      (static_cast<std::uint64_t>(now.tv_sec) + 3600) * 1'000'000'000u;  // an hour ahead
  std::memcpy(record + kJournalWrittenAtField, &ahead, sizeof ahead);
  const std::uint32_t crc = image_crc32c({record, kJournalRecordCrcField});
  std::memcpy(record + kJournalRecordCrcField, &crc, sizeof crc);
  EXPECT_EQ(journal.read().age, 0ns);
}

// A writer killed with SIGKILL at random points of a stream of writes: the journal always
// reads as a complete image, the newest or the one before, and a write cut short is named.
TEST(HandoverJournal, AWriterKilledMidWriteLeavesACompleteImage) {
  constexpr std::size_t kPayload = 4u << 20;
  auto journal = Journal::create(kPayload + kImageHeaderBytes);
  journal.write(image_of(kPayload, 0));  // something complete before the first kill
  int cut_short = 0;
  for (int round = 0; round < 6; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The child writes images 1, 2, 3, ... until it is killed (the mapping is shared).
      try {
        for (unsigned k = 1;; ++k) journal.write(image_of(kPayload, k));
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 13 * round));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself";

    const JournalRead read = journal.read();
    ASSERT_EQ(read.image.size(), kPayload + kImageHeaderBytes);
    // The image is whole: its own checksums hold, and it is one of the images written.
    const auto payload = std::span<const std::byte>(read.image).subspan(kImageHeaderBytes);
    const auto seed =
        static_cast<unsigned>((static_cast<unsigned>(payload[0]) * 43) & 0xff);  // 131⁻¹ mod 256
    EXPECT_EQ(read.image, image_of(kPayload, seed)) << "round " << round;
    cut_short += read.dropped.empty() ? 0 : 1;
    for (const auto& line : read.dropped) EXPECT_THAT(line, HasSubstr("is torn"));
  }
  std::printf("[          ] %d of 6 kills cut a write short\n", cut_short);
}

TEST(HandoverJournal, OpenOfAJournalHandedBackSeesWhatWasWritten) {
  const auto second = image_of(300, 2);
  support::UniqueFd kept;
  {
    auto journal = Journal::create(512);
    journal.write(image_of(200, 1));
    journal.write(second);
    kept = support::duplicate(journal.fd());  // what systemd's store holds
  }                                           // the daemon is gone
  auto journal = Journal::open(std::move(kept));
  EXPECT_EQ(journal.slot_bytes(), 512u);
  JournalRead read = journal.read();
  EXPECT_EQ(read.image, second);
  EXPECT_EQ(read.sequence, 2u);
  EXPECT_TRUE(read.dropped.empty());

  const auto third = image_of(400, 3);
  journal.write(third);
  read = journal.read();
  EXPECT_EQ(read.image, third);
  EXPECT_EQ(read.sequence, 3u);
}

TEST(HandoverJournal, OpenRefusesWhatIsNotAJournal) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  support::UniqueFd write_end(pipe_fds[1]);
  EXPECT_THAT(open_refusal(support::UniqueFd(pipe_fds[0])),
              HasSubstr("the journal descriptor is a pipe, not a memfd"));

  EXPECT_THAT(open_refusal(support::UniqueFd()), HasSubstr("no journal descriptor"));

  EXPECT_THAT(open_refusal(memfd(kJournalHeaderBytes + 200, 0, 0)),
              HasSubstr("not sealed against shrinking and growing"));
  EXPECT_THAT(open_refusal(memfd(kJournalHeaderBytes + 200, MFD_ALLOW_SEALING, F_SEAL_SHRINK)),
              HasSubstr("not sealed against shrinking and growing"));
  EXPECT_THAT(open_refusal(memfd(kJournalHeaderBytes + 200, MFD_ALLOW_SEALING,
                                 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)),
              HasSubstr("sealed against writing"));
  EXPECT_THAT(open_refusal(memfd(100, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW)),
              HasSubstr("the journal memfd holds 100 bytes, less than its 4096-byte header"));
  EXPECT_THAT(open_refusal(
                  memfd(kJournalHeaderBytes + 200, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW)),
              HasSubstr("bad magic"));

  EXPECT_THAT(open_refusal_after([](int fd) { ASSERT_EQ(::pwrite(fd, "X", 1, 2), 1); }),
              HasSubstr("bad magic: not a statepool journal"));
  EXPECT_THAT(open_refusal_after([](int fd) {
                const std::uint32_t version = 2;
                ASSERT_EQ(::pwrite(fd, &version, 4, kJournalVersionOffset), 4);
              }),
              HasSubstr("layout version 2, this statepoold reads version 1 only"));
  EXPECT_THAT(open_refusal_after([](int fd) {
                const std::uint64_t slot = 200;
                ASSERT_EQ(::pwrite(fd, &slot, 8, kJournalSlotSizeOffset), 8);
              }),
              HasSubstr("slot size 200 needs 4496 bytes; the memfd holds 4608"));
  EXPECT_THAT(open_refusal_after([](int fd) {
                const std::uint64_t slot = 0;
                ASSERT_EQ(::pwrite(fd, &slot, 8, kJournalSlotSizeOffset), 8);
              }),
              HasSubstr("slot size 0 is out of range"));

  // The same journal through a read-only descriptor.
  auto journal = Journal::create(64);
  const std::string path = "/proc/self/fd/" + std::to_string(journal.fd());
  EXPECT_THAT(open_refusal(support::UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC))),
              HasSubstr("not open for reading and writing"));
}

TEST(HandoverJournal, NoDescriptorLeaks) {
  const std::size_t before = testing::open_fd_count();
  {
    auto journal = Journal::create(256);
    journal.write(image_of(100, 1));
    auto reopened = Journal::open(support::duplicate(journal.fd()));
    EXPECT_EQ(reopened.read().sequence, 1u);
    Journal moved = std::move(reopened);
    reopened = std::move(journal);
    EXPECT_EQ(moved.read().sequence, 1u);
    EXPECT_THAT(open_refusal(memfd(100, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW)),
                HasSubstr("less than"));
    EXPECT_THAT(open_refusal_after([](int fd) { ASSERT_EQ(::pwrite(fd, "X", 1, 0), 1); }),
                HasSubstr("bad magic"));
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    support::UniqueFd write_end(pipe_fds[1]);
    EXPECT_THAT(open_refusal(support::UniqueFd(pipe_fds[0])), HasSubstr("pipe"));
  }
  EXPECT_EQ(testing::open_fd_count(), before);
}

}  // namespace
}  // namespace statepool::service::handover
