// Pool: tenants, layouts, arenas, quota and capacity, leases, slots and pages.
// Every failing call is checked to change nothing (stats before == after, check() clean).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "pool/lease_token.hpp"
#include "statepool/testing/gtest/pool.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::service {
namespace {

using namespace std::chrono_literals;
using testing::config;
using testing::expect_status;
using testing::join;
using testing::make_pool;
using testing::same_stats;
using testing::small_layout;
using testing::tenant;

const Clock::time_point kT0 = Clock::time_point{} + 1000h;

// --- tenants ---------------------------------------------------------------------------

TEST(PoolTenants, EmptyConfigMeansOneUnlimitedDefaultTenant) {
  auto pool = make_pool();
  EXPECT_EQ(pool->tenant("").name, "default");
  EXPECT_EQ(pool->tenant("default").quota_bytes, 0u);
  ASSERT_EQ(pool->config().tenants.size(), 1u);
  pool->check_peer("", 1234, 5678);  // no restriction
  const auto msg = expect_status(Status::unknown_tenant, [&] { (void)pool->tenant("x"); });
  EXPECT_EQ(msg, "unknown tenant 'x' (not configured in this daemon)");
}

TEST(PoolTenants, UnknownTenantNamesNoOtherTenant) {
  auto pool = make_pool(config({tenant("alice"), tenant("bob")}));
  EXPECT_EQ(pool->tenant("bob").name, "bob");
  const auto msg = expect_status(Status::unknown_tenant, [&] { (void)pool->tenant("carol"); });
  EXPECT_EQ(msg, "unknown tenant 'carol' (not configured in this daemon)");
  EXPECT_EQ(msg.find("alice"), std::string::npos) << msg;
  // Without a tenant called "default", the empty name is unknown too.
  expect_status(Status::unknown_tenant, [&] { (void)pool->tenant(""); });
  expect_status(Status::unknown_tenant, [&] { (void)pool->attach_lease("carol", ""); });
  const auto layout = pool->register_layout(small_layout());
  expect_status(Status::unknown_tenant, [&] { (void)pool->open_arena("carol", layout, 0); });
}

TEST(PoolTenants, BadConfigIsRejected) {
  expect_status(Status::invalid_argument, [] {
    (void)make_pool(config({tenant("a"), tenant("a")}));
  });
  expect_status(Status::invalid_argument, [] { (void)make_pool(config({tenant("")})); });
  expect_status(Status::invalid_argument, [] { Pool pool(config(), nullptr); });
  auto c = config();
  c.default_arena_pages = c.max_arena_pages + 1;
  expect_status(Status::invalid_argument, [&] { (void)make_pool(c); });
}

TEST(PoolTenants, PeerRestrictions) {
  auto restricted = tenant("alice");
  restricted.uids = {1000};
  restricted.gids = {50};
  auto pool = make_pool(config({restricted, tenant("open")}));
  pool->check_peer("alice", 1000, 1);
  pool->check_peer("alice", 7, 50);
  pool->check_peer("open", 7, 7);
  const auto msg =
      expect_status(Status::permission_denied, [&] { pool->check_peer("alice", 7, 7); });
  EXPECT_NE(msg.find("uid 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'alice'"), std::string::npos) << msg;
}

// --- layouts ---------------------------------------------------------------------------

TEST(PoolLayouts, IdenticalLayoutsShareAnIdAndNamesDoNotMatter) {
  auto pool = make_pool();
  const auto a = pool->register_layout(small_layout(kernels::CodecId::int8, "first"));
  const auto b = pool->register_layout(small_layout(kernels::CodecId::int8, "second"));
  const auto c = pool->register_layout(small_layout(kernels::CodecId::fp32));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, 0u);
  EXPECT_EQ(pool->layout(a)->layout().name, "first");
  EXPECT_EQ(pool->layout(c)->layout().codec.id, kernels::CodecId::fp32);
  expect_status(Status::not_found, [&] { (void)pool->layout(0); });
  expect_status(Status::not_found, [&] { (void)pool->layout(99); });
}

TEST(PoolLayouts, InvalidLayoutGetsTheValidatorsMessage) {
  auto pool = make_pool();
  auto bad = small_layout();
  bad.key_dim = 0;
  const std::string expected = kernels::validate(bad);
  ASSERT_FALSE(expected.empty());
  const auto msg = expect_status(Status::invalid_argument, [&] { pool->register_layout(bad); });
  EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  expect_status(Status::not_found, [&] { (void)pool->layout(1); });  // nothing registered
}

// --- per-tenant limits on the shared tables ---------------------------------------------

TenantConfig limited(std::string name, TenantLimits limits) {
  TenantConfig t = tenant(std::move(name));
  t.limits = limits;
  return t;
}

kernels::StateLayout layout_number(int i) {
  auto layout = small_layout(kernels::CodecId::int8, "n" + std::to_string(i));
  layout.num_layers = static_cast<std::uint32_t>(1 + i);  // distinct shapes
  return layout;
}

// The reviewed failure: one tenant with an unused byte quota filled the layout table and
// every other tenant got pool_exhausted until restart.
TEST(PoolLimits, ATenantAtItsLayoutLimitLeavesOtherTenantsAlone) {
  TenantLimits small;
  small.max_layouts = 3;
  auto pool = make_pool(config({limited("greedy", small), tenant("polite")}));
  for (int i = 0; i < 3; ++i) (void)pool->register_layout("greedy", layout_number(i));
  const auto before = pool->stats();
  const auto msg = expect_status(Status::quota_exceeded,
                                 [&] { (void)pool->register_layout("greedy", layout_number(3)); });
  EXPECT_NE(msg.find("'greedy' has added 3 layouts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tenant-max-layouts"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool->stats()));
  // A layout the daemon holds already costs nothing: registering it again still works,
  // for the tenant at its limit too.
  const LayoutId known = pool->register_layout("polite", layout_number(0));
  EXPECT_EQ(pool->register_layout("greedy", layout_number(0)), known);
  // The other tenant registers new layouts as before.
  EXPECT_NE(pool->register_layout("polite", layout_number(3)), 0u);
  EXPECT_NE(pool->register_layout("polite", layout_number(4)), 0u);
  // Operators' entries (start-up) are not any tenant's.
  EXPECT_NE(pool->register_layout(layout_number(5)), 0u);
  expect_status(Status::quota_exceeded,
                [&] { (void)pool->register_layout("greedy", layout_number(6)); });
  EXPECT_TRUE(pool->check().empty());
}

