// Layout validation, names and identity (layout.hpp), and codec construction errors.

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/format.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/testing/codec_fixtures.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::kernels {
namespace {

using testing::qwen3_next_layout;

TEST(Layout, QwenNextIsValid) {
  for (const CodecId id :
       {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4, CodecId::int6, CodecId::int8}) {
    EXPECT_EQ(validate(qwen3_next_layout(id)), "") << to_string(id);
  }
}

struct BadField {
  const char* what;
  void (*mutate)(StateLayout&);
  const char* message;
};

TEST(Layout, MessagesNameTheFieldAndTheValue) {
  const BadField cases[] = {
      {"layers 0", [](StateLayout& l) { l.num_layers = 0; },
       "num_layers must be between 1 and 1024, got 0"},
      {"layers big", [](StateLayout& l) { l.num_layers = 1025; },
       "num_layers must be between 1 and 1024, got 1025"},
      {"heads 0", [](StateLayout& l) { l.num_heads = 0; },
       "num_heads must be between 1 and 1024, got 0"},
      {"key_dim 0", [](StateLayout& l) { l.key_dim = 0; },
       "key_dim must be between 1 and 4096, got 0"},
      {"value_dim big", [](StateLayout& l) { l.value_dim = 5000; },
       "value_dim must be between 1 and 4096, got 5000"},
      {"conv_channels big", [](StateLayout& l) { l.conv_channels = (1u << 20) + 1; },
       "conv_channels must be between 0 and 1048576, got 1048577"},
      {"conv_width big", [](StateLayout& l) { l.conv_width = 65; },
       "conv_width must be between 0 and 64, got 65"},
      {"conv half set", [](StateLayout& l) { l.conv_width = 0; },
       "conv_channels and conv_width must both be 0 (no conv state) or both be non-zero, "
       "got conv_channels 8192 and conv_width 0"},
      {"arch", [](StateLayout& l) { l.arch = static_cast<Arch>(7); },
       "arch must be gdn or kda, got 7"},
      {"conv_dtype", [](StateLayout& l) { l.conv_dtype = static_cast<DType>(9); },
       "conv_dtype must be f32, bf16 or f16, got 9"},
      {"codec", [](StateLayout& l) { l.codec.id = static_cast<CodecId>(42); },
       "codec must be one of fp32, bf16, fp16, int4, int6, int8, stepquant4, stepquant6, dsq4, "
       "dsq6, got 42"},
      {"variant", [](StateLayout& l) { l.codec.variant = static_cast<StepQuantVariant>(4); },
       "codec.variant must be full, spatial_only, temporal_only or no_refit, got 4"},
      {"group", [](StateLayout& l) { l.codec.group_size = 6; },
       "codec.group_size must be 0 (default 128) or a multiple of 4 between 4 and 65536, got 6"},
      {"page size",
       [](StateLayout& l) {
         l.num_layers = 1024;
         l.num_heads = 1024;
         l.codec.id = CodecId::fp32;
       },
       "page size must be at most 4294967296 bytes, got 68769808384 bytes"},
  };
  for (const auto& c : cases) {
    StateLayout layout = qwen3_next_layout(CodecId::int6);
    c.mutate(layout);
    EXPECT_EQ(validate(layout), c.message) << c.what;
    try {
      (void)make_codec(layout);
      ADD_FAILURE() << "make_codec accepted " << c.what;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), std::string("invalid layout: ") + c.message);
    }
  }
}

TEST(Layout, NoConvStateIsValid) {
  StateLayout layout = qwen3_next_layout(CodecId::int4);
  layout.conv_channels = 0;
  layout.conv_width = 0;
  EXPECT_EQ(validate(layout), "");
}

TEST(Layout, GroupSizeValidation) {
  for (const std::uint32_t bad : {1u, 2u, 3u, 6u, 130u, 65540u, 131072u, 0xFFFFFFFFu}) {
    for (const CodecId id : {CodecId::int4, CodecId::int6, CodecId::int8}) {
      StateLayout layout = testing::head_layout(id, bad, 16, 16);
      const std::string problem = validate(layout);
      EXPECT_NE(problem.find("codec.group_size"), std::string::npos) << bad;
      EXPECT_NE(problem.find("got " + std::to_string(bad)), std::string::npos) << bad;
      EXPECT_THROW((void)make_codec(layout), std::invalid_argument) << bad;
    }
  }
  for (const std::uint32_t good : {0u, 4u, 8u, 12u, 128u, 1000u, 65536u}) {
    StateLayout layout = testing::head_layout(CodecId::int6, good, 16, 16);
    EXPECT_EQ(validate(layout), "") << good;
    EXPECT_NO_THROW((void)make_codec(layout)) << good;
  }
  // The float codecs ignore group_size.
  EXPECT_EQ(validate(testing::head_layout(CodecId::bf16, 6, 16, 16)), "");
}

