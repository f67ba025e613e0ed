// The hand-over image (service/handover/image.hpp): a PoolState with every kind of entry
// round-trips field for field; and an image is input, so every corruption is refused with
// an ImageError that names what is wrong: each header field, every truncation, every
// single-byte flip (the checksums), and payloads with correct checksums whose FlatBuffer
// or fields are wrong (built here with the generated builder), which only the verifier or
// the field checks can catch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "handover/image.hpp"
#include "image_generated.h"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::service::handover {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace wire = ::statepool::handover::wire;
namespace sq = kernels::stepquant;

// --- a state with every kind of entry ---------------------------------------------------

kernels::StateLayout gdn_layout(kernels::CodecId codec, std::string name) {
  kernels::StateLayout layout;
  layout.name = std::move(name);
  layout.arch = kernels::Arch::gdn;
  layout.num_layers = 2;
  layout.num_heads = 2;
  layout.key_dim = 16;
  layout.value_dim = 16;
  layout.codec.id = codec;
  return layout;
}

std::shared_ptr<const sq::Plan> nominal6() {
  return std::make_shared<const sq::Plan>(
      sq::nominal_plan(gdn_layout(kernels::CodecId::stepquant6, ""), 6));
}

// A KDA plan with varied widths, impact and provenance (fields the nominal plan leaves at
// their defaults).
std::shared_ptr<const sq::Plan> varied4() {
  auto plan = testing::make_plan(
      kernels::Arch::kda, 1, 2, 8, 8, 4,
      [](std::size_t u) -> std::uint8_t { return u % 3 ? 4 : 2; },
      [](std::size_t i) { return 0.5f + static_cast<float>(i) / 16.0f; });
  plan.gamma = 0.5f;
  plan.horizon = 512;
  plan.tokens = 4096;
  plan.source = "handover test";
  return std::make_shared<const sq::Plan>(std::move(plan));
}

PoolState sample_state() {
  PoolState state;
  const auto plan6 = nominal6();
  state.plans = {{plan6}, {varied4()}};

  PoolStateLayout fp32;
  fp32.id = 1;
  fp32.layout = gdn_layout(kernels::CodecId::fp32, "fp32 with conv");
  fp32.layout.conv_channels = 32;
  fp32.layout.conv_width = 3;
  fp32.layout.conv_dtype = kernels::DType::f16;
  PoolStateLayout int8;
  int8.id = 2;
  int8.layout = gdn_layout(kernels::CodecId::int8, "int8/64");
  int8.layout.num_layers = 3;
  int8.layout.codec.group_size = 64;
  PoolStateLayout step;
  step.id = 3;
  step.layout = gdn_layout(kernels::CodecId::stepquant6, "stepquant6 spatial");
  step.layout.codec.variant = kernels::StepQuantVariant::spatial_only;
  step.layout.plan = plan6;
  step.plan_digest = sq::digest(*plan6);
  state.layouts = {fp32, int8, step};

  PoolStateArena a1;
  a1.id = 1;
  a1.tenant = "alice";
  a1.layout = 2;
  a1.page_count = 5;
  a1.page_stride = 1024;
  a1.bytes = 8192;
  a1.handle = kernels::HandleKind::memfd;
  a1.owner = {0, 7, kSnapshotOwner, 7, kSnapshotOwner};
  a1.fd = 5;  // not encoded
  PoolStateArena a2;
  a2.id = 4;
  a2.tenant = "bob";
  a2.layout = 3;
  a2.page_count = 5;
  a2.page_stride = 768;
  a2.bytes = 2u << 20;
  a2.handle = kernels::HandleKind::cuda_vmm_fd;
  a2.owner = {8, kSnapshotOwner, kSnapshotOwner, 0, kSnapshotOwner};
  state.arenas = {a1, a2};

  PoolStateLease l7;
  l7.id = 7;
  l7.tenant = "alice";
  l7.token = "token-of-seven";
  l7.grace_left = 1500ms;
  l7.slots = {{1, 1}, {1, 3}};
  PoolStateLease l8;
  l8.id = 8;
  l8.tenant = "bob";
  l8.token = "token-of-eight";
  l8.grace_left = 30000ms;
  l8.slots = {{4, 0}};
  state.leases = {l7, l8};

  PoolStateSnapshot plain;
  plain.space = "alice-ns";
  plain.prefix = std::string("\0\xff raw hash", 11);
  plain.position = 128;
  plain.layout = 2;
  plain.tenant = "alice";
  plain.arena = 1;
  plain.slot = 2;
  plain.hits = 3;
  plain.age = 5000ms;
  plain.idle = 200ms;
  PoolStateSnapshot hybrid;
  hybrid.space = "bob-ns";
  hybrid.prefix = "0123456789abcdef";
  hybrid.position = 4096;
  hybrid.layout = 3;
  hybrid.tenant = "bob";
  hybrid.arena = 4;
  hybrid.slot = 1;
  hybrid.kv = kernels::KvBlocks{kernels::KvCodecId::kivi4, 3, 64, 32, 300};
  hybrid.kv_pages = {2, 4};
  hybrid.hits = 1;
  hybrid.age = 60000ms;
  hybrid.idle = 1000ms;
  hybrid.held_below = true;
  hybrid.pages_crc = 0xC0FFEE01u;  // the crash journal's; the other snapshot has none
  PoolStateSnapshot pinned;
  pinned.space = "alice-ns";
  pinned.prefix = "system prompt";
  pinned.position = 77;
  pinned.layout = 2;
  pinned.tenant = "alice";
  pinned.arena = 1;
  pinned.slot = 4;
  pinned.pinned = true;
  pinned.hits = 99;
  pinned.age = 1h;
  pinned.idle = 1ms;
  state.snapshots = {plain, hybrid, pinned};

  PoolStateTenant alice{{10, 11, 12, 13, 14, 15, 16, 17}, "alice", 2, 1};
  PoolStateTenant bob{{20, 21, 22, 23, 24, 25, 26, 27}, "bob", 1, 0};
  state.tenants = {alice, bob};
  state.next_arena = 5;
  state.next_lease = 9;
  state.pages_reclaimed_total = 12345;
  return state;
}

