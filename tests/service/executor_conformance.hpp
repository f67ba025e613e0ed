#pragma once
// The executor conformance suite: one contract, every executor.
//
// An executor's compress/decompress must write exactly the bytes of PageCodec::encode /
// decode (every codec, STEPQuant with a plan included), refuse NaN/Inf before writing
// anything, refuse wrong sizes and memory it cannot reach, copy whole pages, and call its
// completion exactly once, off the submitting thread. Its KV-block encode and decode must
// write exactly the bytes of kernels::kv_encode_blocks / kv_decode_blocks, spread over
// and gathered from any number of chunks (a Rig's kv_missing() names why an executor does
// not run them yet; those tests are then skipped). Staged views (Operation::state_view,
// kv_view: a value-major state, a conv state apart, strided KV rows) give the packed
// operations' bytes on the executors that run them (the host executor), and are refused
// with invalid_argument, writing nothing, by the others. Instantiated for the host executor
// (tests/service/test_executor.cpp) and for the CUDA executor
// (tests/gpu/test_cuda_executor_gpu.cpp, skipped without a device).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "exec/executor.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/staged_view.hpp"
#include "statepool/support/status.hpp"
#include "statepool/synthetic/state.hpp"
#include "statepool/testing/plans.hpp"
#include "statepool/testing/staged_views.hpp"

namespace statepool::service::conformance {

using kernels::CodecId;
using kernels::DType;

/// Runs `op` and waits for its completion; returns the error it completed with.
inline std::exception_ptr run_op(Executor& executor, Operation op,
                                 std::thread::id* completed_on = nullptr) {
  std::promise<std::exception_ptr> done;
  auto future = done.get_future();
  executor.submit(std::move(op), [&done, completed_on](std::exception_ptr error) {
    if (completed_on != nullptr) *completed_on = std::this_thread::get_id();
    done.set_value(std::move(error));
  });
  EXPECT_EQ(future.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  return future.get();
}

/// The status an operation completed with (ok when it succeeded).
inline Status status_of(const std::exception_ptr& error, std::string* message = nullptr) {
  if (!error) return Status::ok;
  try {
    std::rethrow_exception(error);
  } catch (const StatusError& e) {
    if (message != nullptr) *message = e.what();
    return e.status();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "completed with a non-StatusError: " << e.what();
  }
  return Status::internal;
}

/// The layouts every executor is checked on: every codec, GDN and KDA, odd shapes, with
/// and without a conv state.
inline std::vector<kernels::StateLayout> layouts() {
  std::vector<kernels::StateLayout> out;
  const auto add = [&](CodecId codec, kernels::Arch arch, std::uint32_t layers, std::uint32_t heads,
                       std::uint32_t k, std::uint32_t v, std::uint32_t conv) {
    kernels::StateLayout l;
    if (codec == CodecId::stepquant4 || codec == CodecId::stepquant6) {
      const std::uint32_t budget = codec == CodecId::stepquant4 ? 4 : 6;
      l = testing::plan_layout(testing::uniform_plan(arch, layers, heads, k, v, budget), codec);
    } else {
      l.arch = arch;
      l.num_layers = layers;
      l.num_heads = heads;
      l.key_dim = k;
      l.value_dim = v;
      l.codec.id = codec;
    }
    l.name = std::string(kernels::to_string(codec)) + "-" + kernels::to_string(arch);
    l.conv_channels = conv;
    l.conv_width = conv == 0 ? 0 : 3;
    out.push_back(std::move(l));
  };
  for (const CodecId codec :
       {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4, CodecId::int6, CodecId::int8,
        CodecId::stepquant4, CodecId::stepquant6, CodecId::dsq4, CodecId::dsq6}) {
    add(codec, kernels::Arch::gdn, 3, 5, 16, 24, 40);
    add(codec, kernels::Arch::kda, 2, 3, 7, 5, 0);
  }
  return out;
}

/// The suite. A Rig owns an executor (executor(); missing() says why it cannot run here,
/// empty when it can) and says how test data reaches memory the executor can use: bind(vector)
/// gives a buffer holding the vector's bytes (the vector itself for a host executor, a device copy
/// for a device executor), sync() copies every bound buffer back into its vector, memory() is a
/// resource the executor can reach and upload(allocation, bytes) writes into one of its
/// allocations.
template <class Rig>
class ExecutorConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = rig_.missing(); !missing.empty()) GTEST_SKIP() << missing;
  }
  Rig rig_;
  Executor& executor() { return rig_.executor(); }
  kernels::BufferRef buffer(std::vector<std::byte>& bytes) { return rig_.bind(bytes); }
  /// Runs `op`, waits for it and copies the bound buffers back.
  std::exception_ptr run(Operation op, std::thread::id* completed_on = nullptr) {
    std::exception_ptr error = run_op(executor(), std::move(op), completed_on);
    rig_.sync();
    return error;
  }
  /// True for the executors that run staged views (the host executor); the others refuse
  /// them (invalid_argument, "staged views ... need the host backend").
  bool runs_views() { return executor().name() == "host"; }
  /// Runs `op`, which holds a view: true when the executor ran it (and it succeeded);
  /// false after checking that it was refused as an executor without views must.
  bool run_view(Operation op) {
    std::string message;
    const Status status = status_of(this->run(std::move(op)), &message);
    if (runs_views()) {
      EXPECT_EQ(status, Status::ok) << message;
      return status == Status::ok;
    }
    EXPECT_EQ(status, Status::invalid_argument);
    EXPECT_NE(message.find("staged views"), std::string::npos) << message;
    return false;
  }
};
TYPED_TEST_SUITE_P(ExecutorConformance);

