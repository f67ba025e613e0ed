#include "memory/limiting.hpp"

#include <limits>
#include <utility>

#include "statepool/support/size.hpp"

namespace statepool::service {
namespace {

/// Gives the charged bytes back when the allocation is released.
template <class State>
class ChargedAllocation final : public AdaptedAllocation {
 public:
  ChargedAllocation(std::shared_ptr<Allocation> upstream, std::shared_ptr<State> state,
                    std::uint64_t bytes) noexcept
      : AdaptedAllocation(std::move(upstream)), state_(std::move(state)), bytes_(bytes) {}
  ~ChargedAllocation() override { state_->used.fetch_sub(bytes_); }

 private:
  std::shared_ptr<State> state_;
  std::uint64_t bytes_;
};

}  // namespace

LimitingResource::LimitingResource(MemoryResource& upstream, std::uint64_t limit, Status status,
                                   LimitText text)
    : ResourceAdaptor(upstream),
      limit_(limit),
      status_(status),
      text_(std::move(text)),
      state_(std::make_shared<State>()) {}

std::uint64_t LimitingResource::available() const noexcept {
  if (unlimited()) return std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t now = used();
  return now >= limit_ ? 0 : limit_ - now;
}

bool LimitingResource::fits(std::uint64_t bytes) const noexcept {
  return unlimited() || bytes <= available();
}

bool LimitingResource::try_charge(std::uint64_t bytes) noexcept {
  std::uint64_t now = state_->used.load();
  for (;;) {
    if (!unlimited() && (bytes > limit_ || now > limit_ - bytes)) return false;
    if (state_->used.compare_exchange_weak(now, now + bytes)) return true;
  }
}

template <class Upstream>
std::shared_ptr<Allocation> LimitingResource::charged(std::size_t bytes, Upstream&& upstream) {
  if (!try_charge(bytes)) {
    throw LimitExceeded(status_, text_.subject + " exceeded: " + support::format_bytes(used()) +
                                     " " + text_.held + " + " + support::format_bytes(bytes) +
                                     " requested > " + support::format_bytes(limit_) +
                                     text_.suffix);
  }
  std::shared_ptr<Allocation> memory;
  try {
    memory = upstream();
    return std::make_shared<ChargedAllocation<State>>(std::move(memory), state_, bytes);
  } catch (...) {
    // Released upstream memory (if make_shared failed) must not be charged either.
    memory.reset();
    state_->used.fetch_sub(bytes);
    throw;
  }
}

std::shared_ptr<Allocation> LimitingResource::do_allocate(std::size_t bytes, std::string_view label,
                                                          HandleKind handle) {
  return charged(bytes, [&] { return this->upstream().allocate(bytes, label, handle); });
}

std::shared_ptr<Allocation> LimitingResource::do_adopt(support::UniqueFd fd, std::size_t bytes,
                                                       std::string_view label, HandleKind handle) {
  return charged(bytes,
                 [&] { return this->upstream().adopt(std::move(fd), bytes, label, handle); });
}

}  // namespace statepool::service
