#include "server/crash_journal.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <exception>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include <boost/crc.hpp>

#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"

namespace statepool::service {
namespace {

using std::chrono::steady_clock;

/// The first journal's slots: a pool of ~10,000 pages and 1,000 leases writes ~200 KB.
constexpr std::size_t kFirstSlotBytes = std::size_t{1} << 20;

std::string arena_name(ArenaId id) {
  return std::string(kStoredArenaPrefix) + std::to_string(id);
}
std::string journal_name(std::uint64_t k) {
  return std::string(kStoredJournalPrefix) + std::to_string(k);
}

/// The number after `prefix` in `name`, when `name` is exactly prefix + digits.
std::optional<std::uint64_t> suffix_number(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return {};
  const std::string_view digits = name.substr(prefix.size());
  if (digits.size() > 1 && digits.front() == '0') return {};  // as arena_name() writes it
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return {};
  return value;
}

/// The CRC-32C of a snapshot's pages in `arena` (the bytes of its arena): its state slot,
/// then its KV pages, a page stride each; none when a page lies outside. The pages may be
/// rewritten while this reads them (the snapshot evicted since the state was saved, its
/// pages reused): the checksum then matches no later bytes, and a recovery drops the
/// snapshot, which is right for an evicted one (tests/tsan.supp names this function).
std::optional<std::uint32_t> snapshot_pages_crc(std::span<const std::byte> arena,
                                                std::size_t stride,
                                                const PoolStateSnapshot& snapshot) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  const auto add = [&](SlotId slot) {
    const std::size_t at = static_cast<std::size_t>(slot) * stride;
    if (stride == 0 || slot >= arena.size() / stride) return false;
    crc.process_bytes(arena.data() + at, stride);
    return true;
  };
  if (!add(snapshot.slot)) return std::nullopt;
  for (const SlotId page : snapshot.kv_pages) {
    if (!add(page)) return std::nullopt;
  }
  return crc.checksum();
}

/// Takes the arenas `gone` out of `state`, with their snapshots and with every lease that
/// holds a slot in one of them or is in `leases`; the slots those leases held elsewhere
/// become free. Returns the leases taken out.
std::set<LeaseId> drop_from_state(PoolState& state, const std::set<ArenaId>& gone,
                                  std::set<LeaseId> leases) {
  for (const PoolStateLease& lease : state.leases) {
    for (const auto& [arena, slot] : lease.slots) {
      if (gone.count(arena) != 0) leases.insert(lease.id);
    }
  }
  std::erase_if(state.leases, [&](const PoolStateLease& l) { return leases.count(l.id) != 0; });
  std::erase_if(state.arenas, [&](const PoolStateArena& a) { return gone.count(a.id) != 0; });
  std::erase_if(state.snapshots,
                [&](const PoolStateSnapshot& s) { return gone.count(s.arena) != 0; });
  for (PoolStateArena& arena : state.arenas) {
    for (LeaseId& owner : arena.owner) {
      if (leases.count(owner) != 0) owner = 0;
    }
  }
  return leases;
}

}  // namespace

// --- the writer ----------------------------------------------------------------------

CrashJournal::CrashJournal(Pool& pool, Metrics* metrics, handover::ImageMeta meta,
                           std::chrono::milliseconds interval, std::optional<KeptJournal> kept,
                           std::uint64_t first_index)
    : pool_(pool),
      metrics_(metrics),
      meta_(std::move(meta)),
      interval_(interval),
      journal_(kept ? std::move(kept->journal) : handover::Journal::create(kFirstSlotBytes)) {
  if (kept) {
    name_ = std::move(kept->name);
    index_ = suffix_number(name_, kStoredJournalPrefix).value_or(0);
    stored_ = std::move(kept->stored_arenas);
    LOG_INFO("journal", "continuing the crash journal ", name_, " (writes at most every ",
             interval_.count(), " ms)");
  } else {
    // Above every journal the store was seen to hold: a recovery prefers the highest.
    index_ = first_index;
    name_ = journal_name(index_);
    systemd::store_fd(name_, journal_.fd());
    LOG_INFO("journal", "crash journal ", name_, " in the service manager's descriptor store ",
             "(writes at most every ", interval_.count(), " ms)");
  }
  start();
}

CrashJournal::~CrashJournal() {
  stop(false);
}

void CrashJournal::start() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { run(); });
}

void CrashJournal::stop(bool forget) {
  const std::lock_guard control(control_);
  stopped_ = true;
  halt();
  if (forget && !name_.empty()) {
    for (const ArenaId id : stored_) systemd::remove_stored_fd(arena_name(id));
    stored_.clear();
    systemd::remove_stored_fd(name_);
    name_.clear();
  }
}

