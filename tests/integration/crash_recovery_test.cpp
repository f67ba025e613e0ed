// Crash recovery (docs/operations.md, "Crash recovery under systemd"): statepoold keeps its
// arenas' memfds and a crash journal in the service manager's descriptor store; after a
// kill -9 the restarted daemon gets them back (LISTEN_FDS, LISTEN_FDNAMES) and recovers the
// parked states the journal covers. CI has no systemd: testing::ServiceManager plays its
// part (FDSTORE=1 and FDSTOREREMOVE=1 on $NOTIFY_SOCKET, the descriptors handed back as
// systemd hands them).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "handover/image.hpp"
#include "handover/journal.hpp"
#include "parked_clients.hpp"
#include "statepool/client.hpp"
#include "statepool/support/unique_fd.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/service_manager.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace client = statepool::client;
namespace handover = statepool::service::handover;
using statepool::support::UniqueFd;
using statepool::testing::client_options;
using statepool::testing::DaemonOptions;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using statepool::testing::http_get;
using statepool::testing::park;
using statepool::testing::Parked;
using statepool::testing::resume;
using statepool::testing::ServiceManager;
using statepool::testing::TempDir;
using namespace std::chrono_literals;

namespace {

/// The name of the journal in the store ("" when none).
std::string journal_name(const ServiceManager& manager) {
  for (const std::string& name : manager.stored_names()) {
    if (name.rfind("statepool-journal-", 0) == 0) return name;
  }
  return {};
}

/// What the stored journal's newest complete image holds, read through a copy of the
/// descriptor (nullopt when there is none yet).
struct JournalView {
  std::uint64_t sequence = 0;
  std::size_t leases = 0;
  std::size_t arenas = 0;
  std::size_t snapshots = 0;
};
std::optional<JournalView> stored_journal(const ServiceManager& manager) {
  const std::string name = journal_name(manager);
  if (name.empty()) return std::nullopt;
  try {
    handover::Journal journal =
        handover::Journal::open(UniqueFd(::fcntl(manager.stored_fd(name), F_DUPFD_CLOEXEC, 3)));
    const handover::JournalRead read = journal.read();
    const handover::DecodedImage image = handover::decode_image(read.image);
    return JournalView{read.sequence, image.state.leases.size(), image.state.arenas.size(),
                       image.state.snapshots.size()};
  } catch (const std::exception&) {
    return std::nullopt;  // empty still
  }
}

std::size_t stored_arenas(const ServiceManager& manager) {
  std::size_t n = 0;
  for (const std::string& name : manager.stored_names()) {
    n += name.rfind("statepool-arena-", 0) == 0 ? 1 : 0;
  }
  return n;
}

/// Waits until the journal holds `leases` leases and `snapshots` snapshots.
void wait_for_journal(const ServiceManager& manager, std::size_t leases, std::size_t snapshots) {
  ASSERT_TRUE(eventually(
      [&] {
        const auto view = stored_journal(manager);
        return view && view->leases == leases && view->snapshots == snapshots;
      },
      20s))
      << "the crash journal never covered " << leases << " leases";
}

/// The value of a metric line that starts with `series` ("" when absent).
std::string metric(int port, const std::string& series) {
  const std::string text = http_get(port, "/metrics");
  const std::size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return {};
  const std::size_t start = at + series.size() + 2;
  return text.substr(start, text.find('\n', start) - start);
}

DaemonOptions under(const ServiceManager& manager) {
  DaemonOptions options;
  options.metrics = true;
  options.service_manager = &manager;
  return options;
}

const std::vector<std::string> kArgs = {"--grace-period",           "60s", "--workers", "2",
                                        "--crash-journal-interval", "5ms"};

/// A daemon under `manager` with one client's parked state (park(i)), journaled, then
/// killed with SIGKILL: the store holds what the crashed daemon left.
Parked park_and_crash(const ServiceManager& manager, const std::vector<std::string>& args, int i) {
  DaemonProcess crashed(args, under(manager));
  Parked parked = park(crashed, i);
  wait_for_journal(manager, 1, 1);
  EXPECT_EQ(crashed.stop(SIGKILL, 5s), 128 + SIGKILL);
  return parked;
}

}  // namespace

TEST(CrashRecovery, ParkedStatesComeBackAfterKillDashNine) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  auto crashed = std::make_unique<DaemonProcess>(kArgs, under(manager));
  std::vector<Parked> parked;
  for (int i = 0; i < 16; ++i) parked.push_back(park(*crashed, i));
  wait_for_journal(manager, 16, 16);
  EXPECT_EQ(stored_arenas(manager), 4u);  // one per codec
  EXPECT_EQ(crashed->stop(SIGKILL, 5s), 128 + SIGKILL);
  crashed.reset();

  DaemonProcess restarted(kArgs, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("recovered generation 0's pool from its crash journal"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("dropped "), std::string::npos) << log;
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_generation"), "1");
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_recovered{what=\"leases\"}"), "16");
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_recovered{what=\"snapshots\"}"), "16");
  for (int i = 0; i < 16; ++i) resume(restarted, parked[i], i);

  // The pinned snapshots are still pinned: deleting the leases left them in place.
  auto conn = client::Connection::connect(client_options(restarted));
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(conn.pin_snapshot({parked[i].snapshot, 64}), parked[i].pinned ? 0u : 1u)
        << "client " << i;
  }
}