TEST(PoolLimits, ATenantAtItsPlanLimitLeavesOtherTenantsAlone) {
  TenantLimits small;
  small.max_plans = 2;
  auto pool = make_pool(config({limited("greedy", small), tenant("polite")}));
  const auto plan = [](std::uint32_t layers) {
    return std::make_shared<const kernels::stepquant::Plan>(
        testing::uniform_plan(kernels::Arch::gdn, layers, 2, 16, 16, 6));
  };
  EXPECT_TRUE(pool->install_plan("greedy", plan(1)).created);
  EXPECT_TRUE(pool->install_plan("greedy", plan(2)).created);
  const auto msg =
      expect_status(Status::quota_exceeded, [&] { (void)pool->install_plan("greedy", plan(3)); });
  EXPECT_NE(msg.find("'greedy' has added 2 plans"), std::string::npos) << msg;
  EXPECT_EQ(pool->plans().size(), 2u);
  EXPECT_FALSE(pool->install_plan("greedy", plan(1)).created);  // known: free
  for (std::uint32_t layers = 3; layers < 8; ++layers)
    EXPECT_TRUE(pool->install_plan("polite", plan(layers)).created);
}

TEST(PoolLimits, ArenasPerTenantAreBounded) {
  TenantLimits small;
  small.max_arenas = 2;
  auto pool = make_pool(config({limited("greedy", small), tenant("polite")}));
  std::vector<LayoutId> layouts;
  for (int i = 0; i < 3; ++i) layouts.push_back(pool->register_layout(layout_number(i)));
  (void)pool->open_arena("greedy", layouts[0], 2);
  (void)pool->open_arena("greedy", layouts[1], 2);
  EXPECT_FALSE(pool->open_arena("greedy", layouts[1], 2).created);  // the existing one
  const auto before = pool->stats();
  const auto msg = expect_status(Status::quota_exceeded,
                                 [&] { (void)pool->open_arena("greedy", layouts[2], 2); });
  EXPECT_NE(msg.find("'greedy' has 2 arenas"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tenant-max-arenas"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool->stats()));
  for (const LayoutId layout : layouts) EXPECT_TRUE(pool->open_arena("polite", layout, 2).created);
  EXPECT_TRUE(pool->check().empty());
}

TEST(PoolLimits, ConnectionsPerTenantAreBoundedAndComeBackWhenOneLeaves) {
  TenantLimits small;
  small.max_connections = 2;
  auto pool = make_pool(config({limited("greedy", small), tenant("polite")}));
  const auto layout = pool->register_layout(small_layout());
  const auto arena = pool->open_arena("greedy", layout, 4);
  const LeaseGrant first = pool->attach_lease("greedy", "", kT0);
  const LeaseGrant second = pool->attach_lease("greedy", "", kT0);
  (void)pool->allocate(first.id, arena.id, 1);
  const auto msg = expect_status(Status::too_many_connections,
                                 [&] { (void)pool->attach_lease("greedy", "", kT0); });
  EXPECT_NE(msg.find("'greedy' has 2 connections"), std::string::npos) << msg;
  for (int i = 0; i < 5; ++i) (void)pool->attach_lease("polite", "", kT0);
  // A lease that leaves (orphaned, with its slot kept) frees its connection...
  pool->detach_lease(first.id, kT0);
  const LeaseGrant third = pool->attach_lease("greedy", "", kT0);
  // ...and resuming it is a connection again.
  expect_status(Status::too_many_connections,
                [&] { (void)pool->attach_lease("greedy", first.token, kT0); });
  pool->detach_lease(third.id, kT0);
  EXPECT_TRUE(pool->attach_lease("greedy", first.token, kT0).resumed);
  (void)second;
  EXPECT_TRUE(pool->check().empty());
}

TEST(PoolArenas, ATenantNeedingALargerArenaGetsASecondOneBesideTheFirst) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const ArenaInfo small = pool->open_arena("", layout, 4);
  EXPECT_TRUE(small.created);
  const LeaseGrant lease = pool->attach_lease("", "", kT0);
  (void)pool->allocate(lease.id, small.id, 3);
  // Asking for more pages than the arena has adds one of that size (arenas never grow:
  // clients map them whole).
  const ArenaInfo large = pool->open_arena("", layout, 16);
  EXPECT_TRUE(large.created);
  EXPECT_NE(large.id, small.id);
  EXPECT_EQ(large.page_count, 16u);
  EXPECT_EQ(pool->allocate(lease.id, large.id, 16).size(), 16u);
  // Asking again finds an existing arena large enough: the one with the most free pages.
  const ArenaInfo again = pool->open_arena("", layout, 4);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.id, small.id) << "the large one is full, the small one has a page free";
  EXPECT_FALSE(pool->open_arena("", layout, 0).created);
  EXPECT_EQ(pool->stats().arenas.size(), 2u);
  EXPECT_TRUE(pool->check().empty());
}

// --- arenas ----------------------------------------------------------------------------

