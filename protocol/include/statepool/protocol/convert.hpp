#pragma once
// The one conversion layer between wire types (protocol/statepool.fbs) and domain types
// (kernels/), used by the daemon and the client alike.
//
// Enums: every wire enum has a domain twin with the same values; the static_asserts in
// convert.cpp tie each value, so renumbering either side fails to compile. to_wire() never
// fails; from_wire() checks that the value is known (a peer may send anything that
// verifies) and throws StatusError(invalid_argument) naming the field otherwise.
// Layouts are converted here and nowhere else; so are memory descriptors.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/support/status.hpp"
#include "statepool_generated.h"

namespace statepool::protocol {

[[nodiscard]] wire::Arch to_wire(kernels::Arch value) noexcept;
[[nodiscard]] wire::DType to_wire(kernels::DType value) noexcept;
[[nodiscard]] wire::CodecId to_wire(kernels::CodecId value) noexcept;
[[nodiscard]] wire::StepQuantVariant to_wire(kernels::StepQuantVariant value) noexcept;
[[nodiscard]] wire::MemorySpace to_wire(kernels::MemorySpace value) noexcept;
[[nodiscard]] wire::HandleKind to_wire(kernels::HandleKind value) noexcept;
[[nodiscard]] wire::KvCodec to_wire(kernels::KvCodecId value) noexcept;
[[nodiscard]] wire::Status to_wire(Status value) noexcept;
/// Never throws: a status this build does not know (from a newer peer) keeps its number,
/// and status_name() calls it "unknown".
[[nodiscard]] Status from_wire(wire::Status value) noexcept;

/// Throw StatusError(invalid_argument): "unknown <field> value 7".
[[nodiscard]] kernels::Arch from_wire(wire::Arch value, std::string_view field = "arch");
[[nodiscard]] kernels::DType from_wire(wire::DType value, std::string_view field = "dtype");
[[nodiscard]] kernels::CodecId from_wire(wire::CodecId value, std::string_view field = "codec");
[[nodiscard]] kernels::StepQuantVariant from_wire(wire::StepQuantVariant value,
                                                  std::string_view field = "stepquant variant");
[[nodiscard]] kernels::MemorySpace from_wire(wire::MemorySpace value,
                                             std::string_view field = "memory space");
[[nodiscard]] kernels::KvCodecId from_wire(wire::KvCodec value,
                                           std::string_view field = "kv codec");
[[nodiscard]] kernels::HandleKind from_wire(wire::HandleKind value,
                                            std::string_view field = "handle kind");

/// Longest layout name accepted (free text for logs and metrics).
inline constexpr std::size_t kMaxLayoutName = 128;

/// A wire Layout as the domain sees it: the layout without its plan, and the digest of
/// the plan it names (empty for codecs without one). The daemon resolves the digest.
struct LayoutMessage {
  kernels::StateLayout layout;
  std::string plan_digest;
};

/// Throws StatusError(invalid_argument) for unknown enum values, a name longer than
/// kMaxLayoutName, or a stepquant codec without a plan digest (naming how to get one).
[[nodiscard]] LayoutMessage from_wire(const wire::Layout& in);
/// The wire form of `layout`, naming its plan by `plan_digest` ("" = no plan).
[[nodiscard]] flatbuffers::Offset<wire::Layout> to_wire(flatbuffers::FlatBufferBuilder& builder,
                                                        const kernels::StateLayout& layout,
                                                        std::string_view plan_digest);

/// An absent descriptor (a daemon from before protocol 1.1 of the schema) is a host memfd.
/// Throws StatusError(invalid_argument) for unknown enum values, a cuda_ipc descriptor
/// whose handle is not kCudaIpcHandleBytes long, or a granularity of 0.
[[nodiscard]] kernels::MemoryDescriptor from_wire(const wire::MemoryDescriptor* in);
[[nodiscard]] flatbuffers::Offset<wire::MemoryDescriptor> to_wire(
    flatbuffers::FlatBufferBuilder& builder, const kernels::MemoryDescriptor& descriptor);

/// KV blocks (hybrid snapshots): the codec is checked here, the shape by the daemon
/// (kernels::kv_blocks_problem).
[[nodiscard]] kernels::KvBlocks from_wire(const wire::KvBlocks& in);
[[nodiscard]] flatbuffers::Offset<wire::KvBlocks> to_wire(flatbuffers::FlatBufferBuilder& builder,
                                                          const kernels::KvBlocks& blocks);

/// A list of codec ids (capacity requests). At most `max` entries; throws like from_wire.
[[nodiscard]] std::vector<kernels::CodecId> from_wire(const flatbuffers::Vector<wire::CodecId>* in,
                                                      std::size_t max);
[[nodiscard]] std::vector<wire::CodecId> to_wire(const std::vector<kernels::CodecId>& codecs);

}  // namespace statepool::protocol