ImageMeta sample_meta() {
  return ImageMeta{4, "0.9.1+test", "cuda", 1};
}

void expect_same_plan(const std::shared_ptr<const sq::Plan>& a,
                      const std::shared_ptr<const sq::Plan>& b) {
  ASSERT_EQ(a == nullptr, b == nullptr);
  if (a != nullptr) {
    EXPECT_TRUE(*a == *b);
  }
}

void expect_same(const PoolState& a, const PoolState& b) {
  ASSERT_EQ(a.plans.size(), b.plans.size());
  for (std::size_t i = 0; i < a.plans.size(); ++i)
    expect_same_plan(a.plans[i].plan, b.plans[i].plan);
  ASSERT_EQ(a.layouts.size(), b.layouts.size());
  for (std::size_t i = 0; i < a.layouts.size(); ++i) {
    SCOPED_TRACE("layout " + std::to_string(i));
    const auto& x = a.layouts[i];
    const auto& y = b.layouts[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.plan_digest, y.plan_digest);
    EXPECT_EQ(x.layout.name, y.layout.name);
    EXPECT_EQ(x.layout.arch, y.layout.arch);
    EXPECT_EQ(x.layout.num_layers, y.layout.num_layers);
    EXPECT_EQ(x.layout.num_heads, y.layout.num_heads);
    EXPECT_EQ(x.layout.key_dim, y.layout.key_dim);
    EXPECT_EQ(x.layout.value_dim, y.layout.value_dim);
    EXPECT_EQ(x.layout.conv_channels, y.layout.conv_channels);
    EXPECT_EQ(x.layout.conv_width, y.layout.conv_width);
    EXPECT_EQ(x.layout.conv_dtype, y.layout.conv_dtype);
    EXPECT_EQ(x.layout.codec.id, y.layout.codec.id);
    EXPECT_EQ(x.layout.codec.group_size, y.layout.codec.group_size);
    EXPECT_EQ(x.layout.codec.variant, y.layout.codec.variant);
    expect_same_plan(x.layout.plan, y.layout.plan);
    EXPECT_TRUE(x.layout.same_shape_and_codec(y.layout));
  }
  ASSERT_EQ(a.arenas.size(), b.arenas.size());
  for (std::size_t i = 0; i < a.arenas.size(); ++i) {
    SCOPED_TRACE("arena " + std::to_string(i));
    const auto& x = a.arenas[i];
    const auto& y = b.arenas[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.tenant, y.tenant);
    EXPECT_EQ(x.layout, y.layout);
    EXPECT_EQ(x.page_count, y.page_count);
    EXPECT_EQ(x.page_stride, y.page_stride);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.handle, y.handle);
    EXPECT_EQ(x.owner, y.owner);
  }
  ASSERT_EQ(a.leases.size(), b.leases.size());
  for (std::size_t i = 0; i < a.leases.size(); ++i) {
    SCOPED_TRACE("lease " + std::to_string(i));
    EXPECT_EQ(a.leases[i].id, b.leases[i].id);
    EXPECT_EQ(a.leases[i].tenant, b.leases[i].tenant);
    EXPECT_EQ(a.leases[i].token, b.leases[i].token);
    EXPECT_EQ(a.leases[i].grace_left, b.leases[i].grace_left);
    EXPECT_EQ(a.leases[i].slots, b.leases[i].slots);
  }
  ASSERT_EQ(a.snapshots.size(), b.snapshots.size());
  for (std::size_t i = 0; i < a.snapshots.size(); ++i) {
    SCOPED_TRACE("snapshot " + std::to_string(i));
    const auto& x = a.snapshots[i];
    const auto& y = b.snapshots[i];
    EXPECT_EQ(x.space, y.space);
    EXPECT_EQ(x.prefix, y.prefix);
    EXPECT_EQ(x.position, y.position);
    EXPECT_EQ(x.layout, y.layout);
    EXPECT_EQ(x.tenant, y.tenant);
    EXPECT_EQ(x.arena, y.arena);
    EXPECT_EQ(x.slot, y.slot);
    EXPECT_EQ(x.kv, y.kv);
    EXPECT_EQ(x.kv_pages, y.kv_pages);
    EXPECT_EQ(x.pinned, y.pinned);
    EXPECT_EQ(x.hits, y.hits);
    EXPECT_EQ(x.age, y.age);
    EXPECT_EQ(x.idle, y.idle);
    EXPECT_EQ(x.held_below, y.held_below);
    EXPECT_EQ(x.pages_crc, y.pages_crc);
  }
  ASSERT_EQ(a.tenants.size(), b.tenants.size());
  for (std::size_t i = 0; i < a.tenants.size(); ++i) {
    SCOPED_TRACE("tenant " + std::to_string(i));
    const auto& x = a.tenants[i];
    const auto& y = b.tenants[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.layouts_added, y.layouts_added);
    EXPECT_EQ(x.plans_added, y.plans_added);
    EXPECT_EQ(x.hits, y.hits);
    EXPECT_EQ(x.misses, y.misses);
    EXPECT_EQ(x.puts_created, y.puts_created);
    EXPECT_EQ(x.puts_existing, y.puts_existing);
    EXPECT_EQ(x.evictions, y.evictions);
    EXPECT_EQ(x.demotions, y.demotions);
    EXPECT_EQ(x.hits_host, y.hits_host);
    EXPECT_EQ(x.hits_remote, y.hits_remote);
  }
  EXPECT_EQ(a.next_arena, b.next_arena);
  EXPECT_EQ(a.next_lease, b.next_lease);
  EXPECT_EQ(a.pages_reclaimed_total, b.pages_reclaimed_total);
}

