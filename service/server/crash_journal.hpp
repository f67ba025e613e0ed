#pragma once
// Crash recovery under systemd (docs/operations.md "Crash recovery"): the daemon keeps
// every arena's memfd and a crash journal (handover/journal.hpp: the latest hand-over
// image, two checksummed slots) in its unit's file-descriptor store (FDSTORE=1). When the
// process dies (kill -9, a crash), systemd keeps those descriptors and passes them to the
// restarted daemon (LISTEN_FDS, LISTEN_FDNAMES), which recovers the pool the journal
// describes (recover()) before it serves.
//
// Names in the store:
//   statepool-arena-<id>       an arena's memory (its memfd, or a CUDA VMM allocation's
//                              exported descriptor)
//   statepool-journal-<k>      the journal; k grows when an image outgrows it (a larger
//                              journal is stored before the smaller one is removed)
//
// CrashJournal's thread saves the pool's state (Pool::save_state) when Pool::changes()
// has moved, at most once per --crash-journal-interval, encodes it and writes it to the
// journal: a crash loses the changes of at most that interval and one write. Arena
// descriptors are stored (and confirmed: sd_notify_barrier) before a journal that names
// them is written, and removed only after a journal that no longer names them is written.
// Each snapshot's pages are checksummed once (the journal holds who owns a page, the
// memfds hold its bytes as they are at the crash). It never runs on an I/O thread.
//
// recover() reads what was passed: the journal with the highest k that holds a complete
// image (a torn newest slot falls back to the previous image; every other journal is
// removed from the store), then restores the pool from it, dropping, with a line each for
// the log: arenas whose memory is missing and the leases and snapshots in them, leases
// whose grace period ended while the daemon was down (the journal's age counts), arena
// descriptors the journal does not name (created after its last write: released), and
// snapshots whose pages no longer match their checksum (deleted or evicted after the last
// write, the page reused; or never checked: device memory).
//
// Thread-safety: a CrashJournal is driven by one thread (main, the hand-over thread);
// its writer thread is its own.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "handover/image.hpp"
#include "handover/journal.hpp"
#include "metrics/metrics.hpp"
#include "pool/pool.hpp"
#include "server/systemd.hpp"

namespace statepool::service {

inline constexpr std::string_view kStoredArenaPrefix = "statepool-arena-";
inline constexpr std::string_view kStoredJournalPrefix = "statepool-journal-";

/// A journal that continues (recovered, or handed over by the predecessor), with its name
/// in the store and the arenas known to be stored beside it (the others are stored again:
/// the service manager keeps one copy of a file it holds already).
struct KeptJournal {
  handover::Journal journal;
  std::string name;
  std::set<ArenaId> stored_arenas;
};

class CrashJournal {
 public:
  /// Starts the writer for `pool` (`meta`: what the images say about this daemon), first
  /// writing soon after start. `kept`: a journal to continue; without one, a new journal
  /// is made and stored as statepool-journal-`first_index` (above every journal the store
  /// was seen to hold). Throws handover::JournalError when a new journal cannot be made.
  CrashJournal(Pool& pool, Metrics* metrics, handover::ImageMeta meta,
               std::chrono::milliseconds interval, std::optional<KeptJournal> kept,
               std::uint64_t first_index = 0);
  ~CrashJournal();  ///< stop(false) if still running
  CrashJournal(const CrashJournal&) = delete;
  CrashJournal& operator=(const CrashJournal&) = delete;

  /// Stops the writer. `forget`: a clean stop, so every descriptor this daemon stored is
  /// removed from the store (nothing is left to recover). Idempotent.
  void stop(bool forget);

  /// For a hand-over: writes the state once more and stops the writer, returning the
  /// journal's descriptor and name (borrowed) for the successor, who continues it.
  /// resume() restarts the writer when the hand-over fails (unless stop() came first).
  [[nodiscard]] std::pair<int, std::string> pause();
  void resume();

 private:
  void run();
  void write_once();
  /// Sets each snapshot's pages_crc (cached in crcs_), so that a recovery can tell a
  /// snapshot whose pages were reused after the write.
  void checksum_snapshots(PoolState& state);
  void start();
  void halt();  ///< stops and joins the writer thread

  Pool& pool_;
  Metrics* metrics_;
  handover::ImageMeta meta_;
  std::chrono::milliseconds interval_;
  handover::Journal journal_;
  std::string name_;
  std::uint64_t index_ = 0;       ///< k of name_
  std::set<ArenaId> stored_;      ///< arenas whose memory the service manager holds
  std::set<ArenaId> ipc_arenas_;  ///< legacy IPC arenas already warned about
  using SnapshotWhere = std::tuple<ArenaId, SlotId, std::string, std::string, std::uint64_t>;
  std::map<SnapshotWhere, std::uint32_t> crcs_;  ///< the last write's snapshots' checksums
  std::uint64_t seen_changes_ = ~std::uint64_t{0};
  std::string last_error_;  ///< logged once until a write succeeds

  std::mutex control_;    ///< serializes stop, pause and resume (main and the hand-over thread)
  bool stopped_ = false;  ///< by stop(): resume() starts nothing
  std::mutex mutex_;      ///< guards stopping_ (the writer waits on wake_)
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

/// What recover() found and did.
struct Recovered {
  Pool::RestoreReport report;
  handover::ImageMeta meta;  ///< the crashed daemon's (its generation: ours is one more)
  std::uint64_t sequence = 0;
  std::chrono::milliseconds age{0};  ///< of the journal's image when it was read
  std::vector<std::string> dropped;  ///< one line each, for the log
  std::uint32_t dropped_leases = 0;
  std::uint32_t dropped_snapshots = 0;  ///< whose pages changed after the last write
  std::optional<KeptJournal> journal;   ///< to continue; none when nothing was recovered
  /// One above the highest journal index passed: a new journal's (CrashJournal).
  std::uint64_t next_journal_index = 0;
};

/// Whether `passed` holds anything of a crashed daemon (names with the prefixes above).
[[nodiscard]] bool has_crash_state(const std::vector<systemd::PassedFd>& passed);

/// Recovers `pool` (new, as for Pool::restore_state) from the journal and arenas in
/// `passed`, taking those out of it; what it does not use is removed from the store.
/// Never throws for bad input: a journal or image it cannot use, or a state restore_state
/// refuses, recovers nothing (the reason is in `dropped`; `report` is empty). When
/// restore_state refused, `pool_spoiled` is set: the pool may hold some of the state's
/// layouts and plans and must be replaced by a new one.
[[nodiscard]] Recovered recover(Pool& pool, std::vector<systemd::PassedFd>& passed,
                                bool& pool_spoiled);

}  // namespace statepool::service