void CrashJournal::halt() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::pair<int, std::string> CrashJournal::pause() {
  const std::lock_guard control(control_);
  halt();
  seen_changes_ = ~std::uint64_t{0};
  write_once();  // the successor starts from the paused state even if it never writes
  return {journal_.fd(), name_};
}

void CrashJournal::resume() {
  const std::lock_guard control(control_);
  if (!stopped_ && !thread_.joinable()) start();
}

void CrashJournal::checksum_snapshots(PoolState& state) {
  // A snapshot's pages do not change while it lives: each is read once, when it first
  // appears in a journal (keyed by where it is and what it is).
  std::map<SnapshotWhere, std::uint32_t> now;
  for (PoolStateSnapshot& snapshot : state.snapshots) {
    const SnapshotWhere where{snapshot.arena, snapshot.slot, snapshot.space, snapshot.prefix,
                              snapshot.position};
    if (const auto it = crcs_.find(where); it != crcs_.end()) {
      snapshot.pages_crc = it->second;
    } else {
      const auto arena =
          std::find_if(state.arenas.begin(), state.arenas.end(),
                       [&](const PoolStateArena& a) { return a.id == snapshot.arena; });
      // Device memory cannot be read here: such snapshots go unchecked, and a recovery
      // drops them.
      if (arena == state.arenas.end() || arena->memory == nullptr ||
          arena->memory->info().where.space != kernels::MemorySpace::host) {
        continue;
      }
      snapshot.pages_crc =
          snapshot_pages_crc(arena->memory->host_bytes(), arena->page_stride, snapshot);
    }
    if (snapshot.pages_crc) now.emplace(where, *snapshot.pages_crc);
  }
  crcs_ = std::move(now);
}

void CrashJournal::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    if (pool_.changes() != seen_changes_) write_once();
    lock.lock();
    wake_.wait_for(lock, interval_, [this] { return stopping_; });
  }
}

void CrashJournal::write_once() {
  const std::uint64_t changes = pool_.changes();  // before the save: it covers at least these
  const auto started = steady_clock::now();
  try {
    PoolState state = pool_.save_state();
    // Memory that cannot be kept in the store stays out of the journal, with the leases
    // and snapshots in it (a crash loses those): legacy CUDA IPC arenas, and an arena the
    // service manager was not sent (tried again at the next write).
    std::set<ArenaId> left_out;
    bool stored_new = false;
    for (const PoolStateArena& arena : state.arenas) {
      if (arena.fd < 0) {
        if (ipc_arenas_.insert(arena.id).second) {
          LOG_WARN("journal", "arena ", arena.id,
                   " is shared as legacy CUDA IPC handles, which outlive no process: the crash "
                   "journal leaves it out, and its states are lost in a crash");
        }
        left_out.insert(arena.id);
      } else if (stored_.count(arena.id) == 0) {
        if (systemd::store_fd(arena_name(arena.id), arena.fd)) {
          stored_.insert(arena.id);
          stored_new = true;
        } else {
          left_out.insert(arena.id);
        }
      }
    }
    // A journal names an arena only once the service manager holds its memory: its
    // messages are processed in order, and the barrier waits until they are.
    if (stored_new && !systemd::barrier()) {
      throw std::runtime_error("the service manager did not confirm the arenas' descriptors");
    }
    if (!left_out.empty()) (void)drop_from_state(state, left_out, {});
    std::set<ArenaId> named;
    for (const PoolStateArena& arena : state.arenas) named.insert(arena.id);
    checksum_snapshots(state);
    const std::vector<std::byte> image = handover::encode_image(state, meta_);
    if (image.size() > journal_.slot_bytes()) {
      // A larger journal, stored before the smaller one goes: the store always holds one
      // with a complete image.
      handover::Journal larger = handover::Journal::create(std::min<std::size_t>(
          std::max(image.size() * 2, journal_.slot_bytes() * 2), handover::kMaxJournalSlotBytes));
      larger.write(image);
      const std::string larger_name = journal_name(index_ + 1);
      if (!systemd::store_fd(larger_name, larger.fd()) || !systemd::barrier()) {
        throw std::runtime_error("the service manager did not take the larger journal " +
                                 larger_name);
      }
      systemd::remove_stored_fd(name_);
      LOG_INFO("journal", "the pool's image (", support::format_bytes(image.size()), ") outgrew ",
               name_, ": continuing in ", larger_name, " (slots of ",
               support::format_bytes(larger.slot_bytes()), ")");
      journal_ = std::move(larger);
      name_ = larger_name;
      ++index_;
    } else {
      journal_.write(image);
    }
    // Removed only once a journal without them is written.
    for (auto it = stored_.begin(); it != stored_.end();) {
      if (named.count(*it) != 0) {
        ++it;
        continue;
      }
      systemd::remove_stored_fd(arena_name(*it));
      it = stored_.erase(it);
    }
    seen_changes_ = changes;
    if (!last_error_.empty()) {
      LOG_INFO("journal", "the crash journal is written again");
      last_error_.clear();
    }
    if (metrics_ != nullptr) {
      metrics_->journal_written(
          image.size(), std::chrono::duration<double>(steady_clock::now() - started).count());
    }
  } catch (const std::exception& e) {
    // Retried at the next interval; said once, not every interval.
    if (last_error_ != e.what()) {
      last_error_ = e.what();
      LOG_ERROR("journal", "cannot write the crash journal (a crash now loses the changes since ",
                "its last write): ", e.what());
    }
  }
}