void expect_same(const ImageMeta& a, const ImageMeta& b) {
  EXPECT_EQ(a.generation, b.generation);
  EXPECT_EQ(a.daemon_version, b.daemon_version);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.device, b.device);
}

// The ImageError decode_image throws for `image`; fails the test if it returns.
std::string refusal(std::span<const std::byte> image) {
  try {
    (void)decode_image(image);
  } catch (const ImageError& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_THAT(e.what(), StartsWith("hand-over image: "));
    return e.what();
  }
  ADD_FAILURE() << "decode_image accepted the image";
  return {};
}

template <class T>
void poke(std::vector<std::byte>& image, std::size_t offset, T value) {
  std::memcpy(image.data() + offset, &value, sizeof value);
}
// The header checksum recomputed after the header was edited.
void reseal(std::vector<std::byte>& image) {
  poke(image, kImageHeaderCrcOffset, image_crc32c(std::span(image).first(kImageHeaderCrcOffset)));
}

std::span<const std::byte> payload_of(const std::vector<std::byte>& image) {
  return std::span(image).subspan(kImageHeaderBytes);
}

// --- round trip ---------------------------------------------------------------------------

TEST(HandoverImage, RoundTripKeepsEveryField) {
  const PoolState state = sample_state();
  const auto image = encode_image(state, sample_meta());
  const DecodedImage decoded = decode_image(image);
  expect_same(state, decoded.state);
  expect_same(sample_meta(), decoded.meta);
  for (const auto& arena : decoded.state.arenas) {
    EXPECT_EQ(arena.fd, -1);  // descriptors travel beside the image
    EXPECT_EQ(arena.memory, nullptr);
  }
  // A layout's plan is the decoded plan with its digest, shared with the plan table.
  EXPECT_EQ(decoded.state.layouts[2].layout.plan, decoded.state.plans[0].plan);
  EXPECT_EQ(decoded.state.layouts[0].layout.plan, nullptr);
  // Encoding is deterministic: the decoded state encodes to the same bytes.
  EXPECT_EQ(encode_image(decoded.state, decoded.meta), image);
}

TEST(HandoverImage, EmptyStateRoundTrips) {
  const auto decoded = decode_image(encode_image(PoolState{}, ImageMeta{}));
  expect_same(PoolState{}, decoded.state);
  expect_same(ImageMeta{}, decoded.meta);
}