TYPED_TEST_P(ExecutorConformance, CompressAndDecompressWriteThePageCodecsBytes) {
  for (const auto& layout : layouts()) {
    const auto codec = std::make_shared<const kernels::PageCodec>(layout);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(layout.name + " staged " + kernels::to_string(dtype));
      std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 8, 11, dtype);
      std::vector<std::byte> expected(codec->page_bytes());
      codec->encode(staged, dtype, expected);

      std::vector<std::byte> page(codec->page_bytes(), std::byte{0xee});
      Operation op;
      op.kind = OperationKind::compress;
      op.codec = codec;
      op.dtype = dtype;
      op.staged = this->buffer(staged);
      op.page = this->buffer(page);
      ASSERT_EQ(status_of(this->run(op)), Status::ok);
      ASSERT_EQ(page, expected);

      std::vector<std::byte> decoded_expected(staged.size());
      codec->decode(page, dtype, decoded_expected);
      std::vector<std::byte> decoded(staged.size(), std::byte{0xee});
      op.kind = OperationKind::decompress;
      op.staged = this->buffer(decoded);
      ASSERT_EQ(status_of(this->run(op)), Status::ok);
      ASSERT_EQ(decoded, decoded_expected);
    }
  }
}

TYPED_TEST_P(ExecutorConformance, NonFiniteIsRefusedWithTheFirstValueInPageOrder) {
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    const auto codec = std::make_shared<const kernels::PageCodec>(layout);
    std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 4, 3, DType::f32);
    const std::size_t per_head = std::size_t{layout.key_dim} * layout.value_dim;
    const std::size_t heads = codec->head_count();
    // A NaN in the last head and an Inf in a middle one: the Inf comes first.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(staged.data() + 4 * ((heads - 1) * per_head + 1), &nan, 4);
    std::memcpy(staged.data() + 4 * ((heads / 2) * per_head + per_head - 1), &inf, 4);
    std::string expected;
    try {
      std::vector<std::byte> scratch(codec->page_bytes());
      codec->encode(staged, DType::f32, scratch);
    } catch (const kernels::NonFiniteError& e) {
      expected = e.what();
    }
    ASSERT_FALSE(expected.empty());

    std::vector<std::byte> page(codec->page_bytes(), std::byte{0x5a});
    const std::vector<std::byte> before = page;
    Operation op;
    op.kind = OperationKind::compress;
    op.codec = codec;
    op.staged = this->buffer(staged);
    op.page = this->buffer(page);
    std::string message;
    EXPECT_EQ(status_of(this->run(op), &message), Status::not_finite);
    EXPECT_EQ(message, expected);
    EXPECT_EQ(page, before) << "a refused state must leave the page as it was";
  }
}

TYPED_TEST_P(ExecutorConformance, WrongSizesAreInvalidArgumentAndWriteNothing) {
  const auto layout = layouts().front();
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 2, 1, DType::f32);
  std::vector<std::byte> page(codec->page_bytes(), std::byte{0x11});
  std::vector<std::byte> short_page(codec->page_bytes() - 4, std::byte{0x11});
  const auto short_before = short_page;
  Operation op;
  op.kind = OperationKind::compress;
  op.codec = codec;
  op.staged = this->buffer(staged);
  op.page = this->buffer(short_page);
  EXPECT_EQ(status_of(this->run(op)), Status::invalid_argument);
  EXPECT_EQ(short_page, short_before);

  std::vector<std::byte> short_staged(staged.begin(), staged.end() - 2);
  op.staged = this->buffer(short_staged);
  op.page = this->buffer(page);
  const auto page_before = page;
  EXPECT_EQ(status_of(this->run(op)), Status::invalid_argument);
  op.kind = OperationKind::decompress;
  EXPECT_EQ(status_of(this->run(op)), Status::invalid_argument);
  EXPECT_EQ(page, page_before);

  op.kind = OperationKind::compress;
  op.staged = this->buffer(staged);
  op.dtype = DType::f16;  // f16 staging is not a thing
  std::string message;
  EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument);
  EXPECT_NE(message.find("f32 or bf16"), std::string::npos) << message;
  EXPECT_EQ(page, page_before);

  Operation copy;
  copy.kind = OperationKind::copy;
  copy.source = this->buffer(page);
  copy.page = this->buffer(short_page);
  EXPECT_EQ(status_of(this->run(copy)), Status::invalid_argument);
  EXPECT_EQ(short_page, short_before);
}

