// Whole-page operations (page.hpp): exact sizes and offsets, byte layout, conv state,
// staging dtypes, non-finite rejection and buffer checks.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "statepool/kernels/format.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/reference.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/synthetic_state.hpp"

namespace statepool::kernels {
namespace {

const CodecId kCodecs[] = {CodecId::fp32, CodecId::bf16, CodecId::fp16,
                           CodecId::int4, CodecId::int6, CodecId::int8};

StateLayout small_layout(CodecId id, std::uint32_t group = 0) {
  StateLayout layout;
  layout.name = "small";
  layout.num_layers = 3;
  layout.num_heads = 4;
  layout.key_dim = 16;
  layout.value_dim = 24;
  layout.conv_channels = 10;
  layout.conv_width = 3;
  layout.conv_dtype = DType::bf16;
  layout.codec = {id, group};
  return layout;
}

TEST(Page, QwenNextExactBytes) {
  // 36 layers x 32 heads x 128 x 128, conv 8192 channels x 3 in bf16, computed by hand:
  //   heads = 1152, conv = 36 * 8192 * 3 * 2 = 1,769,472 B
  //   fp32 head 65,536 B; bf16/fp16 32,768; int8 256 + 16,384 = 16,640;
  //   int6 256 + 12,288 = 12,544; int4 256 + 8,192 = 8,448.
  struct Expect {
    CodecId id;
    std::size_t head;
    std::size_t page;
  };
  const Expect expects[] = {
      {CodecId::fp32, 65536, 75497472 + 1769472}, {CodecId::bf16, 32768, 37748736 + 1769472},
      {CodecId::fp16, 32768, 37748736 + 1769472}, {CodecId::int8, 16640, 19169280 + 1769472},
      {CodecId::int6, 12544, 14450688 + 1769472}, {CodecId::int4, 8448, 9732096 + 1769472},
  };
  for (const auto& e : expects) {
    const PageCodec page(testing::qwen3_next_layout(e.id));
    EXPECT_EQ(page.codec().head_bytes(0, 0), e.head) << to_string(e.id);
    EXPECT_EQ(page.page_bytes(), e.page) << to_string(e.id);
    EXPECT_EQ(page.conv_bytes(), 1769472u);
    EXPECT_EQ(page.conv_offset(), 1152 * e.head);
    EXPECT_EQ(page.head_offset(0, 0), 0u);
    EXPECT_EQ(page.head_offset(1, 0), 32 * e.head);
    EXPECT_EQ(page.head_offset(35, 31), 1151 * e.head);
    // FP32 reference: 75,497,472 recurrent + 36 * 8192 * 3 * 4 = 3,538,944 conv.
    EXPECT_EQ(page.fp32_bytes(), 79036416u);
    EXPECT_EQ(page.staged_bytes(DType::f32), 75497472u + 1769472u);
    EXPECT_EQ(page.staged_bytes(DType::bf16), 37748736u + 1769472u);
    EXPECT_DOUBLE_EQ(page.compression_ratio(), 79036416.0 / static_cast<double>(e.page));
  }
  // int6: 79,036,416 / 16,220,160 = 4.8727...: metadata and conv count in the ratio.
  EXPECT_NEAR(PageCodec(testing::qwen3_next_layout(CodecId::int6)).compression_ratio(), 4.8727,
              1e-4);
}

TEST(Page, OffsetsArePrefixSums) {
  for (const CodecId id : kCodecs) {
    const PageCodec page(small_layout(id, 32));
    const std::size_t head = page.codec().head_bytes(0, 0);
    for (std::uint32_t l = 0; l < 3; ++l) {
      for (std::uint32_t h = 0; h < 4; ++h) {
        EXPECT_EQ(page.head_offset(l, h), (l * 4 + h) * head);
        EXPECT_EQ(page.head_offset(l, h) % 4, 0u);
      }
    }
    EXPECT_EQ(page.conv_offset(), 12 * head);
    EXPECT_EQ(page.page_bytes(), 12 * head + 3 * 10 * 3 * 2);
  }
}

TEST(Page, BytesAreTheHeadsThenTheRawConvState) {
  for (const CodecId id : kCodecs) {
    const StateLayout layout = small_layout(id, 32);
    const PageCodec page(layout);
    const auto staged = testing::synthetic_staged_state(layout, 40, 3, DType::f32);
    std::vector<std::byte> bytes(page.page_bytes(), std::byte{0xCD});
    page.encode(staged, DType::f32, bytes);

    const std::size_t n = 16 * 24;
    const std::size_t head = page.codec().head_bytes(0, 0);
    std::vector<std::byte> expected;
    for (std::size_t index = 0; index < 12; ++index) {
      const auto values = testing::bytes_to_floats(
          std::span<const std::byte>(staged).subspan(index * n * 4, n * 4));
      std::vector<std::byte> one(head);
      reference::encode_head(layout.codec, 16, 24, values, one);
      expected.insert(expected.end(), one.begin(), one.end());
    }
    expected.insert(expected.end(), staged.end() - static_cast<std::ptrdiff_t>(page.conv_bytes()),
                    staged.end());
    EXPECT_EQ(testing::first_difference(bytes, expected), -1) << to_string(id);
  }
}

TEST(Page, RoundTripKeepsConvBytesAndMatchesHeadDecode) {
  for (const CodecId id : kCodecs) {
    const StateLayout layout = small_layout(id);
    const PageCodec page(layout);
    const auto staged = testing::synthetic_staged_state(layout, 40, 9, DType::f32);
    std::vector<std::byte> bytes(page.page_bytes());
    page.encode(staged, DType::f32, bytes);
    std::vector<std::byte> back(page.staged_bytes(DType::f32), std::byte{0xEE});
    page.decode(bytes, DType::f32, back);

    const std::size_t conv = page.conv_bytes();
    EXPECT_EQ(
        std::memcmp(back.data() + back.size() - conv, staged.data() + staged.size() - conv, conv),
        0);
    const auto out = testing::bytes_to_floats(back);
    const std::size_t n = 16 * 24;
    for (std::uint32_t l = 0; l < 3; ++l) {
      for (std::uint32_t h = 0; h < 4; ++h) {
        std::vector<float> head(n);
        reference::decode_head(layout.codec, 16, 24,
                               std::span<const std::byte>(bytes).subspan(
                                   page.head_offset(l, h), page.codec().head_bytes(l, h)),
                               head);
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(float_bits(out[(l * 4 + h) * n + i]), float_bits(head[i]))
              << to_string(id) << " layer " << l << " head " << h << " i " << i;
        }
      }
    }
    if (id == CodecId::fp32) {
      EXPECT_EQ(back, staged);
    }
  }
}

TEST(Page, Bf16StagingEqualsF32StagingOfTheSameValues) {
  for (const CodecId id : kCodecs) {
    const StateLayout layout = small_layout(id);
    const PageCodec page(layout);
    const auto staged_bf16 = testing::synthetic_staged_state(layout, 40, 21, DType::bf16);
    // The same values widened to f32 (bf16 -> f32 is exact).
    const std::size_t values = 12 * 16 * 24;
    std::vector<float> widened(values);
    for (std::size_t i = 0; i < values; ++i) {
      std::uint16_t b = 0;
      std::memcpy(&b, staged_bf16.data() + 2 * i, 2);
      widened[i] = bf16_bits_to_float(b);
    }
    std::vector<std::byte> staged_f32 = testing::float_bytes(widened);
    staged_f32.insert(staged_f32.end(), staged_bf16.begin() + 2 * values, staged_bf16.end());

    std::vector<std::byte> from_bf16(page.page_bytes());
    std::vector<std::byte> from_f32(page.page_bytes());
    page.encode(staged_bf16, DType::bf16, from_bf16);
    page.encode(staged_f32, DType::f32, from_f32);
    EXPECT_EQ(testing::first_difference(from_bf16, from_f32), -1) << to_string(id);

    // Decoding to bf16 equals decoding to f32 then rounding each value to bf16.
    std::vector<std::byte> out_bf16(page.staged_bytes(DType::bf16));
    std::vector<std::byte> out_f32(page.staged_bytes(DType::f32));
    page.decode(from_bf16, DType::bf16, out_bf16);
    page.decode(from_bf16, DType::f32, out_f32);
    const auto decoded =
        testing::bytes_to_floats(std::span<const std::byte>(out_f32).first(values * 4));
    for (std::size_t i = 0; i < values; ++i) {
      std::uint16_t b = 0;
      std::memcpy(&b, out_bf16.data() + 2 * i, 2);
      ASSERT_EQ(b, float_to_bf16_bits(decoded[i])) << to_string(id) << " i " << i;
    }
    EXPECT_EQ(std::memcmp(out_bf16.data() + 2 * values, staged_bf16.data() + 2 * values,
                          page.conv_bytes()),
              0);
    if (id == CodecId::bf16 || id == CodecId::fp32) {
      EXPECT_EQ(out_bf16, staged_bf16) << "lossless for bf16 input";
    }
  }
}

TEST(Page, MisalignedStagingGivesTheSameBytes) {
  const StateLayout layout = small_layout(CodecId::int6);
  const PageCodec page(layout);
  const auto staged = testing::synthetic_staged_state(layout, 20, 5, DType::f32);
  std::vector<std::byte> shifted(staged.size() + 1);
  std::memcpy(shifted.data() + 1, staged.data(), staged.size());
  const auto misaligned = std::span<std::byte>(shifted).subspan(1);

  std::vector<std::byte> a(page.page_bytes());
  std::vector<std::byte> b(page.page_bytes());
  page.encode(staged, DType::f32, a);
  page.encode(misaligned, DType::f32, b);
  EXPECT_EQ(a, b);

  std::vector<std::byte> out(page.staged_bytes(DType::f32));
  page.decode(a, DType::f32, out);
  std::fill(misaligned.begin(), misaligned.end(), std::byte{0});
  page.decode(a, DType::f32, misaligned);
  EXPECT_EQ(std::memcmp(out.data(), misaligned.data(), out.size()), 0);
}

struct NonFiniteCase {
  DType dtype;
  std::uint32_t bits;  // f32 bits or bf16 bits
  const char* text;
};

TEST(Page, NonFiniteIsRejectedBeforeAnythingIsWritten) {
  const NonFiniteCase cases[] = {
      {DType::f32, 0x7FC00000u, "nan"},  {DType::f32, 0x7F800000u, "inf"},
      {DType::f32, 0xFF800000u, "-inf"}, {DType::f32, 0xFFC00001u, "nan"},
      {DType::bf16, 0x7FC0u, "nan"},     {DType::bf16, 0x7F80u, "inf"},
      {DType::bf16, 0xFF80u, "-inf"},
  };
  for (const CodecId id : kCodecs) {
    const StateLayout layout = small_layout(id);
    const PageCodec page(layout);
    for (const auto& c : cases) {
      auto staged = testing::synthetic_staged_state(layout, 10, 1, c.dtype);
      // layer 1, head 2, row 3, col 4 (and a later bad value that must not be reported)
      const std::size_t index = ((1 * 4 + 2) * 16 + 3) * 24 + 4;
      const std::size_t later = ((2 * 4 + 1) * 16 + 0) * 24 + 0;
      const std::size_t width = dtype_bytes(c.dtype);
      std::memcpy(staged.data() + index * width, &c.bits, width);
      std::memcpy(staged.data() + later * width, &c.bits, width);

      std::vector<std::byte> bytes(page.page_bytes());
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] = static_cast<std::byte>(i * 31 + 7);
      }
      const std::vector<std::byte> before = bytes;
      try {
        page.encode(staged, c.dtype, bytes);
        ADD_FAILURE() << "accepted " << c.text << " for " << to_string(id);
      } catch (const NonFiniteError& e) {
        EXPECT_EQ(e.layer(), 1u);
        EXPECT_EQ(e.head(), 2u);
        EXPECT_EQ(e.index(), 3u * 24 + 4);
        EXPECT_EQ(std::string(e.what()),
                  std::string("non-finite value ") + c.text + " at layer 1 head 2 row 3 col 4");
      }
      EXPECT_EQ(bytes, before) << "page changed after a rejected encode";
    }
  }
}

