// Staged views (staged_view.hpp, PageCodec's view functions in page.hpp): a state or KV
// blocks read from and written to wherever an engine keeps them give exactly the packed
// layout's bytes and values.
//   - every codec instance (codec_instances.hpp), a conv state in a buffer of its own,
//     f32 and bf16 staging, aligned or not: a key-major or value-major (each head
//     transposed) view encodes to PageCodec::encode's bytes, whole or in pieces, and decodes
//     to PageCodec::decode's values (transposed back);
//   - a NaN/Inf in a value-major head is reported at its [K][V] index, the first in [K][V]
//     order (not in the order the view stores it), as the packed layout reports it;
//   - wrong sizes, dtypes and head orders are std::invalid_argument;
//   - KV blocks of every KV codec in SGLang's host layouts (page_first, page_first_direct,
//     layer_first), keys and values of different widths, keys only, and the packed view:
//     kv_encode_view writes kv_encode_blocks's bytes, kv_decode_view gives kv_decode_blocks's
//     values and writes nothing between the rows; strides that make rows overlap are refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/staged_view.hpp"
#include "statepool/synthetic/random.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/codec_instances.hpp"
#include "statepool/testing/staged_views.hpp"

namespace statepool::kernels {
namespace {

using testing::Instance;

constexpr std::byte kUntouched{0xEE};

/// A staged state of `page`'s layout in `dtype`, packed: heavy-tailed recurrent values
/// (rounded to bf16 for bf16), then random conv bytes.
std::vector<std::byte> random_staged(const PageCodec& page, DType dtype, unsigned seed) {
  const StateLayout& l = page.layout();
  const std::size_t values = std::size_t{l.num_layers} * l.num_heads * l.key_dim * l.value_dim;
  const std::vector<float> x = synthetic::heavy_tailed_values<std::mt19937>(values, seed, 1.0f);
  std::vector<std::byte> out(page.staged_bytes(dtype));
  for (std::size_t i = 0; i < values; ++i) {
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t b = float_to_bf16_bits(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  std::mt19937 rng(seed + 1);
  for (std::size_t i = values * dtype_bytes(dtype); i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(rng());
  }
  return out;
}

using statepool::testing::transpose_heads;

/// Bytes at an offset of 0 or 1 from a vector's (aligned) start: `size` bytes of `fill`.
struct Shifted {
  Shifted(std::size_t size, std::size_t shift, std::byte fill)
      : storage(size + shift, fill), bytes(storage.data() + shift, size) {}
  Shifted(std::span<const std::byte> from, std::size_t shift) : Shifted(from.size(), shift, {}) {
    std::copy(from.begin(), from.end(), bytes.begin());
  }
  std::vector<std::byte> storage;
  std::span<std::byte> bytes;
};

std::vector<std::byte> bytes_of(std::span<const std::byte> s) {
  return {s.begin(), s.end()};
}

/// Every instance, with a conv state where it has none (the view keeps it apart).
StateLayout layout_of(const Instance& instance) {
  StateLayout layout = instance.layout;
  if (layout.conv_channels == 0) layout = testing::with_conv(layout, 6, 3, DType::bf16);
  return layout;
}

class StagedView : public ::testing::TestWithParam<Instance> {};

TEST_P(StagedView, EncodesThePackedBytesAndDecodesThePackedValues) {
  const PageCodec page(layout_of(GetParam()));
  const StateLayout& l = page.layout();
  const std::size_t heads = page.head_count();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::size_t width = dtype_bytes(dtype);
    const std::vector<std::byte> packed = random_staged(page, dtype, 17);
    const std::size_t recurrent_bytes = packed.size() - page.conv_bytes();
    const std::span<const std::byte> recurrent(packed.data(), recurrent_bytes);
    std::vector<std::byte> conv(packed.begin() + static_cast<std::ptrdiff_t>(recurrent_bytes),
                                packed.end());
    std::vector<std::byte> expected(page.page_bytes());
    page.encode(packed, dtype, expected);
    std::vector<std::byte> decoded(packed.size());
    page.decode(expected, dtype, decoded);
    const std::span<const std::byte> decoded_recurrent(decoded.data(), recurrent_bytes);

    for (const HeadOrder order : {HeadOrder::key_major, HeadOrder::value_major}) {
      const bool transposed = order == HeadOrder::value_major;
      const std::vector<std::byte> heads_in =
          transposed ? transpose_heads(recurrent, l.key_dim, l.value_dim, width)
                     : bytes_of(recurrent);
      const std::vector<std::byte> heads_out =
          transposed ? transpose_heads(decoded_recurrent, l.key_dim, l.value_dim, width)
                     : bytes_of(decoded_recurrent);
      for (const std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(order) + " shifted by " +
                     std::to_string(shift));
        Shifted in(heads_in, shift);
        const StateView view{in.bytes, conv, dtype, order};

        std::vector<std::byte> whole(page.page_bytes(), kUntouched);
        page.encode(view, whole);
        EXPECT_EQ(testing::first_difference(whole, expected), -1);

        // In pieces, as an executor splits them.
        std::vector<std::byte> pieces(page.page_bytes(), kUntouched);
        page.check_finite(view, 0, heads);
        const std::size_t middle = heads / 2;
        page.encode_heads(view, pieces, middle, heads);
        page.encode_heads(view, pieces, 0, middle);
        page.encode_conv(view, pieces);
        EXPECT_EQ(testing::first_difference(pieces, expected), -1);

        Shifted out(heads_in.size(), shift, kUntouched);
        std::vector<std::byte> conv_out(conv.size(), kUntouched);
        page.decode(expected, StateView{out.bytes, conv_out, dtype, order});
        EXPECT_EQ(testing::first_difference(out.bytes, heads_out), -1);
        EXPECT_EQ(conv_out, conv);

        Shifted out2(heads_in.size(), shift, kUntouched);
        std::vector<std::byte> conv_out2(conv.size(), kUntouched);
        const StateView view2{out2.bytes, conv_out2, dtype, order};
        page.decode_heads(expected, view2, middle, heads);
        page.decode_heads(expected, view2, 0, middle);
        page.decode_conv(expected, view2);
        EXPECT_EQ(testing::first_difference(out2.bytes, heads_out), -1);
        EXPECT_EQ(conv_out2, conv);
      }
    }
  }
}

// Two bad values in the last head: an Inf at [0][V-1] and a NaN at [K-1][0]. A value-major
// head stores the NaN first, but in [K][V] order (the page's, the packed layout's) the Inf
// comes first: that is the one reported, as the packed layout reports it.
TEST_P(StagedView, ANonFiniteValueIsReportedAtItsKeyValueIndex) {
  const PageCodec page(layout_of(GetParam()));
  const StateLayout& l = page.layout();
  const std::size_t K = l.key_dim;
  const std::size_t V = l.value_dim;
  const std::size_t heads = page.head_count();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::size_t width = dtype_bytes(dtype);
    std::vector<std::byte> packed = random_staged(page, dtype, 5);
    const auto put = [&](std::size_t k, std::size_t v, float x) {
      const std::size_t at = ((heads - 1) * K * V + k * V + v) * width;
      if (dtype == DType::f32) {
        std::memcpy(packed.data() + at, &x, 4);
      } else {
        const std::uint16_t b = float_to_bf16_bits(x);
        std::memcpy(packed.data() + at, &b, 2);
      }
    };
    if (K > 1) put(K - 1, 0, nan);  // with one row, it would come first in either order
    put(0, V - 1, inf);
    std::string expected;
    std::vector<std::byte> scratch(page.page_bytes());
    try {
      page.encode(packed, dtype, scratch);
    } catch (const NonFiniteError& e) {
      expected = e.what();
      EXPECT_EQ(e.index(), V - 1);
    }
    ASSERT_FALSE(expected.empty());

    const std::size_t recurrent_bytes = packed.size() - page.conv_bytes();
    const std::span<const std::byte> recurrent(packed.data(), recurrent_bytes);
    std::vector<std::byte> conv(packed.begin() + static_cast<std::ptrdiff_t>(recurrent_bytes),
                                packed.end());
    for (const HeadOrder order : {HeadOrder::key_major, HeadOrder::value_major}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(order));
      std::vector<std::byte> heads_in = order == HeadOrder::value_major
                                            ? transpose_heads(recurrent, K, V, width)
                                            : bytes_of(recurrent);
      const StateView view{heads_in, conv, dtype, order};
      const auto expect_refused = [&](const auto& call) {
        try {
          call();
          ADD_FAILURE() << "no NonFiniteError";
        } catch (const NonFiniteError& e) {
          EXPECT_EQ(e.what(), expected);
          EXPECT_EQ(e.layer(), l.num_layers - 1);
          EXPECT_EQ(e.head(), l.num_heads - 1);
          EXPECT_EQ(e.index(), V - 1);
          EXPECT_TRUE(std::isinf(e.value()));
        }
      };
      std::vector<std::byte> target(page.page_bytes(), kUntouched);
      expect_refused([&] { page.encode(view, target); });
      EXPECT_TRUE(std::all_of(target.begin(), target.end(), [](std::byte b) {
        return b == kUntouched;
      })) << "a refused state leaves the page as it was";
      expect_refused([&] { page.check_finite(view, heads - 1, heads); });
      expect_refused([&] { page.encode_heads(view, target, 0, heads); });
      page.check_finite(view, 0, heads - 1);  // the other heads are fine
    }
  }
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, StagedView, ::testing::ValuesIn(testing::instances()),
                         instance_name);