// `after` (protocol: the client's interprocess event) is something an executor waits for
// or refuses; bytes that name no event are refused before anything is written, whether
// the executor has device streams (the handle does not open) or not (nothing to order).
TYPED_TEST_P(ExecutorConformance, AnAfterEventItCannotWaitForIsRefusedAndWritesNothing) {
  const auto layout = layouts().front();
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 2, 1, DType::f32);
  std::vector<std::byte> page(codec->page_bytes(), std::byte{0x11});
  std::vector<std::byte> other(codec->page_bytes(), std::byte{0x22});
  const auto staged_before = staged;
  const auto page_before = page;
  IpcEventBytes garbage{};
  garbage.fill(std::byte{0xA5});
  for (const OperationKind kind : {OperationKind::compress, OperationKind::decompress}) {
    Operation op;
    op.kind = kind;
    op.codec = codec;
    op.staged = this->buffer(staged);
    op.page = this->buffer(page);
    op.after = garbage;
    std::string message;
    EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument) << to_string(kind);
    EXPECT_NE(message.find("`after`"), std::string::npos) << message;
    EXPECT_EQ(staged, staged_before) << to_string(kind);
    EXPECT_EQ(page, page_before) << to_string(kind);
  }
  Operation copy;
  copy.kind = OperationKind::copy;
  copy.source = this->buffer(other);
  copy.page = this->buffer(page);
  copy.after = garbage;
  EXPECT_EQ(status_of(this->run(copy)), Status::invalid_argument);
  EXPECT_EQ(page, page_before);
}

TYPED_TEST_P(ExecutorConformance, MemoryItCannotReachIsRefused) {
  const auto layout = layouts().front();
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 2, 1, DType::f32);
  std::vector<std::byte> page(codec->page_bytes());
  Operation op;
  op.kind = OperationKind::compress;
  op.codec = codec;
  op.staged = this->buffer(staged);
  op.page = this->buffer(page);
  // Pretend the page is somewhere this executor cannot reach (an executor must look before
  // it touches): device 0 for a host executor, device 63 for a device executor.
  op.page.space = MemorySpace::device;
  op.page.device = this->executor().can_access(MemorySpace::device, 0) ? 63 : 0;
  const std::string where = "device " + std::to_string(op.page.device);
  std::string message;
  EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument);
  EXPECT_NE(message.find(where), std::string::npos) << message;
  EXPECT_TRUE(this->executor().can_access(MemorySpace::host, -1) ||
              this->executor().can_access(MemorySpace::device, 0));
}

TYPED_TEST_P(ExecutorConformance, CopyCopiesAWholePage) {
  // Large enough to be split into pieces by a parallel executor.
  std::vector<std::byte> source((std::size_t{9} << 20) + 12);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 131);
  std::vector<std::byte> page(source.size(), std::byte{0});
  Operation op;
  op.kind = OperationKind::copy;
  op.source = this->buffer(source);
  op.page = this->buffer(page);
  ASSERT_EQ(status_of(this->run(op)), Status::ok);
  EXPECT_EQ(page, source);
  op.page = this->buffer(source);  // onto itself: nothing changes
  ASSERT_EQ(status_of(this->run(op)), Status::ok);
  EXPECT_EQ(page, source);

  // Neither end aligned (a copy may take a path of its own for aligned lines): the 9 MiB
  // from source byte 5 onto page byte 3; the bytes around the range stay as they were.
  std::vector<std::byte> shifted(source.size(), std::byte{0x5a});
  const std::size_t n = source.size() - 8;
  op.source = this->buffer(source);
  op.source.data += 5;
  op.source.size = n;
  op.page = this->buffer(shifted);
  op.page.data += 3;
  op.page.size = n;
  ASSERT_EQ(status_of(this->run(op)), Status::ok);
  std::vector<std::byte> expected(source.size(), std::byte{0x5a});
  std::copy_n(source.begin() + 5, n, expected.begin() + 3);
  EXPECT_EQ(shifted, expected);
}

