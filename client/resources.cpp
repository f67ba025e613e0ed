// Arena, Staging and Slot: RAII owners of what the daemon hands out.

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "device_memory.hpp"
#include "impl.hpp"
#include "statepool/client.hpp"

namespace statepool::client {
namespace {

// Maps `bytes` of a received descriptor read-write and shared. Checks the file is large
// enough first: touching a mapping past the end of a memfd is SIGBUS, not an error.
std::byte* map_shared(int fd, std::size_t bytes, const char* what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw Error(Status::internal,
                std::string("cannot stat the ") + what + " descriptor: " + std::strerror(errno));
  }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < bytes) {
    throw Error(Status::internal, std::string("statepoold sent a ") + what + " descriptor of " +
                                      std::to_string(st.st_size) + " bytes for a region of " +
                                      std::to_string(bytes) + " bytes; refusing to map it");
  }
  if (bytes == 0) return nullptr;
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    throw Error(Status::internal,
                std::string("cannot map the ") + what + " (" + std::to_string(bytes) +
                    " bytes): " + std::strerror(errno) +
                    " — check the address-space limit (ulimit -v) and vm.max_map_count");
  }
  return static_cast<std::byte*>(base);
}

void unmap(std::byte* base, std::size_t bytes) noexcept {
  if (base != nullptr) ::munmap(base, bytes);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Arena

Arena::Arena(Arena&& other) noexcept
    : id_(other.id_),
      layout_id_(other.layout_id_),
      page_bytes_(other.page_bytes_),
      page_stride_(other.page_stride_),
      page_count_(other.page_count_),
      bytes_(other.bytes_),
      backend_(std::move(other.backend_)),
      created_(other.created_),
      memory_(other.memory_),
      fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      device_mapping_(std::move(other.device_mapping_)),
      device_base_(std::exchange(other.device_base_, nullptr)),
      codec_(std::move(other.codec_)) {
  other.reset();
}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    layout_id_ = other.layout_id_;
    page_bytes_ = other.page_bytes_;
    page_stride_ = other.page_stride_;
    page_count_ = other.page_count_;
    bytes_ = other.bytes_;
    backend_ = std::move(other.backend_);
    created_ = other.created_;
    memory_ = other.memory_;
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    device_mapping_ = std::move(other.device_mapping_);
    device_base_ = std::exchange(other.device_base_, nullptr);
    codec_ = std::move(other.codec_);
    other.reset();
  }
  return *this;
}

Arena::~Arena() {
  reset();
}

void Arena::reset() noexcept {
  unmap(base_, bytes_);
  base_ = nullptr;
  device_mapping_.reset();  // unmaps device memory
  device_base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  id_ = 0;
  layout_id_ = 0;
  page_bytes_ = 0;
  page_stride_ = 0;
  page_count_ = 0;
  bytes_ = 0;
  backend_.clear();
  created_ = false;
  memory_ = {};
  codec_.reset();
}

void Arena::map() {
  if (memory_.space == kernels::MemorySpace::device) {
    detail::DeviceMapping mapping =
        detail::map_device_memory(memory_, fd_, bytes_, "arena " + std::to_string(id_));
    device_mapping_ = std::move(mapping.owner);
    device_base_ = mapping.data;
    memory_.device = mapping.device;  // this process's ordinal from now on
    return;
  }
  base_ = map_shared(fd_, bytes_, "arena");
}

std::span<std::byte> Arena::data() const noexcept {
  return base_ == nullptr ? std::span<std::byte>() : std::span<std::byte>(base_, bytes_);
}

std::span<std::byte> Arena::page(SlotId slot) const {
  if (base_ == nullptr) {
    throw std::logic_error("Arena::page: arena " + std::to_string(id_) +
                           " is not mapped in this process (" + kernels::to_string(memory_.space) +
                           " memory, " + kernels::to_string(memory_.handle_kind) + " handle)");
  }
  if (slot >= page_count_) {
    throw std::out_of_range("Arena::page: slot " + std::to_string(slot) +
                            " is out of range for arena " + std::to_string(id_) + " of " +
                            std::to_string(page_count_) + " pages");
  }
  return {base_ + static_cast<std::size_t>(slot) * page_stride_, page_bytes_};
}

