#pragma once
// Memory backends: where arena and staging bytes live.
//
// `host`: a sealed memfd mapped MAP_SHARED; the fd is what clients receive over
// SCM_RIGHTS and map themselves. The embedded default, so everything runs without a GPU.
// (`cuda` arrives with the CUDA backend issue: cuMemCreate + POSIX-FD handles.)
//
// Thread-safety: a Memory object may be read and written from several threads as long as
// they touch disjoint bytes; creation and destruction are not synchronised.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace statepool::service {

/// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept;
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// One shareable memory region.
class Memory {
 public:
  virtual ~Memory() = default;
  /// The bytes, mapped into this process.
  [[nodiscard]] virtual std::span<std::byte> bytes() noexcept = 0;
  /// A descriptor a peer can map (borrowed; valid as long as this object lives).
  [[nodiscard]] virtual int share_fd() const noexcept = 0;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Allocates `bytes` (> 0) of zeroed shareable memory. `label` names it for debugging
  /// (memfd name). Throws StatusError(pool_exhausted) when the system refuses and
  /// StatusError(internal) on other OS failures, with errno text in the message.
  [[nodiscard]] virtual std::unique_ptr<Memory> allocate(std::size_t bytes,
                                                         std::string_view label) = 0;
};

/// memfd_create + ftruncate + seals (no shrink, no grow) + mmap(MAP_SHARED).
/// Sealing matters: a client holding the fd cannot truncate it under the daemon.
class HostBackend final : public MemoryBackend {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "host"; }
  [[nodiscard]] std::unique_ptr<Memory> allocate(std::size_t bytes,
                                                 std::string_view label) override;
};

}  // namespace statepool::service
