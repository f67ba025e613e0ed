#include "statepool/protocol/convert.hpp"

#include <cstring>
#include <string>

#include "statepool/support/status.hpp"

namespace statepool::protocol {
namespace {

template <class Wire, class Domain>
constexpr bool same(Wire wire, Domain domain) {
  return static_cast<unsigned>(wire) == static_cast<unsigned>(domain);
}

// Every wire enum value is its domain twin's value; MAX pins the count.
static_assert(same(wire::Arch::gdn, kernels::Arch::gdn) &&
              same(wire::Arch::kda, kernels::Arch::kda) &&
              same(wire::Arch::MAX, kernels::Arch::kda));
static_assert(same(wire::DType::f32, kernels::DType::f32) &&
              same(wire::DType::bf16, kernels::DType::bf16) &&
              same(wire::DType::f16, kernels::DType::f16) &&
              same(wire::DType::MAX, kernels::DType::f16));
static_assert(same(wire::CodecId::fp32, kernels::CodecId::fp32) &&
              same(wire::CodecId::bf16, kernels::CodecId::bf16) &&
              same(wire::CodecId::fp16, kernels::CodecId::fp16) &&
              same(wire::CodecId::int4, kernels::CodecId::int4) &&
              same(wire::CodecId::int6, kernels::CodecId::int6) &&
              same(wire::CodecId::int8, kernels::CodecId::int8) &&
              same(wire::CodecId::stepquant4, kernels::CodecId::stepquant4) &&
              same(wire::CodecId::stepquant6, kernels::CodecId::stepquant6) &&
              same(wire::CodecId::dsq4, kernels::CodecId::dsq4) &&
              same(wire::CodecId::dsq6, kernels::CodecId::dsq6) &&
              same(wire::CodecId::MAX, kernels::CodecId::dsq6));
static_assert(same(wire::StepQuantVariant::full, kernels::StepQuantVariant::full) &&
              same(wire::StepQuantVariant::spatial_only, kernels::StepQuantVariant::spatial_only) &&
              same(wire::StepQuantVariant::temporal_only,
                   kernels::StepQuantVariant::temporal_only) &&
              same(wire::StepQuantVariant::no_refit, kernels::StepQuantVariant::no_refit) &&
              same(wire::StepQuantVariant::MAX, kernels::StepQuantVariant::no_refit));
static_assert(same(wire::MemorySpace::host, kernels::MemorySpace::host) &&
              same(wire::MemorySpace::device, kernels::MemorySpace::device) &&
              same(wire::MemorySpace::MAX, kernels::MemorySpace::device));
static_assert(same(wire::HandleKind::memfd, kernels::HandleKind::memfd) &&
              same(wire::HandleKind::cuda_vmm_fd, kernels::HandleKind::cuda_vmm_fd) &&
              same(wire::HandleKind::cuda_ipc, kernels::HandleKind::cuda_ipc) &&
              same(wire::HandleKind::MAX, kernels::HandleKind::cuda_ipc));
static_assert(same(wire::KvCodec::bf16, kernels::KvCodecId::bf16) &&
              same(wire::KvCodec::fp8, kernels::KvCodecId::fp8) &&
              same(wire::KvCodec::kivi2, kernels::KvCodecId::kivi2) &&
              same(wire::KvCodec::kivi4, kernels::KvCodecId::kivi4) &&
              same(wire::KvCodec::flexgen4, kernels::KvCodecId::flexgen4) &&
              same(wire::KvCodec::MAX, kernels::KvCodecId::flexgen4));

static_assert(same(wire::Status::ok, Status::ok) &&
              same(wire::Status::invalid_argument, Status::invalid_argument) &&
              same(wire::Status::not_found, Status::not_found) &&
              same(wire::Status::quota_exceeded, Status::quota_exceeded) &&
              same(wire::Status::pool_exhausted, Status::pool_exhausted) &&
              same(wire::Status::not_owner, Status::not_owner) &&
              same(wire::Status::unsupported_version, Status::unsupported_version) &&
              same(wire::Status::protocol_error, Status::protocol_error) &&
              same(wire::Status::lease_busy, Status::lease_busy) &&
              same(wire::Status::unknown_tenant, Status::unknown_tenant) &&
              same(wire::Status::permission_denied, Status::permission_denied) &&
              same(wire::Status::draining, Status::draining) &&
              same(wire::Status::not_finite, Status::not_finite) &&
              same(wire::Status::internal, Status::internal) &&
              same(wire::Status::not_hello, Status::not_hello) &&
              same(wire::Status::too_many_connections, Status::too_many_connections) &&
              same(wire::Status::in_use, Status::in_use) &&
              same(wire::Status::MAX, Status::in_use) && kMaxStatus == 16);

template <class Domain, class Wire>
Domain checked(Wire value, std::string_view field) {
  STATEPOOL_EXPECTS(
      value <= Wire::MAX, Status::invalid_argument,
      "unknown " + std::string(field) + " value " + std::to_string(static_cast<unsigned>(value)));
  return static_cast<Domain>(value);
}

std::string str(const flatbuffers::String* s) {
  return s == nullptr ? std::string() : s->str();
}

}  // namespace

wire::Arch to_wire(kernels::Arch value) noexcept {
  return static_cast<wire::Arch>(value);
}
wire::DType to_wire(kernels::DType value) noexcept {
  return static_cast<wire::DType>(value);
}
wire::CodecId to_wire(kernels::CodecId value) noexcept {
  return static_cast<wire::CodecId>(value);
}
wire::StepQuantVariant to_wire(kernels::StepQuantVariant value) noexcept {
  return static_cast<wire::StepQuantVariant>(value);
}
wire::MemorySpace to_wire(kernels::MemorySpace value) noexcept {
  return static_cast<wire::MemorySpace>(value);
}
wire::HandleKind to_wire(kernels::HandleKind value) noexcept {
  return static_cast<wire::HandleKind>(value);
}
wire::KvCodec to_wire(kernels::KvCodecId value) noexcept {
  return static_cast<wire::KvCodec>(value);
}
wire::Status to_wire(Status value) noexcept {
  return static_cast<wire::Status>(value);
}
Status from_wire(wire::Status value) noexcept {
  return static_cast<Status>(value);
}

kernels::Arch from_wire(wire::Arch value, std::string_view field) {
  return checked<kernels::Arch>(value, field);
}
kernels::DType from_wire(wire::DType value, std::string_view field) {
  return checked<kernels::DType>(value, field);
}
kernels::CodecId from_wire(wire::CodecId value, std::string_view field) {
  return checked<kernels::CodecId>(value, field);
}
kernels::StepQuantVariant from_wire(wire::StepQuantVariant value, std::string_view field) {
  return checked<kernels::StepQuantVariant>(value, field);
}
kernels::MemorySpace from_wire(wire::MemorySpace value, std::string_view field) {
  return checked<kernels::MemorySpace>(value, field);
}
kernels::HandleKind from_wire(wire::HandleKind value, std::string_view field) {
  return checked<kernels::HandleKind>(value, field);
}
kernels::KvCodecId from_wire(wire::KvCodec value, std::string_view field) {
  return checked<kernels::KvCodecId>(value, field);
}

kernels::KvBlocks from_wire(const wire::KvBlocks& in) {
  return kernels::KvBlocks{from_wire(in.codec()), in.layers(), in.key_channels(),
                           in.value_channels(), in.tokens()};
}

flatbuffers::Offset<wire::KvBlocks> to_wire(flatbuffers::FlatBufferBuilder& builder,
                                            const kernels::KvBlocks& blocks) {
  return wire::CreateKvBlocks(builder, to_wire(blocks.codec), blocks.layers, blocks.key_channels,
                              blocks.value_channels, blocks.tokens);
}

LayoutMessage from_wire(const wire::Layout& in) {
  LayoutMessage out;
  kernels::StateLayout& layout = out.layout;
  layout.arch = from_wire(in.arch());
  layout.conv_dtype = from_wire(in.conv_dtype(), "conv_dtype");
  layout.codec.id = from_wire(in.codec());
  layout.name = str(in.name());
  STATEPOOL_EXPECTS(layout.name.size() <= kMaxLayoutName, Status::invalid_argument,
                    "layout name longer than " + std::to_string(kMaxLayoutName) + " bytes");
  layout.num_layers = in.num_layers();
  layout.num_heads = in.num_heads();
  layout.key_dim = in.key_dim();
  layout.value_dim = in.value_dim();
  layout.conv_channels = in.conv_channels();
  layout.conv_width = in.conv_width();
  if (const wire::CodecParams* params = in.codec_params()) {
    layout.codec.group_size = params->group_size();
    layout.codec.variant = from_wire(params->variant());
  }
  out.plan_digest = str(in.plan_digest());
  const bool needs_plan = layout.codec.id == kernels::CodecId::stepquant4 ||
                          layout.codec.id == kernels::CodecId::stepquant6;
  STATEPOOL_EXPECTS(!needs_plan || !out.plan_digest.empty(), Status::invalid_argument,
                    std::string("codec ") + kernels::to_string(layout.codec.id) +
                        " needs a calibration plan: set the layout's plan_digest to an "
                        "installed plan (InstallPlan, or statepoold --plan FILE)");
  return out;
}

flatbuffers::Offset<wire::Layout> to_wire(flatbuffers::FlatBufferBuilder& builder,
                                          const kernels::StateLayout& layout,
                                          std::string_view plan_digest) {
  const auto name = builder.CreateString(layout.name);
  const auto digest = plan_digest.empty() ? flatbuffers::Offset<flatbuffers::String>()
                                          : builder.CreateString(plan_digest);
  const auto params =
      wire::CreateCodecParams(builder, layout.codec.group_size, to_wire(layout.codec.variant));
  return wire::CreateLayout(builder, name, to_wire(layout.arch), layout.num_layers,
                            layout.num_heads, layout.key_dim, layout.value_dim,
                            layout.conv_channels, layout.conv_width, to_wire(layout.conv_dtype),
                            to_wire(layout.codec.id), params, digest);
}

kernels::MemoryDescriptor from_wire(const wire::MemoryDescriptor* in) {
  kernels::MemoryDescriptor out;
  if (in == nullptr) return out;
  out.space = from_wire(in->space());
  out.device = in->device();
  out.handle_kind = from_wire(in->handle_kind());
  STATEPOOL_EXPECTS(in->granularity() >= 1, Status::invalid_argument,
                    "memory descriptor with granularity 0");
  out.granularity = static_cast<std::size_t>(in->granularity());
  if (out.handle_kind == kernels::HandleKind::cuda_ipc) {
    const auto* bytes = in->ipc_handle();
    STATEPOOL_EXPECTS(bytes != nullptr && bytes->size() == kernels::kCudaIpcHandleBytes,
                      Status::invalid_argument,
                      "cuda_ipc memory descriptor without its " +
                          std::to_string(kernels::kCudaIpcHandleBytes) + "-byte handle");
    std::memcpy(out.ipc_handle.data(), bytes->data(), out.ipc_handle.size());
  }
  if (const auto* uuid = in->device_uuid(); uuid != nullptr) {
    STATEPOOL_EXPECTS(uuid->size() == kernels::kDeviceUuidBytes, Status::invalid_argument,
                      "memory descriptor with a device_uuid of " + std::to_string(uuid->size()) +
                          " bytes (a GPU's UUID has " + std::to_string(kernels::kDeviceUuidBytes) +
                          ")");
    std::memcpy(out.device_uuid.data(), uuid->data(), out.device_uuid.size());
  }
  return out;
}

flatbuffers::Offset<wire::MemoryDescriptor> to_wire(flatbuffers::FlatBufferBuilder& builder,
                                                    const kernels::MemoryDescriptor& descriptor) {
  flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> ipc;
  if (descriptor.handle_kind == kernels::HandleKind::cuda_ipc) {
    ipc = builder.CreateVector(reinterpret_cast<const std::uint8_t*>(descriptor.ipc_handle.data()),
                               descriptor.ipc_handle.size());
  }
  flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> uuid;
  if (descriptor.device_uuid != kernels::DeviceUuid{}) {
    uuid =
        builder.CreateVector(reinterpret_cast<const std::uint8_t*>(descriptor.device_uuid.data()),
                             descriptor.device_uuid.size());
  }
  return wire::CreateMemoryDescriptor(builder, to_wire(descriptor.space), descriptor.device,
                                      to_wire(descriptor.handle_kind), descriptor.granularity, ipc,
                                      uuid);
}

std::vector<kernels::CodecId> from_wire(const flatbuffers::Vector<wire::CodecId>* in,
                                        std::size_t max) {
  std::vector<kernels::CodecId> out;
  if (in == nullptr) return out;
  STATEPOOL_EXPECTS(
      in->size() <= max, Status::invalid_argument,
      "at most " + std::to_string(max) + " codecs per request, got " + std::to_string(in->size()));
  out.reserve(in->size());
  for (const wire::CodecId id : *in) out.push_back(from_wire(id));
  return out;
}

std::vector<wire::CodecId> to_wire(const std::vector<kernels::CodecId>& codecs) {
  std::vector<wire::CodecId> out;
  out.reserve(codecs.size());
  for (const kernels::CodecId id : codecs) out.push_back(to_wire(id));
  return out;
}

}  // namespace statepool::protocol
