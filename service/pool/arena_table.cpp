#include "pool/arena_table.hpp"

#include "statepool/protocol/status.hpp"

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
    Arena* arena = arenas_[id - 1].get();
    if (arena->page_count() < pages) continue;
    if (best == nullptr || arena->slots.available() > best->slots.available()) best = arena;
  }
  return best;
}

std::size_t ArenaTable::count_for_tenant(std::size_t tenant) const noexcept {
  std::size_t count = 0;
  for (const auto& arena : arenas_) count += arena->tenant == tenant;
  for (const auto& key : pending_) count += key.first == tenant;
  return count;
}

std::size_t ArenaTable::index_size() const noexcept {
  std::size_t count = 0;
  for (const auto& [key, ids] : index_) count += ids.size();
  return count;
}

Arena& ArenaTable::get(ArenaId id) {
  STATEPOOL_EXPECTS(id >= 1 && id <= arenas_.size(), Status::not_found,
                    "arena " + std::to_string(id) + " not found");
  return *arenas_[id - 1];
}

const Arena& ArenaTable::get(ArenaId id) const {
  return const_cast<ArenaTable*>(this)->get(id);  // NOLINT: same lookup, const view
}

Arena& ArenaTable::add(const Key& key, std::unique_ptr<Arena> arena) {
  const auto id = static_cast<ArenaId>(arenas_.size() + 1);
  arena->id = id;
  std::vector<ArenaId>& ids = index_[key];
  try {
    ids.push_back(id);
    arenas_.push_back(std::move(arena));
  } catch (...) {
    if (!ids.empty() && ids.back() == id) ids.pop_back();
    if (ids.empty()) index_.erase(key);
    throw;
  }
  pending_.erase(key);
  return *arenas_.back();
}

}  // namespace statepool::service