TEST(HandoverImage, HeaderIsAsDocumented) {
  const auto image = encode_image(sample_state(), sample_meta());
  ASSERT_GT(image.size(), kImageHeaderBytes);
  EXPECT_EQ(std::memcmp(image.data(), "SPHOVER\0", 8), 0);
  std::uint32_t version = 0;
  std::uint32_t flags = 1;
  std::uint64_t length = 0;
  std::uint32_t payload_crc = 0;
  std::uint32_t header_crc = 0;
  std::memcpy(&version, image.data() + kImageVersionOffset, 4);
  std::memcpy(&flags, image.data() + kImageFlagsOffset, 4);
  std::memcpy(&length, image.data() + kImageLengthOffset, 8);
  std::memcpy(&payload_crc, image.data() + kImagePayloadCrcOffset, 4);
  std::memcpy(&header_crc, image.data() + kImageHeaderCrcOffset, 4);
  EXPECT_EQ(version, kImageVersion);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(length, image.size() - kImageHeaderBytes);
  EXPECT_EQ(payload_crc, image_crc32c(payload_of(image)));
  EXPECT_EQ(header_crc, image_crc32c(std::span(image).first(28)));
  // CRC-32C's check value (the CRC of "123456789").
  const char* check = "123456789";
  EXPECT_EQ(image_crc32c(std::as_bytes(std::span(check, 9))), 0xE3069283u);
  // wrap_payload of the payload is the image.
  EXPECT_EQ(wrap_payload(payload_of(image)), image);
}

TEST(HandoverImage, MisalignedInputDecodes) {
  const PoolState state = sample_state();
  const auto image = encode_image(state, sample_meta());
  for (std::size_t shift = 1; shift < 8; ++shift) {
    std::vector<std::byte> buffer(image.size() + shift);
    std::memcpy(buffer.data() + shift, image.data(), image.size());
    expect_same(state, decode_image(std::span(buffer).subspan(shift)).state);
  }
}

// The image of a pool of a million pages fits the limits (verifier depth and tables,
// payload size): owners of 1M slots, half of them leased, a tenth snapshots.
TEST(HandoverImage, MillionPagePoolFitsTheLimits) {
  constexpr std::uint32_t kPages = 1'000'000;
  PoolState state;
  PoolStateLayout layout;
  layout.id = 1;
  layout.layout = gdn_layout(kernels::CodecId::int8, "big");
  state.layouts = {layout};
  PoolStateArena arena;
  arena.id = 1;
  arena.tenant = "t";
  arena.layout = 1;
  arena.page_count = kPages;
  arena.page_stride = 256;
  arena.bytes = std::size_t{kPages} * 256;
  arena.owner.assign(kPages, 0);
  for (std::uint32_t lease = 0; lease < 1000; ++lease) {
    PoolStateLease l;
    l.id = lease + 1;
    l.tenant = "t";
    l.token = "token " + std::to_string(lease);
    for (std::uint32_t s = 0; s < 500; ++s) {
      const std::uint32_t slot = lease * 500 + s;
      l.slots.emplace_back(1, slot);
      arena.owner[slot] = l.id;
    }
    state.leases.push_back(std::move(l));
  }
  for (std::uint32_t i = 0; i < kPages / 10; ++i) {
    PoolStateSnapshot s;
    s.space = "ns";
    s.prefix = "prefix " + std::to_string(i);
    s.layout = 1;
    s.tenant = "t";
    s.arena = 1;
    s.slot = kPages / 2 + i;
    arena.owner[s.slot] = kSnapshotOwner;
    state.snapshots.push_back(std::move(s));
  }
  state.arenas = {std::move(arena)};
  const auto image = encode_image(state, sample_meta());
  const auto decoded = decode_image(image);
  ASSERT_EQ(decoded.state.arenas.size(), 1u);
  EXPECT_EQ(decoded.state.arenas[0].owner, state.arenas[0].owner);
  EXPECT_EQ(decoded.state.leases.size(), 1000u);
  EXPECT_EQ(decoded.state.snapshots.size(), kPages / 10);
  EXPECT_EQ(decoded.state.snapshots.back().prefix, state.snapshots.back().prefix);
}

TEST(HandoverImage, EncodeRefusesANullOrInvalidPlan) {
  PoolState state;
  state.plans = {{nominal6()}, {nullptr}};
  EXPECT_THROW(
      {
        try {
          (void)encode_image(state, {});
        } catch (const ImageError& e) {
          EXPECT_THAT(e.what(), HasSubstr("hand-over image: plan 1 is null"));
          throw;
        }
      },
      ImageError);
  auto bad = *nominal6();
  bad.widths.pop_back();
  state.plans = {{std::make_shared<const sq::Plan>(bad)}};
  EXPECT_THROW(
      {
        try {
          (void)encode_image(state, {});
        } catch (const ImageError& e) {
          EXPECT_THAT(e.what(), HasSubstr("hand-over image: plan 0: "));
          throw;
        }
      },
      ImageError);
}

// --- the header ---------------------------------------------------------------------------

TEST(HandoverImageHeader, BadMagicIsRefused) {
  auto image = encode_image(sample_state(), sample_meta());
  image[3] ^= std::byte{0x20};
  EXPECT_THAT(refusal(image), HasSubstr("hand-over image: bad magic"));
}

