// Host executor throughput: compress and decompress of ONE large state through the
// daemon's HostExecutor, with one worker and with every worker, against memcpy of the
// same FP32 bytes measured in the same run.
//
//   bench_executor_throughput [--layers N] [--heads N] [--iters N] [--workers N]
//
// Default shape: Qwen3.5-27B (48 GDN layers x 48 value heads x 128 x 128, conv 10240 x 3
// bf16): a 151 MB FP32 state, far larger than any cache. GB/s are of the f32 staged state
// (recurrent FP32 + raw conv); "x memcpy" divides by one thread's memcpy of those bytes.
// The values are seeded normals of statepool::testing (the codecs' speed does not depend
// on the recurrence that made a state); median of --iters runs after one warm-up.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "exec/host_executor.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/support/status.hpp"
#include "statepool/support/worker_pool.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/tools/cli.hpp"

namespace {

using statepool::bench::median_seconds;

using statepool::kernels::CodecId;
using statepool::kernels::DType;
using statepool::kernels::PageCodec;
using statepool::kernels::StateLayout;
namespace service = statepool::service;

struct Options {
  std::uint32_t layers = 48;
  std::uint32_t heads = 48;
  std::uint32_t iters = 7;
  std::uint32_t workers = 0;  // 0 = one per core
};

constexpr const char* kUsage =
    "usage: bench_executor_throughput [--layers N] [--heads N] [--iters N] [--workers N]\n"
    "  --layers N   linear-attention layers (default 48: Qwen3.5-27B)\n"
    "  --heads N    heads per layer (default 48)\n"
    "  --iters N    timed runs per measurement, median reported (default 7)\n"
    "  --workers N  workers of the all-workers column (default: one per core)\n";

std::optional<int> parse(int argc, char** argv, Options& o) {
  using statepool::tools::bounded;
  statepool::tools::CommandLine cli("bench_executor_throughput", kUsage);
  // clang-format off
  cli.add_options()
      ("layers", bounded(o.layers, 1, 1024))
      ("heads", bounded(o.heads, 1, 1024))
      ("iters", bounded(o.iters, 1, 1000))
      ("workers", bounded(o.workers, 0, 256));
  // clang-format on
  return cli.parse(argc, argv);
}

/// N(0, 0.05^2) values (synthetic::fill_gaussian) in the f32 recurrent part, the bf16 bits
/// of more of them in the conv part.
std::vector<std::byte> staged_state(const PageCodec& codec) {
  std::vector<std::byte> out(codec.staged_bytes(DType::f32));
  const std::size_t values = (out.size() - codec.conv_bytes()) / 4;
  std::vector<float> v(values + codec.conv_bytes() / 2);
  statepool::synthetic::fill_gaussian(v, 7, 0.05f);
  std::memcpy(out.data(), v.data(), 4 * values);
  for (std::size_t i = values * 4, j = values; i + 1 < out.size(); i += 2, ++j) {
    const std::uint16_t h = statepool::kernels::float_to_bf16_bits(v[j]);
    std::memcpy(out.data() + i, &h, 2);
  }
  return out;
}

StateLayout make_layout(const Options& o, CodecId codec) {
  return statepool::bench::gdn_layout(o.layers, o.heads, 10240, codec);  // Qwen3.5-27B conv
}

/// Runs one operation through the executor, as a session would, and waits for it.
void run(service::Executor& executor, service::Operation op) {
  std::promise<std::exception_ptr> done;
  auto future = done.get_future();
  executor.submit(std::move(op), [&](std::exception_ptr e) { done.set_value(e); });
  if (const auto error = future.get()) std::rethrow_exception(error);
}

statepool::kernels::BufferRef buffer(std::vector<std::byte>& bytes) {
  return {bytes.data(), bytes.size(), statepool::kernels::MemorySpace::host, -1};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const auto exit_status = parse(argc, argv, o)) return *exit_status;
  try {
    const unsigned all =
        o.workers != 0 ? o.workers : std::max(1u, std::thread::hardware_concurrency());
    statepool::support::WorkerPool one_pool(1);
    statepool::support::WorkerPool all_pool(all);
    service::HostExecutor one(one_pool);
    service::HostExecutor every(all_pool);

    const auto fp32 = std::make_shared<const PageCodec>(make_layout(o, CodecId::fp32));
    std::vector<std::byte> staged = staged_state(*fp32);
    const std::size_t state_bytes = staged.size();
    std::vector<std::byte> copy(state_bytes);
    std::vector<std::byte> back(state_bytes);
    std::printf(
        "layout: %u layers x %u heads x 128 x 128, conv 10240 x 3 bf16; f32 staged state "
        "%.1f MB; median of %u runs; 1 worker vs %u workers (host executor, as the daemon "
        "runs it)\n",
        o.layers, o.heads, static_cast<double>(state_bytes) / 1e6, o.iters, all);

    const double memcpy_s =
        median_seconds(o.iters, [&] { std::memcpy(copy.data(), staged.data(), state_bytes); });
    const double memcpy_gbs = static_cast<double>(state_bytes) / memcpy_s / 1e9;
    const auto gbs = [&](double seconds) {
      return static_cast<double>(state_bytes) / seconds / 1e9;
    };

    service::Operation copy_op;
    copy_op.kind = service::OperationKind::copy;
    copy_op.source = buffer(staged);
    copy_op.page = buffer(copy);
    const double copy_all = gbs(median_seconds(o.iters, [&] { run(every, copy_op); }));

    std::printf("\n%-8s %8s %6s | %9s %6s %9s %6s | %9s %6s %9s %6s\n", "codec", "page MB", "ratio",
                "enc 1w", "x mc", "enc all", "x mc", "dec 1w", "x mc", "dec all", "x mc");
    std::printf(
        "%-8s %8.1f %6.2f | %9.2f %6.2f %9.2f %6.2f |   (memcpy, one thread; Copy with "
        "every worker)\n",
        "memcpy", static_cast<double>(state_bytes) / 1e6, 1.0, memcpy_gbs, 1.0, copy_all,
        copy_all / memcpy_gbs);
    for (const CodecId id :
         {CodecId::fp32, CodecId::bf16, CodecId::int8, CodecId::int6, CodecId::int4}) {
      const auto codec = std::make_shared<const PageCodec>(make_layout(o, id));
      std::vector<std::byte> page(codec->page_bytes());
      service::Operation op;
      op.codec = codec;
      op.dtype = DType::f32;
      op.page = buffer(page);
      op.kind = service::OperationKind::compress;
      op.staged = buffer(staged);
      const double enc1 = gbs(median_seconds(o.iters, [&] { run(one, op); }));
      const double encn = gbs(median_seconds(o.iters, [&] { run(every, op); }));
      op.kind = service::OperationKind::decompress;
      op.staged = buffer(back);
      const double dec1 = gbs(median_seconds(o.iters, [&] { run(one, op); }));
      const double decn = gbs(median_seconds(o.iters, [&] { run(every, op); }));
      std::printf("%-8s %8.1f %6.2f | %9.2f %6.2f %9.2f %6.2f | %9.2f %6.2f %9.2f %6.2f\n",
                  statepool::kernels::to_string(id), static_cast<double>(codec->page_bytes()) / 1e6,
                  codec->compression_ratio(), enc1, enc1 / memcpy_gbs, encn, encn / memcpy_gbs,
                  dec1, dec1 / memcpy_gbs, decn, decn / memcpy_gbs);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_executor_throughput: %s\n", e.what());
    return 1;
  }
}
