// Randomised (seeded, reproducible) allocate / free / detach / resume / reclaim against a
// simple model of the pool. After every step: check() is clean, per-arena usage matches
// the model, and every owned page still carries the signature written when it was handed
// out (a page handed out twice would have been overwritten by its second owner).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "statepool/testing/gtest/pool.hpp"

namespace statepool::service {
namespace {

using namespace std::chrono_literals;
using testing::config;
using testing::join;
using testing::make_pool;
using testing::small_layout;
using testing::tenant;

struct ModelLease {
  LeaseId id = 0;
  std::string token;
  std::size_t tenant = 0;
  bool attached = true;
  Clock::time_point deadline{};
  std::set<std::pair<ArenaId, SlotId>> slots;
};

struct Signature {
  LeaseId lease;
  ArenaId arena;
  SlotId slot;
  std::uint32_t generation;
};

class PoolStress : public ::testing::TestWithParam<std::uint32_t> {
 protected:
  void SetUp() override {
    pool_ = make_pool(config({tenant("alice"), tenant("bob")}));
    const LayoutId l1 = pool_->register_layout(small_layout());
    const LayoutId l2 = pool_->register_layout(small_layout(kernels::CodecId::fp32));
    for (std::size_t t = 0; t < 2; ++t) {
      for (const LayoutId l : {l1, l2}) {
        const ArenaInfo a = pool_->open_arena(names_[t], l, 16);
        arenas_.push_back(a);
        arena_tenant_[a.id] = t;
      }
    }
  }

  std::size_t used_in(ArenaId arena) const {
    std::size_t n = 0;
    for (const auto& [id, lease] : leases_) {
      for (const auto& [a, s] : lease.slots) n += a == arena ? 1 : 0;
    }
    return n;
  }

  void write_signature(const ModelLease& lease, ArenaId arena, SlotId slot) {
    const Signature sig{lease.id, arena, slot, ++generation_};
    const auto bytes = pool_->page(lease.id, arena, slot).bytes;
    ASSERT_GE(bytes.size(), sizeof sig);
    std::memcpy(bytes.data(), &sig, sizeof sig);
    signatures_[{arena, slot}] = sig;
  }

  /// Reads every owned page through the arena's own mapping (no lease needed) and
  /// compares it with the model.
  void verify(const std::string& step) {
    const auto problems = pool_->check();
    ASSERT_TRUE(problems.empty()) << step << "\n" << join(problems);
    const PoolStats stats = pool_->stats();
    std::uint32_t active = 0;
    std::uint32_t orphaned = 0;
    for (const auto& [id, lease] : leases_) (lease.attached ? active : orphaned) += 1;
    ASSERT_EQ(stats.leases_active, active) << step;
    ASSERT_EQ(stats.leases_orphaned, orphaned) << step;
    ASSERT_EQ(stats.pages_reclaimed_total, reclaimed_) << step;
    for (const ArenaInfo& info : stats.arenas) {
      ASSERT_EQ(info.pages_used, used_in(info.id)) << step << " arena " << info.id;
    }
    for (const auto& [id, lease] : leases_) {
      for (const auto& [arena, slot] : lease.slots) {
        const ArenaInfo& info = arenas_[arena - 1];
        const std::byte* base = mapped(info);
        Signature sig{};
        std::memcpy(&sig, base + std::size_t{slot} * info.page_stride, sizeof sig);
        const Signature& want = signatures_.at({arena, slot});
        ASSERT_EQ(sig.lease, id) << step << " arena " << arena << " slot " << slot;
        ASSERT_EQ(sig.generation, want.generation) << step;
      }
    }
  }

  const std::byte* mapped(const ArenaInfo& info) {
    // The pool hands out spans only to owners; for checking we map the fd as a client.
    auto it = maps_.find(info.id);
    if (it == maps_.end()) {
      void* p = ::mmap(nullptr, info.bytes, PROT_READ, MAP_SHARED, info.fd, 0);
      EXPECT_NE(p, MAP_FAILED);
      it = maps_.emplace(info.id, static_cast<const std::byte*>(p)).first;
    }
    return it->second;
  }

  void TearDown() override {
    for (const auto& [id, p] : maps_) {
      ::munmap(const_cast<std::byte*>(p), arenas_[id - 1].bytes);  // NOLINT: munmap API
    }
  }