TEST(PoolArenas, ClosingGivesTheBytesBackAndTheIdIsNeverUsedAgain) {
  auto pool = make_pool(config({tenant("alice", 0), tenant("bob")}));
  const auto layout = pool->register_layout(small_layout());
  const LeaseId lease = pool->attach_lease("alice", "", kT0).id;
  ArenaInfo a = pool->open_arena("alice", layout, 4, {}, lease);
  a.memory.reset();  // an ArenaInfo keeps the memory alive (as a reply being sent does)
  const std::uint64_t reserved = pool->stats().reserved_bytes;
  ASSERT_EQ(reserved, a.bytes);

  {  // Another tenant may not close it, and learns nothing by trying.
    const auto before = pool->stats();  // (stats hold the memory too, until they go)
    expect_status(Status::permission_denied, [&] { (void)pool->close_arena("bob", a.id); });
    expect_status(Status::not_found, [&] { (void)pool->close_arena("alice", a.id + 1); });
    EXPECT_TRUE(same_stats(before, pool->stats()));
  }

  const ClosedArena closed = pool->close_arena("alice", a.id, lease);  // its own opener
  EXPECT_EQ(closed.id, a.id);
  EXPECT_EQ(closed.layout_name, "demo");
  EXPECT_EQ(closed.bytes, a.bytes);
  EXPECT_EQ(closed.snapshots_dropped, 0u);
  const PoolStats after = pool->stats();
  EXPECT_EQ(after.reserved_bytes, 0u);
  EXPECT_EQ(after.memory.live_bytes, 0u) << "the backend freed the memory";
  EXPECT_TRUE(after.arenas.empty());
  for (const auto& t : after.tenants) EXPECT_EQ(t.reserved_bytes, 0u) << t.name;

  // Its id names nothing any more; the message says why.
  const auto msg = expect_status(Status::not_found, [&] { (void)pool->allocate(lease, a.id, 1); });
  EXPECT_EQ(msg, "arena " + std::to_string(a.id) + " was closed");
  expect_status(Status::not_found, [&] { (void)pool->close_arena("alice", a.id); });
  // A new arena of the same layout gets a new id.
  const ArenaInfo b = pool->open_arena("alice", layout, 4, {}, lease);
  EXPECT_TRUE(b.created);
  EXPECT_GT(b.id, a.id);
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

TEST(PoolArenas, ClosingIsRefusedWhileALeaseHoldsAPageOrAnotherConnectionOpenedIt) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const LeaseId engine = pool->attach_lease("", "", kT0).id;
  const LeaseId operator_ = pool->attach_lease("", "", kT0).id;
  ArenaInfo a = pool->open_arena("", layout, 4, {}, engine);
  a.memory.reset();
  const auto slots = pool->allocate(engine, a.id, 2);

  {
    const auto before = pool->stats();
    auto msg = expect_status(Status::in_use, [&] { (void)pool->close_arena("", a.id, engine); });
    EXPECT_NE(msg.find("has 2 pages held by leases"), std::string::npos) << msg;
    msg = expect_status(Status::in_use, [&] { (void)pool->close_arena("", a.id, operator_); });
    EXPECT_NE(msg.find("is open on 1 other connection of the tenant"), std::string::npos) << msg;
    EXPECT_TRUE(same_stats(before, pool->stats()));
  }

  // The engine disconnects: it no longer counts as having the arena mapped, but its lease
  // keeps the pages through the grace period.
  pool->detach_lease(engine, kT0);
  const auto msg =
      expect_status(Status::in_use, [&] { (void)pool->close_arena("", a.id, operator_); });
  EXPECT_NE(msg.find("has 2 pages held by leases"), std::string::npos) << msg;
  EXPECT_EQ(pool->reclaim_expired(kT0 + 1h), slots.size());
  EXPECT_EQ(pool->close_arena("", a.id, operator_).bytes, a.bytes);
  EXPECT_EQ(pool->stats().reserved_bytes, 0u);
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

TEST(PoolArenas, OpenersAreCountedOncePerConnectionAndLeaveWithIt) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const LeaseId one = pool->attach_lease("", "", kT0).id;
  const LeaseId two = pool->attach_lease("", "", kT0).id;
  const ArenaId a = pool->open_arena("", layout, 4, {}, one).id;
  EXPECT_EQ(pool->open_arena("", layout, 4, {}, one).id, a);  // twice: still one opener
  EXPECT_EQ(pool->open_arena("", layout, 4, {}, two).id, a);
  auto msg = expect_status(Status::in_use, [&] { (void)pool->close_arena("", a, one); });
  EXPECT_NE(msg.find("open on 1 other connection"), std::string::npos) << msg;
  msg = expect_status(Status::in_use, [&] { (void)pool->close_arena("", a); });
  EXPECT_NE(msg.find("open on 2 other connections"), std::string::npos) << msg;
  pool->detach_lease(two, kT0);  // no slots: dropped at once
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
  EXPECT_EQ(pool->close_arena("", a, one).id, a);
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

TEST(PoolArenas, ClosingWhileWorkHoldsTheMemoryFreesItWhenTheWorkEnds) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const LeaseId lease = pool->attach_lease("", "", kT0).id;
  ArenaInfo a = pool->open_arena("", layout, 4, {}, lease);
  a.memory.reset();
  const SlotId slot = pool->allocate(lease, a.id, 1).at(0);
  PageRef page = pool->page(lease, a.id, slot);  // what an executor operation holds
  ASSERT_EQ(pool->free(lease, a.id, std::vector<SlotId>{slot}), 1u);
  std::shared_ptr<const Allocation> memory = std::move(page.memory);
  page = {};

  (void)pool->close_arena("", a.id, lease);
  EXPECT_EQ(pool->stats().memory.live_bytes, a.bytes) << "still in use by the operation";
  memory.reset();
  EXPECT_EQ(pool->stats().memory.live_bytes, 0u);
  EXPECT_EQ(pool->stats().reserved_bytes, 0u);
}