TEST(CrashRecovery, ATornJournalIsDetectedAndThePreviousImageServes) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  auto crashed = std::make_unique<DaemonProcess>(kArgs, under(manager));
  const Parked first = park(*crashed, 0);
  wait_for_journal(manager, 1, 1);
  const Parked second = park(*crashed, 1);
  wait_for_journal(manager, 2, 2);
  EXPECT_EQ(crashed->stop(SIGKILL, 5s), 128 + SIGKILL);
  crashed.reset();

  // A write cut short: the newest slot's record checksum no longer matches (the first
  // thing a write does to the slot it overwrites).
  const std::uint64_t newest = stored_journal(manager)->sequence;
  {
    const int fd = manager.stored_fd(journal_name(manager));
    const off_t size = ::lseek(fd, 0, SEEK_END);
    void* base =
        ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(base, MAP_FAILED);
    auto* bytes = static_cast<std::byte*>(base);
    for (const std::size_t record : handover::kJournalRecordOffsets) {
      std::uint64_t sequence = 0;
      std::memcpy(&sequence, bytes + record + handover::kJournalSequenceField, sizeof sequence);
      if (sequence == newest) bytes[record + handover::kJournalRecordCrcField] ^= std::byte{0xff};
    }
    ::munmap(base, static_cast<std::size_t>(size));
  }

  DaemonProcess restarted(kArgs, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("is torn: record checksum mismatch (a write cut short); using sequence " +
                     std::to_string(newest - 1)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("write " + std::to_string(newest - 1) + ","), std::string::npos) << log;
  // The first client's state was complete long before the torn write.
  resume(restarted, first, 0);
}

TEST(CrashRecovery, AJournalWithNoCompleteImageRecoversNothingAndReleasesTheMemory) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  const Parked parked = park_and_crash(manager, kArgs, 0);
  {
    const int fd = manager.stored_fd(journal_name(manager));
    for (const std::size_t record : handover::kJournalRecordOffsets) {
      const std::byte flipped{0x5a};
      ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(record)), 1);
    }
  }

  DaemonProcess restarted(kArgs, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("the journal holds no complete image"), std::string::npos) << log;
  EXPECT_NE(log.find("nothing could be recovered"), std::string::npos) << log;
  // The arena's memory left the store; a new, empty journal took the old one's place.
  EXPECT_TRUE(eventually([&] { return stored_arenas(manager) == 0; }, 5s));
  EXPECT_TRUE(eventually(
      [&] {
        const auto view = stored_journal(manager);
        return view && view->leases == 0;
      },
      5s));
  auto options = client_options(restarted);
  options.lease_token = parked.token;
  auto conn = client::Connection::connect(options);
  EXPECT_FALSE(conn.lease_resumed());
}

TEST(CrashRecovery, LeasesWhoseGraceEndedWhileNoDaemonRanAreDropped) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  const std::vector<std::string> args = {"--grace-period", "3s", "--crash-journal-interval", "5ms"};
  const Parked parked = park_and_crash(manager, args, 0);
  std::this_thread::sleep_for(3500ms);  // longer than the grace period: no daemon runs

  DaemonProcess restarted(args, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("its grace period ended while the daemon was down"), std::string::npos) << log;
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_recovered{what=\"dropped_leases\"}"), "1");
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_recovered{what=\"snapshots\"}"), "1");
  auto options = client_options(restarted);
  options.lease_token = parked.token;
  EXPECT_FALSE(client::Connection::connect(options).lease_resumed());
  // Its snapshot outlived it, in the recovered arena.
  auto conn = client::Connection::connect(client_options(restarted));
  EXPECT_EQ(conn.pin_snapshot({parked.snapshot, 64}), parked.pinned ? 0u : 1u);
}

TEST(CrashRecovery, ACleanStopLeavesNothingInTheStore) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  DaemonProcess daemon(kArgs, under(manager));
  (void)park(daemon, 0);
  wait_for_journal(manager, 1, 1);
  EXPECT_GT(manager.stored_count(), 1u);
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
  EXPECT_TRUE(eventually([&] { return manager.stored_count() == 0; }, 5s))
      << "left in the store after a clean stop";
}

