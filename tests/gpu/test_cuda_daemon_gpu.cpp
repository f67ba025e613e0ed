// statepoold --backend cuda end to end, as an engine uses it: device arenas and staging
// mapped in the client, states written into device staging, compress / decompress / copy
// by the daemon's kernels (page bytes equal to the CPU codec's), local decode on the device
// with the same kernels, early replies with IPC events, compresses ordered behind the
// engine's stream (`after`), legacy IPC handles, NaN refusal,
// and the engine's fused decode step on the device pages (client::DeviceDecodeStep);
// device memory given back by CloseArena, also after a client holding the arena was
// killed. Skipped without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device_buffer.hpp"
#include "statepool/client.hpp"
#include "statepool/client_cuda.hpp"
#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/client_options.hpp"
#include "statepool/testing/decode_step.hpp"
#include "statepool/testing/gtest/daemon_process.hpp"

namespace {

namespace client = statepool::client;
namespace kernels = statepool::kernels;
using statepool::testing::DaemonProcess;
using statepool::testing::eventually;
using namespace std::chrono_literals;

kernels::StateLayout layout_for(kernels::CodecId codec) {
  kernels::StateLayout l;
  l.name = "gpu-daemon";
  l.num_layers = 3;
  l.num_heads = 4;
  l.key_dim = 64;
  l.value_dim = 64;
  l.conv_channels = 96;
  l.conv_width = 3;
  l.conv_dtype = kernels::DType::bf16;
  l.codec.id = codec;
  return l;
}

client::Options options_for(const DaemonProcess& d) {
  client::Options o = statepool::testing::client_options(d);
  o.timeout = 30s;  // device work and a first CUDA context can be slow
  return o;
}

std::vector<std::byte> state_bytes(const client::LayoutInfo& layout, std::uint64_t seed) {
  std::vector<std::byte> out(layout.state_bytes_f32);
  const std::size_t conv = kernels::PageCodec(layout.layout).conv_bytes();
  const std::size_t n = (out.size() - conv) / 4;
  const std::vector<float> values = statepool::synthetic::gaussian_values(n, seed, 0.05f);
  std::memcpy(out.data(), values.data(), n * 4);
  return out;
}

std::vector<std::byte> download(const std::byte* device, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

void upload(std::byte* device, const std::vector<std::byte>& bytes) {
  ASSERT_EQ(cudaMemcpy(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  // The daemon reads it from another process: the copy must have landed.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaDaemon, DeviceArenasAndStagingMatchTheCpuCodecsEndToEnd) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DaemonProcess daemon({"--backend", "cuda", "--device", "0", "--pool-capacity", "512MiB"});
  auto conn = client::Connection::connect(options_for(daemon));
  for (const kernels::CodecId codec :
       {kernels::CodecId::int8, kernels::CodecId::dsq6, kernels::CodecId::bf16}) {
    SCOPED_TRACE(kernels::to_string(codec));
    const auto layout = conn.register_layout(layout_for(codec));
    auto arena = conn.open_arena(layout, 4);
    ASSERT_EQ(arena.memory().space, kernels::MemorySpace::device);
    EXPECT_EQ(arena.memory().handle_kind, kernels::HandleKind::cuda_vmm_fd);
    ASSERT_NE(arena.device_data(), nullptr);
    const std::size_t state = layout.state_bytes_f32;
    auto staging = conn.open_staging(2 * state);
    ASSERT_NE(staging.device_data(), nullptr);
    auto slots = conn.allocate(arena, 2);

    const auto original = state_bytes(layout, 5);
    upload(staging.device_data(), original);
    conn.compress(slots[0], staging, 0);
    std::vector<std::byte> local(layout.page_bytes);
    arena.codec().encode(original, kernels::DType::f32, local);
    EXPECT_EQ(download(arena.device_page(slots[0].id()), layout.page_bytes), local);

    conn.decompress(slots[0], staging, state);
    std::vector<std::byte> decoded(state);
    arena.codec().decode(local, kernels::DType::f32, decoded);
    EXPECT_EQ(download(staging.device_data() + state, state), decoded);

    // Local decode on the device, no round trip: the same bytes.
    const client::DeviceDecoder decoder(arena, kernels::DType::f32);
    void* mine = nullptr;
    ASSERT_EQ(cudaMalloc(&mine, state), cudaSuccess);
    decoder.decode(slots[0].id(), mine, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(download(static_cast<std::byte*>(mine), state), decoded);
    (void)cudaFree(mine);

    // Early replies: the stream waits on the daemon's event, then sees the work.
    const client::Pending copied = conn.copy_async(arena.id(), slots[0].id(), slots[1].id());
    ASSERT_TRUE(copied.event.has_value());
    client::synchronize(copied);
    EXPECT_EQ(download(arena.device_page(slots[1].id()), layout.page_bytes), local);
    const client::Pending parked = conn.compress_async(arena.id(), slots[1].id(), staging.id(), 0);
    ASSERT_TRUE(parked.event.has_value());
    EXPECT_EQ(parked.bytes, layout.page_bytes);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    client::wait_on_stream(parked, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    (void)cudaStreamDestroy(stream);
    EXPECT_EQ(download(arena.device_page(slots[1].id()), layout.page_bytes), local);

    // A NaN is refused and the page stays as it was.
    auto poisoned = original;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(poisoned.data() + 4 * 77, &nan, 4);
    upload(staging.device_data(), poisoned);
    try {
      conn.compress(slots[0], staging, 0);
      ADD_FAILURE() << "expected not_finite";
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), statepool::Status::not_finite) << e.what();
    }
    EXPECT_EQ(download(arena.device_page(slots[0].id()), layout.page_bytes), local);
  }
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
}

// The engine writes the state on its own stream, behind work that holds the stream for a
// while (a host callback that sleeps), and passes a StreamFence as `after`: the daemon's
// stream waits for the write, so the page is the new state's, with no host wait.
TEST(CudaDaemon, AfterOrdersTheCompressBehindTheEnginesStream) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DaemonProcess daemon({"--backend", "cuda", "--device", "0", "--pool-capacity", "256MiB"});
  auto conn = client::Connection::connect(options_for(daemon));
  const auto layout = conn.register_layout(layout_for(kernels::CodecId::int8));
  auto arena = conn.open_arena(layout, 2);
  auto staging = conn.open_staging(layout.state_bytes_f32);
  auto slots = conn.allocate(arena, 1);
  upload(staging.device_data(), state_bytes(layout, 1));  // the old state
  const auto fresh = state_bytes(layout, 2);
  void* host = nullptr;  // pinned, so that the copy is asynchronous
  ASSERT_EQ(cudaMallocHost(&host, fresh.size()), cudaSuccess);
  std::memcpy(host, fresh.data(), fresh.size());
  cudaStream_t engine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking), cudaSuccess);
  client::StreamFence fence(0);
  for (const bool async : {false, true}) {
    ASSERT_EQ(cudaLaunchHostFunc(
                  engine, [](void*) { std::this_thread::sleep_for(300ms); }, nullptr),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(staging.device_data(), host, fresh.size(), cudaMemcpyHostToDevice, engine),
        cudaSuccess);
    const client::IpcEventBytes after = fence.record(engine);
    if (async) {
      const client::Pending pending = conn.compress_async(arena.id(), slots[0].id(), staging.id(),
                                                          0, kernels::DType::f32, after);
      client::synchronize(pending);
    } else {
      conn.compress(slots[0], staging, 0, kernels::DType::f32, after);
    }
    std::vector<std::byte> expected(layout.page_bytes);
    arena.codec().encode(fresh, kernels::DType::f32, expected);
    EXPECT_EQ(download(arena.device_page(slots[0].id()), layout.page_bytes), expected)
        << (async ? "compress_async" : "compress");
    ASSERT_EQ(cudaStreamSynchronize(engine), cudaSuccess);
    upload(staging.device_data(), state_bytes(layout, 1));  // old again for the next round
  }
  (void)cudaStreamDestroy(engine);
  (void)cudaFreeHost(host);
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
}

TEST(CudaDaemon, DeviceDecodeStepStepsTheDaemonsPagesAsTheHostStepDoes) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DaemonProcess daemon({"--backend", "cuda", "--device", "0", "--pool-capacity", "512MiB"});
  auto conn = client::Connection::connect(options_for(daemon));
  auto l = layout_for(kernels::CodecId::int8);
  l.arch = kernels::Arch::kda;
  const auto layout = conn.register_layout(l);
  auto arena = conn.open_arena(layout, 4);
  auto staging = conn.open_staging(layout.state_bytes_f32);
  auto slots = conn.allocate(arena, 2);
  std::vector<std::vector<std::byte>> host;
  for (std::size_t b = 0; b < slots.size(); ++b) {
    upload(staging.device_data(), state_bytes(layout, 20 + b));
    conn.compress(slots[b], staging, 0);
    host.push_back(download(arena.device_page(slots[b].id()), layout.page_bytes));
  }
  const client::DeviceDecodeStep step(arena);
  const std::vector<std::uint32_t> ids = {slots[1].id(), slots[0].id()};
  statepool::testing::StepBatch in(arena.codec().layout(), 2, 2, 3);
  const auto to_device = [](const auto& v) {
    auto buffer = std::make_unique<statepool::testing::DeviceBuffer>(v.size() * sizeof(v[0]));
    EXPECT_TRUE(buffer->ok());
    EXPECT_EQ(buffer->upload(v.data(), v.size() * sizeof(v[0])), cudaSuccess);
    return buffer;
  };
  const auto d_ids = to_device(ids);
  const auto d_q = to_device(in.q);
  const auto d_k = to_device(in.k);
  const auto d_v = to_device(in.v);
  const auto d_g = to_device(in.log_decay);
  const auto d_beta = to_device(in.beta);
  const auto d_out = to_device(in.out);
  for (std::uint32_t layer = 0; layer < l.num_layers; ++layer) {
    step.run(layer,
             {.batch = 2,
              .qk_heads = 2,
              .slots = static_cast<const std::uint32_t*>(d_ids->get()),
              .q = static_cast<const float*>(d_q->get()),
              .k = static_cast<const float*>(d_k->get()),
              .v = static_cast<const float*>(d_v->get()),
              .log_decay = static_cast<const float*>(d_g->get()),
              .beta = static_cast<const float*>(d_beta->get()),
              .out = static_cast<float*>(d_out->get())},
             nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::byte*> pages = {host[1].data(), host[0].data()};
    ASSERT_TRUE(kernels::fused_step(arena.codec(), layer, pages, in.view()).ok());
    EXPECT_EQ(download(static_cast<std::byte*>(d_out->get()), in.out.size() * 4),
              std::vector<std::byte>(
                  reinterpret_cast<const std::byte*>(in.out.data()),
                  reinterpret_cast<const std::byte*>(in.out.data()) + in.out.size() * 4));
    for (std::size_t b = 0; b < slots.size(); ++b) {
      EXPECT_EQ(download(arena.device_page(slots[b].id()), layout.page_bytes), host[b]);
    }
  }
  EXPECT_THROW(step.run(l.num_layers, {.batch = 1}, nullptr), std::invalid_argument);
  // The daemon resumes the stepped state.
  conn.decompress(slots[0], staging, 0);
  std::vector<std::byte> decoded(layout.state_bytes_f32);
  arena.codec().decode(host[0], kernels::DType::f32, decoded);
  EXPECT_EQ(download(staging.device_data(), decoded.size()), decoded);
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
}

TEST(CudaDaemon, LegacyIpcHandlesAndAFractionOfTheDevicesMemory) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DaemonProcess daemon({"--backend", "cuda", "--pool-capacity", "5%"});
  EXPECT_NE(daemon.log().find("of the device's free memory"), std::string::npos) << daemon.log();
  client::Options options = options_for(daemon);
  options.legacy_ipc = true;
  auto conn = client::Connection::connect(options);
  const auto layout = conn.register_layout(layout_for(kernels::CodecId::int6));
  auto arena = conn.open_arena(layout, 2);
  EXPECT_EQ(arena.memory().handle_kind, kernels::HandleKind::cuda_ipc);
  EXPECT_EQ(arena.fd(), -1);
  ASSERT_NE(arena.device_data(), nullptr);
  auto staging = conn.open_staging(layout.state_bytes_f32);
  EXPECT_EQ(staging.memory().handle_kind, kernels::HandleKind::cuda_ipc);
  auto slots = conn.allocate(arena, 1);
  const auto original = state_bytes(layout, 9);
  upload(staging.device_data(), original);
  conn.compress(slots[0], staging, 0);
  std::vector<std::byte> local(layout.page_bytes);
  arena.codec().encode(original, kernels::DType::f32, local);
  EXPECT_EQ(download(arena.device_page(slots[0].id()), layout.page_bytes), local);

