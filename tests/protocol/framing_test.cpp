// Unit tests of the frame header and FlatBuffer verification (protocol/frame.hpp).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "statepool/protocol/convert.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/status.hpp"

namespace sp = statepool::protocol;
namespace wire = statepool::wire;

namespace {

std::vector<std::byte> bytes_of(const flatbuffers::FlatBufferBuilder& b) {
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return {p, p + b.GetSize()};
}

std::vector<std::byte> hello_payload() {
  flatbuffers::FlatBufferBuilder b;
  const auto hello = wire::CreateHello(b, 1, 1, b.CreateString("alice"), 0, b.CreateString("t"));
  b.Finish(wire::CreateRequest(b, 42, wire::RequestBody::Hello, hello.Union()));
  return bytes_of(b);
}

}  // namespace

TEST(FrameHeader, EncodesLittleEndianFieldsAtTheDocumentedOffsets) {
  sp::FrameHeader h;
  h.type = sp::FrameType::reply;
  h.flags = sp::kFlagFdAttached;
  h.length = 0x01020304;
  const auto bytes = sp::encode_header(h);
  const unsigned char expected[16] = {'S', 'P', 'L', '1', 1, 0, 2, 0, 1, 0, 0, 0, 4, 3, 2, 1};
  EXPECT_EQ(std::memcmp(bytes.data(), expected, 16), 0);
  const auto back = sp::decode_header(bytes);
  EXPECT_EQ(back.magic, sp::kMagic);
  EXPECT_EQ(back.type, sp::FrameType::reply);
  EXPECT_EQ(back.flags, sp::kFlagFdAttached);
  EXPECT_EQ(back.length, 0x01020304u);
}

TEST(FrameHeader, CheckRejectsEachMalformedField) {
  sp::FrameHeader good;
  good.length = 100;
  EXPECT_EQ(sp::check_header(good, sp::FrameType::request, 1024), sp::FrameError::none);

  auto h = good;
  h.magic = 0xdeadbeef;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::bad_magic);
  h = good;
  h.version = 2;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::bad_version);
  h = good;
  h.type = sp::FrameType::reply;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::bad_type);
  h = good;
  h.flags = 1u << 7;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::bad_flags);
  h = good;
  h.length = 0;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::empty_payload);
  h = good;
  h.length = 1025;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 1024), sp::FrameError::too_large);
  // The absolute cap applies whatever the caller's limit says.
  h.length = sp::kAbsoluteMaxPayload + 1;
  EXPECT_EQ(sp::check_header(h, sp::FrameType::request, 0xffffffffu), sp::FrameError::too_large);
}

TEST(FrameVerify, AcceptsAWellFormedRequest) {
  const auto payload = hello_payload();
  sp::FrameError error = sp::FrameError::bad_magic;
  const wire::Request* request = sp::verify_request(payload, error);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(error, sp::FrameError::none);
  EXPECT_EQ(request->id(), 42u);
  ASSERT_EQ(request->body_type(), wire::RequestBody::Hello);
  EXPECT_EQ(request->body_as_Hello()->tenant()->str(), "alice");
}

TEST(FrameVerify, TruncatedRequestsAreRejectedOrReadIdentically) {
  const auto payload = hello_payload();
  std::size_t rejected = 0;
  for (std::size_t n = 0; n < payload.size(); ++n) {
    // Copy into a fresh buffer so that the sanitizer build catches any read past the cut.
    std::vector<std::byte> cut(payload.begin(), payload.begin() + static_cast<long>(n));
    sp::FrameError error = sp::FrameError::none;
    const wire::Request* request = sp::verify_request(cut, error);
    if (request == nullptr) {
      EXPECT_EQ(error, sp::FrameError::bad_flatbuffer);
      ++rejected;
      continue;
    }
    // Only trailing alignment padding may be cut without changing what is read.
    EXPECT_GE(n + 8, payload.size()) << "accepted a buffer truncated to " << n << " bytes";
    EXPECT_EQ(request->id(), 42u);
    EXPECT_EQ(request->body_as_Hello()->tenant()->str(), "alice");
  }
  EXPECT_GE(rejected + 8, payload.size());
}

TEST(FrameVerify, RejectsRandomGarbageWithoutCrashing) {
  std::mt19937 rng(7);
  int accepted = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::byte> junk(static_cast<std::size_t>(rng() % 256 + 1));
    for (auto& b : junk) b = static_cast<std::byte>(rng());
    sp::FrameError error = sp::FrameError::none;
    if (sp::verify_request(junk, error) != nullptr) ++accepted;
  }
  // Random bytes essentially never form a valid Request; what matters is that none of
  // them crashed or read out of bounds (the sanitizer build checks the latter).
  EXPECT_LT(accepted, 5);
}

TEST(FrameVerify, RejectsAnOffsetPointingOutsideTheBuffer) {
  // A valid reply whose root offset is then corrupted to point past the end.
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateReply(b, 1, wire::Status::ok, b.CreateString("hello")));
  auto payload = bytes_of(b);
  sp::FrameError error = sp::FrameError::none;
  ASSERT_NE(sp::verify_reply(payload, error), nullptr);
  // Corrupt the root offset so that it points past the end.
  const std::uint32_t bogus = static_cast<std::uint32_t>(payload.size() + 64);
  std::memcpy(payload.data(), &bogus, sizeof bogus);
  EXPECT_EQ(sp::verify_reply(payload, error), nullptr);
  EXPECT_EQ(error, sp::FrameError::bad_flatbuffer);
}

TEST(FrameNames, EveryRequestTypeAndStatusHasAStableName) {
  EXPECT_STREQ(sp::request_name(wire::RequestBody::Allocate), "allocate");
  EXPECT_STREQ(sp::request_name(wire::RequestBody::NONE), "unknown");
  for (int t = 1; t <= static_cast<int>(wire::RequestBody::MAX); ++t)
    EXPECT_STRNE(sp::request_name(static_cast<wire::RequestBody>(t)), "unknown") << t;
}

// The domain's Status and the wire's are one vocabulary: every wire value maps to the
// Status of the same number and name and back, and a value neither knows (a newer
// peer's) keeps its number and is named "unknown".
TEST(StatusMapping, EveryWireStatusMapsToTheSameNameAndBack) {
  int n = 0;
  for (const wire::Status w : wire::EnumValuesStatus()) {
    const statepool::Status s = sp::from_wire(w);
    EXPECT_EQ(static_cast<unsigned>(s), static_cast<unsigned>(w));
    EXPECT_STREQ(statepool::status_name(s), wire::EnumNameStatus(w));
    EXPECT_EQ(sp::to_wire(s), w);
    ++n;
  }
  EXPECT_EQ(n, statepool::kMaxStatus + 1);
  const auto newer = static_cast<wire::Status>(999);
  EXPECT_EQ(static_cast<unsigned>(sp::from_wire(newer)), 999U);
  EXPECT_STREQ(statepool::status_name(sp::from_wire(newer)), "unknown");
  EXPECT_EQ(sp::to_wire(sp::from_wire(newer)), newer);
}
