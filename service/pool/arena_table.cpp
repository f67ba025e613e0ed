#include "pool/arena_table.hpp"

#include "statepool/support/status.hpp"

namespace statepool::service {

kernels::BufferRef Arena::page(SlotId slot) const noexcept {
  kernels::BufferRef buffer = memory->buffer();
  buffer.data += std::size_t{slot} * page_stride;
  buffer.size = codec->page_bytes();
  return buffer;
}

Arena* ArenaTable::find(const Key& key, std::uint32_t pages) noexcept {
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  Arena* best = nullptr;
  for (const ArenaId id : it->second) {
    Arena* arena = find_id(id);
    if (arena == nullptr || arena->page_count() < pages) continue;
    if (best == nullptr || arena->slots.available() > best->slots.available()) best = arena;
  }
  return best;
}

std::size_t ArenaTable::count_for_tenant(std::size_t tenant) const noexcept {
  std::size_t count = 0;
  for (const auto& [id, arena] : arenas_) count += arena->tenant == tenant;
  for (const auto& key : pending_) count += key.first == tenant;
  return count;
}

std::size_t ArenaTable::index_size() const noexcept {
  std::size_t count = 0;
  for (const auto& [key, ids] : index_) count += ids.size();
  return count;
}

Arena* ArenaTable::find_id(ArenaId id) noexcept {
  const auto it = arenas_.find(id);
  return it == arenas_.end() ? nullptr : it->second.get();
}

const Arena* ArenaTable::find_id(ArenaId id) const noexcept {
  return const_cast<ArenaTable*>(this)->find_id(id);  // NOLINT: same lookup, const view
}

Arena& ArenaTable::get(ArenaId id) {
  Arena* arena = find_id(id);
  STATEPOOL_EXPECTS(
      arena != nullptr, Status::not_found,
      "arena " + std::to_string(id) + (id >= 1 && id < next_id_ ? " was closed" : " not found"));
  return *arena;
}

const Arena& ArenaTable::get(ArenaId id) const {
  return const_cast<ArenaTable*>(this)->get(id);  // NOLINT: same lookup, const view
}

Arena& ArenaTable::add(const Key& key, std::unique_ptr<Arena> arena) {
  const ArenaId id = next_id_;
  arena->id = id;
  std::vector<ArenaId>& ids = index_[key];
  try {
    ids.push_back(id);
    Arena& added = *arenas_.emplace(id, std::move(arena)).first->second;
    ++next_id_;
    pending_.erase(key);
    return added;
  } catch (...) {
    if (!ids.empty() && ids.back() == id) ids.pop_back();
    if (ids.empty()) index_.erase(key);
    throw;
  }
}

Arena& ArenaTable::restore(const Key& key, std::unique_ptr<Arena> arena) {
  const ArenaId id = arena->id;
  STATEPOOL_EXPECTS(id != 0 && id < next_id_ && (arenas_.empty() || id > arenas_.rbegin()->first),
                    Status::internal, "arena table: restored id out of order");
  std::vector<ArenaId>& ids = index_[key];
  try {
    ids.push_back(id);
    return *arenas_.emplace(id, std::move(arena)).first->second;
  } catch (...) {
    if (!ids.empty() && ids.back() == id) ids.pop_back();
    if (ids.empty()) index_.erase(key);
    throw;
  }
}

std::unique_ptr<Arena> ArenaTable::remove(ArenaId id) noexcept {
  const auto it = arenas_.find(id);
  if (it == arenas_.end()) return nullptr;
  std::unique_ptr<Arena> arena = std::move(it->second);
  arenas_.erase(it);
  const Key key{arena->tenant, arena->layout};
  if (const auto found = index_.find(key); found != index_.end()) {
    std::erase(found->second, id);
    if (found->second.empty()) index_.erase(found);
  }
  return arena;
}

}  // namespace statepool::service
