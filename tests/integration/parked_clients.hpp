#pragma once
// Clients that park states (a lease with two slots, a compressed page, a snapshot, some
// pinned) and, after the daemon changed process (a hand-over, a crash recovery), resume
// them and check every byte: the integration tests of docs/operations.md §10.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"

namespace statepool::testing {

namespace client = statepool::client;
namespace kernels = statepool::kernels;

inline kernels::StateLayout layout_of(kernels::CodecId codec) {
  kernels::StateLayout l;
  l.name = std::string("handover-") + kernels::to_string(codec);
  l.arch = kernels::Arch::gdn;
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.conv_channels = 64;
  l.conv_width = 3;
  l.conv_dtype = kernels::DType::f32;
  l.codec.id = codec;
  return l;
}

inline constexpr kernels::CodecId kCodecs[] = {kernels::CodecId::int8, kernels::CodecId::fp32,
                                               kernels::CodecId::bf16, kernels::CodecId::int6};

/// What one client parked before the hand-over, to find again after it.
struct Parked {
  std::string token;
  kernels::CodecId codec = kernels::CodecId::int8;
  client::ArenaId arena = 0;
  std::vector<client::SlotId> slots;
  std::vector<std::byte> page;     // slot 0's page
  std::vector<std::byte> decoded;  // slot 0 decompressed
  std::string snapshot;            // its published key
  bool pinned = false;
};

inline Parked park(const DaemonProcess& daemon, int i) {
  Parked p;
  p.codec = kCodecs[i % 4];
  auto conn = client::Connection::connect(client_options(daemon));
  auto arena = conn.open_arena(conn.register_layout(layout_of(p.codec)), 16);
  const std::size_t state = arena.codec().staged_bytes(kernels::DType::f32);
  auto staging = conn.open_staging(2 * state);
  const std::vector<float> values =
      statepool::synthetic::gaussian_values(state / sizeof(float), 100 + i, 0.05f);
  std::memcpy(staging.bytes().data(), values.data(), state);
  auto slots = conn.allocate(arena, 2);
  conn.compress(slots[0], staging, 0);
  conn.decompress(slots[0], staging, state);
  p.decoded.assign(staging.bytes().begin() + state, staging.bytes().begin() + 2 * state);
  p.page.assign(arena.page(slots[0]).begin(), arena.page(slots[0]).end());
  p.snapshot = "prefix-" + std::to_string(i);
  EXPECT_TRUE(conn.put_snapshot(slots[0], {p.snapshot, 64}).created);
  if (i % 3 == 0) {
    EXPECT_EQ(conn.pin_snapshot({p.snapshot, 64}), 1u);
    p.pinned = true;
  }
  p.arena = arena.id();
  for (auto& s : slots) p.slots.push_back(s.release());
  p.token = conn.lease_token();
  return p;  // the connection drops with its slots parked
}

/// Reconnects with the lease token and checks everything the client parked.
inline void resume(const DaemonProcess& daemon, const Parked& p, int i) {
  SCOPED_TRACE("client " + std::to_string(i));
  auto options = client_options(daemon);
  options.lease_token = p.token;
  auto conn = client::Connection::connect(options);
  EXPECT_TRUE(conn.lease_resumed());
  EXPECT_EQ(conn.resumed_slots(), 2u);
  auto arena = conn.open_arena(conn.register_layout(layout_of(p.codec)));
  ASSERT_EQ(arena.id(), p.arena);
  auto slot = conn.adopt(p.arena, p.slots[0]);
  auto other = conn.adopt(p.arena, p.slots[1]);
  const auto page = arena.page(slot);
  ASSERT_EQ(page.size(), p.page.size());
  EXPECT_EQ(std::memcmp(page.data(), p.page.data(), page.size()), 0) << "the page changed";
  auto staging = conn.open_staging(p.decoded.size());
  conn.decompress(slot, staging, 0);
  EXPECT_EQ(std::memcmp(staging.bytes().data(), p.decoded.data(), p.decoded.size()), 0)
      << "the decoded state changed";
  // Its snapshot hits (into the other slot) with the same page.
  const client::SnapshotGet hit = conn.get_snapshot({p.snapshot, 64}, other);
  EXPECT_TRUE(hit.hit);
  EXPECT_EQ(std::memcmp(arena.page(other).data(), p.page.data(), p.page.size()), 0);
  EXPECT_EQ(conn.free(p.arena, p.slots), 2u);
  (void)slot.release();
  (void)other.release();
}

}  // namespace statepool::testing
