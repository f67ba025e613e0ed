#include "pool/arena_table.hpp"

#include "statepool/protocol/status.hpp"

namespace statepool::service {

kernels::BufferRef Arena::page(SlotId slot) const noexcept {
  kernels::BufferRef buffer = memory->buffer();
  buffer.data += std::size_t{slot} * page_stride;
  buffer.size = codec->page_bytes();
  return buffer;
}

Arena* ArenaTable::find(const Key& key) noexcept {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : arenas_[it->second - 1].get();
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
  const auto [it, inserted] = index_.emplace(key, id);
  try {
    arenas_.push_back(std::move(arena));
  } catch (...) {
    index_.erase(it);
    throw;
  }
  pending_.erase(key);
  return *arenas_.back();
}

}  // namespace statepool::service