std::byte* Arena::device_page(SlotId slot) const {
  if (device_base_ == nullptr) {
    throw std::logic_error("Arena::device_page: arena " + std::to_string(id_) +
                           " has no device memory mapped in this process (" +
                           kernels::to_string(memory_.space) + " memory, " +
                           kernels::to_string(memory_.handle_kind) + " handle)");
  }
  if (slot >= page_count_) {
    throw std::out_of_range("Arena::device_page: slot " + std::to_string(slot) +
                            " is out of range for arena " + std::to_string(id_) + " of " +
                            std::to_string(page_count_) + " pages");
  }
  return device_base_ + static_cast<std::size_t>(slot) * page_stride_;
}

std::span<std::byte> Arena::page(const Slot& slot) const {
  if (slot.arena_id() != id_) {
    throw std::invalid_argument("Arena::page: slot " + std::to_string(slot.id()) +
                                " belongs to arena " + std::to_string(slot.arena_id()) +
                                ", not to arena " + std::to_string(id_));
  }
  return page(slot.id());
}

const kernels::PageCodec& Arena::codec() const {
  if (codec_ == nullptr) {
    throw std::logic_error("Arena::codec: the page format of arena " + std::to_string(id_) +
                           " is unknown here; open the arena from the LayoutInfo returned by "
                           "register_layout");
  }
  return *codec_;
}

// ---------------------------------------------------------------------------------------
// Staging

Staging::Staging(Staging&& other) noexcept
    : impl_(std::move(other.impl_)),
      id_(std::exchange(other.id_, 0)),
      size_(std::exchange(other.size_, 0)),
      memory_(other.memory_),
      fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      device_mapping_(std::move(other.device_mapping_)),
      device_base_(std::exchange(other.device_base_, nullptr)) {}

Staging& Staging::operator=(Staging&& other) noexcept {
  if (this != &other) {
    Staging old(std::move(*this));  // closes the current buffer, best-effort
    impl_ = std::move(other.impl_);
    id_ = std::exchange(other.id_, 0);
    size_ = std::exchange(other.size_, 0);
    memory_ = other.memory_;
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    device_mapping_ = std::move(other.device_mapping_);
    device_base_ = std::exchange(other.device_base_, nullptr);
  }
  return *this;
}

Staging::~Staging() {
  if (impl_ != nullptr) {
    try {
      if (impl_->healthy()) impl_->close_staging(id_);
    } catch (...) {
      // Best-effort by contract: the daemon drops the buffer with the connection anyway.
    }
  }
  release_local();
}

void Staging::map() {
  if (memory_.space == kernels::MemorySpace::device) {
    detail::DeviceMapping mapping = detail::map_device_memory(
        memory_, fd_, size_, "staging buffer " + std::to_string(id_));
    device_mapping_ = std::move(mapping.owner);
    device_base_ = mapping.data;
    memory_.device = mapping.device;  // this process's ordinal from now on
    return;
  }
  base_ = map_shared(fd_, size_, "staging buffer");
}

void Staging::release_local() noexcept {
  unmap(base_, size_);
  base_ = nullptr;
  device_mapping_.reset();
  device_base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  size_ = 0;
}

std::span<std::byte> Staging::bytes() const noexcept {
  return base_ == nullptr ? std::span<std::byte>() : std::span<std::byte>(base_, size_);
}

void Staging::close() {
  if (impl_ == nullptr) throw std::logic_error("Staging::close: the buffer is not valid");
  const auto impl = std::move(impl_);
  impl_.reset();
  const StagingId id = std::exchange(id_, 0);
  release_local();
  impl->close_staging(id);
}

// ---------------------------------------------------------------------------------------
// Slot

Slot::Slot(Slot&& other) noexcept
    : impl_(std::move(other.impl_)),
      arena_id_(std::exchange(other.arena_id_, 0)),
      id_(std::exchange(other.id_, 0)) {}

Slot& Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Slot old(std::move(*this));  // frees the current slot, best-effort
    impl_ = std::move(other.impl_);
    arena_id_ = std::exchange(other.arena_id_, 0);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Slot::~Slot() {
  if (impl_ == nullptr) return;
  try {
    if (impl_->healthy()) (void)impl_->free_slots(arena_id_, std::span<const SlotId>(&id_, 1));
  } catch (...) {
    // Best-effort by contract: the lease's slots are reclaimed after the grace period.
  }
}

SlotId Slot::release() {
  if (impl_ == nullptr) throw std::logic_error("Slot::release: the slot is not valid");
  impl_.reset();
  return id_;
}

void Slot::free() {
  if (impl_ == nullptr) throw std::logic_error("Slot::free: the slot is not valid");
  const auto impl = std::move(impl_);
  impl_.reset();
  (void)impl->free_slots(arena_id_, std::span<const SlotId>(&id_, 1));
}

}  // namespace statepool::client
