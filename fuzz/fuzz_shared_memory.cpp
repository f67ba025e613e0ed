// libFuzzer target: states and KV blocks that change while they are encoded, as a client
// that rewrites its staging buffer during a Compress or a hybrid PutSnapshot leaves them
// (docs/architecture.md, "Memory a client can write"). A thread flips chosen values
// between what they were and NaN, +-Inf, huge or tiny values, and rewrites page bytes,
// while this thread encodes, decodes, and KV-encodes and decodes the same buffers.
//
// Input: page_input.hpp's 8 parameter bytes (layout, staged dtype), then
//   byte 8   KV stream: codec value % 5, role bit 3, plain dtype (value >> 4) % 3
//   byte 9   flipped values: 1 + value % 16
//   byte 10  seed of where they are and what they flip to
//   rest     the staged state's and the KV values' bytes, repeated to fill them
//
// Must hold, whatever the interleaving (a failure aborts: libFuzzer reports the input):
//   - nothing crashes, reads or writes outside its buffers (ASan) or has undefined
//     behaviour (UBSan);
//   - PageCodec::encode either succeeds or throws NonFiniteError naming a head of the
//     layout, an index within the head and a value that is NaN or +-Inf; nothing else;
//   - kv_encode likewise, with KvNonFiniteError naming a token and channel of the stream;
//   - decode and kv_decode throw nothing, whatever the bytes do meanwhile.
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <thread>
#include <vector>

#include "page_input.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"

namespace {

namespace kernels = statepool::kernels;
using statepool::fuzz::detail::SplitMix;

constexpr std::size_t kParamBytes = statepool::fuzz::kPageParamBytes + 3;
constexpr int kRounds = 3;

[[noreturn]] void fail(const char* what, const kernels::StateLayout& layout) {
  std::fprintf(stderr, "statepool fuzz_shared_memory: %s (codec %s, arch %s, %ux%ux%ux%u)\n", what,
               kernels::to_string(layout.codec.id), kernels::to_string(layout.arch),
               layout.num_layers, layout.num_heads, layout.key_dim, layout.value_dim);
  std::fflush(stderr);
  std::abort();
}

bool non_finite(float v) {
  return kernels::is_non_finite_bits(kernels::float_bits(v));
}

/// Bytes of `out` from `data`, repeated (zeros if there are none).
void fill(std::vector<std::byte>& out, std::span<const std::uint8_t> data) {
  if (data.empty()) return;
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::byte>(data[i % data.size()]);
}

/// One 32-bit word a thread keeps flipping: where, what it was, what it becomes.
struct Flip {
  volatile std::uint32_t* word;
  std::uint32_t was;
  std::uint32_t bad;
};

/// Words of `buffer` (its size rounded down to whole words); none if it is shorter.
void add_flips(std::vector<Flip>& flips, std::vector<std::byte>& buffer, std::size_t count,
               SplitMix& rng) {
  const std::size_t words = buffer.size() / 4;
  if (words == 0) return;
  // NaN, -Inf, +Inf (f32; and in each 16-bit half for bf16 and f16), huge, tiny.
  constexpr std::uint32_t kBad[] = {0x7fc07fc0u, 0xff80fc00u, 0x7f807c00u, 0x7bff7bffu,
                                    0x00010001u};
  for (std::size_t i = 0; i < count; ++i) {
    auto* word = reinterpret_cast<volatile std::uint32_t*>(buffer.data()) + rng.next() % words;
    flips.push_back({word, *word, kBad[rng.next() % std::size(kBad)]});
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> input(data, size);
  if (size < kParamBytes) return 0;
  const auto page_input = statepool::fuzz::parse_page_input(input);
  if (!page_input) return 0;
  const kernels::StateLayout& layout = page_input->layout;
  const kernels::DType dtype = page_input->staged;
  const kernels::PageCodec codec(layout);
  const std::size_t head_values = std::size_t{layout.key_dim} * layout.value_dim;

  const std::uint8_t kv_param = input[8];
  const kernels::KvStream stream{
      static_cast<kernels::KvCodecId>(kv_param % 5),
      (kv_param & 8) != 0 ? kernels::KvRole::values : kernels::KvRole::keys,
      1 + std::uint64_t{layout.key_dim}, 1 + std::uint64_t{layout.value_dim}};
  const auto kv_dtype = static_cast<kernels::DType>((kv_param >> 4) % 3);
  const std::span<const std::uint8_t> rest = input.subspan(kParamBytes);

  std::vector<std::byte> staged(codec.staged_bytes(dtype));
  std::vector<std::byte> kv_plain(stream.tokens * stream.channels * kernels::dtype_bytes(kv_dtype));
  fill(staged, rest);
  fill(kv_plain, rest);
  std::vector<std::byte> page(codec.page_bytes());
  std::vector<std::byte> back(staged.size());
  std::vector<std::byte> kv_encoded(kernels::kv_encoded_bytes(stream));
  std::vector<std::byte> kv_back(kv_plain.size());

  SplitMix rng{input[10]};
  const std::size_t count = 1 + input[9] % 16u;
  std::vector<Flip> flips;
  add_flips(flips, staged, count, rng);
  add_flips(flips, kv_plain, count, rng);
  add_flips(flips, page, 2, rng);  // page bytes change under decode (and under encode)

  std::atomic<bool> stop{false};
  std::thread mutator([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      for (const Flip& f : flips) {
        *f.word = f.bad;
        *f.word = f.was;
      }
    }
  });
  const auto stop_mutator = [&] {
    stop.store(true);
    mutator.join();
  };

  // Stops the mutator before aborting, so that the report is of this thread's state.
  const auto die = [&](const char* what, const char* detail) {
    stop_mutator();
    if (detail != nullptr) std::fprintf(stderr, "%s\n", detail);
    fail(what, layout);
  };
  for (int round = 0; round < kRounds; ++round) {
    try {
      codec.encode(staged, dtype, page);
    } catch (const kernels::NonFiniteError& e) {
      if (e.layer() >= layout.num_layers || e.head() >= layout.num_heads ||
          e.index() >= head_values || !non_finite(e.value())) {
        die("NonFiniteError names a place outside the state, or a finite value", e.what());
      }
    } catch (const std::exception& e) {
      die("encode threw something other than NonFiniteError", e.what());
    }
    try {
      codec.decode(page, dtype, back);
      kernels::kv_encode(stream, kv_dtype, kv_plain, kv_encoded);
    } catch (const kernels::KvNonFiniteError& e) {
      if (e.token() >= stream.tokens || e.channel() >= stream.channels || !non_finite(e.value())) {
        die("KvNonFiniteError names a place outside the stream, or a finite value", e.what());
      }
    } catch (const std::exception& e) {
      die("decode or kv_encode threw something other than KvNonFiniteError", e.what());
    }
    try {
      kernels::kv_decode(stream, kv_encoded, kv_dtype, kv_back);
    } catch (const std::exception& e) {
      die("kv_decode threw", e.what());
    }
  }
  stop_mutator();
  return 0;
}