  // How the arena is shared was fixed when it was created: a client asking for the
  // backend's default gets the IPC handle too.
  client::Options plain = options_for(daemon);
  plain.map_device_memory = false;  // this process has the handle open already
  auto other = client::Connection::connect(plain);
  const auto same = other.open_arena(layout.id, 2);
  EXPECT_FALSE(same.created());
  EXPECT_EQ(same.memory().handle_kind, kernels::HandleKind::cuda_ipc);
  // Close the IPC mappings before the exporter goes (the other order is undefined).
  staging = client::Staging();
  arena = client::Arena();
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
}

std::size_t free_device_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

// Issue 8's "device memory is released when arenas close" and "a client that dies leaves
// nothing mapped in the daemon", through the daemon: a child process opens a large device
// arena and takes slots, then is killed; CloseArena is refused while it is connected and
// succeeds once the daemon has seen it go, and the device's free memory comes back.
TEST(CudaDaemon, ClosingAnArenaGivesItsDeviceMemoryBackAlsoAfterAKilledClient) {
  STATEPOOL_SKIP_WITHOUT_GPU();
  DaemonProcess daemon({"--backend", "cuda", "--grace-period", "0s", "--pool-capacity", "4GiB"});
  client::Options options = options_for(daemon);
  options.map_device_memory = false;  // this process and the child do not map it
  auto conn = client::Connection::connect(options);
  const auto layout = conn.register_layout(layout_for(kernels::CodecId::int8));
  const auto pages = static_cast<std::uint32_t>((std::size_t{1} << 30) / layout.page_bytes);
  const std::size_t before = free_device_bytes();

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // no CUDA call here: the child only talks to the daemon
    ::close(ready[0]);
    try {
      auto engine = client::Connection::connect(options);
      auto arena = engine.open_arena(layout.id, pages);
      auto slots = engine.allocate(arena, 3);
      const std::uint32_t id = arena.id();
      if (::write(ready[1], &id, sizeof id) != sizeof id) ::_exit(3);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(2);
    }
  }
  ::close(ready[1]);
  std::uint32_t id = 0;
  const bool got = ::read(ready[0], &id, sizeof id) == static_cast<ssize_t>(sizeof id);
  ::close(ready[0]);
  if (!got) ::kill(child, SIGKILL);
  ASSERT_TRUE(got) << daemon.log();
  std::uint64_t bytes = 0;
  for (const auto& a : conn.stats().arenas) bytes = a.arena_id == id ? a.bytes_total : bytes;
  ASSERT_GE(bytes, std::uint64_t{1} << 29);
  EXPECT_LE(free_device_bytes() + bytes / 2, before) << "the arena took no device memory";

  try {
    (void)conn.close_arena(id);
    ADD_FAILURE() << "closed while its client was connected";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), statepool::Status::in_use) << e.what();
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // The daemon sees the connection end a moment later: its lease (grace 0) and its claim
  // on the arena go with it.
  client::ArenaClose closed;
  EXPECT_TRUE(eventually(
      [&] {
        try {
          closed = conn.close_arena(id);
          return true;
        } catch (const client::Error& e) {
          if (e.status() != statepool::Status::in_use) throw;
          return false;
        }
      },
      10s));
  EXPECT_EQ(closed.bytes, bytes);
  const auto back = eventually([&] { return free_device_bytes() + (64u << 20) >= before; }, 10s);
  EXPECT_TRUE(back) << "free device memory: " << before << " bytes before, " << free_device_bytes()
                    << " after the close";
  EXPECT_EQ(daemon.stop(SIGTERM, 20s), 0) << daemon.log();
}

}  // namespace