TYPED_TEST_P(ExecutorConformance, CompletesOnceOffTheSubmittingThreadAfterReleasingItsMemory) {
  MemoryResource& memory = this->rig_.memory();
  const auto layout = layouts().front();
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  auto staging = memory.allocate(codec->staged_bytes(DType::f32), "executor-staging");
  auto page = memory.allocate(codec->page_bytes(), "executor-page");
  const auto state = synthetic::synthetic_staged_state(layout, 2, 5, DType::f32);
  this->rig_.upload(*staging, state);

  Operation op;
  op.kind = OperationKind::compress;
  op.codec = codec;
  // The exact sizes: a resource rounds allocations up to its granularity (2 MiB on CUDA).
  op.staged = staging->buffer();
  op.staged.size = codec->staged_bytes(DType::f32);
  op.page = page->buffer();
  op.page.size = codec->page_bytes();
  op.keep_alive = {staging, page};
  std::weak_ptr<Allocation> watch = page;
  staging.reset();
  page.reset();  // only the operation holds the memory now

  std::atomic<int> calls{0};
  std::atomic<bool> released_first{false};
  std::promise<void> done;
  const auto submitter = std::this_thread::get_id();
  std::thread::id completer;
  this->executor().submit(std::move(op), [&](std::exception_ptr error) {
    completer = std::this_thread::get_id();
    released_first = watch.expired();
    EXPECT_EQ(error, nullptr);
    if (++calls == 1) done.set_value();
  });
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  this->executor().wait_idle();
  EXPECT_EQ(calls, 1);
  EXPECT_NE(completer, submitter);
  EXPECT_TRUE(released_first) << "the memory must be let go before the completion runs";
}

TYPED_TEST_P(ExecutorConformance, ManyConcurrentOperationsAllCompleteAndWaitIdleWaits) {
  const auto layout = layouts()[11];  // int8, KDA, odd shape
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  const auto staged = synthetic::synthetic_staged_state(layout, 3, 9, DType::f32);
  std::vector<std::byte> expected(codec->page_bytes());
  codec->encode(staged, DType::f32, expected);
  constexpr int kOps = 48;
  std::vector<std::byte> staged_copy = staged;
  const kernels::BufferRef staged_buffer = this->buffer(staged_copy);
  std::vector<std::vector<std::byte>> pages(kOps, std::vector<std::byte>(codec->page_bytes()));
  std::vector<kernels::BufferRef> page_buffers;
  for (auto& page : pages) page_buffers.push_back(this->buffer(page));
  std::atomic<int> completed{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < 3; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = t; i < kOps; i += 3) {
        Operation op;
        op.kind = OperationKind::compress;
        op.codec = codec;
        op.staged = staged_buffer;
        op.page = page_buffers[static_cast<std::size_t>(i)];
        this->executor().submit(std::move(op), [&](std::exception_ptr error) {
          if (error) ++failed;
          ++completed;
        });
      }
    });
  }
  for (auto& s : submitters) s.join();
  this->executor().wait_idle();
  this->rig_.sync();
  EXPECT_EQ(completed, kOps);
  EXPECT_EQ(failed, 0);
  for (const auto& page : pages) EXPECT_EQ(page, expected);
}

/// Plain KV values of `blocks` in `dtype`: normal values, scale 2, from `seed`.
inline std::vector<std::byte> kv_values(const kernels::KvBlocks& blocks, DType dtype,
                                        unsigned seed) {
  const std::size_t count = kernels::kv_blocks_plain_bytes(blocks, DType::f32) / 4;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::byte> out(kernels::kv_blocks_plain_bytes(blocks, dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const float v = normal(rng);
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t bits =
          dtype == DType::bf16 ? kernels::float_to_bf16_bits(v) : kernels::float_to_half_bits(v);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

/// `bytes` cut into pieces of `piece` bytes (the last one shorter).
inline std::vector<std::vector<std::byte>> cut(const std::vector<std::byte>& bytes,
                                               std::size_t piece) {
  std::vector<std::vector<std::byte>> out;
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    const std::size_t n = std::min(piece, bytes.size() - at);
    out.emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                     bytes.begin() + static_cast<std::ptrdiff_t>(at + n));
  }
  return out;
}

TYPED_TEST_P(ExecutorConformance, KvBlocksEncodeAndDecodeAcrossChunksLikeTheCpuReference) {
  if (const std::string why = this->rig_.kv_missing(); !why.empty()) GTEST_SKIP() << why;
  using kernels::KvCodecId;
  for (const KvCodecId codec :
       {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2, KvCodecId::kivi4, KvCodecId::flexgen4}) {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      // 3 layers, keys of 2 heads x 48, values of 2 heads x 40, past the residual window.
      const kernels::KvBlocks blocks{codec, 3, 96, 80, 161};
      SCOPED_TRACE(kernels::describe(blocks) + " from " + kernels::to_string(dtype));
      std::vector<std::byte> plain = kv_values(blocks, dtype, 11);
      std::vector<std::byte> expected(kernels::kv_blocks_encoded_bytes(blocks));
      kernels::kv_encode_blocks(blocks, dtype, plain, expected);
      std::vector<std::byte> decoded_expected(plain.size());
      kernels::kv_decode_blocks(blocks, expected, dtype, decoded_expected);
      // One chunk, and uneven chunks that cut through streams and group records.
      for (const std::size_t piece : {expected.size(), std::size_t{1237}}) {
        std::vector<std::vector<std::byte>> chunks = cut(expected, piece);
        for (auto& c : chunks) std::fill(c.begin(), c.end(), std::byte{0xEE});
        Operation op;
        op.kind = OperationKind::kv_encode;
        op.kv = blocks;
        op.dtype = dtype;
        op.staged = this->buffer(plain);
        for (auto& c : chunks) op.chunks.push_back(this->buffer(c));
        ASSERT_EQ(status_of(this->run(op)), Status::ok);
        std::vector<std::byte> joined;
        for (const auto& c : chunks) joined.insert(joined.end(), c.begin(), c.end());
        ASSERT_EQ(joined, expected) << "pieces of " << piece;

        std::vector<std::byte> decoded(plain.size(), std::byte{0x77});
        Operation back;
        back.kind = OperationKind::kv_decode;
        back.kv = blocks;
        back.dtype = dtype;
        back.staged = this->buffer(decoded);
        for (auto& c : chunks) back.chunks.push_back(this->buffer(c));
        ASSERT_EQ(status_of(this->run(back)), Status::ok);
        ASSERT_EQ(decoded, decoded_expected) << "pieces of " << piece;
      }
    }
  }
}