// --- recovery ------------------------------------------------------------------------

namespace {

/// Drops the snapshots whose pages no longer hold what the journal's writer checksummed
/// (evicted or deleted after its last write, the pages reused), and those it could not
/// check (device memory), freeing their pages; one line each in `dropped`. Reads each
/// arena's memory through its descriptor (`fd`), mapped read-only for the moment.
std::uint32_t drop_changed_snapshots(PoolState& state, std::vector<std::string>& dropped) {
  struct Mapped {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  std::map<ArenaId, Mapped> mapped;
  for (const PoolStateArena& arena : state.arenas) {
    struct stat st {};
    if (::fstat(arena.fd, &st) != 0 || st.st_size <= 0) continue;
    const auto bytes = static_cast<std::size_t>(st.st_size);
    void* at = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, arena.fd, 0);
    if (at != MAP_FAILED) mapped[arena.id] = {static_cast<const std::byte*>(at), bytes};
  }
  std::uint32_t count = 0;
  std::erase_if(state.snapshots, [&](const PoolStateSnapshot& snapshot) {
    const auto it = mapped.find(snapshot.arena);
    std::string why;
    if (!snapshot.pages_crc || it == mapped.end()) {
      why = "its pages could not be checked";
    } else {
      const auto crc = snapshot_pages_crc(
          {it->second.data, it->second.bytes},
          std::find_if(state.arenas.begin(), state.arenas.end(),
                       [&](const PoolStateArena& a) { return a.id == snapshot.arena; })
              ->page_stride,
          snapshot);
      if (crc == snapshot.pages_crc) return false;
      why = "its pages changed after the journal's last write (evicted, and reused)";
    }
    dropped.push_back("snapshot at position " + std::to_string(snapshot.position) + " in arena " +
                      std::to_string(snapshot.arena) + " slot " + std::to_string(snapshot.slot) +
                      ": " + why);
    for (PoolStateArena& arena : state.arenas) {
      if (arena.id != snapshot.arena) continue;
      const auto free_slot = [&](SlotId slot) {
        if (slot < arena.owner.size() && arena.owner[slot] == kSnapshotOwner) arena.owner[slot] = 0;
      };
      free_slot(snapshot.slot);
      for (const SlotId page : snapshot.kv_pages) free_slot(page);
    }
    ++count;
    return true;
  });
  for (const auto& [id, m] : mapped) ::munmap(const_cast<std::byte*>(m.data), m.bytes);
  return count;
}

}  // namespace

bool has_crash_state(const std::vector<systemd::PassedFd>& passed) {
  return std::any_of(passed.begin(), passed.end(), [](const systemd::PassedFd& p) {
    return p.name.rfind(kStoredArenaPrefix, 0) == 0 || p.name.rfind(kStoredJournalPrefix, 0) == 0;
  });
}