TEST(HandoverImageHeader, AnyOtherVersionIsRefusedNamingBoth) {
  const auto image = encode_image(sample_state(), sample_meta());
  for (const std::uint32_t version : {0u, 2u, 3u, 0xFFFFFFFFu}) {
    auto edited = image;
    poke(edited, kImageVersionOffset, version);
    reseal(edited);
    EXPECT_THAT(refusal(edited), HasSubstr("version " + std::to_string(version) +
                                           ", this statepoold reads version 1 only"));
    // The version is read before the header checksum: another version's header may
    // differ, and a version flipped in transit is still named.
    auto unsealed = image;
    poke(unsealed, kImageVersionOffset, version);
    EXPECT_THAT(refusal(unsealed), HasSubstr("version " + std::to_string(version) + ","));
  }
}

TEST(HandoverImageHeader, VersionTwoHeaderIsRefused) {
  const auto image = encode_image(sample_state(), sample_meta());
  const auto v2 = wrap_payload(payload_of(image), 2);
  EXPECT_THAT(refusal(v2),
              HasSubstr("hand-over image: version 2, this statepoold reads version 1 only"));
}

TEST(HandoverImageHeader, HeaderChecksumCoversEveryHeaderByte) {
  const auto image = encode_image(sample_state(), sample_meta());
  // Flags, length, payload checksum and the header checksum itself.
  for (std::size_t offset = kImageFlagsOffset; offset < kImageHeaderBytes; ++offset) {
    auto edited = image;
    edited[offset] ^= std::byte{0x01};
    EXPECT_THAT(refusal(edited), HasSubstr("hand-over image: header checksum mismatch"))
        << "offset " << offset;
  }
}

TEST(HandoverImageHeader, UnknownFlagsAreRefused) {
  auto image = encode_image(sample_state(), sample_meta());
  poke(image, kImageFlagsOffset, std::uint32_t{4});
  reseal(image);
  EXPECT_THAT(refusal(image), HasSubstr("hand-over image: unknown flags 0x4"));
}

TEST(HandoverImageHeader, LengthMustBeWhatArrived) {
  const auto image = encode_image(sample_state(), sample_meta());
  const std::uint64_t n = image.size() - kImageHeaderBytes;
  for (const std::uint64_t length : {n - 1, n + 1, std::uint64_t{0}}) {
    auto edited = image;
    poke(edited, kImageLengthOffset, length);
    reseal(edited);
    EXPECT_THAT(refusal(edited),
                HasSubstr("hand-over image: payload length " + std::to_string(length) + " but " +
                          std::to_string(n) + " bytes received"));
  }
  auto huge = image;
  poke(huge, kImageLengthOffset, std::uint64_t{1} << 40);
  reseal(huge);
  EXPECT_THAT(refusal(huge), HasSubstr("payload length 1099511627776 exceeds the limit of "
                                       "1073741824"));
  // Bytes after the payload are refused too.
  auto longer = image;
  longer.push_back(std::byte{0});
  EXPECT_THAT(refusal(longer), HasSubstr("payload length " + std::to_string(n) + " but " +
                                         std::to_string(n + 1) + " bytes received"));
}

TEST(HandoverImageHeader, PayloadChecksumMismatchIsRefused) {
  auto image = encode_image(sample_state(), sample_meta());
  image.back() ^= std::byte{0x80};
  EXPECT_THAT(refusal(image), HasSubstr("hand-over image: payload checksum mismatch"));
  auto edited = encode_image(sample_state(), sample_meta());
  poke(edited, kImagePayloadCrcOffset, std::uint32_t{0x12345678});
  reseal(edited);
  EXPECT_THAT(refusal(edited), HasSubstr("hand-over image: payload checksum mismatch"));
}

TEST(HandoverImageHeader, EveryTruncationIsRefused) {
  const auto image = encode_image(sample_state(), sample_meta());
  for (std::size_t size = 0; size < image.size(); ++size) {
    const std::string message = refusal(std::span(image).first(size));
    if (size < kImageHeaderBytes) {
      EXPECT_THAT(message, HasSubstr("shorter than its 32-byte header")) << size;
    } else {
      EXPECT_THAT(message, HasSubstr(" bytes received")) << size;
    }
  }
}

TEST(HandoverImageHeader, EverySingleByteFlipIsRefused) {
  const auto image = encode_image(sample_state(), sample_meta());
  for (std::size_t offset = 0; offset < image.size(); ++offset) {
    for (const std::byte mask : {std::byte{0x01}, std::byte{0xFF}}) {
      auto edited = image;
      edited[offset] ^= mask;
      const std::string message = refusal(edited);
      if (offset >= kImageHeaderBytes) {
        EXPECT_THAT(message, HasSubstr("payload checksum mismatch")) << offset;
      }
    }
  }
}

