#pragma once
// LeaseTable: the leases (one per client connection, resumable by token within a grace
// period after the connection drops) and the slots each holds. Records hold ids.
//
// A lease lists its slots as (arena, slot) keys; the ArenaTable records the owner of each
// slot. The Pool keeps the two in agreement (both change under its lock).
//
// Thread-safety: none; the Pool serializes every call.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pool/ids.hpp"

namespace statepool::service {

/// One key per (arena, slot) for a lease's slot set.
[[nodiscard]] constexpr std::uint64_t slot_key(ArenaId arena, SlotId slot) noexcept {
  return (std::uint64_t{arena} << 32) | slot;
}
[[nodiscard]] constexpr ArenaId key_arena(std::uint64_t key) noexcept {
  return static_cast<ArenaId>(key >> 32);
}
[[nodiscard]] constexpr SlotId key_slot(std::uint64_t key) noexcept {
  return static_cast<SlotId>(key & 0xffffffffu);
}

struct Lease {
  LeaseId id = 0;
  std::size_t tenant = 0;  ///< index into the pool's tenants
  std::string token;
  bool attached = true;
  Clock::time_point deadline{};             ///< meaningful when !attached
  std::unordered_set<std::uint64_t> slots;  ///< slot_key(arena, slot)
};

class LeaseTable {
 public:
  /// A new attached lease with a fresh id; `token` must not be in use. Strong guarantee.
  Lease& create(std::size_t tenant, std::string token);
  /// An orphaned lease taken over from another process, under its own id (above every id
  /// in the table, below next_id()) until `deadline`; `token` must not be in use. Strong
  /// guarantee.
  Lease& restore(LeaseId id, std::size_t tenant, std::string token, Clock::time_point deadline);
  /// The id the next create() gives; set_next_id(): the predecessor's.
  [[nodiscard]] LeaseId next_id() const noexcept { return next_id_; }
  void set_next_id(LeaseId id) noexcept { next_id_ = id; }
  /// nullptr when unknown.
  [[nodiscard]] Lease* find(LeaseId id) noexcept;
  [[nodiscard]] const Lease* find(LeaseId id) const noexcept;
  [[nodiscard]] Lease* find_token(std::string_view token) noexcept;
  [[nodiscard]] bool token_in_use(std::string_view token) const;
  /// The lease, which must exist and be attached. Throws StatusError(not_found).
  [[nodiscard]] Lease& attached(LeaseId id);
  [[nodiscard]] const Lease& attached(LeaseId id) const;

  /// Marks an attached lease orphaned until `deadline`. Throws std::bad_alloc only (then
  /// the lease is unchanged).
  void orphan(Lease& lease, Clock::time_point deadline);
  /// Re-attaches an orphaned lease. noexcept.
  void reattach(Lease& lease) noexcept;
  /// Forgets the lease, its token and its deadline (its slots are the caller's to free).
  void erase(LeaseId id) noexcept;

  /// The orphaned lease with the earliest deadline <= now, if any.
  [[nodiscard]] std::optional<LeaseId> first_expired(Clock::time_point now) const noexcept;
  [[nodiscard]] std::optional<Clock::time_point> next_deadline() const noexcept;

  /// Attached leases of the tenant (its connections that completed Hello).
  [[nodiscard]] std::uint32_t attached_count(std::size_t tenant) const noexcept;

  [[nodiscard]] const std::unordered_map<LeaseId, Lease>& all() const noexcept { return leases_; }
  /// Cross-checks tokens and deadlines against the leases; one line per problem.
  [[nodiscard]] std::vector<std::string> check() const;

 private:
  std::unordered_map<LeaseId, Lease> leases_;
  std::unordered_map<std::string, LeaseId> tokens_;
  std::set<std::pair<Clock::time_point, LeaseId>> deadlines_;  // orphaned leases
  std::unordered_map<std::size_t, std::uint32_t> attached_;    // per tenant
  LeaseId next_id_ = 1;
};

}  // namespace statepool::service