TEST(PoolArenas, OpenCreatesOnceThenReturnsTheSameArena) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const auto codec = pool->layout(layout);
  const ArenaInfo a = pool->open_arena("", layout, 0);
  EXPECT_TRUE(a.created);
  EXPECT_NE(a.id, 0u);
  EXPECT_EQ(a.tenant, "default");
  EXPECT_EQ(a.layout, layout);
  EXPECT_EQ(a.layout_name, "demo");
  EXPECT_EQ(a.codec, kernels::CodecId::int8);
  EXPECT_EQ(a.backend, "host");
  EXPECT_EQ(a.page_count, 8u);  // default_arena_pages
  EXPECT_EQ(a.pages_used, 0u);
  EXPECT_EQ(a.page_bytes, codec->page_bytes());
  EXPECT_EQ(a.fp32_page_bytes, codec->fp32_bytes());
  EXPECT_EQ(a.page_stride % kPageAlignment, 0u);
  EXPECT_GE(a.page_stride, a.page_bytes);
  EXPECT_LT(a.page_stride - a.page_bytes, kPageAlignment);
  EXPECT_EQ(a.bytes, a.page_stride * a.page_count);
  EXPECT_GE(a.fd, 0);

  const ArenaInfo again = pool->open_arena("default", layout, 8);  // large enough: the same
  EXPECT_FALSE(again.created);
  EXPECT_EQ(again.id, a.id);
  EXPECT_EQ(again.page_count, 8u);
  EXPECT_EQ(again.fd, a.fd);
  EXPECT_EQ(pool->arena("", a.id).id, a.id);
  EXPECT_EQ(pool->stats().reserved_bytes, a.bytes);

  const ArenaInfo other =
      pool->open_arena("", pool->register_layout(small_layout(kernels::CodecId::fp32)), 3);
  EXPECT_TRUE(other.created);
  EXPECT_NE(other.id, a.id);
  EXPECT_EQ(other.page_count, 3u);
  expect_status(Status::not_found, [&] { (void)pool->open_arena("", 77, 1); });
  expect_status(Status::not_found, [&] { (void)pool->arena("", 77); });
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

TEST(PoolArenas, TooManyPagesIsInvalidAndChangesNothing) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const auto before = pool->stats();
  const auto msg =
      expect_status(Status::invalid_argument, [&] { (void)pool->open_arena("", layout, 1025); });
  EXPECT_NE(msg.find("max_arena_pages"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool->stats()));
  EXPECT_TRUE(pool->open_arena("", layout, 1024).created);  // the limit itself is fine
}

TEST(PoolArenas, QuotaExceededChangesNothing) {
  auto pool = make_pool(config({tenant("alice", 0), tenant("bob", 0)}));
  const auto small = pool->register_layout(small_layout());
  const ArenaInfo probe = pool->open_arena("bob", small, 4);
  // alice may hold exactly 4 pages' worth of this layout.
  auto pool2 = make_pool(config({tenant("alice", probe.bytes), tenant("bob")}));
  const auto l1 = pool2->register_layout(small_layout());
  const auto l2 = pool2->register_layout(small_layout(kernels::CodecId::fp32));
  EXPECT_TRUE(pool2->open_arena("alice", l1, 4).created);  // exactly at the quota

  const auto before = pool2->stats();
  const auto msg =
      expect_status(Status::quota_exceeded, [&] { (void)pool2->open_arena("alice", l2, 1); });
  EXPECT_EQ(msg.rfind("tenant 'alice' quota exceeded: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(" reserved + "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" requested > "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" quota"), std::string::npos) << msg;
  EXPECT_TRUE(same_stats(before, pool2->stats()));
  EXPECT_TRUE(pool2->check().empty()) << join(pool2->check());
  // The existing arena is still returned (no new reservation), and bob is unaffected.
  EXPECT_FALSE(pool2->open_arena("alice", l1, 0).created);
  EXPECT_TRUE(pool2->open_arena("bob", l2, 1).created);
}

TEST(PoolArenas, QuotaMessageUsesHumanUnits) {
  auto c = config({tenant("alice", (1ull << 30) + (1ull << 30) / 5)});
  c.capacity_bytes = 8ull << 30;
  c.max_arena_pages = 1u << 20;
  auto pool = std::make_unique<Pool>(std::move(c), std::make_shared<HostMemfdResource>());
  // A layout whose page stride is a power of two makes exact unit arithmetic possible.
  auto layout = small_layout(kernels::CodecId::fp32);
  layout.key_dim = 128;
  layout.value_dim = 128;  // 4 heads of 64 KiB = 256 KiB per page (fp32 needs no metadata)
  const auto id = pool->register_layout(layout);
  const auto codec = pool->layout(id);
  if (codec->page_bytes() != 256u << 10) GTEST_SKIP() << "fp32 page has metadata";
  // Not allocated: the quota check fails before the backend is called.
  const auto msg =
      expect_status(Status::quota_exceeded, [&] { (void)pool->open_arena("alice", id, 8192); });
  EXPECT_EQ(msg.rfind("tenant 'alice' quota exceeded: 0 B reserved + 2.0 GiB requested > "
                      "1.2 GiB quota",
                      0),
            0u)
      << msg;
}

TEST(PoolArenas, CapacityExhaustedChangesNothing) {
  auto c = config({tenant("alice"), tenant("bob")});
  auto pool0 = make_pool(c);
  const auto probe = pool0->open_arena("alice", pool0->register_layout(small_layout()), 4);
  c.capacity_bytes = probe.bytes * 2;
  auto pool = make_pool(c);
  const auto layout = pool->register_layout(small_layout());
  EXPECT_TRUE(pool->open_arena("alice", layout, 4).created);
  const auto before = pool->stats();
  const auto msg =
      expect_status(Status::pool_exhausted, [&] { (void)pool->open_arena("bob", layout, 5); });
  EXPECT_EQ(msg.rfind("pool capacity exceeded: ", 0), 0u) << msg;
  EXPECT_TRUE(same_stats(before, pool->stats()));
  EXPECT_TRUE(pool->open_arena("bob", layout, 4).created);  // exactly at capacity
  EXPECT_EQ(pool->stats().reserved_bytes, pool->stats().capacity_bytes);
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

/// A backend that fails when told to: the pool must undo its accounting.
class FlakyBackend final : public MemoryResource {
 public:
  explicit FlakyBackend(std::atomic<bool>& fail) : fail_(fail) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "flaky"; }
  [[nodiscard]] MemorySpace space() const noexcept override { return MemorySpace::host; }
  [[nodiscard]] int device() const noexcept override { return -1; }
  [[nodiscard]] std::size_t granularity() const noexcept override { return 1; }
  std::vector<std::string> labels;

  [[nodiscard]] std::span<const HandleKind> handle_kinds() const noexcept override {
    return inner_.handle_kinds();
  }

 private:
  std::shared_ptr<Allocation> do_allocate(std::size_t bytes, std::string_view label,
                                          HandleKind handle) override {
    labels.emplace_back(label);
    if (fail_) throw StatusError(Status::pool_exhausted, "flaky: no memory today");
    return inner_.allocate(bytes, label, handle);
  }
  std::atomic<bool>& fail_;
  HostMemfdResource inner_;
};

TEST(PoolArenas, BackendFailureUndoesTheAccounting) {
  std::atomic<bool> fail{true};
  auto flaky = std::make_shared<FlakyBackend>(fail);
  Pool pool(config({tenant("alice", 1ull << 20)}), flaky);
  EXPECT_EQ(pool.backend_name(), "flaky");
  const auto layout = pool.register_layout(small_layout());
  const auto before = pool.stats();
  const auto msg =
      expect_status(Status::pool_exhausted, [&] { (void)pool.open_arena("alice", layout, 4); });
  EXPECT_EQ(msg, "flaky: no memory today");
  EXPECT_TRUE(same_stats(before, pool.stats()));
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_TRUE(pool.check().empty()) << join(pool.check());
  fail = false;
  const ArenaInfo a = pool.open_arena("alice", layout, 4);
  EXPECT_TRUE(a.created);
  EXPECT_EQ(pool.stats().tenants[0].reserved_bytes, a.bytes);
  ASSERT_EQ(flaky->labels.size(), 2u);
  EXPECT_EQ(flaky->labels[1], "statepool-arena-alice-" + std::to_string(layout));
  EXPECT_TRUE(pool.check().empty()) << join(pool.check());
}

// --- slots -----------------------------------------------------------------------------

class PoolSlots : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = make_pool(config({tenant("alice"), tenant("bob")}));
    layout_ = pool_->register_layout(small_layout());
    alice_ = pool_->open_arena("alice", layout_, 8);
    bob_ = pool_->open_arena("bob", layout_, 8);
  }
  void TearDown() override { EXPECT_TRUE(pool_->check().empty()) << join(pool_->check()); }

  std::uint32_t used(const ArenaInfo& arena) const {
    return pool_->arena(arena.tenant, arena.id).pages_used;
  }

  std::unique_ptr<Pool> pool_;
  LayoutId layout_ = 0;
  ArenaInfo alice_;
  ArenaInfo bob_;
};