// Bytes changed at random inside the payload and the checksums recomputed: whatever the
// verifier and the field checks let through decodes, everything else is an ImageError;
// never another exception, a crash or undefined behaviour (the suite runs under
// ASan/UBSan too).
TEST(HandoverImagePayload, RandomCorruptionsWithFreshChecksumsAreDecodedOrRefused) {
  const auto image = encode_image(sample_state(), sample_meta());
  const auto payload = payload_of(image);
  std::mt19937_64 rng(20261207);
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::byte> edited(payload.begin(), payload.end());
    const int changes = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < changes; ++i) {
      edited[rng() % edited.size()] = static_cast<std::byte>(rng() & 0xFF);
    }
    try {
      (void)decode_image(wrap_payload(edited));
    } catch (const ImageError&) {
      ++refused;
    }
  }
  // Both outcomes happen: corruptions in a counter decode, most others are refused.
  EXPECT_GT(refused, 0);
  EXPECT_LT(refused, 3000);
}

// --- payloads with correct checksums: the verifier and the field checks ---------------------

// A small valid payload, every value of which a test can change: one plan, one stepquant6
// layout naming it, one arena, one lease, one hybrid snapshot, one tenant.
struct Craft {
  std::vector<std::vector<std::byte>> plans = {sq::to_bytes(*nominal6())};
  std::string plan_digest = sq::digest(*nominal6());
  std::uint8_t arch = 0;
  std::uint8_t conv_dtype = 1;
  std::uint8_t codec = 7;  // stepquant6
  std::uint8_t variant = 0;
  std::uint32_t key_dim = 16;
  std::uint32_t group_size = 0;
  std::string layout_name = "crafted";
  std::uint8_t handle = 0;
  std::string arena_tenant = "alice";
  std::string lease_tenant = "alice";
  std::int64_t grace_left_ms = 1000;
  std::string prefix = "p";
  std::uint8_t kv_codec = 1;
  std::uint32_t kv_layers = 2;
  std::uint64_t kv_tokens = 16;
  std::int64_t age_ms = 10;
  std::int64_t idle_ms = 5;
  std::string daemon_version = "test";
  bool meta = true;
};

std::vector<std::byte> build(const Craft& c) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::Plan>> plans;
  for (const auto& bytes : c.plans) {
    const auto data =
        fbb.CreateVector(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    plans.push_back(wire::CreatePlan(fbb, data));
  }
  const auto plans_vec = fbb.CreateVector(plans);

  const auto name = fbb.CreateString(c.layout_name);
  const auto digest = fbb.CreateString(c.plan_digest);
  wire::LayoutBuilder lb(fbb);
  lb.add_id(1);
  lb.add_name(name);
  lb.add_arch(static_cast<wire::Arch>(c.arch));
  lb.add_num_layers(2);
  lb.add_num_heads(2);
  lb.add_key_dim(c.key_dim);
  lb.add_value_dim(16);
  lb.add_conv_dtype(static_cast<wire::DType>(c.conv_dtype));
  lb.add_codec(static_cast<wire::CodecId>(c.codec));
  lb.add_group_size(c.group_size);
  lb.add_variant(static_cast<wire::StepQuantVariant>(c.variant));
  lb.add_plan_digest(digest);
  const std::vector<flatbuffers::Offset<wire::Layout>> layouts = {lb.Finish()};
  const auto layouts_vec = fbb.CreateVector(layouts);

  const auto arena_tenant = fbb.CreateString(c.arena_tenant);
  const auto owner = fbb.CreateVector(std::vector<std::uint64_t>{7, kSnapshotOwner, 0});
  wire::ArenaBuilder ab(fbb);
  ab.add_id(3);
  ab.add_tenant(arena_tenant);
  ab.add_layout(1);
  ab.add_page_count(3);
  ab.add_page_stride(256);
  ab.add_bytes(4096);
  ab.add_handle(static_cast<wire::HandleKind>(c.handle));
  ab.add_owner(owner);
  const std::vector<flatbuffers::Offset<wire::Arena>> arenas = {ab.Finish()};
  const auto arenas_vec = fbb.CreateVector(arenas);

  const auto lease_tenant = fbb.CreateString(c.lease_tenant);
  const auto token = fbb.CreateString("token");
  const std::vector<wire::SlotRef> refs = {wire::SlotRef(3, 0)};
  const auto slots = fbb.CreateVectorOfStructs(refs);
  const std::vector<flatbuffers::Offset<wire::Lease>> leases = {
      wire::CreateLease(fbb, 7, lease_tenant, token, c.grace_left_ms, slots)};
  const auto leases_vec = fbb.CreateVector(leases);

  const auto space = fbb.CreateString("ns");
  const auto prefix =
      fbb.CreateVector(reinterpret_cast<const std::uint8_t*>(c.prefix.data()), c.prefix.size());
  const auto snap_tenant = fbb.CreateString("alice");
  const auto kv_pages = fbb.CreateVector(std::vector<std::uint32_t>{});
  const wire::KvBlocks kv(c.kv_tokens, c.kv_layers, 32, 32,
                          static_cast<wire::KvCodecId>(c.kv_codec));
  const std::vector<flatbuffers::Offset<wire::Snapshot>> snapshots = {
      wire::CreateSnapshot(fbb, space, prefix, 64, 1, snap_tenant, 3, 1, &kv, kv_pages, false, 0,
                           c.age_ms, c.idle_ms, false)};
  const auto snapshots_vec = fbb.CreateVector(snapshots);

  const auto tenant_name = fbb.CreateString("alice");
  const std::vector<flatbuffers::Offset<wire::Tenant>> tenants = {
      wire::CreateTenant(fbb, tenant_name, 1, 1)};
  const auto tenants_vec = fbb.CreateVector(tenants);

  flatbuffers::Offset<wire::Meta> meta = 0;
  if (c.meta) {
    meta = wire::CreateMeta(fbb, 1, fbb.CreateString(c.daemon_version), fbb.CreateString("host"));
  }
  wire::ImageBuilder ib(fbb);
  if (c.meta) ib.add_meta(meta);
  ib.add_plans(plans_vec);
  ib.add_layouts(layouts_vec);
  ib.add_arenas(arenas_vec);
  ib.add_leases(leases_vec);
  ib.add_snapshots(snapshots_vec);
  ib.add_tenants(tenants_vec);
  ib.add_next_arena(4);
  ib.add_next_lease(8);
  // Finish() would assert on a missing required field: finish without the check.
  fbb.Finish(flatbuffers::Offset<wire::Image>(ib.fbb_.EndTable(ib.start_)),
             wire::ImageIdentifier());
  const auto* data = reinterpret_cast<const std::byte*>(fbb.GetBufferPointer());
  return wrap_payload(std::span(data, fbb.GetSize()));
}