TYPED_TEST_P(ExecutorConformance, KvBlocksNonFiniteOrWrongSizesWriteNoChunk) {
  if (const std::string why = this->rig_.kv_missing(); !why.empty()) GTEST_SKIP() << why;
  const kernels::KvBlocks blocks{kernels::KvCodecId::kivi2, 2, 64, 64, 40};
  std::vector<std::byte> plain = kv_values(blocks, DType::f32, 5);
  const float inf = std::numeric_limits<float>::infinity();
  // Layer 1's values, token 3, channel 9: the last stream.
  const std::size_t at =
      3 * (kernels::kv_blocks_plain_bytes(blocks, DType::f32) / 4) / 4 + 3 * 64 + 9;
  std::memcpy(plain.data() + 4 * at, &inf, 4);
  const std::size_t encoded = kernels::kv_blocks_encoded_bytes(blocks);
  std::vector<std::byte> first(encoded / 2, std::byte{0x42});
  std::vector<std::byte> second(encoded - first.size(), std::byte{0x42});
  const auto untouched = [&] {
    return std::all_of(first.begin(), first.end(),
                       [](std::byte b) { return b == std::byte{0x42}; }) &&
           std::all_of(second.begin(), second.end(),
                       [](std::byte b) { return b == std::byte{0x42}; });
  };
  Operation op;
  op.kind = OperationKind::kv_encode;
  op.kv = blocks;
  op.dtype = DType::f32;
  op.staged = this->buffer(plain);
  op.chunks = {this->buffer(first), this->buffer(second)};
  std::string message;
  EXPECT_EQ(status_of(this->run(op), &message), Status::not_finite);
  EXPECT_NE(message.find("token 3 channel 9"), std::string::npos) << message;
  EXPECT_TRUE(untouched());

  std::vector<std::byte> good = kv_values(blocks, DType::f32, 6);
  op.staged = this->buffer(good);
  std::vector<std::byte> short_second(second.size() - 1, std::byte{0x42});
  op.chunks = {this->buffer(first), this->buffer(short_second)};
  EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument);
  EXPECT_NE(message.find("the chunks hold"), std::string::npos) << message;
  op.chunks = {this->buffer(first), this->buffer(second)};
  op.dtype = DType::bf16;  // the staged range holds f32 values
  EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument);
  EXPECT_NE(message.find("the staged range has"), std::string::npos) << message;
  op.dtype = DType::f32;
  op.kv.layers = 0;
  EXPECT_EQ(status_of(this->run(op), &message), Status::invalid_argument);
  EXPECT_TRUE(untouched());
}

// --- staged views ----------------------------------------------------------------------

using statepool::testing::transpose_heads;

/// A packed staged state split as an engine keeps it: the recurrent part, every head
/// transposed for a value-major view, and the conv state in a buffer of its own.
struct SplitState {
  std::vector<std::byte> recurrent;
  std::vector<std::byte> conv;
};
inline SplitState split_state(const kernels::PageCodec& codec, std::span<const std::byte> packed,
                              DType dtype, kernels::HeadOrder order) {
  const std::size_t recurrent = packed.size() - codec.conv_bytes();
  SplitState out;
  out.recurrent.assign(packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(recurrent));
  if (order == kernels::HeadOrder::value_major) {
    out.recurrent = transpose_heads(out.recurrent, codec.layout().key_dim, codec.layout().value_dim,
                                    kernels::dtype_bytes(dtype));
  }
  out.conv.assign(packed.begin() + static_cast<std::ptrdiff_t>(recurrent), packed.end());
  return out;
}

