// OpenArena, CloseArena, OpenStaging, CloseStaging, Allocate, Free; adopt() (no request).
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "impl.hpp"
#include "requests/requests.hpp"
#include "statepool/client.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace {

using detail::Impl;
using detail::inconsistent;
using detail::str;
using detail::UniqueFd;

/// How to map the memory a reply describes.
kernels::MemoryDescriptor memory_descriptor(const wire::MemoryDescriptor* in, const char* what) {
  try {
    return protocol::from_wire(in);
  } catch (const StatusError& e) {
    inconsistent(std::string(what) + ": " + e.what());
  }
}

/// Memory this process maps with mmap: a host memfd. Device memory is imported with the
/// CUDA driver instead (the CUDA backend), and stays unmapped here.
bool host_mappable(const kernels::MemoryDescriptor& memory) noexcept {
  return memory.space == kernels::MemorySpace::host &&
         memory.handle_kind == kernels::HandleKind::memfd;
}

/// Memory this process imports with the CUDA driver (the cuda backend).
bool device_memory(const kernels::MemoryDescriptor& memory) noexcept {
  return memory.space == kernels::MemorySpace::device &&
         (memory.handle_kind == kernels::HandleKind::cuda_vmm_fd ||
          memory.handle_kind == kernels::HandleKind::cuda_ipc);
}

/// Whether an arena or staging buffer is mapped into this process as soon as it is open.
bool map_here(const kernels::MemoryDescriptor& memory, const Impl& impl) noexcept {
  return host_mappable(memory) || (device_memory(memory) && impl.map_device_memory);
}

/// Memory shared by a descriptor comes with one: `request`'s reply attached it to `fd`.
/// `what` names the memory ("arena", "buffer").
void require_fd(const kernels::MemoryDescriptor& memory, int fd, const char* request,
                const char* what) {
  if (memory.handle_is_fd() && fd < 0) {
    inconsistent(std::string(request) + "'s reply carries no file descriptor for a " +
                 std::string(kernels::to_string(memory.handle_kind)) + " " + what);
  }
}