// The message of a payload built from `c` after `change`.
std::string crafted_refusal(const std::function<void(Craft&)>& change) {
  Craft c;
  change(c);
  return refusal(build(c));
}

TEST(HandoverImagePayload, TheCraftedPayloadIsValid) {
  const auto decoded = decode_image(build(Craft{}));
  ASSERT_EQ(decoded.state.layouts.size(), 1u);
  EXPECT_NE(decoded.state.layouts[0].layout.plan, nullptr);
  ASSERT_EQ(decoded.state.snapshots.size(), 1u);
  EXPECT_TRUE(decoded.state.snapshots[0].kv.has_value());
  EXPECT_EQ(decoded.meta.daemon_version, "test");
}

TEST(HandoverImagePayload, WhatIsNotTheSchemasFlatBufferIsMalformed) {
  const std::string malformed = "hand-over image: malformed (FlatBuffers verifier)";
  EXPECT_THAT(refusal(wrap_payload({})), HasSubstr(malformed));
  std::vector<std::byte> garbage(256);
  for (std::size_t i = 0; i < garbage.size(); ++i) {
    garbage[i] = static_cast<std::byte>(i * 37 + 11);
  }
  EXPECT_THAT(refusal(wrap_payload(garbage)), HasSubstr(malformed));
  // Another schema's buffer (a plan file) has another file identifier.
  EXPECT_THAT(refusal(wrap_payload(sq::to_bytes(*nominal6()))), HasSubstr(malformed));
  // The required meta table missing.
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.meta = false; }), HasSubstr(malformed));
  // A valid payload cut short, its checksums correct.
  const auto image = build(Craft{});
  const auto payload = payload_of(image);
  EXPECT_THAT(refusal(wrap_payload(payload.first(payload.size() / 2))), HasSubstr(malformed));
  // An offset pointing outside the buffer: the root offset.
  std::vector<std::byte> bad_root(payload.begin(), payload.end());
  const std::uint32_t far = 0x7FFFFFF0;
  std::memcpy(bad_root.data(), &far, 4);
  EXPECT_THAT(refusal(wrap_payload(bad_root)), HasSubstr(malformed));
}

TEST(HandoverImagePayload, EnumsOutOfRangeAreRefusedNamingTheField) {
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.codec = 200; }),
              HasSubstr("hand-over image: layout 1: codec 200 unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.arch = 2; }),
              HasSubstr("hand-over image: layout 1: arch 2 unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.conv_dtype = 3; }),
              HasSubstr("hand-over image: layout 1: conv_dtype 3 unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.variant = 4; }),
              HasSubstr("hand-over image: layout 1: codec variant 4 unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.handle = 9; }),
              HasSubstr("hand-over image: arena 3: handle kind 9 unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.kv_codec = 200; }),
              HasSubstr("hand-over image: snapshot 0: KV codec 200 unknown"));
}

TEST(HandoverImagePayload, InvalidLayoutIsRefusedWithValidatesMessage) {
  auto layout = gdn_layout(kernels::CodecId::stepquant6, "");
  layout.plan = nominal6();
  layout.key_dim = 0;
  const std::string expected = kernels::validate(layout);
  ASSERT_FALSE(expected.empty());
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.key_dim = 0; }),
              HasSubstr("hand-over image: layout 1: " + expected));
  // A uniform codec's group size.
  EXPECT_THAT(crafted_refusal([](Craft& c) {
                c.codec = 5;  // int8
                c.plan_digest.clear();
                c.group_size = 3;
              }),
              HasSubstr("hand-over image: layout 1: codec.group_size must be"));
  // A stepquant layout without a plan, and a plan on a codec without one.
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.plan_digest.clear(); }),
              HasSubstr("hand-over image: layout 1: codec stepquant6 needs a calibration plan"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.codec = 5; }),
              HasSubstr("hand-over image: layout 1: codec int8 does not use a calibration plan"));
}