TEST(StagedViewChecks, WrongSizesDtypesAndOrdersAreInvalidArgument) {
  StateLayout layout =
      testing::with_conv(testing::head_layout(CodecId::int6, 0, 16, 8), 4, 3, DType::bf16);
  layout.num_layers = 2;
  layout.num_heads = 3;
  const PageCodec page(layout);
  std::vector<std::byte> packed = random_staged(page, DType::f32, 3);
  const std::size_t recurrent_bytes = packed.size() - page.conv_bytes();
  const std::span<std::byte> recurrent(packed.data(), recurrent_bytes);
  const std::span<std::byte> conv(packed.data() + recurrent_bytes, page.conv_bytes());
  std::vector<std::byte> target(page.page_bytes());
  const StateView good{recurrent, conv, DType::f32, HeadOrder::value_major};
  page.encode(good, target);  // the conv state may follow the recurrent part

  const StateView packed_view = packed_state_view(layout, DType::f32, packed);
  EXPECT_EQ(packed_view.recurrent.data(), recurrent.data());
  EXPECT_EQ(packed_view.recurrent.size(), recurrent.size());
  EXPECT_EQ(packed_view.conv.data(), conv.data());
  EXPECT_EQ(packed_view.conv.size(), conv.size());
  EXPECT_EQ(packed_view.order, HeadOrder::key_major);
  EXPECT_THROW((void)packed_state_view(layout, DType::f32, std::span(packed).first(10)),
               std::invalid_argument);
  EXPECT_THROW((void)packed_state_view(layout, DType::f16, packed), std::invalid_argument);

  std::vector<StateView> bad;
  bad.push_back({recurrent.first(recurrent.size() - 4), conv, DType::f32, HeadOrder::value_major});
  bad.push_back({recurrent, conv.first(conv.size() - 1), DType::f32, HeadOrder::value_major});
  bad.push_back({recurrent, {}, DType::f32, HeadOrder::key_major});
  bad.push_back({recurrent, conv, DType::bf16, HeadOrder::value_major});  // f32 sizes
  bad.push_back({recurrent.first(recurrent.size() / 2), conv, DType::f16, HeadOrder::key_major});
  bad.push_back({recurrent, conv, DType::f32, static_cast<HeadOrder>(2)});
  const std::size_t heads = page.head_count();
  for (const StateView& view : bad) {
    EXPECT_THROW(page.encode(view, target), std::invalid_argument);
    EXPECT_THROW(page.decode(target, view), std::invalid_argument);
    EXPECT_THROW(page.check_finite(view, 0, heads), std::invalid_argument);
    EXPECT_THROW(page.encode_heads(view, target, 0, 0), std::invalid_argument);
    EXPECT_THROW(page.encode_conv(view, target), std::invalid_argument);
    EXPECT_THROW(page.decode_heads(target, view, 0, 0), std::invalid_argument);
    EXPECT_THROW(page.decode_conv(target, view), std::invalid_argument);
  }
  std::vector<std::byte> short_page(page.page_bytes() - 4);
  EXPECT_THROW(page.encode(good, short_page), std::invalid_argument);
  EXPECT_THROW(page.decode(short_page, good), std::invalid_argument);
  EXPECT_THROW(page.encode_heads(good, short_page, 0, 1), std::invalid_argument);
  EXPECT_THROW(page.decode_heads(short_page, good, 0, 1), std::invalid_argument);
  EXPECT_THROW(page.encode_conv(good, short_page), std::invalid_argument);
  EXPECT_THROW(page.encode_heads(good, target, 2, heads + 1), std::invalid_argument);
  EXPECT_THROW(page.decode_heads(target, good, 3, 2), std::invalid_argument);

  // Without a conv state, its span is empty.
  const PageCodec no_conv(testing::head_layout(CodecId::fp16, 0, 4, 4));
  std::vector<std::byte> values(16 * 4);
  std::vector<std::byte> extra(4);
  std::vector<std::byte> no_conv_page(no_conv.page_bytes());
  no_conv.encode(StateView{values, {}, DType::f32, HeadOrder::value_major}, no_conv_page);
  EXPECT_THROW(
      no_conv.encode(StateView{values, extra, DType::f32, HeadOrder::value_major}, no_conv_page),
      std::invalid_argument);
}

