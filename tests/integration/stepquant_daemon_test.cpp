// STEPQuant through the daemon: plans installed by clients or loaded at start, stepquant
// layouts registered, pages written and read back, and every way a plan can be wrong.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"
#include "statepool/testing/raw_peer.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace sp = statepool;
namespace client = statepool::client;
namespace kernels = statepool::kernels;
namespace sq = statepool::kernels::stepquant;
using statepool::testing::client_options;
using statepool::testing::DaemonProcess;
using namespace std::chrono_literals;

namespace {

// A small GDN plan: mostly 6-bit heads, one 8-bit, one 4-bit, one FP16 pivot.
std::shared_ptr<const sq::Plan> small_plan() {
  auto plan = std::make_shared<sq::Plan>();
  plan->arch = kernels::Arch::gdn;
  plan->num_layers = 2;
  plan->num_heads = 4;
  plan->key_dim = 32;
  plan->value_dim = 32;
  plan->budget_bits = 6;
  plan->widths.assign(8, 6);
  plan->widths[1] = 8;
  plan->widths[2] = 4;
  plan->widths[5] = sq::kPivotWidth;
  plan->impact.assign(8 * 32, 1.0f);
  for (std::size_t i = 0; i < plan->impact.size(); ++i)
    plan->impact[i] = 0.5f + static_cast<float>(i % 7) * 0.25f;
  plan->source = "integration test";
  return plan;
}

kernels::StateLayout stepquant_layout(std::shared_ptr<const sq::Plan> plan) {
  kernels::StateLayout l;
  l.name = "it-stepquant";
  l.num_layers = 2;
  l.num_heads = 4;
  l.key_dim = 32;
  l.value_dim = 32;
  l.conv_channels = 16;
  l.conv_width = 3;
  l.codec.id = kernels::CodecId::stepquant6;
  l.plan = std::move(plan);
  return l;
}

}  // namespace