TEST(CrashRecovery, ASuccessorContinuesTheJournalAndIsRecoveredAfterItsOwnCrash) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  DaemonProcess old(kArgs, under(manager));
  std::vector<Parked> parked;
  for (int i = 0; i < 4; ++i) parked.push_back(park(old, i));
  wait_for_journal(manager, 4, 4);
  const std::string journal = journal_name(manager);

  DaemonOptions options = under(manager);
  options.take_over_from = &old;
  auto successor = std::make_unique<DaemonProcess>(kArgs, options);
  EXPECT_NE(successor->log().find("continuing the crash journal " + journal), std::string::npos)
      << successor->log();
  EXPECT_TRUE(eventually([&] { return !old.running(); }, 20s)) << old.log();
  EXPECT_EQ(old.stop(SIGKILL, 1s), 0) << old.log();
  parked.push_back(park(*successor, 4));
  wait_for_journal(manager, 5, 5);
  // The same journal, written by the successor; the predecessor's exit removed nothing.
  EXPECT_EQ(journal_name(manager), journal);
  std::size_t journals = 0;
  for (const std::string& name : manager.stored_names()) {
    journals += name.rfind("statepool-journal-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(journals, 1u);
  EXPECT_EQ(successor->stop(SIGKILL, 5s), 128 + SIGKILL);
  successor.reset();

  DaemonProcess restarted(kArgs, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("recovered generation 1's pool from its crash journal"), std::string::npos)
      << log;
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_generation"), "2");
  for (int i = 0; i < 5; ++i) resume(restarted, parked[i], i);
}

TEST(CrashRecovery, ADaemonThatKeepsNoJournalRecoversAndEmptiesTheStore) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  const Parked parked = park_and_crash(manager, kArgs, 0);

  // Restarted with the journal off: it recovers, but the store must not keep a journal
  // that nobody writes any more (a later crash would restore it over newer pages).
  std::vector<std::string> args = kArgs;
  args.back() = "off";
  DaemonProcess restarted(args, under(manager));
  EXPECT_NE(restarted.log().find("not continuing the crash journal"), std::string::npos)
      << restarted.log();
  EXPECT_TRUE(eventually([&] { return manager.stored_count() == 0; }, 5s))
      << "left in the store: " << manager.stored_names().size();
  resume(restarted, parked, 0);
}

// The journal records who owns each page, the memfds hold the pages' bytes: a snapshot
// deleted (or evicted) after the last write whose page another snapshot took must not come
// back with that one's bytes. The writer checksums each snapshot's pages; the recovery
// drops a snapshot whose pages changed.
TEST(CrashRecovery, ASnapshotWhosePageWasReusedAfterTheLastWriteIsDropped) {
  TempDir dir("/tmp/statepool-sm");
  ServiceManager manager(dir.path());
  const std::vector<std::string> args = {"--grace-period", "60s", "--crash-journal-interval", "5s"};
  auto crashed = std::make_unique<DaemonProcess>(args, under(manager));
  const Parked parked = park(*crashed, 1);  // not pinned
  wait_for_journal(manager, 1, 1);
  const std::uint64_t sequence = stored_journal(manager)->sequence;
  {
    // Well within the next interval: the snapshot goes, and another takes its page (the
    // pool reuses the page freed last first).
    auto options = client_options(*crashed);
    options.lease_token = parked.token;
    auto conn = client::Connection::connect(options);
    ASSERT_TRUE(conn.lease_resumed());
    auto arena = conn.open_arena(conn.register_layout(statepool::testing::layout_of(parked.codec)));
    auto other = conn.adopt(parked.arena, parked.slots[1]);
    EXPECT_EQ(conn.delete_snapshot({parked.snapshot, 64}), 1u);
    EXPECT_TRUE(conn.put_snapshot(other, {"another prefix", 64}).created);
    (void)other.release();
  }
  ASSERT_EQ(stored_journal(manager)->sequence, sequence) << "the journal was written meanwhile";
  EXPECT_EQ(crashed->stop(SIGKILL, 5s), 128 + SIGKILL);
  crashed.reset();

  DaemonProcess restarted(args, under(manager));
  const std::string log = restarted.log();
  EXPECT_NE(log.find("its pages changed after the journal's last write"), std::string::npos) << log;
  EXPECT_EQ(metric(restarted.metrics_port(), "statepool_recovered{what=\"dropped_snapshots\"}"),
            "1");
  auto options = client_options(restarted);
  options.lease_token = parked.token;
  auto conn = client::Connection::connect(options);
  ASSERT_TRUE(conn.lease_resumed());
  auto arena = conn.open_arena(conn.register_layout(statepool::testing::layout_of(parked.codec)));
  auto slot = conn.adopt(parked.arena, parked.slots[0]);
  EXPECT_FALSE(conn.get_snapshot({parked.snapshot, 64}, slot).hit)
      << "the deleted snapshot came back over another one's page";
  (void)slot.release();
}