TEST_F(PoolSlots, AllocateIsAllOrNothingWithAClearExhaustionMessage) {
  const auto lease = pool_->attach_lease("alice", "").id;
  const auto five = pool_->allocate(lease, alice_.id, 5);
  EXPECT_EQ(five.size(), 5u);
  EXPECT_EQ(std::set<SlotId>(five.begin(), five.end()).size(), 5u);

  const auto before = pool_->stats();
  const auto msg =
      expect_status(Status::pool_exhausted, [&] { (void)pool_->allocate(lease, alice_.id, 4); });
  EXPECT_EQ(msg, "arena " + std::to_string(alice_.id) +
                     " (tenant 'alice', layout 'demo'): 3 of 8 pages free, 4 requested");
  EXPECT_TRUE(same_stats(before, pool_->stats()));
  expect_status(Status::invalid_argument, [&] { (void)pool_->allocate(lease, alice_.id, 0); });
  expect_status(Status::not_found, [&] { (void)pool_->allocate(lease, 99, 1); });
  expect_status(Status::not_found, [&] { (void)pool_->allocate(12345, alice_.id, 1); });
  EXPECT_TRUE(same_stats(before, pool_->stats()));

  EXPECT_EQ(pool_->allocate(lease, alice_.id, 3).size(), 3u);
  EXPECT_EQ(used(alice_), 8u);
  EXPECT_EQ(used(bob_), 0u);
}

TEST_F(PoolSlots, FreeIsAllOrNothing) {
  const auto lease = pool_->attach_lease("alice", "").id;
  const auto other = pool_->attach_lease("alice", "").id;
  const auto mine = pool_->allocate(lease, alice_.id, 3);
  const auto theirs = pool_->allocate(other, alice_.id, 1);
  const auto before = pool_->stats();

  const SlotId a = mine[0];
  const SlotId b = mine[1];
  const SlotId unallocated = 7;
  ASSERT_EQ(std::count(mine.begin(), mine.end(), unallocated), 0);
  const auto range_msg = expect_status(Status::invalid_argument, [&] {
    const SlotId list[] = {a, 8};
    (void)pool_->free(lease, alice_.id, list);
  });
  EXPECT_NE(range_msg.find("out of range"), std::string::npos) << range_msg;
  const auto dup_msg = expect_status(Status::invalid_argument, [&] {
    const SlotId list[] = {a, b, a};
    (void)pool_->free(lease, alice_.id, list);
  });
  EXPECT_NE(dup_msg.find("twice"), std::string::npos) << dup_msg;
  const auto free_msg = expect_status(Status::invalid_argument, [&] {
    const SlotId list[] = {a, unallocated};
    (void)pool_->free(lease, alice_.id, list);
  });
  EXPECT_NE(free_msg.find("not allocated"), std::string::npos) << free_msg;
  expect_status(Status::not_owner, [&] {
    const SlotId list[] = {a, theirs[0]};
    (void)pool_->free(lease, alice_.id, list);
  });
  EXPECT_TRUE(same_stats(before, pool_->stats()));

  EXPECT_EQ(pool_->free(lease, alice_.id, {}), 0u);
  const SlotId pair[] = {b, a};
  EXPECT_EQ(pool_->free(lease, alice_.id, pair), 2u);
  EXPECT_EQ(used(alice_), 2u);
  // Freed already: a second free is an error, not a corruption.
  expect_status(Status::invalid_argument, [&] { (void)pool_->free(lease, alice_.id, pair); });
  expect_status(Status::invalid_argument, [&] { (void)pool_->page(lease, alice_.id, a); });
  // Freed slots can be handed out again.
  EXPECT_EQ(pool_->allocate(lease, alice_.id, 6).size(), 6u);
  EXPECT_EQ(used(alice_), 8u);
}