Recovered recover(Pool& pool, std::vector<systemd::PassedFd>& passed, bool& pool_spoiled) {
  pool_spoiled = false;
  Recovered out;
  // Take what is ours out of `passed`: journals by k (highest first), arenas by id.
  std::multimap<std::uint64_t, systemd::PassedFd, std::greater<>> journals;
  std::map<ArenaId, support::UniqueFd> arenas;
  for (auto it = passed.begin(); it != passed.end();) {
    if (const auto k = suffix_number(it->name, kStoredJournalPrefix)) {
      journals.emplace(*k, std::move(*it));
    } else if (const auto id = suffix_number(it->name, kStoredArenaPrefix);
               id && *id <= std::numeric_limits<ArenaId>::max()) {
      // A name given twice (a store that keeps duplicates) counts once.
      arenas.emplace(static_cast<ArenaId>(*id), std::move(it->fd));
    } else if (it->name.rfind("statepool-", 0) == 0) {
      out.dropped.push_back("stored descriptor '" + it->name + "' is not one this daemon reads");
      systemd::remove_stored_fd(it->name);
    } else {
      ++it;
      continue;
    }
    it = passed.erase(it);
  }
  const auto release_arenas = [&](const std::string& why) {
    for (const auto& [id, fd] : arenas) {
      out.dropped.push_back("arena " + std::to_string(id) + ": " + why);
      systemd::remove_stored_fd(arena_name(id));
    }
    arenas.clear();
  };
  // Nothing is recovered: the stored memory and the journal go (a new journal replaces it).
  const auto recover_nothing = [&](const std::string& why) {
    out.dropped.push_back(why);
    release_arenas("its memory is released");
    if (out.journal) systemd::remove_stored_fd(out.journal->name);
    out.journal.reset();
    out.report = {};
    return std::move(out);
  };

  // The newest journal with a complete image; the others leave the store (by name: never
  // the chosen one's, which a store that keeps duplicates may give twice).
  if (!journals.empty()) out.next_journal_index = journals.begin()->first + 1;
  std::optional<handover::JournalRead> read;
  for (auto& [k, passed_journal] : journals) {
    const std::string name = passed_journal.name;
    if (out.journal) {
      if (name != out.journal->name) systemd::remove_stored_fd(name);
      continue;
    }
    try {
      handover::Journal journal = handover::Journal::open(std::move(passed_journal.fd));
      handover::JournalRead r = journal.read();
      for (const std::string& line : r.dropped) out.dropped.push_back(name + ": " + line);
      read = std::move(r);
      out.journal = KeptJournal{std::move(journal), name, {}};
    } catch (const handover::JournalError& e) {
      out.dropped.push_back(name + ": " + e.what());
      systemd::remove_stored_fd(name);
    }
  }
  if (!read) return recover_nothing("the store holds no crash journal with a complete image");
  out.sequence = read->sequence;
  out.age = std::chrono::duration_cast<std::chrono::milliseconds>(read->age);

  handover::DecodedImage image;
  try {
    image = handover::decode_image(read->image);
  } catch (const std::exception& e) {
    return recover_nothing(out.journal->name + ": " + e.what());
  }
  out.meta = image.meta;
  if (const std::string differs =
          handover::backend_mismatch(image.meta, pool.backend_name(), pool.memory().device());
      !differs.empty()) {
    return recover_nothing("the crashed daemon's pool was on " + differs);
  }

  PoolState& state = image.state;
  // Arenas without memory go, with every lease and snapshot in them; so do leases whose
  // grace period ended while no daemon ran.
  std::set<ArenaId> gone_arenas;
  for (const PoolStateArena& arena : state.arenas) {
    if (arenas.count(arena.id) == 0) {
      gone_arenas.insert(arena.id);
      out.dropped.push_back("arena " + std::to_string(arena.id) +
                            ": its memory is not in the store; its leases and snapshots go");
    }
  }
  std::set<LeaseId> expired;
  for (PoolStateLease& lease : state.leases) {
    if (lease.grace_left <= out.age) {
      expired.insert(lease.id);
      out.dropped.push_back("lease " + std::to_string(lease.id) + " (tenant " + lease.tenant +
                            "): its grace period ended while the daemon was down");
    } else {
      lease.grace_left -= out.age;
    }
  }
  out.dropped_leases =
      static_cast<std::uint32_t>(drop_from_state(state, gone_arenas, std::move(expired)).size());
  for (PoolStateArena& arena : state.arenas) {
    arena.fd = arenas.at(arena.id).get();  // borrowed: restore_state takes its own copy
  }
  out.dropped_snapshots = drop_changed_snapshots(state, out.dropped);
  // Memory the journal does not name: an arena created after its last write.
  for (auto it = arenas.begin(); it != arenas.end();) {
    const bool named = std::any_of(state.arenas.begin(), state.arenas.end(),
                                   [&](const PoolStateArena& a) { return a.id == it->first; });
    if (named) {
      ++it;
      continue;
    }
    out.dropped.push_back("arena " + std::to_string(it->first) +
                          ": not in the crash journal (created after its last write); its "
                          "memory is released");
    systemd::remove_stored_fd(arena_name(it->first));
    it = arenas.erase(it);
  }
  try {
    out.report = pool.restore_state(state, Clock::now());
  } catch (const std::exception& e) {
    pool_spoiled = true;
    return recover_nothing(std::string("the journal's pool cannot be restored: ") + e.what());
  }
  for (const PoolStateArena& arena : state.arenas) out.journal->stored_arenas.insert(arena.id);
  return out;
}

}  // namespace statepool::service