TEST(StepQuantDaemon, ClientInstallsThePlanAndPagesMatchTheLocalEncoder) {
  DaemonProcess daemon({}, true);
  auto conn = client::Connection::connect(client_options(daemon));
  const auto layout = stepquant_layout(small_plan());
  const auto info = conn.register_layout(layout);  // installs the plan on the way
  EXPECT_GT(info.compression_ratio(), 3.0);
  auto arena = conn.open_arena(info, 4);
  auto staging = conn.open_staging(2 * info.state_bytes_f32);
  auto slots = conn.allocate(arena, 1);

  auto state = staging.bytes().subspan(0, info.state_bytes_f32);
  const std::vector<float> values =
      statepool::synthetic::gaussian_values<std::mt19937>(info.state_bytes_f32 / 4, 3, 0.1f);
  std::memcpy(state.data(), values.data(), state.size());
  conn.compress(slots[0], staging, 0);

  std::vector<std::byte> local(info.page_bytes);
  arena.codec().encode(state, kernels::DType::f32, local);
  EXPECT_EQ(std::memcmp(arena.page(slots[0]).data(), local.data(), local.size()), 0);
  conn.decompress(slots[0], staging, info.state_bytes_f32);
  double num = 0, den = 0;
  const auto* back = reinterpret_cast<const float*>(staging.bytes().data() + info.state_bytes_f32);
  for (std::size_t i = 0; i < values.size(); ++i) {
    num += (values[i] - back[i]) * (values[i] - back[i]);
    den += values[i] * values[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.1);

  // The second registration finds the plan installed and the layout registered.
  EXPECT_EQ(conn.register_layout(layout).id, info.id);
  EXPECT_FALSE(conn.install_plan(*layout.plan).created);

  // stepquant arenas are reported like any other.
  const std::string metrics = statepool::testing::http_get(daemon.metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("codec=\"stepquant6\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("statepool_plan_pivots{plan=\"" + sq::digest(*layout.plan) + "\"} 1"),
            std::string::npos)
      << metrics;
  const auto stats = conn.stats();
  ASSERT_EQ(stats.arenas.size(), 1u);
  EXPECT_EQ(stats.arenas[0].codec, kernels::CodecId::stepquant6);
  EXPECT_NEAR(stats.arenas[0].compression_ratio(), info.compression_ratio(), 1e-9);
  EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
}

TEST(StepQuantDaemon, PlansLoadAtStartAndBadPlansAreClearErrors) {
  const statepool::testing::TempDir tmp("/tmp/statepool-plans");
  const std::string& dir = tmp.path();
  const auto plan = small_plan();
  sq::save(*plan, dir + "/good.spqp");

  {
    DaemonProcess daemon({"--plan-dir", dir});
    EXPECT_NE(daemon.log().find(sq::digest(*plan)), std::string::npos) << daemon.log();
    // Registering by digest alone works: the daemon has the plan.
    statepool::testing::RawPeer peer(daemon.socket_path());
    flatbuffers::FlatBufferBuilder b;
    b.Finish(sp::wire::CreateRequest(b, 1, sp::wire::RequestBody::Hello,
                                     sp::wire::CreateHello(b, 1, 1).Union()));
    ASSERT_TRUE(peer.send_frame(b));
    ASSERT_TRUE(peer.read_reply().has_value());
    auto register_with = [&](const std::string& digest, sp::wire::CodecId codec) {
      b.Clear();
      const auto layout = sp::wire::CreateLayoutDirect(
          b, "raw", sp::wire::Arch::gdn, 2, 4, 32, 32, 0, 0, sp::wire::DType::bf16, codec,
          sp::wire::CreateCodecParams(b), digest.empty() ? nullptr : digest.c_str());
      b.Finish(sp::wire::CreateRequest(b, 2, sp::wire::RequestBody::RegisterLayout,
                                       sp::wire::CreateRegisterLayout(b, layout).Union()));
      EXPECT_TRUE(peer.send_frame(b));
      auto reply = peer.read_reply();
      EXPECT_TRUE(reply.has_value());
      const auto* r = statepool::testing::as_reply(*reply);
      return std::make_pair(r->status(), r->message() ? r->message()->str() : std::string());
    };
    EXPECT_EQ(register_with(sq::digest(*plan), sp::wire::CodecId::stepquant6).first,
              sp::wire::Status::ok);
    // A budget mismatch (a 6-bit plan for stepquant4), an unknown digest, and no digest.
    auto [status, message] = register_with(sq::digest(*plan), sp::wire::CodecId::stepquant4);
    EXPECT_EQ(status, sp::wire::Status::invalid_argument) << message;
    std::tie(status, message) = register_with("0123456789abcdef", sp::wire::CodecId::stepquant6);
    EXPECT_EQ(status, sp::wire::Status::not_found);
    EXPECT_NE(message.find("InstallPlan"), std::string::npos) << message;
    std::tie(status, message) = register_with("", sp::wire::CodecId::stepquant6);
    EXPECT_EQ(status, sp::wire::Status::invalid_argument);
    EXPECT_NE(message.find("plan"), std::string::npos) << message;
    // Garbage plan bytes over the wire.
    b.Clear();
    const std::vector<std::uint8_t> junk(200, 0x5a);
    b.Finish(sp::wire::CreateRequest(b, 3, sp::wire::RequestBody::InstallPlan,
                                     sp::wire::CreateInstallPlanDirect(b, &junk).Union()));
    ASSERT_TRUE(peer.send_frame(b));
    const auto reply = peer.read_reply();
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(statepool::testing::as_reply(*reply)->status(), sp::wire::Status::invalid_argument);
    EXPECT_EQ(daemon.stop(SIGTERM, 10s), 0);
  }

  // A corrupt plan file stops the daemon at start with a message naming the file.
  std::string bytes;
  {
    std::ifstream in(dir + "/good.spqp", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(dir + "/bad.spqp", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const auto exit = statepool::testing::run_daemon(
      {"--plan", dir + "/bad.spqp", "--socket", dir + "/sock", "--metrics-address", "off"}, dir);
  EXPECT_EQ(exit.code, 2) << exit.stderr_text;
  EXPECT_NE(exit.stderr_text.find("bad.spqp"), std::string::npos) << exit.stderr_text;
  EXPECT_FALSE(std::filesystem::exists(dir + "/sock"));
}