TYPED_TEST_P(ExecutorConformance, StateViewsWriteThePackedBytesInEitherHeadOrder) {
  for (const auto& layout : layouts()) {
    const auto codec = std::make_shared<const kernels::PageCodec>(layout);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 8, 11, dtype);
      std::vector<std::byte> expected(codec->page_bytes());
      codec->encode(staged, dtype, expected);
      std::vector<std::byte> decoded(staged.size());
      codec->decode(expected, dtype, decoded);
      for (const kernels::HeadOrder order :
           {kernels::HeadOrder::key_major, kernels::HeadOrder::value_major}) {
        SCOPED_TRACE(layout.name + " staged " + kernels::to_string(dtype) + " " +
                     kernels::to_string(order));
        SplitState in = split_state(*codec, staged, dtype, order);
        std::vector<std::byte> page(codec->page_bytes(), std::byte{0xee});
        const std::vector<std::byte> page_before = page;
        Operation op;
        op.kind = OperationKind::compress;
        op.codec = codec;
        op.dtype = dtype;
        op.page = this->buffer(page);
        op.state_view =
            StateViewRef{this->buffer(in.recurrent), this->buffer(in.conv), dtype, order};
        if (!this->run_view(op)) {
          EXPECT_EQ(page, page_before);
          return;
        }
        ASSERT_EQ(page, expected);

        const SplitState want = split_state(*codec, decoded, dtype, order);
        SplitState out{std::vector<std::byte>(want.recurrent.size(), std::byte{0xee}),
                       std::vector<std::byte>(want.conv.size(), std::byte{0xee})};
        op.kind = OperationKind::decompress;
        op.state_view =
            StateViewRef{this->buffer(out.recurrent), this->buffer(out.conv), dtype, order};
        ASSERT_TRUE(this->run_view(op));
        ASSERT_EQ(out.recurrent, want.recurrent);
        ASSERT_EQ(out.conv, want.conv);
      }
    }
  }
}

// Two bad values in a middle head: an Inf at [0][V-1] and a NaN at [K-1][0]. A value-major
// head stores the NaN first; the Inf is first in page order, as the packed compress says.
TYPED_TEST_P(ExecutorConformance, StateViewsRefuseNonFiniteLikeThePackedLayout) {
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    const auto codec = std::make_shared<const kernels::PageCodec>(layout);
    std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 4, 3, DType::f32);
    const std::size_t k = layout.key_dim;
    const std::size_t v = layout.value_dim;
    const std::size_t head = codec->head_count() / 2;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(staged.data() + 4 * (head * k * v + (k - 1) * v), &nan, 4);
    std::memcpy(staged.data() + 4 * (head * k * v + v - 1), &inf, 4);
    std::string expected;
    try {
      std::vector<std::byte> scratch(codec->page_bytes());
      codec->encode(staged, DType::f32, scratch);
    } catch (const kernels::NonFiniteError& e) {
      expected = e.what();
    }
    ASSERT_FALSE(expected.empty());

    SplitState in = split_state(*codec, staged, DType::f32, kernels::HeadOrder::value_major);
    std::vector<std::byte> page(codec->page_bytes(), std::byte{0x5a});
    const std::vector<std::byte> before = page;
    Operation op;
    op.kind = OperationKind::compress;
    op.codec = codec;
    op.page = this->buffer(page);
    op.state_view = StateViewRef{this->buffer(in.recurrent), this->buffer(in.conv), DType::f32,
                                 kernels::HeadOrder::value_major};
    std::string message;
    const Status status = status_of(this->run(op), &message);
    EXPECT_EQ(page, before) << "a refused state must leave the page as it was";
    if (!this->runs_views()) {
      EXPECT_EQ(status, Status::invalid_argument);
      return;
    }
    EXPECT_EQ(status, Status::not_finite);
    EXPECT_EQ(message, expected);
  }
}

