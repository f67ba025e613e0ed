#pragma once
// LimitingResource: an adaptor that refuses an allocation when the bytes it holds plus
// the new allocation would pass a limit (RMM's limiting_resource_adaptor). The pool's
// capacity, each tenant's quota and each connection's staging budget are one each,
// chained: tenant quota -> pool capacity -> tracking -> the backend's resource.
//
// The bytes are charged before the upstream is called and given back if it throws, so
// a failed allocation charges nothing; they are given back when the allocation is
// released. A refusal is StatusError(<status given at construction>) with a message in
// human units: "tenant 'a' quota exceeded: 1.0 GiB reserved + 2.0 GiB requested > 2.5 GiB
// quota" (LimitExceeded). Nothing is allocated upstream when the limit refuses.
//
// Thread-safety: allocate() and the getters may be called concurrently. Allocations
// keep the adaptor's counter alive, so they may outlive the adaptor object.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "memory/resource.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {

/// What a LimitingResource throws when it refuses (a StatusError with the limit's status),
/// so that callers can add context to the message.
class LimitExceeded : public StatusError {
 public:
  using StatusError::StatusError;
};

/// How a limit names itself in its refusal:
///   "<subject> exceeded: <used> <held> + <requested> requested > <limit><suffix>".
struct LimitText {
  explicit LimitText(std::string subject_, std::string held_ = "reserved",
                     std::string suffix_ = "")
      : subject(std::move(subject_)), held(std::move(held_)), suffix(std::move(suffix_)) {}
  std::string subject;  ///< "tenant 'a' quota", "pool capacity"
  std::string held;     ///< what the used bytes are called
  std::string suffix;   ///< after the limit: " quota", " (--max-staging-bytes)"
};

class LimitingResource final : public ResourceAdaptor {
 public:
  /// `limit` 0 means unlimited (allocations are still counted).
  LimitingResource(MemoryResource& upstream, std::uint64_t limit, Status status, LimitText text);

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] bool unlimited() const noexcept { return limit_ == 0; }
  /// Bytes of the live allocations made through this adaptor.
  [[nodiscard]] std::uint64_t used() const noexcept { return state_->used.load(); }
  /// Bytes still available (limit - used; UINT64_MAX when unlimited).
  [[nodiscard]] std::uint64_t available() const noexcept;
  /// True when an allocation of `bytes` would be accepted now.
  [[nodiscard]] bool fits(std::uint64_t bytes) const noexcept;

 private:
  struct State {
    std::atomic<std::uint64_t> used{0};
  };
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override;
  std::shared_ptr<Allocation> do_adopt(support::UniqueFd fd, std::size_t bytes,
                                       std::string_view label, HandleKind handle) override;
  /// Charges `bytes`, then takes the upstream's allocation from `upstream()` (allocate or
  /// adopt); nothing stays charged when either throws.
  template <class Upstream>
  std::shared_ptr<Allocation> charged(std::size_t bytes, Upstream&& upstream);
  /// Adds `bytes` to used if the result stays within the limit.
  [[nodiscard]] bool try_charge(std::uint64_t bytes) noexcept;

  std::uint64_t limit_;
  Status status_;
  LimitText text_;
  std::shared_ptr<State> state_;
};

}  // namespace statepool::service