TEST_F(PoolSlots, TenantsCannotTouchEachOthersArenas) {
  const auto a = pool_->attach_lease("alice", "").id;
  const auto b = pool_->attach_lease("bob", "").id;
  const auto bobs = pool_->allocate(b, bob_.id, 1);
  const auto before = pool_->stats();
  const auto msg =
      expect_status(Status::permission_denied, [&] { (void)pool_->allocate(a, bob_.id, 1); });
  EXPECT_EQ(msg.find("bob"), std::string::npos) << "leaks the owner's name: " << msg;
  expect_status(Status::permission_denied, [&] { (void)pool_->free(a, bob_.id, bobs); });
  expect_status(Status::permission_denied, [&] { (void)pool_->page(a, bob_.id, bobs[0]); });
  expect_status(Status::permission_denied, [&] { (void)pool_->arena("alice", bob_.id); });
  EXPECT_TRUE(same_stats(before, pool_->stats()));
}

TEST_F(PoolSlots, SlotsBelongToTheirLease) {
  const auto a = pool_->attach_lease("alice", "").id;
  const auto b = pool_->attach_lease("alice", "").id;
  const auto as = pool_->allocate(a, alice_.id, 2);
  const auto msg = expect_status(Status::not_owner, [&] { (void)pool_->free(b, alice_.id, as); });
  EXPECT_NE(msg.find("another lease"), std::string::npos) << msg;
  expect_status(Status::not_owner, [&] { (void)pool_->page(b, alice_.id, as[0]); });
  expect_status(Status::invalid_argument, [&] { (void)pool_->page(a, alice_.id, 8); });
  EXPECT_EQ(used(alice_), 2u);
  EXPECT_EQ(pool_->page(a, alice_.id, as[1]).bytes.size(), alice_.page_bytes);
}

TEST_F(PoolSlots, PagesAreDisjointAlignedAndSized) {
  const auto lease = pool_->attach_lease("alice", "").id;
  const auto slots = pool_->allocate(lease, alice_.id, 8);
  const auto codec = pool_->layout(layout_);
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;
  for (const SlotId slot : slots) {
    const PageRef page = pool_->page(lease, alice_.id, slot);
    EXPECT_EQ(page.bytes.size(), codec->page_bytes());
    EXPECT_EQ(page.codec, codec);
    EXPECT_EQ(page.memory, alice_.memory) << "the page keeps its arena's memory alive";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(page.bytes.data()) % kPageAlignment, 0u);
    ranges.emplace_back(page.bytes.data(), page.bytes.data() + page.bytes.size());
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "pages overlap";
  }
  // Every page lies within the arena: [first page, first page + arena bytes).
  const PageRef first = pool_->page(lease, alice_.id, 0);
  for (const auto& [begin, end] : ranges) {
    EXPECT_GE(begin, first.bytes.data());
    EXPECT_LE(end, first.bytes.data() + alice_.bytes);
  }
}

// What a client sees: the arena fd mapped in its own address space shows the pages the
// daemon writes, and the daemon sees what the client writes.
TEST_F(PoolSlots, PagesAreSharedThroughTheArenaFd) {
  const auto lease = pool_->attach_lease("alice", "").id;
  const auto slots = pool_->allocate(lease, alice_.id, 3);
  void* peer = ::mmap(nullptr, alice_.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, alice_.fd, 0);
  ASSERT_NE(peer, MAP_FAILED) << std::strerror(errno);
  auto* client = static_cast<std::byte*>(peer);
  for (const SlotId slot : slots) {
    const PageRef page = pool_->page(lease, alice_.id, slot);
    std::memset(page.bytes.data(), static_cast<int>(0x10 + slot), page.bytes.size());
  }
  for (const SlotId slot : slots) {
    const std::byte* p = client + std::size_t{slot} * alice_.page_stride;
    for (std::size_t i = 0; i < alice_.page_bytes; ++i) {
      ASSERT_EQ(p[i], static_cast<std::byte>(0x10 + slot)) << "slot " << slot << " byte " << i;
    }
  }
  client[std::size_t{slots[1]} * alice_.page_stride + 5] = std::byte{0xee};
  EXPECT_EQ(pool_->page(lease, alice_.id, slots[1]).bytes[5], std::byte{0xee});
  ::munmap(peer, alice_.bytes);
}

TEST_F(PoolSlots, ArenaFdIsSealed) {
  errno = 0;
  EXPECT_EQ(::ftruncate(alice_.fd, 0), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::ftruncate(alice_.fd, static_cast<off_t>(alice_.bytes * 2)), -1);
  EXPECT_EQ(errno, EPERM);
}

TEST_F(PoolSlots, StatsAccountPerTenant) {
  const auto a = pool_->attach_lease("alice", "").id;
  const auto b = pool_->attach_lease("bob", "").id;
  (void)pool_->allocate(a, alice_.id, 3);
  (void)pool_->allocate(b, bob_.id, 1);
  pool_->detach_lease(b, kT0);
  const auto codec = pool_->layout(layout_);
  const PoolStats stats = pool_->stats();
  EXPECT_EQ(stats.capacity_bytes, 64ull << 20);
  EXPECT_EQ(stats.reserved_bytes, alice_.bytes + bob_.bytes);
  EXPECT_EQ(stats.leases_active, 1u);
  EXPECT_EQ(stats.leases_orphaned, 1u);
  EXPECT_EQ(stats.pages_reclaimed_total, 0u);
  ASSERT_EQ(stats.arenas.size(), 2u);
  EXPECT_EQ(stats.arenas[0].pages_used, 3u);
  EXPECT_EQ(stats.arenas[1].pages_used, 1u);
  ASSERT_EQ(stats.tenants.size(), 2u);
  const TenantUsage& alice = stats.tenants[0];
  EXPECT_EQ(alice.name, "alice");
  EXPECT_EQ(alice.reserved_bytes, alice_.bytes);
  EXPECT_EQ(alice.pages_used, 3u);
  EXPECT_EQ(alice.stored_bytes, 3 * codec->page_bytes());
  EXPECT_EQ(alice.fp32_bytes, 3 * codec->fp32_bytes());
  EXPECT_EQ(stats.tenants[1].pages_used, 1u);
}

// --- leases ----------------------------------------------------------------------------