/// An engine's KV memory for `kv` in `dtype`, SGLang's page_first [2][size][L][row] (rows
/// of one token's layers together), or layer_first [2][L][size][row]; the blocks start at
/// token 3 of a pool of tokens + 5. Every byte outside the rows is 0xEE.
struct KvPool {
  KvPool(const kernels::KvBlocks& blocks, DType values_dtype, bool page_first)
      : kv(blocks), dtype(values_dtype) {
    const std::uint64_t w = kernels::dtype_bytes(dtype);
    row = std::uint64_t{std::max(kv.key_channels, kv.value_channels)} * w;
    const std::uint64_t size = kv.tokens + 5;
    const std::uint64_t layers = kv.layers;
    layer_stride = page_first ? row : size * row;
    token_stride = page_first ? layers * row : row;
    keys_at = 3 * token_stride;
    values_at = size * layers * row + keys_at;
    bytes.assign(2 * size * layers * row, std::byte{0xEE});
  }
  /// Byte offsets of every row, in the packed order (kv.hpp) and in the pool.
  template <class F>
  void for_each_row(F&& f) const {
    const std::uint64_t w = kernels::dtype_bytes(dtype);
    std::uint64_t packed = 0;
    for (std::uint64_t l = 0; l < kv.layers; ++l) {
      for (const bool values : {false, true}) {
        const std::uint64_t channels = values ? kv.value_channels : kv.key_channels;
        for (std::uint64_t t = 0; t < kv.tokens && channels != 0; ++t) {
          f(packed, (values ? values_at : keys_at) + l * layer_stride + t * token_stride,
            channels * w);
          packed += channels * w;
        }
      }
    }
  }
  void place(const std::vector<std::byte>& plain) {
    for_each_row([&](std::uint64_t from, std::uint64_t to, std::uint64_t n) {
      std::memcpy(bytes.data() + to, plain.data() + from, n);
    });
  }
  [[nodiscard]] std::vector<std::byte> gather() const {
    std::vector<std::byte> out(kernels::kv_blocks_plain_bytes(kv, dtype));
    for_each_row([&](std::uint64_t to, std::uint64_t from, std::uint64_t n) {
      std::memcpy(out.data() + to, bytes.data() + from, n);
    });
    return out;
  }
  /// True when every byte outside the rows is still 0xEE.
  [[nodiscard]] bool gaps_untouched() const {
    std::vector<std::byte> copy = bytes;
    for_each_row([&](std::uint64_t, std::uint64_t at, std::uint64_t n) {
      std::fill_n(copy.begin() + static_cast<std::ptrdiff_t>(at), n, std::byte{0xEE});
    });
    return std::all_of(copy.begin(), copy.end(), [](std::byte b) { return b == std::byte{0xEE}; });
  }
  /// The view of the pool, `bound` being its bytes where the executor reaches them.
  [[nodiscard]] KvViewRef view(kernels::BufferRef bound) const {
    KvViewRef v;
    v.layer_stride = layer_stride;
    v.token_stride = token_stride;
    v.dtype = dtype;
    v.keys = bound;
    v.keys.data += keys_at;
    v.keys.size = kernels::kv_view_extent(kv, kv.key_channels, dtype, layer_stride, token_stride);
    v.values = bound;
    v.values.data += values_at;
    v.values.size =
        kernels::kv_view_extent(kv, kv.value_channels, dtype, layer_stride, token_stride);
    return v;
  }

  kernels::KvBlocks kv;
  DType dtype = DType::bf16;
  std::uint64_t row = 0;
  std::uint64_t layer_stride = 0;
  std::uint64_t token_stride = 0;
  std::uint64_t keys_at = 0;
  std::uint64_t values_at = 0;
  std::vector<std::byte> bytes;
};

TYPED_TEST_P(ExecutorConformance, KvViewsEncodeAndDecodeLikeThePackedBlocks) {
  if (const std::string why = this->rig_.kv_missing(); !why.empty()) GTEST_SKIP() << why;
  using kernels::KvCodecId;
  for (const KvCodecId codec :
       {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2, KvCodecId::kivi4, KvCodecId::flexgen4}) {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (const bool page_first : {true, false}) {
        // Keys of 2 heads x 48, values of 2 heads x 40, past the residual window.
        const kernels::KvBlocks blocks{codec, 3, 96, 80, 161};
        SCOPED_TRACE(kernels::describe(blocks) + " from " + kernels::to_string(dtype) +
                     (page_first ? " page_first" : " layer_first"));
        const std::vector<std::byte> plain = kv_values(blocks, dtype, 11);
        std::vector<std::byte> expected(kernels::kv_blocks_encoded_bytes(blocks));
        kernels::kv_encode_blocks(blocks, dtype, plain, expected);
        std::vector<std::byte> decoded_expected(plain.size());
        kernels::kv_decode_blocks(blocks, expected, dtype, decoded_expected);
        KvPool pool(blocks, dtype, page_first);
        pool.place(plain);
        for (const std::size_t piece : {expected.size(), std::size_t{1237}}) {
          std::vector<std::vector<std::byte>> chunks = cut(expected, piece);
          for (auto& c : chunks) std::fill(c.begin(), c.end(), std::byte{0x42});
          Operation op;
          op.kind = OperationKind::kv_encode;
          op.kv = blocks;
          op.dtype = dtype;
          op.kv_view = pool.view(this->buffer(pool.bytes));
          for (auto& c : chunks) op.chunks.push_back(this->buffer(c));
          if (!this->run_view(op)) {
            for (const auto& c : chunks) {
              EXPECT_TRUE(std::all_of(c.begin(), c.end(),
                                      [](std::byte b) { return b == std::byte{0x42}; }));
            }
            return;
          }
          std::vector<std::byte> joined;
          for (const auto& c : chunks) joined.insert(joined.end(), c.begin(), c.end());
          ASSERT_EQ(joined, expected) << "pieces of " << piece;

          KvPool out(blocks, dtype, page_first);
          Operation back;
          back.kind = OperationKind::kv_decode;
          back.kv = blocks;
          back.dtype = dtype;
          back.kv_view = out.view(this->buffer(out.bytes));
          for (auto& c : chunks) back.chunks.push_back(this->buffer(c));
          ASSERT_TRUE(this->run_view(back));
          ASSERT_EQ(out.gather(), decoded_expected) << "pieces of " << piece;
          EXPECT_TRUE(out.gaps_untouched()) << "pieces of " << piece;
        }
      }
    }
  }
}