// --- KV blocks ----------------------------------------------------------------------------

/// Plain KV values of `blocks` in `dtype`, packed (kv.hpp): N(0, 2) from `seed`.
std::vector<std::byte> kv_values(const KvBlocks& blocks, DType dtype, unsigned seed) {
  const std::size_t count = kv_blocks_plain_bytes(blocks, DType::f32) / 4;
  const std::vector<float> x = synthetic::gaussian_values<std::mt19937>(count, seed, 2.0f);
  std::vector<std::byte> out(kv_blocks_plain_bytes(blocks, dtype));
  for (std::size_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t b =
          dtype == DType::bf16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

/// An engine's KV memory: keys and values regions at offsets of one buffer (the rest
/// filled with kUntouched), and the strides of its rows.
struct KvLayout {
  std::string name;
  std::uint64_t keys_at = 0;
  std::uint64_t values_at = 0;
  std::uint64_t layer_stride = 0;
  std::uint64_t token_stride = 0;
  std::uint64_t buffer_bytes = 0;
};

/// SGLang's host layouts for `kv` in `dtype`, each of a pool larger than the blocks (the
/// blocks start at token `first` of it), and a layout of layers inside tokens with padding.
std::vector<KvLayout> kv_layouts(const KvBlocks& kv, DType dtype) {
  const std::uint64_t row =
      std::uint64_t{std::max(kv.key_channels, kv.value_channels)} * dtype_bytes(dtype);
  const std::uint64_t L = kv.layers;
  const std::uint64_t T = kv.tokens;
  const std::uint64_t size = T + 9;  // tokens of the pool
  const std::uint64_t first = 5;     // the blocks' first token in it
  std::vector<KvLayout> out;
  // page_first [2][size][L][row]
  out.push_back(
      {"page_first", first * L * row, (size + first) * L * row, row, L * row, 2 * size * L * row});
  // page_first_direct [2][pages][L][ps][row], the blocks one whole page (page 1 of 3)
  out.push_back({"page_first_direct", 1 * L * T * row, (3 + 1) * L * T * row, T * row, row,
                 2 * 3 * L * T * row});
  // layer_first [2][L][size][row]
  out.push_back(
      {"layer_first", first * row, (L * size + first) * row, size * row, row, 2 * L * size * row});
  // layers inside tokens with gaps: [size][L][row + 6] plus 10 bytes a token, at odd
  // offsets; the values after the keys.
  const std::uint64_t padded = row + 6;
  out.push_back({"padded_token_major", 3, 3 + size * L * padded + 7, padded, L * padded + 10,
                 2 * (size * (L * padded + 10)) + 64});
  return out;
}

/// Byte offset of row (layer, role, token) in the packed values.
std::uint64_t packed_row(const KvBlocks& kv, DType dtype, std::uint32_t layer, KvRole role,
                         std::uint64_t token) {
  const std::uint64_t w = dtype_bytes(dtype);
  const std::uint64_t layer_bytes =
      (std::uint64_t{kv.key_channels} + kv.value_channels) * kv.tokens * w;
  const std::uint64_t channels = role == KvRole::keys ? kv.key_channels : kv.value_channels;
  return layer * layer_bytes + (role == KvRole::keys ? 0 : kv.key_channels * kv.tokens * w) +
         token * channels * w;
}

/// Moves every row between the packed values and a view of `layout` in `buffer`.
void move_rows(const KvBlocks& kv, DType dtype, const KvLayout& layout, std::byte* buffer,
               std::byte* packed, bool to_view) {
  const std::uint64_t w = dtype_bytes(dtype);
  for (std::uint32_t layer = 0; layer < kv.layers; ++layer) {
    for (const KvRole role : {KvRole::keys, KvRole::values}) {
      const std::uint64_t channels = role == KvRole::keys ? kv.key_channels : kv.value_channels;
      const std::uint64_t base = role == KvRole::keys ? layout.keys_at : layout.values_at;
      for (std::uint64_t t = 0; t < kv.tokens; ++t) {
        std::byte* view_row = buffer + base + layer * layout.layer_stride + t * layout.token_stride;
        std::byte* packed_at = packed + packed_row(kv, dtype, layer, role, t);
        if (to_view) {
          std::memcpy(view_row, packed_at, channels * w);
        } else {
          std::memcpy(packed_at, view_row, channels * w);
        }
      }
    }
  }
}

KvView view_in(const KvBlocks& kv, DType dtype, const KvLayout& layout,
               std::vector<std::byte>& buffer) {
  KvView view;
  view.layer_stride = layout.layer_stride;
  view.token_stride = layout.token_stride;
  view.dtype = dtype;
  view.keys = std::span(buffer).subspan(
      layout.keys_at,
      kv_view_extent(kv, kv.key_channels, dtype, layout.layer_stride, layout.token_stride));
  view.values = std::span(buffer).subspan(
      layout.values_at,
      kv_view_extent(kv, kv.value_channels, dtype, layout.layer_stride, layout.token_stride));
  return view;
}

TEST(KvView, EncodesTheBlocksBytesAndDecodesTheirValuesInEveryLayout) {
  for (const KvCodecId codec :
       {KvCodecId::bf16, KvCodecId::fp8, KvCodecId::kivi2, KvCodecId::kivi4, KvCodecId::flexgen4}) {
    // 3 layers past the KIVI residual window; keys and values of one width (SGLang's), of
    // two widths (an odd partial group), keys only (an MLA latent); one token, one layer.
    for (const KvBlocks kv : {KvBlocks{codec, 3, 64, 64, 161}, KvBlocks{codec, 2, 96, 40, 45},
                              KvBlocks{codec, 2, 72, 0, 33}, KvBlocks{codec, 1, 64, 64, 1}}) {
      for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        std::vector<std::byte> plain = kv_values(kv, dtype, 3);
        std::vector<std::byte> expected(kv_blocks_encoded_bytes(kv));
        kv_encode_blocks(kv, dtype, plain, expected);
        std::vector<std::byte> decoded(plain.size());
        kv_decode_blocks(kv, expected, dtype, decoded);
        const std::size_t streams = kv_block_streams(kv, dtype).size();

        for (const KvLayout& layout : kv_layouts(kv, dtype)) {
          SCOPED_TRACE(describe(kv) + " in " + to_string(dtype) + ", " + layout.name);
          std::vector<std::byte> buffer(layout.buffer_bytes, kUntouched);
          move_rows(kv, dtype, layout, buffer.data(), plain.data(), true);
          const KvView view = view_in(kv, dtype, layout, buffer);
          ASSERT_EQ(kv_view_problem(kv, dtype, layout.layer_stride, layout.token_stride), nullptr);
          std::vector<std::byte> encoded(expected.size(), kUntouched);
          kv_encode_view(kv, view, encoded, streams / 2, streams);
          kv_encode_view(kv, view, encoded, 0, streams / 2);
          EXPECT_EQ(testing::first_difference(encoded, expected), -1);

          std::vector<std::byte> out(layout.buffer_bytes, kUntouched);
          const KvView out_view = view_in(kv, dtype, layout, out);
          kv_decode_view(kv, expected, out_view, 0, streams);
          // The rows hold the decoded values; every byte between them is as it was.
          std::vector<std::byte> rows(decoded.size(), kUntouched);
          move_rows(kv, dtype, layout, out.data(), rows.data(), false);
          EXPECT_EQ(testing::first_difference(rows, decoded), -1);
          std::vector<std::byte> blank = out;
          std::vector<std::byte> zeros(decoded.size(), kUntouched);
          move_rows(kv, dtype, layout, blank.data(), zeros.data(), true);
          EXPECT_TRUE(std::all_of(blank.begin(), blank.end(), [](std::byte b) {
            return b == kUntouched;
          })) << "decoding wrote outside the rows";

          // Stream by stream from the stream's own bytes, as an executor over chunks does.
          std::vector<std::byte> out2(layout.buffer_bytes, kUntouched);
          const KvView out2_view = view_in(kv, dtype, layout, out2);
          const std::vector<KvBlockStream> each = kv_block_streams(kv, dtype);
          for (std::size_t i = 0; i < each.size(); ++i) {
            const auto begin =
                expected.begin() + static_cast<std::ptrdiff_t>(each[i].encoded_offset);
            const std::vector<std::byte> own(
                begin, begin + static_cast<std::ptrdiff_t>(each[i].encoded_bytes));
            kv_decode_view_stream(kv, i, own, out2_view);
          }
          EXPECT_EQ(out2, out);
        }

        // The packed order is a view when keys and values are as wide.
        if (kv.value_channels != 0 && kv.value_channels != kv.key_channels) {
          EXPECT_THROW((void)kv_packed_view(kv, dtype, plain), std::invalid_argument);
          continue;
        }
        SCOPED_TRACE(describe(kv) + " in " + to_string(dtype) + ", packed");
        const KvView packed = kv_packed_view(kv, dtype, plain);
        EXPECT_EQ(packed.keys.data(), plain.data());
        std::vector<std::byte> encoded(expected.size(), kUntouched);
        kv_encode_view(kv, packed, encoded, 0, streams);
        EXPECT_EQ(testing::first_difference(encoded, expected), -1);
        std::vector<std::byte> out(plain.size(), kUntouched);
        kv_decode_view(kv, expected, kv_packed_view(kv, dtype, out), 0, streams);
        EXPECT_EQ(testing::first_difference(out, decoded), -1);
      }
    }
  }
}

TEST(KvView, OverlappingStridesAndWrongSizesAreRefused) {
  const KvBlocks kv{KvCodecId::kivi4, 4, 64, 32, 10};
  const DType dtype = DType::bf16;
  const std::uint64_t row = 64 * 2;  // the wider row
  // Tokens inside layers, layers inside tokens, and one token or one layer (whose stride is
  // never used).
  EXPECT_EQ(kv_view_problem(kv, dtype, 10 * row, row), nullptr);
  EXPECT_EQ(kv_view_problem(kv, dtype, 11 * row, row + 1), nullptr);
  EXPECT_EQ(kv_view_problem(kv, dtype, row, 4 * row), nullptr);
  EXPECT_EQ(kv_view_problem(kv, dtype, row + 3, 3 * (row + 3) + row), nullptr);
  EXPECT_EQ(kv_view_problem(KvBlocks{KvCodecId::kivi4, 1, 64, 32, 10}, dtype, 0, row), nullptr);
  EXPECT_EQ(kv_view_problem(KvBlocks{KvCodecId::kivi4, 4, 64, 32, 1}, dtype, row, 0), nullptr);

  EXPECT_NE(kv_view_problem(kv, dtype, 10 * row, row - 2), nullptr);  // tokens overlap
  EXPECT_NE(kv_view_problem(kv, dtype, 10 * row - 2, row), nullptr);  // layers overlap
  EXPECT_NE(kv_view_problem(kv, dtype, row, 4 * row - 2), nullptr);   // tokens overlap
  EXPECT_NE(kv_view_problem(kv, dtype, row - 2, 4 * row), nullptr);   // layers overlap
  EXPECT_NE(kv_view_problem(kv, dtype, 0, 0), nullptr);               // every row at once
  EXPECT_NE(kv_view_problem(kv, dtype, 5 * row, 2 * row), nullptr);   // interleaved
  EXPECT_NE(kv_view_problem(kv, static_cast<DType>(7), 10 * row, row), nullptr);
  EXPECT_NE(kv_view_problem(kv, dtype, std::uint64_t{1} << 61, row), nullptr);  // past 2^62
  EXPECT_NE(kv_view_problem(kv, dtype, UINT64_MAX / 2, row), nullptr);          // past 2^64
  EXPECT_NE(kv_view_problem(KvBlocks{KvCodecId::kivi4, 0, 64, 32, 10}, dtype, 10 * row, row),
            nullptr);
  EXPECT_EQ(kv_view_extent(kv, 64, dtype, 10 * row, row), 3 * 10 * row + 9 * row + row);
  EXPECT_EQ(kv_view_extent(kv, 32, dtype, 10 * row, row), 3 * 10 * row + 9 * row + 64);
  EXPECT_EQ(kv_view_extent(kv, 0, dtype, 10 * row, row), 0u);
  EXPECT_EQ(kv_view_extent(kv, 64, dtype, UINT64_MAX / 2, row), UINT64_MAX);

  std::vector<std::byte> buffer(kv_view_extent(kv, 64, dtype, 10 * row, row) + 64);
  KvView view;
  view.layer_stride = 10 * row;
  view.token_stride = row;
  view.dtype = dtype;
  view.keys = std::span(buffer).first(kv_view_extent(kv, 64, dtype, 10 * row, row));
  view.values = std::span(buffer).first(kv_view_extent(kv, 32, dtype, 10 * row, row));
  check_kv_view(kv, view);
  std::vector<std::byte> encoded(kv_blocks_encoded_bytes(kv));
  const std::size_t streams = 8;
  kv_encode_view(kv, view, encoded, 0, streams);
  kv_decode_view(kv, encoded, view, 0, streams);
  EXPECT_THROW(kv_encode_view(kv, view, encoded, 0, streams + 1), std::invalid_argument);
  EXPECT_THROW(kv_decode_view(kv, encoded, view, 3, 2), std::invalid_argument);
  EXPECT_THROW(kv_encode_view(kv, view, std::span(encoded).first(encoded.size() - 1), 0, 0),
               std::invalid_argument);
  EXPECT_THROW(kv_decode_view_stream(kv, 0, encoded, view), std::invalid_argument);
  EXPECT_THROW(kv_decode_view_stream(kv, streams, encoded, view), std::invalid_argument);

  KvView bad = view;
  bad.keys = bad.keys.first(bad.keys.size() - 1);
  EXPECT_THROW(check_kv_view(kv, bad), std::invalid_argument);
  EXPECT_THROW(kv_encode_view(kv, bad, encoded, 0, 0), std::invalid_argument);
  EXPECT_THROW(kv_decode_view(kv, encoded, bad, 0, 0), std::invalid_argument);
  bad = view;
  bad.values = {};
  EXPECT_THROW(check_kv_view(kv, bad), std::invalid_argument);
  bad = view;
  bad.token_stride = row - 2;
  EXPECT_THROW(check_kv_view(kv, bad), std::invalid_argument);
  bad = view;
  bad.dtype = DType::f32;  // spans of bf16 rows
  EXPECT_THROW(check_kv_view(kv, bad), std::invalid_argument);
}

// A stream of rows apart larger than the per-thread buffer kept for gathering (4 MiB):
// gathered into a buffer of its own, with the same bytes.
TEST(KvView, ALongStridedStreamEncodesAndDecodesLikeTheBlocks) {
  const KvBlocks kv{KvCodecId::fp8, 1, 1024, 0, 1100};  // 4.5 MB of f32 keys
  const DType dtype = DType::f32;
  const std::uint64_t row = 1024 * 4;
  const KvLayout layout{"padded rows", 16, 0, 0, row + 64, 16 + 1100 * (row + 64)};
  std::vector<std::byte> plain = kv_values(kv, dtype, 4);
  std::vector<std::byte> expected(kv_blocks_encoded_bytes(kv));
  kv_encode_blocks(kv, dtype, plain, expected);
  std::vector<std::byte> decoded(plain.size());
  kv_decode_blocks(kv, expected, dtype, decoded);
  std::vector<std::byte> buffer(layout.buffer_bytes, kUntouched);
  move_rows(kv, dtype, layout, buffer.data(), plain.data(), true);
  std::vector<std::byte> encoded(expected.size());
  kv_encode_view(kv, view_in(kv, dtype, layout, buffer), encoded, 0, 1);
  EXPECT_EQ(testing::first_difference(encoded, expected), -1);
  std::vector<std::byte> out(layout.buffer_bytes, kUntouched);
  kv_decode_view(kv, expected, view_in(kv, dtype, layout, out), 0, 1);
  std::vector<std::byte> rows(decoded.size());
  move_rows(kv, dtype, layout, out.data(), rows.data(), false);
  EXPECT_EQ(testing::first_difference(rows, decoded), -1);
}

TEST(KvView, ANonFiniteValueIsReportedAtItsTokenAndChannel) {
  const KvBlocks kv{KvCodecId::kivi2, 2, 64, 64, 40};
  const DType dtype = DType::f32;
  const KvLayout layout = kv_layouts(kv, dtype).front();  // page_first: rows not contiguous
  std::vector<std::byte> plain = kv_values(kv, dtype, 9);
  const float inf = std::numeric_limits<float>::infinity();
  // Layer 1's values, token 3, channel 9.
  std::memcpy(plain.data() + packed_row(kv, dtype, 1, KvRole::values, 3) + 4 * 9, &inf, 4);
  std::vector<std::byte> buffer(layout.buffer_bytes, kUntouched);
  move_rows(kv, dtype, layout, buffer.data(), plain.data(), true);
  std::vector<std::byte> encoded(kv_blocks_encoded_bytes(kv));
  const KvView view = view_in(kv, dtype, layout, buffer);
  kv_encode_view(kv, view, encoded, 0, 3);  // the other streams are fine
  try {
    kv_encode_view(kv, view, encoded, 0, 4);
    ADD_FAILURE() << "no KvNonFiniteError";
  } catch (const KvNonFiniteError& e) {
    EXPECT_EQ(e.token(), 3u);
    EXPECT_EQ(e.channel(), 9u);
    EXPECT_TRUE(std::isinf(e.value()));
  }
}

}  // namespace
}  // namespace statepool::kernels