TEST_F(PoolSlots, TokensAre32HexCharactersAndUnique) {
  const auto g1 = pool_->attach_lease("alice", "");
  const auto g2 = pool_->attach_lease("alice", "");
  EXPECT_TRUE(is_lease_token(g1.token)) << g1.token;
  EXPECT_TRUE(is_lease_token(g2.token)) << g2.token;
  EXPECT_NE(g1.token, g2.token);
  EXPECT_NE(g1.id, g2.id);
  EXPECT_FALSE(g1.resumed);
  EXPECT_EQ(g1.slots, 0u);
}

TEST_F(PoolSlots, DetachKeepsSlotsUntilTheDeadlineThenReclaimsExactlyThem) {
  const auto leaving = pool_->attach_lease("alice", "");
  const auto staying = pool_->attach_lease("alice", "").id;
  const auto kept = pool_->allocate(staying, alice_.id, 2);
  (void)pool_->allocate(leaving.id, alice_.id, 3);
  EXPECT_FALSE(pool_->next_deadline().has_value());

  pool_->detach_lease(leaving.id, kT0);
  ASSERT_TRUE(pool_->next_deadline().has_value());
  EXPECT_EQ(*pool_->next_deadline(), kT0 + 10s);
  EXPECT_EQ(pool_->stats().leases_orphaned, 1u);
  expect_status(Status::not_found, [&] { (void)pool_->allocate(leaving.id, alice_.id, 1); });

  EXPECT_EQ(pool_->reclaim_expired(kT0 + 10s - 1ms), 0u);
  EXPECT_EQ(used(alice_), 5u);
  EXPECT_EQ(pool_->reclaim_expired(kT0 + 10s), 3u);
  EXPECT_EQ(used(alice_), 2u);
  EXPECT_EQ(pool_->stats().pages_reclaimed_total, 3u);
  EXPECT_EQ(pool_->stats().leases_orphaned, 0u);
  EXPECT_FALSE(pool_->next_deadline().has_value());
  EXPECT_EQ(pool_->reclaim_expired(kT0 + 1h), 0u);
  // The other lease's slots were not touched.
  for (const SlotId slot : kept) (void)pool_->page(staying, alice_.id, slot);
  // The token is gone: presenting it starts a new, empty lease.
  const auto again = pool_->attach_lease("alice", leaving.token, kT0 + 11s);
  EXPECT_FALSE(again.resumed);
  EXPECT_NE(again.id, leaving.id);
  EXPECT_EQ(again.slots, 0u);
}

TEST_F(PoolSlots, ResumeWithinGraceReturnsTheSameUsableSlots) {
  const auto grant = pool_->attach_lease("alice", "");
  const auto slots = pool_->allocate(grant.id, alice_.id, 3);
  std::memset(pool_->page(grant.id, alice_.id, slots[2]).bytes.data(), 0x42, 16);
  pool_->detach_lease(grant.id, kT0);

  const auto resumed = pool_->attach_lease("alice", grant.token, kT0 + 9s);
  EXPECT_TRUE(resumed.resumed);
  EXPECT_EQ(resumed.id, grant.id);
  EXPECT_EQ(resumed.token, grant.token);
  EXPECT_EQ(resumed.slots, 3u);
  EXPECT_FALSE(pool_->next_deadline().has_value());
  EXPECT_EQ(pool_->reclaim_expired(kT0 + 1h), 0u);  // attached again: never reclaimed
  EXPECT_EQ(pool_->page(resumed.id, alice_.id, slots[2]).bytes[15], std::byte{0x42});
  EXPECT_EQ(pool_->free(resumed.id, alice_.id, slots), 3u);
  EXPECT_EQ(pool_->stats().leases_active, 1u);
}

TEST_F(PoolSlots, ResumeAfterExpiryStartsANewLeaseAndReclaimsTheOld) {
  const auto grant = pool_->attach_lease("alice", "");
  (void)pool_->allocate(grant.id, alice_.id, 3);
  pool_->detach_lease(grant.id, kT0);
  // Not reclaimed yet by the timer, but expired: attach must not hand the slots back.
  const auto fresh = pool_->attach_lease("alice", grant.token, kT0 + 10s);
  EXPECT_FALSE(fresh.resumed);
  EXPECT_NE(fresh.id, grant.id);
  EXPECT_NE(fresh.token, grant.token);
  EXPECT_EQ(fresh.slots, 0u);
  EXPECT_EQ(used(alice_), 0u);
  EXPECT_EQ(pool_->stats().pages_reclaimed_total, 3u);
  EXPECT_FALSE(pool_->next_deadline().has_value());
}

TEST_F(PoolSlots, ResumingAnAttachedLeaseIsBusy) {
  const auto grant = pool_->attach_lease("alice", "");
  (void)pool_->allocate(grant.id, alice_.id, 1);
  const auto before = pool_->stats();
  expect_status(Status::lease_busy, [&] { (void)pool_->attach_lease("alice", grant.token); });
  EXPECT_TRUE(same_stats(before, pool_->stats()));
}

TEST_F(PoolSlots, AnotherTenantsTokenStartsANewLeaseAndLeavesTheOwnerAlone) {
  const auto alice = pool_->attach_lease("alice", "");
  (void)pool_->allocate(alice.id, alice_.id, 2);
  pool_->detach_lease(alice.id, kT0);
  const auto bob = pool_->attach_lease("bob", alice.token, kT0 + 1s);
  EXPECT_FALSE(bob.resumed);
  EXPECT_NE(bob.id, alice.id);
  EXPECT_EQ(bob.slots, 0u);
  expect_status(Status::permission_denied, [&] { (void)pool_->allocate(bob.id, alice_.id, 1); });
  EXPECT_EQ(pool_->stats().leases_orphaned, 1u);
  EXPECT_EQ(used(alice_), 2u);
  // Even an expired one is left to its owner's timer (bob's attach reclaims nothing).
  const auto bob2 = pool_->attach_lease("bob", alice.token, kT0 + 1h);
  EXPECT_FALSE(bob2.resumed);
  EXPECT_EQ(used(alice_), 2u);
  const auto back = pool_->attach_lease("alice", alice.token, kT0 + 2s);
  EXPECT_TRUE(back.resumed);
  EXPECT_EQ(back.id, alice.id);
  EXPECT_EQ(back.slots, 2u);
}