TEST(Layout, NamesAndParsing) {
  EXPECT_STREQ(to_string(CodecId::int6), "int6");
  EXPECT_STREQ(to_string(CodecId::stepquant4), "stepquant4");
  EXPECT_STREQ(to_string(CodecId::stepquant6), "stepquant6");
  EXPECT_STREQ(to_string(CodecId::dsq4), "dsq4");
  EXPECT_STREQ(to_string(CodecId::dsq6), "dsq6");
  EXPECT_STREQ(to_string(DType::bf16), "bf16");
  EXPECT_STREQ(to_string(Arch::kda), "kda");
  EXPECT_STREQ(to_string(static_cast<CodecId>(99)), "unknown");
  EXPECT_STREQ(to_string(static_cast<DType>(99)), "unknown");
  EXPECT_STREQ(to_string(static_cast<Arch>(99)), "unknown");
  for (const CodecId id :
       {CodecId::fp32, CodecId::bf16, CodecId::fp16, CodecId::int4, CodecId::int6, CodecId::int8,
        CodecId::stepquant4, CodecId::stepquant6, CodecId::dsq4, CodecId::dsq6}) {
    CodecId parsed = CodecId::fp32;
    EXPECT_TRUE(parse_codec(to_string(id), parsed));
    EXPECT_EQ(parsed, id);
  }
  CodecId untouched = CodecId::int8;
  EXPECT_FALSE(parse_codec("int5", untouched));
  EXPECT_FALSE(parse_codec("INT6", untouched));
  EXPECT_FALSE(parse_codec("", untouched));
  EXPECT_EQ(untouched, CodecId::int8);
  EXPECT_EQ(dtype_bytes(DType::f32), 4u);
  EXPECT_EQ(dtype_bytes(DType::bf16), 2u);
  EXPECT_EQ(dtype_bytes(DType::f16), 2u);
}

TEST(Layout, SameShapeAndCodec) {
  const StateLayout a = qwen3_next_layout(CodecId::int6);
  StateLayout b = a;
  b.name = "another name";
  EXPECT_TRUE(a.same_shape_and_codec(b));
  b.codec.group_size = 128;  // the default, spelled out
  EXPECT_TRUE(a.same_shape_and_codec(b));
  b.codec.group_size = 64;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  b = a;
  b.key_dim = 64;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  b = a;
  b.conv_dtype = DType::f32;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  b = a;
  b.codec.id = CodecId::int4;
  EXPECT_FALSE(a.same_shape_and_codec(b));
  // group_size has no effect on float-codec pages, so it is not part of their identity.
  StateLayout f1 = qwen3_next_layout(CodecId::bf16);
  StateLayout f2 = f1;
  f2.codec.group_size = 64;
  EXPECT_TRUE(f1.same_shape_and_codec(f2));
}

