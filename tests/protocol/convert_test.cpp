// The wire <-> domain conversion layer: layouts and memory descriptors survive a round
// trip through a real FlatBuffer, unknown enum values are refused naming the field.
#include <gtest/gtest.h>

#include <flatbuffers/flatbuffers.h>

#include <string>

#include "statepool/protocol/convert.hpp"
#include "statepool/support/status.hpp"

namespace statepool::protocol {
namespace {

template <class T>
const T& reread(flatbuffers::FlatBufferBuilder& b, flatbuffers::Offset<T> offset) {
  b.Finish(offset);
  return *flatbuffers::GetRoot<T>(b.GetBufferPointer());
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    return e.what();
  }
  ADD_FAILURE() << "expected StatusError(invalid_argument)";
  return {};
}

TEST(Convert, LayoutSurvivesTheWire) {
  kernels::StateLayout layout;
  layout.name = "kimi-linear";
  layout.arch = kernels::Arch::kda;
  layout.num_layers = 20;
  layout.num_heads = 32;
  layout.key_dim = 128;
  layout.value_dim = 96;
  layout.conv_channels = 4096;
  layout.conv_width = 3;
  layout.conv_dtype = kernels::DType::f16;
  layout.codec.id = kernels::CodecId::stepquant4;
  layout.codec.group_size = 64;
  layout.codec.variant = kernels::StepQuantVariant::temporal_only;
  flatbuffers::FlatBufferBuilder b;
  const LayoutMessage back = from_wire(reread(b, to_wire(b, layout, "0123456789abcdef")));
  EXPECT_EQ(back.plan_digest, "0123456789abcdef");
  EXPECT_EQ(back.layout.name, layout.name);
  EXPECT_EQ(back.layout.arch, layout.arch);
  EXPECT_EQ(back.layout.num_layers, layout.num_layers);
  EXPECT_EQ(back.layout.num_heads, layout.num_heads);
  EXPECT_EQ(back.layout.key_dim, layout.key_dim);
  EXPECT_EQ(back.layout.value_dim, layout.value_dim);
  EXPECT_EQ(back.layout.conv_channels, layout.conv_channels);
  EXPECT_EQ(back.layout.conv_width, layout.conv_width);
  EXPECT_EQ(back.layout.conv_dtype, layout.conv_dtype);
  EXPECT_EQ(back.layout.codec.id, layout.codec.id);
  EXPECT_EQ(back.layout.codec.group_size, layout.codec.group_size);
  EXPECT_EQ(back.layout.codec.variant, layout.codec.variant);
  EXPECT_EQ(back.layout.plan, nullptr) << "the daemon resolves the digest";
}

TEST(Convert, LayoutRefusals) {
  flatbuffers::FlatBufferBuilder b;
  const auto bad_arch = wire::CreateLayout(b, 0, static_cast<wire::Arch>(9));
  EXPECT_EQ(refusal([&] { (void)from_wire(reread(b, bad_arch)); }), "unknown arch value 9");
  b.Clear();
  const auto bad_conv =
      wire::CreateLayout(b, 0, wire::Arch::gdn, 1, 1, 1, 1, 0, 0, static_cast<wire::DType>(7));
  EXPECT_EQ(refusal([&] { (void)from_wire(reread(b, bad_conv)); }), "unknown conv_dtype value 7");
  b.Clear();
  const auto bad_codec = wire::CreateLayout(b, 0, wire::Arch::gdn, 1, 1, 1, 1, 0, 0,
                                            wire::DType::bf16, static_cast<wire::CodecId>(42));
  EXPECT_EQ(refusal([&] { (void)from_wire(reread(b, bad_codec)); }), "unknown codec value 42");
  b.Clear();
  const auto long_name = wire::CreateLayout(b, b.CreateString(std::string(129, 'n')));
  EXPECT_EQ(refusal([&] { (void)from_wire(reread(b, long_name)); }),
            "layout name longer than 128 bytes");
  b.Clear();
  const auto no_plan = wire::CreateLayout(b, 0, wire::Arch::gdn, 1, 1, 1, 1, 0, 0,
                                          wire::DType::bf16, wire::CodecId::stepquant6);
  EXPECT_NE(refusal([&] { (void)from_wire(reread(b, no_plan)); }).find("needs a calibration plan"),
            std::string::npos);
}

TEST(Convert, MemoryDescriptorSurvivesTheWire) {
  kernels::MemoryDescriptor ipc;
  ipc.space = kernels::MemorySpace::device;
  ipc.device = 3;
  ipc.handle_kind = kernels::HandleKind::cuda_ipc;
  ipc.granularity = 2 << 20;
  for (std::size_t i = 0; i < ipc.ipc_handle.size(); ++i) {
    ipc.ipc_handle[i] = static_cast<std::byte>(i + 1);
  }
  for (std::size_t i = 0; i < ipc.device_uuid.size(); ++i) {
    ipc.device_uuid[i] = static_cast<std::byte>(0xA0 + i);
  }
  flatbuffers::FlatBufferBuilder b;
  const kernels::MemoryDescriptor back = from_wire(&reread(b, to_wire(b, ipc)));
  EXPECT_EQ(back.space, ipc.space);
  EXPECT_EQ(back.device, 3);
  EXPECT_EQ(back.handle_kind, ipc.handle_kind);
  EXPECT_EQ(back.granularity, ipc.granularity);
  EXPECT_EQ(back.ipc_handle, ipc.ipc_handle);
  EXPECT_EQ(back.device_uuid, ipc.device_uuid);
  EXPECT_FALSE(back.handle_is_fd());

  // An absent descriptor is what a daemon before the descriptor field sent: a host memfd.
  const kernels::MemoryDescriptor old =
      from_wire(static_cast<const wire::MemoryDescriptor*>(nullptr));
  EXPECT_EQ(old.space, kernels::MemorySpace::host);
  EXPECT_EQ(old.handle_kind, kernels::HandleKind::memfd);
  EXPECT_TRUE(old.handle_is_fd());
}

TEST(Convert, MemoryDescriptorRefusals) {
  flatbuffers::FlatBufferBuilder b;
  const auto bad_space = wire::CreateMemoryDescriptor(b, static_cast<wire::MemorySpace>(5), -1);
  EXPECT_EQ(refusal([&] { (void)from_wire(&reread(b, bad_space)); }),
            "unknown memory space value 5");
  b.Clear();
  const auto no_handle =
      wire::CreateMemoryDescriptor(b, wire::MemorySpace::device, 0, wire::HandleKind::cuda_ipc, 1);
  EXPECT_NE(refusal([&] { (void)from_wire(&reread(b, no_handle)); }).find("64-byte handle"),
            std::string::npos);
  b.Clear();
  const auto zero =
      wire::CreateMemoryDescriptor(b, wire::MemorySpace::host, -1, wire::HandleKind::memfd, 0);
  EXPECT_NE(refusal([&] { (void)from_wire(&reread(b, zero)); }).find("granularity 0"),
            std::string::npos);
  b.Clear();
  const std::vector<std::uint8_t> short_uuid(15);
  const auto bad_uuid = wire::CreateMemoryDescriptorDirect(
      b, wire::MemorySpace::device, 0, wire::HandleKind::cuda_vmm_fd, 1, nullptr, &short_uuid);
  EXPECT_NE(refusal([&] { (void)from_wire(&reread(b, bad_uuid)); }).find("device_uuid of 15"),
            std::string::npos);
}

TEST(Convert, CodecLists) {
  flatbuffers::FlatBufferBuilder b;
  const std::vector<kernels::CodecId> codecs = {kernels::CodecId::int6, kernels::CodecId::dsq4};
  b.Finish(b.CreateVector(to_wire(codecs)));
  const auto* vector =
      flatbuffers::GetRoot<flatbuffers::Vector<wire::CodecId>>(b.GetBufferPointer());
  EXPECT_EQ(from_wire(vector, 64), codecs);
  EXPECT_EQ(refusal([&] { (void)from_wire(vector, 1); }), "at most 1 codecs per request, got 2");
  EXPECT_TRUE(
      from_wire(static_cast<const flatbuffers::Vector<wire::CodecId>*>(nullptr), 1).empty());
}

}  // namespace
}  // namespace statepool::protocol