TYPED_TEST_P(ExecutorConformance, ViewsOfWrongSizesOrBesideAStagedRangeWriteNothing) {
  const auto layout = layouts().front();  // with a conv state
  const auto codec = std::make_shared<const kernels::PageCodec>(layout);
  const std::vector<std::byte> staged = synthetic::synthetic_staged_state(layout, 2, 1, DType::f32);
  SplitState in = split_state(*codec, staged, DType::f32, kernels::HeadOrder::value_major);
  std::vector<std::byte> short_conv(in.conv.begin(), in.conv.end() - 1);
  std::vector<std::byte> staged_copy = staged;
  std::vector<std::byte> page(codec->page_bytes(), std::byte{0x11});
  const std::vector<std::byte> page_before = page;
  const StateViewRef good{this->buffer(in.recurrent), this->buffer(in.conv), DType::f32,
                          kernels::HeadOrder::value_major};
  std::vector<Operation> bad;
  const auto add = [&](OperationKind kind, const StateViewRef& view, bool with_staged) {
    Operation op;
    op.kind = kind;
    op.codec = codec;
    op.page = this->buffer(page);
    op.state_view = view;
    if (with_staged) op.staged = this->buffer(staged_copy);
    bad.push_back(std::move(op));
  };
  for (const OperationKind kind : {OperationKind::compress, OperationKind::decompress}) {
    StateViewRef view = good;
    view.recurrent.size -= 4;
    add(kind, view, false);
    view = good;
    view.conv = this->buffer(short_conv);
    add(kind, view, false);
    view = good;
    view.dtype = DType::f16;
    add(kind, view, false);
    add(kind, good, true);  // a view replaces the staged range
    view = good;            // memory the executor cannot reach
    view.recurrent.space = MemorySpace::device;
    view.recurrent.device = this->executor().can_access(MemorySpace::device, 0) ? 63 : 0;
    add(kind, view, false);
  }
  for (Operation& op : bad) {
    SCOPED_TRACE(to_string(op.kind));
    EXPECT_EQ(status_of(this->run(std::move(op))), Status::invalid_argument);
    EXPECT_EQ(page, page_before);
  }

  if (const std::string why = this->rig_.kv_missing(); !why.empty()) return;
  const kernels::KvBlocks blocks{kernels::KvCodecId::kivi4, 2, 64, 64, 40};
  KvPool pool(blocks, DType::bf16, true);
  pool.place(kv_values(blocks, DType::bf16, 2));
  const std::vector<std::byte> pool_before = pool.bytes;
  std::vector<std::byte> chunk(kernels::kv_blocks_encoded_bytes(blocks), std::byte{0x42});
  const std::vector<std::byte> chunk_before = chunk;
  for (const OperationKind kind : {OperationKind::kv_encode, OperationKind::kv_decode}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string(to_string(kind)) + " variant " + std::to_string(variant));
      Operation op;
      op.kind = kind;
      op.kv = blocks;
      op.dtype = DType::bf16;
      op.kv_view = pool.view(this->buffer(pool.bytes));
      op.chunks = {this->buffer(chunk)};
      if (variant == 0) op.kv_view->values.size -= 2;             // not the extent
      if (variant == 1) op.kv_view->token_stride = pool.row - 2;  // rows overlap
      if (variant == 2) op.staged = this->buffer(staged_copy);    // beside a staged range
      if (variant == 3) {                                         // a state view on a KV operation
        op.kv_view.reset();
        op.state_view = good;
      }
      EXPECT_EQ(status_of(this->run(std::move(op))), Status::invalid_argument);
      EXPECT_EQ(chunk, chunk_before);
      EXPECT_EQ(pool.bytes, pool_before);
    }
  }
}

REGISTER_TYPED_TEST_SUITE_P(
    ExecutorConformance, CompressAndDecompressWriteThePageCodecsBytes,
    NonFiniteIsRefusedWithTheFirstValueInPageOrder, WrongSizesAreInvalidArgumentAndWriteNothing,
    AnAfterEventItCannotWaitForIsRefusedAndWritesNothing, MemoryItCannotReachIsRefused,
    CopyCopiesAWholePage, CompletesOnceOffTheSubmittingThreadAfterReleasingItsMemory,
    ManyConcurrentOperationsAllCompleteAndWaitIdleWaits,
    KvBlocksEncodeAndDecodeAcrossChunksLikeTheCpuReference,
    KvBlocksNonFiniteOrWrongSizesWriteNoChunk, StateViewsWriteThePackedBytesInEitherHeadOrder,
    StateViewsRefuseNonFiniteLikeThePackedLayout, KvViewsEncodeAndDecodeLikeThePackedBlocks,
    ViewsOfWrongSizesOrBesideAStagedRangeWriteNothing);

}  // namespace statepool::service::conformance