  const std::string names_[2] = {"alice", "bob"};
  std::unique_ptr<Pool> pool_;
  std::vector<ArenaInfo> arenas_;  // index = id - 1
  std::map<ArenaId, std::size_t> arena_tenant_;
  std::map<LeaseId, ModelLease> leases_;
  std::vector<std::string> dead_tokens_;
  std::map<std::pair<ArenaId, SlotId>, Signature> signatures_;
  std::map<ArenaId, const std::byte*> maps_;
  std::uint32_t generation_ = 0;
  std::uint64_t reclaimed_ = 0;
};

TEST_P(PoolStress, RandomOperationsAgreeWithTheModel) {
  std::mt19937 rng(GetParam());
  const auto pick = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  const auto attached = [&] {
    std::vector<LeaseId> out;
    for (const auto& [id, l] : leases_) {
      if (l.attached) out.push_back(id);
    }
    return out;
  };
  Clock::time_point now = Clock::time_point{} + 1000h;
  // What the run exercised; asserted at the end so a change of weights cannot silently
  // turn a branch off.
  std::map<std::string, int> seen;
  const auto grace = pool_->config().grace_period;

  const auto drop_expired = [&] {
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (!it->second.attached && it->second.deadline <= now) {
        reclaimed_ += it->second.slots.size();
        dead_tokens_.push_back(it->second.token);
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
  };

  for (int step = 0; step < 3000; ++step) {
    const std::string where =
        "seed " + std::to_string(GetParam()) + " step " + std::to_string(step);
    const std::size_t op = pick(100);
    const auto live = attached();

    if (op < 10 || live.empty()) {  // attach a new lease
      const std::size_t t = pick(2);
      const LeaseGrant g = pool_->attach_lease(names_[t], "", now);
      ASSERT_FALSE(g.resumed);
      ASSERT_FALSE(leases_.contains(g.id));
      leases_[g.id] = ModelLease{g.id, g.token, t, true, {}, {}};
    } else if (op < 45) {  // allocate, maybe in another tenant's arena
      ModelLease& lease = leases_.at(live[pick(live.size())]);
      const ArenaInfo& arena = arenas_[pick(arenas_.size())];
      const auto count = static_cast<std::uint32_t>(1 + pick(6));
      const std::size_t free_pages = arena.page_count - used_in(arena.id);
      try {
        const auto slots = pool_->allocate(lease.id, arena.id, count);
        ASSERT_EQ(arena_tenant_[arena.id], lease.tenant) << where;
        ASSERT_LE(count, free_pages) << where;
        ASSERT_EQ(slots.size(), count) << where;
        for (const SlotId s : slots) {
          ASSERT_TRUE(lease.slots.emplace(arena.id, s).second) << where;
          write_signature(lease, arena.id, s);
        }
        ++seen["allocated"];
      } catch (const StatusError& e) {
        if (arena_tenant_[arena.id] != lease.tenant) {
          ASSERT_EQ(e.status(), Status::permission_denied) << where;
          ++seen["denied"];
        } else {
          ASSERT_EQ(e.status(), Status::pool_exhausted) << where << ": " << e.what();
          ASSERT_GT(count, free_pages) << where;
          ++seen["exhausted"];
        }
      }
    } else if (op < 70) {  // free a subset, sometimes poisoned with one bad slot
      ModelLease& lease = leases_.at(live[pick(live.size())]);
      if (lease.slots.empty()) continue;
      const ArenaId arena = std::next(lease.slots.begin(), pick(lease.slots.size()))->first;
      std::vector<SlotId> list;
      for (const auto& [a, s] : lease.slots) {
        if (a == arena && pick(2) == 0) list.push_back(s);
      }
      const std::size_t poison = pick(8);
      Status expected = Status::ok;
      if (poison == 0) {
        list.push_back(arenas_[arena - 1].page_count);  // out of range
        expected = Status::invalid_argument;
      } else if (poison == 1 && !list.empty()) {
        list.push_back(list.front());  // duplicate
        expected = Status::invalid_argument;
      } else if (poison == 2) {
        // A slot of the same arena owned by another lease, if any; else a free one.
        for (SlotId s = 0; s < arenas_[arena - 1].page_count; ++s) {
          if (lease.slots.contains({arena, s})) continue;
          bool owned = false;
          for (const auto& [id, other] : leases_) owned |= other.slots.contains({arena, s});
          list.push_back(s);
          expected = owned ? Status::not_owner : Status::invalid_argument;
          break;
        }
      }
      std::shuffle(list.begin(), list.end(), rng);
      if (expected == Status::ok) {
        ASSERT_EQ(pool_->free(lease.id, arena, list), list.size()) << where;
        for (const SlotId s : list) lease.slots.erase({arena, s});
        ++seen["freed"];
      } else {
        try {
          (void)pool_->free(lease.id, arena, list);
          FAIL() << where << ": poisoned free succeeded";
        } catch (const StatusError& e) {
          // With a duplicate *and* a bad slot the first check to fire wins; both are
          // invalid_argument, and not_owner needs a list that is otherwise valid.
          ASSERT_EQ(e.status(), expected) << where << ": " << e.what();
          ++seen[expected == Status::not_owner ? "not_owner" : "bad_free"];
        }
      }
    } else if (op < 82) {  // detach
      ModelLease& lease = leases_.at(live[pick(live.size())]);
      pool_->detach_lease(lease.id, now);
      if (lease.slots.empty()) {
        dead_tokens_.push_back(lease.token);
        leases_.erase(lease.id);
      } else {
        lease.attached = false;
        lease.deadline = now + grace;
      }
    } else if (op < 88) {  // resume by token (orphaned, or long dead)
      std::vector<LeaseId> orphans;
      for (const auto& [id, l] : leases_) {
        if (!l.attached) orphans.push_back(id);
      }
      if (orphans.empty() && dead_tokens_.empty()) continue;
      if (!orphans.empty() && (dead_tokens_.empty() || pick(4) != 0)) {
        ModelLease& lease = leases_.at(orphans[pick(orphans.size())]);
        const LeaseGrant g = pool_->attach_lease(names_[lease.tenant], lease.token, now);
        if (lease.deadline > now) {
          ASSERT_TRUE(g.resumed) << where;
          ASSERT_EQ(g.id, lease.id) << where;
          ASSERT_EQ(g.slots, lease.slots.size()) << where;
          lease.attached = true;
          ++seen["resumed"];
        } else {  // expired, not reclaimed yet: reclaimed by the attach
          ASSERT_FALSE(g.resumed) << where;
          const std::size_t t = lease.tenant;
          reclaimed_ += lease.slots.size();
          dead_tokens_.push_back(lease.token);
          leases_.erase(lease.id);  // `lease` dangles from here on
          leases_[g.id] = ModelLease{g.id, g.token, t, true, {}, {}};
          ++seen["expired_on_attach"];
        }
      } else {
        const std::size_t t = pick(2);
        const std::string& token = dead_tokens_[pick(dead_tokens_.size())];
        const LeaseGrant g = pool_->attach_lease(names_[t], token, now);
        ASSERT_FALSE(g.resumed) << where;
        leases_[g.id] = ModelLease{g.id, g.token, t, true, {}, {}};
      }
    } else if (op < 94) {  // time passes (the timer may fire late, or not at all)
      now += std::chrono::milliseconds(pick(static_cast<std::size_t>(grace.count())));
    } else {  // the server's reclaim timer fires
      const auto deadline = pool_->next_deadline();
      std::optional<Clock::time_point> want;
      for (const auto& [id, l] : leases_) {
        if (!l.attached && (!want || l.deadline < *want)) want = l.deadline;
      }
      ASSERT_EQ(deadline, want) << where;
      const std::uint64_t before = reclaimed_;
      drop_expired();
      ASSERT_EQ(pool_->reclaim_expired(now), reclaimed_ - before) << where;
      if (reclaimed_ > before) ++seen["reclaimed"];
    }
    verify(where);
    if (HasFatalFailure()) return;
  }

  // Everyone leaves; after the grace period nothing is left.
  for (const LeaseId id : attached()) {
    pool_->detach_lease(id, now);
    ModelLease& lease = leases_.at(id);
    if (lease.slots.empty()) {
      leases_.erase(id);
    } else {
      lease.attached = false;
      lease.deadline = now + grace;
    }
  }
  now += grace;
  drop_expired();
  (void)pool_->reclaim_expired(now);
  verify("final");
  const PoolStats stats = pool_->stats();
  for (const ArenaInfo& info : stats.arenas) EXPECT_EQ(info.pages_used, 0u);
  EXPECT_EQ(stats.leases_active + stats.leases_orphaned, 0u);
  EXPECT_TRUE(leases_.empty());
  for (const char* what : {"allocated", "denied", "exhausted", "freed", "not_owner", "bad_free",
                           "resumed", "expired_on_attach", "reclaimed"}) {
    EXPECT_GT(seen[what], 0) << what << " never happened with seed " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, PoolStress, ::testing::Values(1u, 2u, 3u, 42u, 2024u));

}  // namespace
}  // namespace statepool::service
