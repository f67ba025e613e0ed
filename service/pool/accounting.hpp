#pragma once
// Byte accounting that survives failure (the RMM habit): reserve the bytes first, call the
// upstream allocator, and give the bytes back if it throws.
//
//   ByteBudget   a counter of reserved bytes against an optional limit
//   Reservation  bytes added to one or more budgets; released on destruction unless
//                commit() was called
//
// Thread-safety: none; the pool's mutex guards every budget.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace statepool::service {

class ByteBudget {
 public:
  /// limit 0 = unlimited.
  explicit ByteBudget(std::uint64_t limit = 0) noexcept : limit_(limit) {}

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  [[nodiscard]] bool unlimited() const noexcept { return limit_ == 0; }
  /// True when `bytes` more stay within the limit (overflow-safe).
  [[nodiscard]] bool fits(std::uint64_t bytes) const noexcept {
    return unlimited() || (bytes <= limit_ && used_ <= limit_ - bytes);
  }
  /// Unchecked: callers check fits() first (or deliberately go over, e.g. never).
  void add(std::uint64_t bytes) noexcept { used_ += bytes; }
  /// Saturates at zero; a release of more than was added is a bug that check() reports.
  void sub(std::uint64_t bytes) noexcept { used_ = bytes > used_ ? 0 : used_ - bytes; }

 private:
  std::uint64_t limit_;
  std::uint64_t used_ = 0;
};

/// Adds `bytes` to up to two budgets now; subtracts them again when destroyed unless
/// committed. Non-copyable, non-movable: it lives on the stack of one operation.
class Reservation {
 public:
  Reservation(std::uint64_t bytes, ByteBudget& first, ByteBudget* second = nullptr) noexcept
      : bytes_(bytes), budgets_{&first, second} {
    for (ByteBudget* budget : budgets_) {
      if (budget != nullptr) budget->add(bytes_);
    }
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() {
    if (committed_) return;
    for (ByteBudget* budget : budgets_) {
      if (budget != nullptr) budget->sub(bytes_);
    }
  }
  void commit() noexcept { committed_ = true; }

 private:
  std::uint64_t bytes_;
  std::array<ByteBudget*, 2> budgets_;
  bool committed_ = false;
};

/// Human units for messages: "512 B", "4.0 KiB", "512 MiB", "1.2 GiB" (one decimal below
/// 10 units, none above).
[[nodiscard]] std::string format_bytes(std::uint64_t bytes);

}  // namespace statepool::service