TEST_F(PoolSlots, DetachingAnEmptyLeaseDropsItAtOnce) {
  const auto grant = pool_->attach_lease("alice", "");
  pool_->detach_lease(grant.id, kT0);
  EXPECT_EQ(pool_->stats().leases_active, 0u);
  EXPECT_EQ(pool_->stats().leases_orphaned, 0u);
  EXPECT_FALSE(pool_->next_deadline().has_value());
  EXPECT_FALSE(pool_->attach_lease("alice", grant.token, kT0).resumed);
}

TEST_F(PoolSlots, DetachIsIdempotentAndKeepsTheFirstDeadline) {
  const auto grant = pool_->attach_lease("alice", "");
  (void)pool_->allocate(grant.id, alice_.id, 1);
  pool_->detach_lease(grant.id, kT0);
  pool_->detach_lease(grant.id, kT0 + 5s);
  pool_->detach_lease(424242, kT0);  // unknown: no-op
  EXPECT_EQ(*pool_->next_deadline(), kT0 + 10s);
  EXPECT_EQ(pool_->stats().leases_orphaned, 1u);
}

TEST_F(PoolSlots, DeadlinesAreReclaimedInOrder) {
  std::vector<LeaseGrant> grants;
  for (int i = 0; i < 3; ++i) {
    grants.push_back(pool_->attach_lease("alice", ""));
    (void)pool_->allocate(grants.back().id, alice_.id, static_cast<std::uint32_t>(i + 1));
  }
  pool_->detach_lease(grants[2].id, kT0 + 2s);
  pool_->detach_lease(grants[0].id, kT0);
  pool_->detach_lease(grants[1].id, kT0 + 1s);
  EXPECT_EQ(*pool_->next_deadline(), kT0 + 10s);
  EXPECT_EQ(pool_->reclaim_expired(kT0 + 10s), 1u);
  EXPECT_EQ(*pool_->next_deadline(), kT0 + 11s);
  EXPECT_EQ(pool_->reclaim_expired(kT0 + 12s), 5u);
  EXPECT_FALSE(pool_->next_deadline().has_value());
  EXPECT_EQ(pool_->stats().pages_reclaimed_total, 6u);
  EXPECT_EQ(used(alice_), 0u);
}

TEST(PoolConcurrency, ThreadsWithTheirOwnLeasesNeverShareASlot) {
  auto pool = make_pool();
  const auto layout = pool->register_layout(small_layout());
  const auto arena = pool->open_arena("", layout, 64);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto lease = pool->attach_lease("", "").id;
      for (int round = 0; round < 200; ++round) {
        std::vector<SlotId> mine;
        try {
          mine = pool->allocate(lease, arena.id, 4);
        } catch (const StatusError& e) {
          if (e.status() != Status::pool_exhausted) ++failures;
          continue;
        }
        for (const SlotId slot : mine) {
          auto bytes = pool->page(lease, arena.id, slot).bytes;
          std::memset(bytes.data(), t + 1, bytes.size());
        }
        for (const SlotId slot : mine) {
          const auto bytes = pool->page(lease, arena.id, slot).bytes;
          for (const std::byte b : bytes) {
            if (b != static_cast<std::byte>(t + 1)) {
              ++failures;
              break;
            }
          }
        }
        if (pool->free(lease, arena.id, mine) != mine.size()) ++failures;
      }
      pool->detach_lease(lease, Clock::now());
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pool->arena("", arena.id).pages_used, 0u);
  EXPECT_EQ(pool->stats().leases_active, 0u);
  EXPECT_TRUE(pool->check().empty()) << join(pool->check());
}

TEST(PoolLeases, ZeroGracePeriodReclaimsAtDetach) {
  auto c = config();
  c.grace_period = std::chrono::milliseconds(0);
  auto pool = make_pool(c);
  const auto layout = pool->register_layout(small_layout());
  const auto arena = pool->open_arena("", layout, 4).id;
  const auto lease = pool->attach_lease("", "");
  ASSERT_EQ(pool->allocate(lease.id, arena, 3).size(), 3u);
  pool->detach_lease(lease.id, kT0);
  const auto stats = pool->stats();
  EXPECT_EQ(stats.arenas.at(0).pages_used, 0u);
  EXPECT_EQ(stats.pages_reclaimed_total, 3u);
  EXPECT_EQ(stats.leases_orphaned, 0u);
  EXPECT_FALSE(pool->next_deadline().has_value());
  EXPECT_TRUE(pool->check().empty());
  // The token is gone with the lease: presenting it starts a new, empty lease.
  const auto again = pool->attach_lease("", lease.token);
  EXPECT_FALSE(again.resumed);
  EXPECT_EQ(again.slots, 0u);
}

TEST(PoolPlans, InstallIsIdempotentAndLookupsNameTheRemedy) {
  auto pool = make_pool();
  auto plan = std::make_shared<kernels::stepquant::Plan>();
  plan->num_layers = 1;
  plan->num_heads = 2;
  plan->key_dim = 8;
  plan->value_dim = 8;
  plan->budget_bits = 6;
  plan->widths = {6, 8};
  plan->impact.assign(16, 1.0f);
  const PlanInfo first = pool->install_plan(plan);
  EXPECT_TRUE(first.created);
  EXPECT_EQ(first.digest, kernels::stepquant::digest(*plan));
  EXPECT_EQ(first.units, 2u);
  EXPECT_DOUBLE_EQ(first.average_bits, 7.0);
  EXPECT_FALSE(pool->install_plan(std::make_shared<kernels::stepquant::Plan>(*plan)).created);
  EXPECT_EQ(pool->plan(first.digest).get(), plan.get());
  EXPECT_EQ(pool->plans().size(), 1u);
  const std::string message =
      expect_status(Status::not_found, [&] { (void)pool->plan("0000000000000000"); });
  EXPECT_NE(message.find("--plan"), std::string::npos) << message;
  auto bad = std::make_shared<kernels::stepquant::Plan>(*plan);
  bad->widths = {6, 5};  // not a candidate width
  expect_status(Status::invalid_argument, [&] { (void)pool->install_plan(bad); });
  EXPECT_EQ(pool->plans().size(), 1u);
}

}  // namespace
}  // namespace statepool::service
