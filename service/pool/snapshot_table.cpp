#include "pool/snapshot_table.hpp"

#include "statepool/support/status.hpp"

namespace statepool::service {

Snapshot& SnapshotTable::entry(SnapshotId id) {
  const auto it = entries_.find(id);
  STATEPOOL_EXPECTS(it != entries_.end(), Status::internal,
                    "snapshot table: no entry " + std::to_string(id));
  return it->second;
}

const Snapshot* SnapshotTable::get(SnapshotId id) const noexcept {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

const Snapshot* SnapshotTable::find(std::size_t space, std::string_view prefix,
                                    std::uint64_t position, LayoutId layout) const {
  const auto it = index_.find(Key{space, std::string(prefix), position, layout});
  return it == index_.end() ? nullptr : get(it->second);
}

std::vector<SnapshotId> SnapshotTable::with_key(std::size_t space, std::string_view prefix,
                                                std::uint64_t position) const {
  std::vector<SnapshotId> out;
  for (auto it = index_.lower_bound(Key{space, std::string(prefix), position, 0});
       it != index_.end(); ++it) {
    const auto& [s, p, pos, layout] = it->first;
    if (s != space || p != prefix || pos != position) break;
    if (get(it->second)->visible) out.push_back(it->second);
  }
  return out;
}

std::vector<SnapshotId> SnapshotTable::starting_with(std::size_t space, std::string_view start,
                                                     std::size_t limit, bool& more) const {
  std::vector<SnapshotId> out;
  more = false;
  for (auto it = index_.lower_bound(Key{space, std::string(start), 0, 0}); it != index_.end();
       ++it) {
    const auto& [s, p, pos, layout] = it->first;
    if (s != space || !std::string_view(p).starts_with(start)) break;
    if (!get(it->second)->visible) continue;
    if (out.size() == limit) {
      more = true;
      break;
    }
    out.push_back(it->second);
  }
  return out;
}

void SnapshotTable::unlist(const Snapshot& s) noexcept {
  const auto it = lru_.find(s.arena);
  if (it == lru_.end()) return;
  it->second.erase(Use{s.last_use, s.id});
  if (it->second.empty()) lru_.erase(it);
}

void SnapshotTable::list(Snapshot& s) {
  auto& uses = lru_[s.arena];
  const std::uint64_t use = ++clock_;
  uses.insert(Use{use, s.id});
  s.last_use = use;
}

const Snapshot& SnapshotTable::put(Snapshot entry, Clock::time_point now) {
  entry.id = next_id_;
  entry.visible = false;
  entry.erased = false;
  entry.pinned = false;
  entry.busy = 1;  // the writer
  entry.hits = 0;
  entry.created = now;
  entry.used = now;
  Key key{entry.space, entry.prefix, entry.position, entry.layout};
  const auto [slot, inserted] = entries_.emplace(entry.id, std::move(entry));
  STATEPOOL_EXPECTS(inserted, Status::internal, "snapshot table: id in use");
  try {
    const bool fresh = index_.emplace(std::move(key), slot->first).second;
    STATEPOOL_EXPECTS(fresh, Status::internal, "snapshot table: key in use");
  } catch (...) {
    entries_.erase(slot);
    throw;
  }
  ++next_id_;
  return slot->second;
}

const Snapshot& SnapshotTable::restore(Snapshot entry) {
  entry.id = next_id_;
  entry.visible = true;
  entry.erased = false;
  entry.busy = 0;
  Key key{entry.space, entry.prefix, entry.position, entry.layout};
  STATEPOOL_EXPECTS(!index_.contains(key), Status::invalid_argument,
                    "two snapshots under one key and layout");
  const auto [slot, inserted] = entries_.emplace(entry.id, std::move(entry));
  STATEPOOL_EXPECTS(inserted, Status::internal, "snapshot table: id in use");
  Snapshot& s = slot->second;
  try {
    index_.emplace(std::move(key), s.id);
    try {
      if (s.pinned) {
        ++pinned_[s.tenant];
      } else {
        list(s);
      }
    } catch (...) {
      index_.erase(Key{s.space, s.prefix, s.position, s.layout});
      throw;
    }
  } catch (...) {
    entries_.erase(slot);
    throw;
  }
  ++next_id_;
  return s;
}

std::optional<Snapshot> SnapshotTable::commit(SnapshotId id) {
  Snapshot& s = entry(id);
  --s.busy;
  if (s.erased) {
    if (s.busy != 0) return std::nullopt;
    return take(id);
  }
  list(s);
  s.visible = true;
  return std::nullopt;
}

std::optional<Snapshot> SnapshotTable::abort(SnapshotId id) noexcept {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  const Snapshot& s = it->second;
  if (!s.erased) index_.erase(Key{s.space, s.prefix, s.position, s.layout});
  return take(id);
}

const Snapshot& SnapshotTable::acquire(SnapshotId id, Clock::time_point now) {
  Snapshot& s = entry(id);
  STATEPOOL_EXPECTS(s.visible, Status::internal, "snapshot table: acquire of a hidden entry");
  if (!s.pinned) {
    unlist(s);
    list(s);  // strong enough: on bad_alloc the entry is only out of the LRU order
  }
  ++s.busy;
  ++s.hits;
  s.used = now;
  return s;
}

std::optional<Snapshot> SnapshotTable::release(SnapshotId id) noexcept {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  Snapshot& s = it->second;
  if (s.busy > 0) --s.busy;
  if (!s.erased || s.busy != 0) return std::nullopt;
  return take(id);
}

std::optional<Snapshot> SnapshotTable::erase(SnapshotId id) noexcept {
  const auto it = entries_.find(id);
  if (it == entries_.end() || it->second.erased) return std::nullopt;
  Snapshot& s = it->second;
  index_.erase(Key{s.space, s.prefix, s.position, s.layout});
  if (s.visible) {
    if (s.pinned) {
      --pinned_[s.tenant];
    } else {
      unlist(s);
    }
  }
  s.visible = false;
  s.erased = true;
  if (s.busy != 0) return std::nullopt;
  return take(id);
}

std::optional<Snapshot> SnapshotTable::take(SnapshotId id) noexcept {
  const auto it = entries_.find(id);
  std::optional<Snapshot> gone(std::move(it->second));  // no allocation: moves
  entries_.erase(it);
  return gone;
}

bool SnapshotTable::set_pinned(SnapshotId id, bool pinned) noexcept {
  const auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.visible || it->second.pinned == pinned) return false;
  Snapshot& s = it->second;
  try {
    if (pinned) {
      ++pinned_[s.tenant];
      unlist(s);
    } else {
      list(s);
      --pinned_[s.tenant];
    }
  } catch (...) {
    return false;  // out of memory for one node: unchanged
  }
  s.pinned = pinned;
  return true;
}

std::vector<SnapshotId> SnapshotTable::evictable(ArenaId arena, std::size_t pages) const {
  std::vector<SnapshotId> out;
  const auto it = lru_.find(arena);
  if (it == lru_.end()) return out;
  std::size_t held = 0;
  for (const auto& [use, id] : it->second) {
    if (held >= pages) break;
    const Snapshot* s = get(id);
    if (s->busy != 0) continue;
    out.push_back(id);
    held += s->pages();
  }
  return out;
}

std::size_t SnapshotTable::pages_of(std::span<const SnapshotId> ids) const noexcept {
  std::size_t held = 0;
  for (const SnapshotId id : ids) {
    if (const Snapshot* s = get(id)) held += s->pages();
  }
  return held;
}

std::vector<SlotId> Snapshot::all_pages() const {
  std::vector<SlotId> out;
  out.reserve(pages());
  out.push_back(slot);
  out.insert(out.end(), kv_pages.begin(), kv_pages.end());
  return out;
}

std::uint32_t SnapshotTable::pinned_count(std::size_t tenant) const noexcept {
  const auto it = pinned_.find(tenant);
  return it == pinned_.end() ? 0 : it->second;
}

std::vector<std::string> SnapshotTable::check() const {
  std::vector<std::string> problems;
  std::unordered_map<std::size_t, std::uint32_t> pinned;
  std::size_t listed = 0;
  std::size_t indexed = 0;
  for (const auto& [id, s] : entries_) {
    const std::string name = "snapshot " + std::to_string(id);
    if (s.id != id) problems.push_back(name + ": stored under another id");
    if (s.erased == index_.contains(Key{s.space, s.prefix, s.position, s.layout})) {
      problems.push_back(name + (s.erased ? ": erased but indexed" : ": not indexed"));
    }
    if (!s.erased) ++indexed;
    if (s.erased && s.busy == 0) problems.push_back(name + ": erased and idle but kept");
    if (s.visible && s.erased) problems.push_back(name + ": visible and erased");
    if (!s.visible && !s.erased && s.busy == 0) {
      problems.push_back(name + ": hidden, idle and not erased (a write that never ended)");
    }
    const auto lru = lru_.find(s.arena);
    const bool in_lru = lru != lru_.end() && lru->second.contains(Use{s.last_use, id});
    if (in_lru != (s.visible && !s.pinned)) {
      problems.push_back(name + (in_lru ? ": in the LRU order but pinned or hidden"
                                        : ": visible and unpinned but not in the LRU order"));
    }
    if (in_lru) ++listed;
    if (s.visible && s.pinned) ++pinned[s.tenant];
  }
  if (indexed != index_.size()) {
    problems.push_back(std::to_string(index_.size()) + " index entries for " +
                       std::to_string(indexed) + " live snapshots");
  }
  std::size_t in_order = 0;
  for (const auto& [arena, uses] : lru_) in_order += uses.size();
  if (in_order != listed) {
    problems.push_back(std::to_string(in_order) + " LRU entries for " + std::to_string(listed) +
                       " evictable snapshots");
  }
  for (const auto& [tenant, count] : pinned_) {
    const auto it = pinned.find(tenant);
    const std::uint32_t actual = it == pinned.end() ? 0 : it->second;
    if (actual != count) {
      problems.push_back("tenant " + std::to_string(tenant) + ": counts " + std::to_string(count) +
                         " pinned snapshots, holds " + std::to_string(actual));
    }
  }
  for (const auto& [tenant, count] : pinned) {
    if (!pinned_.contains(tenant)) {
      problems.push_back("tenant " + std::to_string(tenant) + ": holds " + std::to_string(count) +
                         " pinned snapshots, counts none");
    }
  }
  return problems;
}

}  // namespace statepool::service
