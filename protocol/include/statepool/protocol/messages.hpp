#pragma once
// Which reply answers which request: one table for the daemon's handlers and the client's
// typed call, so that neither can pair a request with the wrong reply.
//
//   protocol::ReplyFor<wire::Compress>        -> wire::CompressReply
//   protocol::kRequestType<wire::Compress>    -> wire::RequestBody::Compress
//   protocol::kReplyType<wire::CompressReply> -> wire::ReplyBody::CompressReply
//
// Thread-safety: compile-time only.

#include <cstdint>

#include "statepool_generated.h"

namespace statepool::protocol {

template <class Request>
struct ReplyOf;  // defined for every request table below; nothing else

#define STATEPOOL_PAIR(Request)        \
  template <>                          \
  struct ReplyOf<wire::Request> {      \
    using type = wire::Request##Reply; \
  };
STATEPOOL_PAIR(Hello)
STATEPOOL_PAIR(RegisterLayout)
STATEPOOL_PAIR(OpenArena)
STATEPOOL_PAIR(Allocate)
STATEPOOL_PAIR(Free)
STATEPOOL_PAIR(OpenStaging)
STATEPOOL_PAIR(CloseStaging)
STATEPOOL_PAIR(Compress)
STATEPOOL_PAIR(Decompress)
STATEPOOL_PAIR(Copy)
STATEPOOL_PAIR(Stats)
STATEPOOL_PAIR(Ping)
STATEPOOL_PAIR(Drain)
STATEPOOL_PAIR(InstallPlan)
STATEPOOL_PAIR(PlanCapacity)
STATEPOOL_PAIR(FitsNow)
STATEPOOL_PAIR(PutSnapshot)
STATEPOOL_PAIR(GetSnapshot)
STATEPOOL_PAIR(DeleteSnapshot)
STATEPOOL_PAIR(PinSnapshot)
STATEPOOL_PAIR(ListSnapshots)
STATEPOOL_PAIR(ExportSnapshot)
STATEPOOL_PAIR(ImportSnapshot)
STATEPOOL_PAIR(CloseArena)
STATEPOOL_PAIR(RegisterMemory)
STATEPOOL_PAIR(LookupSnapshots)
STATEPOOL_PAIR(PutSnapshots)
STATEPOOL_PAIR(GetSnapshots)
#undef STATEPOOL_PAIR

template <class Request>
using ReplyFor = typename ReplyOf<Request>::type;

template <class Request>
inline constexpr wire::RequestBody kRequestType = wire::RequestBodyTraits<Request>::enum_value;
template <class Reply>
inline constexpr wire::ReplyBody kReplyType = wire::ReplyBodyTraits<Reply>::enum_value;

// The two unions list the same messages in the same order, so every request's value is
// its reply's value; a union member added to one and not the other fails here.
static_assert(static_cast<int>(wire::RequestBody::MAX) == static_cast<int>(wire::ReplyBody::MAX));
static_assert(static_cast<int>(kRequestType<wire::GetSnapshots>) ==
              static_cast<int>(kReplyType<ReplyFor<wire::GetSnapshots>>));

/// Calls f.template operator()<Request>() for every request table, in union order.
template <class F>
constexpr void for_each_request(F&& f) {
  f.template operator()<wire::Hello>();
  f.template operator()<wire::RegisterLayout>();
  f.template operator()<wire::OpenArena>();
  f.template operator()<wire::Allocate>();
  f.template operator()<wire::Free>();
  f.template operator()<wire::OpenStaging>();
  f.template operator()<wire::CloseStaging>();
  f.template operator()<wire::Compress>();
  f.template operator()<wire::Decompress>();
  f.template operator()<wire::Copy>();
  f.template operator()<wire::Stats>();
  f.template operator()<wire::Ping>();
  f.template operator()<wire::Drain>();
  f.template operator()<wire::InstallPlan>();
  f.template operator()<wire::PlanCapacity>();
  f.template operator()<wire::FitsNow>();
  f.template operator()<wire::PutSnapshot>();
  f.template operator()<wire::GetSnapshot>();
  f.template operator()<wire::DeleteSnapshot>();
  f.template operator()<wire::PinSnapshot>();
  f.template operator()<wire::ListSnapshots>();
  f.template operator()<wire::ExportSnapshot>();
  f.template operator()<wire::ImportSnapshot>();
  f.template operator()<wire::CloseArena>();
  f.template operator()<wire::RegisterMemory>();
  f.template operator()<wire::LookupSnapshots>();
  f.template operator()<wire::PutSnapshots>();
  f.template operator()<wire::GetSnapshots>();
}

/// The lowest protocol version in which `type` exists: a connection that negotiated an
/// older one may not send it.
constexpr std::uint16_t min_version(wire::RequestBody type) noexcept {
  switch (type) {
    case wire::RequestBody::RegisterMemory:
    case wire::RequestBody::LookupSnapshots:
    case wire::RequestBody::PutSnapshots:
    case wire::RequestBody::GetSnapshots: return 2;
    default: return 1;
  }
}

}  // namespace statepool::protocol