TEST(HandoverImagePayload, PlanDigestNamingNoPlanIsRefused) {
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.plan_digest = "0123456789abcdef"; }),
              HasSubstr("hand-over image: layout 1: plan digest '0123456789abcdef' unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.plan_digest = std::string("\x01\xfe", 2); }),
              HasSubstr("hand-over image: layout 1: plan digest '\\x01\\xfe' unknown"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.plans.clear(); }),
              HasSubstr("hand-over image: layout 1: plan digest '"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.plan_digest.assign(65, 'a'); }),
              HasSubstr("hand-over image: layout 1: plan digest of 65 bytes, longer than the "
                        "limit of 64"));
}

TEST(HandoverImagePayload, CorruptPlanBytesAreRefusedWithFromBytesMessage) {
  const auto good = sq::to_bytes(*nominal6());
  // The plan's file identifier, a width outside the candidates, and the plan cut short.
  std::vector<std::vector<std::byte>> corrupt(4, good);
  corrupt[0][5] = std::byte{'X'};
  // The widths vector: its length (4 units: 2 layers x 2 heads) and four 6-bit widths.
  const std::vector<std::byte> widths = {std::byte{4}, std::byte{0}, std::byte{0}, std::byte{0},
                                         std::byte{6}, std::byte{6}, std::byte{6}, std::byte{6}};
  const auto at = std::search(good.begin(), good.end(), widths.begin(), widths.end());
  ASSERT_NE(at, good.end());
  corrupt[1][static_cast<std::size_t>(at - good.begin()) + 4] = std::byte{5};
  corrupt[2].resize(good.size() / 2);
  corrupt[3].resize(4);
  for (std::size_t i = 0; i < corrupt.size(); ++i) {
    std::string expected;
    try {
      (void)sq::from_bytes(corrupt[i]);
    } catch (const std::invalid_argument& e) {
      expected = e.what();
    }
    ASSERT_FALSE(expected.empty()) << i;
    EXPECT_THAT(crafted_refusal([&](Craft& c) {
                  c.plans.push_back(corrupt[i]);  // plan 1 (plan 0 is valid)
                }),
                HasSubstr("hand-over image: plan 1: " + expected))
        << i;
  }
}

TEST(HandoverImagePayload, RepeatedPlanIsRefused) {
  EXPECT_THAT(
      crafted_refusal([](Craft& c) { c.plans.push_back(c.plans[0]); }),
      HasSubstr("hand-over image: plan 1: digest " + sq::digest(*nominal6()) + " repeats plan 0"));
}

TEST(HandoverImagePayload, KvBlocksAreChecked) {
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.kv_layers = 0; }),
              HasSubstr("hand-over image: snapshot 0: KV blocks need at least 1 layer"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.kv_tokens = 0; }),
              HasSubstr("hand-over image: snapshot 0: KV blocks need at least 1 token"));
}

TEST(HandoverImagePayload, StringsAndDurationsAreBounded) {
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.lease_tenant.assign(4097, 't'); }),
              HasSubstr("hand-over image: lease 7: tenant of 4097 bytes, longer than the limit "
                        "of 4096"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.arena_tenant.assign(5000, 't'); }),
              HasSubstr("hand-over image: arena 3: tenant of 5000 bytes"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.layout_name.assign(4097, 'n'); }),
              HasSubstr("hand-over image: layout 1: name of 4097 bytes"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.daemon_version.assign(4097, 'v'); }),
              HasSubstr("hand-over image: meta: daemon_version of 4097 bytes"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.prefix.assign(257, 'p'); }),
              HasSubstr("hand-over image: snapshot 0: prefix of 257 bytes, longer than the limit "
                        "of 256"));
  // At the limits they are accepted.
  Craft at_limit;
  at_limit.lease_tenant.assign(4096, 't');
  at_limit.prefix.assign(256, 'p');
  EXPECT_NO_THROW((void)decode_image(build(at_limit)));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.grace_left_ms = -1; }),
              HasSubstr("hand-over image: lease 7: grace_left_ms -1 is negative"));
  EXPECT_THAT(crafted_refusal([](Craft& c) { c.age_ms = -5; }),
              HasSubstr("hand-over image: snapshot 0: age_ms -5 is negative"));
  EXPECT_THAT(
      crafted_refusal([](Craft& c) { c.idle_ms = std::numeric_limits<std::int64_t>::min(); }),
      HasSubstr("hand-over image: snapshot 0: idle_ms"));
}

}  // namespace
}  // namespace statepool::service::handover
