#include "server/crash_journal.hpp"

#include <algorithm>
#include <charconv>
#include <exception>
#include <limits>
#include <map>
#include <utility>

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
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return {};
  return value;
}

}  // namespace

// --- the writer ----------------------------------------------------------------------

CrashJournal::CrashJournal(Pool& pool, Metrics* metrics, handover::ImageMeta meta,
                           std::chrono::milliseconds interval, std::optional<KeptJournal> kept)
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
    name_ = journal_name(index_);
    // Whatever journal of that name a predecessor left goes first: the new one is empty.
    systemd::remove_stored_fd(name_);
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
    const PoolState state = pool_.save_state();
    std::set<ArenaId> named;
    for (const PoolStateArena& arena : state.arenas) {
      if (arena.fd < 0) {
        throw std::runtime_error("arena " + std::to_string(arena.id) +
                                 " is shared as legacy CUDA IPC handles, which outlive no "
                                 "process: the journal cannot cover it");
      }
      named.insert(arena.id);
      // Stored before a journal names it: a recovered journal never lacks its memory.
      if (stored_.insert(arena.id).second) systemd::store_fd(arena_name(arena.id), arena.fd);
    }
    const std::vector<std::byte> image = handover::encode_image(state, meta_);
    if (image.size() > journal_.slot_bytes()) {
      // A larger journal, stored before the smaller one goes: the store always holds one
      // with a complete image.
      handover::Journal larger = handover::Journal::create(std::min<std::size_t>(
          std::max(image.size() * 2, journal_.slot_bytes() * 2), handover::kMaxJournalSlotBytes));
      larger.write(image);
      const std::string larger_name = journal_name(index_ + 1);
      systemd::store_fd(larger_name, larger.fd());
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

  // The newest journal with a complete image; the others leave the store.
  std::optional<handover::JournalRead> read;
  for (auto& [k, passed_journal] : journals) {
    const std::string name = passed_journal.name;
    if (out.journal) {
      systemd::remove_stored_fd(name);
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
  // Arenas without memory go, with every lease and snapshot in them.
  std::set<LeaseId> gone_leases;
  std::set<ArenaId> gone_arenas;
  for (const PoolStateArena& arena : state.arenas) {
    if (arenas.count(arena.id) == 0) {
      gone_arenas.insert(arena.id);
      out.dropped.push_back("arena " + std::to_string(arena.id) +
                            ": its memory is not in the store; its leases and snapshots go");
    }
  }
  // Leases whose grace period ended while no daemon ran.
  for (PoolStateLease& lease : state.leases) {
    const bool lost = std::any_of(lease.slots.begin(), lease.slots.end(), [&](const auto& slot) {
      return gone_arenas.count(slot.first) != 0;
    });
    if (lost) {
      gone_leases.insert(lease.id);
    } else if (lease.grace_left <= out.age) {
      gone_leases.insert(lease.id);
      out.dropped.push_back("lease " + std::to_string(lease.id) + " (tenant " + lease.tenant +
                            "): its grace period ended while the daemon was down");
    } else {
      lease.grace_left -= out.age;
    }
  }
  out.dropped_leases = static_cast<std::uint32_t>(gone_leases.size());
  std::erase_if(state.leases, [&](const PoolStateLease& l) { return gone_leases.count(l.id); });
  std::erase_if(state.arenas, [&](const PoolStateArena& a) { return gone_arenas.count(a.id); });
  std::erase_if(state.snapshots,
                [&](const PoolStateSnapshot& s) { return gone_arenas.count(s.arena) != 0; });
  for (PoolStateArena& arena : state.arenas) {
    for (LeaseId& owner : arena.owner) {
      if (gone_leases.count(owner) != 0) owner = 0;
    }
    arena.fd = arenas.at(arena.id).get();  // borrowed: restore_state takes its own copy
  }
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