TEST(Layout, HeadBytesFormula) {
  EXPECT_EQ(head_bytes_for({CodecId::int6, 0}, 128, 128), 12544u);  // 256 + 12288
  EXPECT_EQ(head_bytes_for({CodecId::int4, 0}, 128, 128), 8448u);   // 256 + 8192
  EXPECT_EQ(head_bytes_for({CodecId::int8, 0}, 128, 128), 16640u);  // 256 + 16384
  EXPECT_EQ(head_bytes_for({CodecId::fp32, 0}, 128, 128), 65536u);
  EXPECT_EQ(head_bytes_for({CodecId::bf16, 0}, 128, 128), 32768u);
  EXPECT_EQ(head_bytes_for({CodecId::fp16, 0}, 128, 128), 32768u);
  // n = 9, G = 4: 3 scales (6 B) + codes + padding to 4.
  EXPECT_EQ(head_bytes_for({CodecId::int6, 4}, 3, 3), 16u);  // 6 + 3 * 3 = 15 -> 16
  EXPECT_EQ(head_bytes_for({CodecId::int4, 4}, 3, 3), 12u);  // 6 + 5 = 11 -> 12
  EXPECT_EQ(head_bytes_for({CodecId::int8, 4}, 3, 3), 16u);  // 6 + 9 = 15 -> 16
  EXPECT_EQ(head_bytes_for({CodecId::bf16, 0}, 3, 3), 20u);  // 18 -> 20
  EXPECT_EQ(head_bytes_for({CodecId::int6, 6}, 3, 3), 0u);   // invalid group
  // dsq: 2K + 2V fp16 scales, then the codes.
  EXPECT_EQ(head_bytes_for({CodecId::dsq6, 0}, 128, 128), 12800u);  // 256 + 256 + 12288
  EXPECT_EQ(head_bytes_for({CodecId::dsq4, 0}, 128, 128), 8704u);   // 256 + 256 + 8192
  EXPECT_EQ(head_bytes_for({CodecId::dsq6, 0}, 3, 3), 24u);         // 6 + 6 + 9 = 21 -> 24
  // stepquant sizes come from the plan.
  EXPECT_EQ(head_bytes_for({CodecId::stepquant6, 0}, 128, 128), 0u);
}

TEST(Layout, DsqNeedsNoPlanAndTakesNone) {
  StateLayout layout = qwen3_next_layout(CodecId::dsq6);
  EXPECT_EQ(validate(layout), "");
  layout.codec.id = CodecId::dsq4;
  EXPECT_EQ(validate(layout), "");
  // group_size and variant do not apply to dsq: ignored, and not part of identity.
  StateLayout other = layout;
  other.codec.group_size = 6;
  other.codec.variant = StepQuantVariant::temporal_only;
  EXPECT_EQ(validate(other), "");
  EXPECT_TRUE(layout.same_shape_and_codec(other));
}

TEST(Layout, DigestNamesThePageFormatAndNothingElse) {
  const StateLayout base = qwen3_next_layout(CodecId::int6);
  const std::string digest = layout_digest(base);
  ASSERT_EQ(digest.size(), 16u);
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos) << digest;
  // The name is not identity, a defaulted parameter equals its default, and parameters
  // that do not apply to the codec are ignored: as same_shape_and_codec.
  StateLayout same = base;
  same.name = "another name";
  same.codec.group_size = kDefaultGroupSize;
  same.codec.variant = StepQuantVariant::spatial_only;
  EXPECT_TRUE(base.same_shape_and_codec(same));
  EXPECT_EQ(layout_digest(same), digest);
  // Every field of identity changes it.
  std::vector<StateLayout> others(9, base);
  others[0].arch = Arch::kda;
  others[1].num_layers += 1;
  others[2].num_heads += 1;
  others[3].key_dim += 1;
  others[4].value_dim += 1;
  others[5].conv_channels += 1;
  others[6].conv_dtype = DType::f32;
  others[7].codec.id = CodecId::int8;
  others[8].codec.group_size = 64;
  std::set<std::string> seen{digest};
  for (const StateLayout& other : others) {
    EXPECT_FALSE(base.same_shape_and_codec(other));
    EXPECT_TRUE(seen.insert(layout_digest(other)).second) << layout_digest(other);
  }
  // Stable across builds and machines: a remote tier keys pages by it.
  EXPECT_EQ(layout_digest(base), "b87543779cfdf95e");
  // A stepquant layout is its plan too.
  StateLayout a;
  a.num_layers = 1;
  a.num_heads = 2;
  a.key_dim = 4;
  a.value_dim = 4;
  a.codec.id = CodecId::stepquant6;
  StateLayout b = a;
  a.plan = std::make_shared<stepquant::Plan>(testing::uniform_plan(Arch::gdn, 1, 2, 4, 4, 6));
  b.plan = std::make_shared<stepquant::Plan>(testing::make_plan(
      Arch::gdn, 1, 2, 4, 4, 6, [](std::size_t unit) { return unit == 0 ? 16 : 6; }));
  EXPECT_NE(layout_digest(a), layout_digest(b));
  StateLayout a2 = a;
  a2.plan = std::make_shared<stepquant::Plan>(*a.plan);  // another object, the same plan
  EXPECT_EQ(layout_digest(a2), layout_digest(a));
}

}  // namespace
}  // namespace statepool::kernels
