// Whole-page numbers worked out by hand (the Qwen3-Next page of every float and int
// codec), NonFiniteError's messages, and layouts refused by PageCodec. The contract every
// codec's pages keep (sizes and offsets, byte layout, conv state, staging dtypes,
// non-finite rejection, buffer checks) is test_codec_conformance.cpp.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "statepool/kernels/page.hpp"
#include "statepool/testing/codec_fixtures.hpp"

namespace statepool::kernels {
namespace {

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

TEST(Page, NonFiniteErrorIsAnInvalidArgument) {
  const NonFiniteError e(3, 7, 12 * 128 + 40, std::numeric_limits<float>::quiet_NaN(), 128);
  EXPECT_STREQ(e.what(), "non-finite value nan at layer 3 head 7 row 12 col 40");
  const NonFiniteError plain(3, 7, 1576, -std::numeric_limits<float>::infinity());
  EXPECT_STREQ(plain.what(), "non-finite value -inf at layer 3 head 7 index 1576");
  EXPECT_THROW(throw e, std::invalid_argument);
}

TEST(Page, InvalidLayoutThrows) {
  const StateLayout layout = testing::head_layout(CodecId::int6, 10, 16, 24);
  try {
    const PageCodec page(layout);
    ADD_FAILURE() << "accepted group_size 10";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("codec.group_size"), std::string::npos);
  }
}

}  // namespace
}  // namespace statepool::kernels