/// An arena's page size against the page format this client computes for its layout.
void check_page_bytes(std::size_t arena_page_bytes, const kernels::PageCodec& codec) {
  if (codec.page_bytes() != arena_page_bytes) {
    inconsistent("arena page_bytes " + std::to_string(arena_page_bytes) +
                 " differ from the layout's " + std::to_string(codec.page_bytes()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Arenas

Arena Connection::open_arena(const LayoutInfo& layout, std::uint32_t pages) {
  Impl& i = impl();
  auto codec = i.codec_for(layout.id);
  if (codec == nullptr && kernels::validate(layout.layout).empty()) {
    try {
      codec = std::make_shared<const kernels::PageCodec>(layout.layout);
    } catch (const std::invalid_argument&) {
      codec = nullptr;  // no local page format; the arena is still usable by id
    }
  }
  Arena arena = open_arena(layout.id, pages);
  if (arena.codec_ == nullptr && codec != nullptr) {
    check_page_bytes(arena.page_bytes(), *codec);
    arena.codec_ = std::move(codec);
  }
  return arena;
}

Arena Connection::open_arena(LayoutId layout_id, std::uint32_t pages) {
  Impl& i = impl();
  Arena arena;
  UniqueFd fd;
  i.call<wire::OpenArena>(
      [&](auto& b) { return wire::CreateOpenArena(b, layout_id, pages, i.legacy_ipc); },
      [&](const wire::OpenArenaReply* r) {
        arena.id_ = r->arena_id();
        arena.layout_id_ = layout_id;
        arena.page_bytes_ = r->page_bytes();
        arena.page_stride_ = r->page_stride();
        arena.page_count_ = r->page_count();
        arena.bytes_ = r->bytes();
        arena.backend_ = str(r->backend());
        arena.created_ = r->created();
        arena.memory_ = memory_descriptor(r->memory(), "arena");
      },
      &fd);
  arena.fd_ = fd.release();  // owned by the arena from here on, also if a check throws
  require_fd(arena.memory_, arena.fd_, "open_arena", "arena");

  if (arena.page_stride_ < arena.page_bytes_) {
    inconsistent("page_stride " + std::to_string(arena.page_stride_) + " < page_bytes " +
                 std::to_string(arena.page_bytes_));
  }
  if (arena.page_count_ != 0 && arena.page_stride_ > arena.bytes_ / arena.page_count_) {
    inconsistent("arena of " + std::to_string(arena.page_count_) + " pages of stride " +
                 std::to_string(arena.page_stride_) + " does not fit in " +
                 std::to_string(arena.bytes_) + " bytes");
  }
  if (auto codec = i.codec_for(layout_id)) {
    check_page_bytes(arena.page_bytes_, *codec);
    arena.codec_ = std::move(codec);
  }
  if (map_here(arena.memory_, i)) arena.map();
  return arena;
}

ArenaClose Connection::close_arena(Arena arena) {
  const ArenaId id = arena.id();
  if (id == 0) {
    throw Error(Status::invalid_argument, "close_arena: the Arena is empty (moved from?)");
  }
  arena.reset();  // unmapped before the daemon frees it (legacy CUDA IPC requires that order)
  return close_arena(id);
}

ArenaClose Connection::close_arena(ArenaId arena) {
  return impl().call<wire::CloseArena>([&](auto& b) { return wire::CreateCloseArena(b, arena); },
                                       [](const wire::CloseArenaReply* r) {
                                         ArenaClose out;
                                         out.bytes = r->bytes();
                                         out.snapshots_dropped = r->snapshots_dropped();
                                         return out;
                                       });
}

// ---------------------------------------------------------------------------------------
// Staging buffers

Staging Connection::open_staging(std::uint64_t bytes) {
  if (bytes == 0) {
    throw Error(Status::invalid_argument, "open_staging: bytes must be greater than 0");
  }
  Impl& i = impl();
  Staging staging;
  UniqueFd fd;
  i.call<wire::OpenStaging>(
      [&](auto& b) { return wire::CreateOpenStaging(b, bytes, i.legacy_ipc); },
      [&](const wire::OpenStagingReply* r) {
        staging.id_ = r->staging_id();
        staging.size_ = r->bytes();
        staging.memory_ = memory_descriptor(r->memory(), "staging buffer");
      },
      &fd);
  // From here the Staging object owns the daemon-side buffer: if mapping fails, its
  // destructor closes the buffer on the daemon (the lock is no longer held).
  staging.impl_ = impl_;
  staging.fd_ = fd.release();
  require_fd(staging.memory_, staging.fd_, "open_staging", "buffer");
  if (staging.size_ < bytes) {
    inconsistent("staging buffer of " + std::to_string(staging.size_) + " bytes for a request of " +
                 std::to_string(bytes));
  }
  if (map_here(staging.memory_, i)) staging.map();
  return staging;
}

void detail::Impl::close_staging(StagingId staging) {
  call<wire::CloseStaging>([&](auto& b) { return wire::CreateCloseStaging(b, staging); },
                           [](const wire::CloseStagingReply*) {});
}

// ---------------------------------------------------------------------------------------
// Slots

std::vector<Slot> Connection::allocate(const Arena& arena, std::uint32_t count) {
  return allocate(arena.id(), count);
}

std::vector<Slot> Connection::allocate(ArenaId arena, std::uint32_t count) {
  if (count == 0) {
    throw Error(Status::invalid_argument, "allocate: count must be greater than 0");
  }
  Impl& i = impl();
  const std::vector<SlotId> ids = i.call<wire::Allocate>(
      [&](auto& b) { return wire::CreateAllocate(b, arena, count); },
      [](const wire::AllocateReply* r) {
        return r->slots() == nullptr ? std::vector<SlotId>()
                                     : std::vector<SlotId>(r->slots()->begin(), r->slots()->end());
      });
  // Slots are built without the lock: a Slot destructor (on a throw below) takes it.
  std::vector<Slot> out;
  out.reserve(ids.size());
  for (const SlotId id : ids) out.push_back(Slot(impl_, arena, id));
  if (out.size() != count) {
    inconsistent("asked for " + std::to_string(count) + " slots, got " +
                 std::to_string(out.size()));
  }
  return out;
}

Slot Connection::adopt(ArenaId arena, SlotId slot) {
  (void)impl();
  return Slot(impl_, arena, slot);
}

std::uint32_t Connection::free(std::span<Slot> slots) {
  std::map<ArenaId, std::vector<SlotId>> mine;
  std::vector<Slot*> foreign;
  for (Slot& slot : slots) {
    if (!slot.valid()) continue;
    if (slot.impl_ == impl_) {
      mine[slot.arena_id_].push_back(slot.id_);
      slot.impl_.reset();
    } else {
      foreign.push_back(&slot);
    }
  }
  std::uint32_t freed = 0;
  Impl& i = impl();
  for (const auto& [arena, ids] : mine) freed += i.free_slots(arena, ids);
  for (Slot* slot : foreign) {
    slot->free();
    ++freed;
  }
  return freed;
}

std::uint32_t Connection::free(ArenaId arena, std::span<const SlotId> slots) {
  return impl().free_slots(arena, slots);
}

std::uint32_t detail::Impl::free_slots(ArenaId arena, std::span<const SlotId> slots) {
  if (slots.empty()) return 0;
  return call<wire::Free>(
      [&](auto& b) {
        return wire::CreateFree(b, arena, b.CreateVector(slots.data(), slots.size()));
      },
      [](const wire::FreeReply* r) { return r->freed(); });
}

}  // namespace statepool::client