TEST(Page, NonFiniteErrorIsAnInvalidArgument) {
  const NonFiniteError e(3, 7, 12 * 128 + 40, std::numeric_limits<float>::quiet_NaN(), 128);
  EXPECT_STREQ(e.what(), "non-finite value nan at layer 3 head 7 row 12 col 40");
  const NonFiniteError plain(3, 7, 1576, -std::numeric_limits<float>::infinity());
  EXPECT_STREQ(plain.what(), "non-finite value -inf at layer 3 head 7 index 1576");
  EXPECT_THROW(throw e, std::invalid_argument);
}

TEST(Page, ConvStateIsOpaqueBytes) {
  // The conv state is stored raw: even NaN bit patterns there pass through unchanged.
  const StateLayout layout = small_layout(CodecId::int4);
  const PageCodec page(layout);
  auto staged = testing::synthetic_staged_state(layout, 10, 2, DType::f32);
  const std::uint16_t nan = 0x7FC1;
  std::memcpy(staged.data() + staged.size() - 2, &nan, 2);
  std::vector<std::byte> bytes(page.page_bytes());
  page.encode(staged, DType::f32, bytes);
  EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - 2, &nan, 2), 0);
}

TEST(Page, RejectsF16StagingAndWrongSizes) {
  const StateLayout layout = small_layout(CodecId::int8);
  const PageCodec page(layout);
  const auto staged = testing::synthetic_staged_state(layout, 5, 4, DType::f32);
  std::vector<std::byte> bytes(page.page_bytes(), std::byte{0x11});
  const std::vector<std::byte> before = bytes;

  std::vector<std::byte> f16_staged(page.staged_bytes(DType::f16));
  EXPECT_THROW(page.encode(f16_staged, DType::f16, bytes), std::invalid_argument);
  EXPECT_THROW(page.decode(bytes, DType::f16, f16_staged), std::invalid_argument);
  EXPECT_THROW(
      page.encode(std::span<const std::byte>(staged).first(staged.size() - 1), DType::f32, bytes),
      std::invalid_argument);
  EXPECT_THROW(page.encode(staged, DType::bf16, bytes), std::invalid_argument);
  std::vector<std::byte> long_page(page.page_bytes() + 1);
  EXPECT_THROW(page.encode(staged, DType::f32, long_page), std::invalid_argument);
  EXPECT_EQ(bytes, before);

  std::vector<std::byte> out(page.staged_bytes(DType::f32));
  EXPECT_THROW(
      page.decode(std::span<const std::byte>(bytes).first(bytes.size() - 4), DType::f32, out),
      std::invalid_argument);
  EXPECT_THROW(page.decode(bytes, DType::bf16, out), std::invalid_argument);
  try {
    page.encode(std::span<const std::byte>(staged).first(100), DType::f32, bytes);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "staged state must be " +
                                         std::to_string(page.staged_bytes(DType::f32)) +
                                         " bytes for this layout, got 100");
  }
}

TEST(Page, InvalidLayoutThrows) {
  StateLayout layout = small_layout(CodecId::int6, 10);
  try {
    const PageCodec page(layout);
    ADD_FAILURE() << "accepted group_size 10";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("codec.group_size"), std::string::npos);
  }
}

TEST(Page, NoConvState) {
  StateLayout layout = small_layout(CodecId::int6);
  layout.conv_channels = 0;
  layout.conv_width = 0;
  const PageCodec page(layout);
  EXPECT_EQ(page.conv_bytes(), 0u);
  EXPECT_EQ(page.page_bytes(), page.conv_offset());
  const auto staged = testing::synthetic_staged_state(layout, 5, 4, DType::f32);
  EXPECT_EQ(staged.size(), page.staged_bytes(DType::f32));
  std::vector<std::byte> bytes(page.page_bytes());
  page.encode(staged, DType::f32, bytes);
  std::vector<std::byte> out(staged.size());
  page.decode(bytes, DType::f32, out);
}

}  // namespace
}  // namespace statepool::kernels
