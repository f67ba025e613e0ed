// The README's "Quick start for an engine author", verbatim apart from the socket path and
// smaller dimensions, run against a real daemon: if this stops compiling or working, the
// README is wrong. Keep the two in step.
#include <gtest/gtest.h>

#include <signal.h>

#include "statepool/client.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"

TEST(Readme, QuickStartCompilesAndRuns) {
  statepool::testing::DaemonProcess daemon({"--tenant", "team-a"});
  const std::string socket = daemon.socket_path();
  // ---- README ----
  // clang-format off
  namespace sc = statepool::client;
  sc::Options options;
  options.socket_path = socket;  options.tenant = "team-a";
  auto conn = sc::Connection::connect(options);           // connect + Hello (lease)
  statepool::kernels::StateLayout layout;                 // smaller than the README's
  layout.name = "qwen3-next";  layout.num_layers = 3;  layout.num_heads = 4;
  layout.key_dim = layout.value_dim = 128;  layout.conv_channels = 256;  layout.conv_width = 3;
  layout.codec.id = statepool::kernels::CodecId::int8;
  auto info = conn.register_layout(layout);               // exact page size, staged size
  auto arena = conn.open_arena(info, 16);                 // 16 pages, mapped into this process
  auto staging = conn.open_staging(info.state_bytes_f32); // shared buffer for full-precision states
  auto slot = std::move(conn.allocate(arena, 1).front()); // RAII: freed when it goes out of scope
  conn.compress(slot, staging, 0);   /* park */           conn.decompress(slot, staging, 0);  /* resume */
  // clang-format on
  // ---- end ----
  EXPECT_EQ(conn.stats().arenas.at(0).pages_used, 1u);
  EXPECT_EQ(daemon.stop(SIGTERM, std::chrono::seconds(10)), 0);
}
