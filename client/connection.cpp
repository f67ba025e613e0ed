#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "impl.hpp"
#include "statepool/client.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/protocol/convert.hpp"

namespace statepool::client {
namespace detail {
namespace {

using Kind = ConnectionError::Kind;

// After these statuses the daemon closes the connection (protocol/statepool.fbs).
bool closes_connection(wire::Status status) noexcept {
  return status == wire::Status::protocol_error || status == wire::Status::not_hello ||
         status == wire::Status::unsupported_version ||
         status == wire::Status::too_many_connections;
}

// Reply tables without fields: a daemon may leave the union empty for them.
bool empty_reply(wire::ReplyBody body) noexcept {
  return body == wire::ReplyBody::CloseStagingReply || body == wire::ReplyBody::CopyReply ||
         body == wire::ReplyBody::DrainReply;
}

const char* reply_name(wire::ReplyBody body) noexcept {
  const char* name = wire::EnumNameReplyBody(body);
  return (name != nullptr && *name != '\0') ? name : "unknown";
}

}  // namespace

Impl::Impl(UniqueFd fd, const Options& options)
    : socket(std::move(fd)),
      timeout(options.timeout),
      max_reply_bytes(std::min(
          options.max_reply_bytes == 0 ? protocol::kDefaultMaxPayload : options.max_reply_bytes,
          protocol::kAbsoluteMaxPayload)),
      map_device_memory(options.map_device_memory),
      legacy_ipc(options.legacy_ipc) {}

void Impl::mark_broken(const std::string& reason) noexcept {
  if (broken) return;
  try {
    broken_reason = reason;
  } catch (...) {
    // Keep going without the text: being broken matters more than saying why.
  }
  broken = true;
  socket.reset();
  received_fds.clear();
}

void Impl::check_usable() const {
  if (broken || !socket) {
    throw ConnectionError(Kind::closed, "the connection to statepoold is no longer usable (" +
                                            broken_reason + "); make a new Connection");
  }
}

bool Impl::healthy() {
  const std::lock_guard lock(mutex);
  return !broken && static_cast<bool>(socket);
}

const wire::Reply& Impl::roundtrip(wire::RequestBody type, flatbuffers::Offset<void> body,
                                   wire::ReplyBody expected, UniqueFd* fd_out) {
  check_usable();
  const char* name = protocol::request_name(type);
  const std::uint64_t id = next_id++;
  builder.Finish(wire::CreateRequest(builder, id, type, body));
  const std::uint32_t size = builder.GetSize();
  if (max_frame_bytes != 0 && size > max_frame_bytes) {
    throw Error(wire::Status::invalid_argument,
                std::string(name) + " request is " + std::to_string(size) +
                    " bytes, more than the daemon's frame limit of " +
                    std::to_string(max_frame_bytes) + "; split it into smaller requests");
  }
  try {
    const Deadline deadline = Deadline::after(timeout);
    protocol::FrameHeader header;
    header.type = protocol::FrameType::request;
    header.length = size;
    const auto head = protocol::encode_header(header);
    // A daemon that refuses a connection (limit reached, peer not allowed) writes its
    // error reply and closes without reading; the request may then fail with EPIPE while
    // the reply already waits in the receive queue. Read it: it says what went wrong.
    std::optional<ConnectionError> send_error;
    try {
      send_frame(socket.get(), head,
                 std::as_bytes(std::span(builder.GetBufferPointer(), builder.GetSize())), deadline);
    } catch (const ConnectionError& error) {
      if (error.kind() != Kind::closed) throw;
      send_error = error;
    }

    received_fds.clear();
    std::array<std::byte, protocol::kHeaderBytes> raw{};
    try {
      recv_exact(socket.get(), raw, received_fds, deadline, "waiting for the reply");
    } catch (const ConnectionError&) {
      if (send_error) throw ConnectionError(*send_error);
      throw;
    }
    const protocol::FrameHeader reply_header = protocol::decode_header(raw);
    const protocol::FrameError header_error =
        protocol::check_header(reply_header, protocol::FrameType::reply, max_reply_bytes);
    if (header_error == protocol::FrameError::too_large) {
      throw ConnectionError(Kind::bad_frame, std::string("statepoold's reply to ") + name + " is " +
                                                 std::to_string(reply_header.length) +
                                                 " bytes, more than this client accepts (" +
                                                 std::to_string(max_reply_bytes) +
                                                 "); raise Options::max_reply_bytes");
    }
    if (header_error != protocol::FrameError::none) {
      throw ConnectionError(Kind::bad_frame,
                            std::string("statepoold sent an invalid reply header to ") + name +
                                ": " + protocol::to_string(header_error) +
                                " (is this socket really statepoold's, and of a compatible "
                                "version?)");
    }
    payload.resize(reply_header.length);
    recv_exact(socket.get(), payload, received_fds, deadline, "reading the reply");
    protocol::FrameError payload_error = protocol::FrameError::none;
    const wire::Reply* reply = protocol::verify_reply(payload, payload_error);
    if (reply == nullptr) {
      throw ConnectionError(Kind::bad_frame,
                            std::string("statepoold's reply to ") + name +
                                " does not verify: " + protocol::to_string(payload_error));
    }
    const bool status_ok = reply->status() == wire::Status::ok;
    if (send_error && status_ok) throw ConnectionError(*send_error);
    if (reply->id() != id && !(reply->id() == 0 && !status_ok)) {
      throw ConnectionError(
          Kind::bad_frame, std::string("statepoold answered request ") + std::to_string(id) + " (" +
                               name + ") with the reply to request " + std::to_string(reply->id()));
    }
    UniqueFd attached;
    if ((reply_header.flags & protocol::kFlagFdAttached) != 0) {
      if (received_fds.empty()) {
        throw ConnectionError(Kind::bad_frame,
                              std::string("statepoold's reply to ") + name +
                                  " is flagged FD_ATTACHED but carries no file descriptor");
      }
      attached = std::move(received_fds.front());
    }
    received_fds.clear();  // closes whatever else arrived: never leak a descriptor

    if (!status_ok) {
      std::string message = reply->message() != nullptr ? reply->message()->str() : "";
      if (message.empty()) {
        message = std::string("statepoold refused ") + name + ": " +
                  protocol::status_name(reply->status());
      }
      // Id 0 answers a frame the daemon could not read, or refuses the whole connection:
      // either way the daemon closes it.
      if (closes_connection(reply->status()) || reply->id() == 0 || send_error) {
        mark_broken("statepoold closed it: " + message);
      }
      throw Error(reply->status(), message);
    }
    if (reply->body_type() != expected || reply->body() == nullptr) {
      if (!(reply->body_type() == wire::ReplyBody::NONE && empty_reply(expected))) {
        throw ConnectionError(Kind::bad_frame, std::string("statepoold answered ") + name +
                                                   " with a " + reply_name(reply->body_type()) +
                                                   " body, expected " + reply_name(expected));
      }
    }
    if (fd_out != nullptr) *fd_out = std::move(attached);
    return *reply;
  } catch (const ConnectionError& error) {
    mark_broken(error.what());
    throw;
  }
}

std::uint32_t Impl::free_slots(ArenaId arena, std::span<const SlotId> slots) {
  if (slots.empty()) return 0;
  return call<wire::Free>(
      [&](auto& b) {
        return wire::CreateFree(b, arena, b.CreateVector(slots.data(), slots.size()));
      },
      [](const wire::FreeReply* r) { return r->freed(); });
}

void Impl::close_staging(StagingId staging) {
  call<wire::CloseStaging>([&](auto& b) { return wire::CreateCloseStaging(b, staging); },
                           [](const wire::CloseStagingReply*) {});
}

std::shared_ptr<const kernels::PageCodec> Impl::codec_for(LayoutId layout) {
  const std::lock_guard lock(codecs_mutex);
  const auto it = codecs.find(layout);
  return it == codecs.end() ? nullptr : it->second;
}

}  // namespace detail

namespace {

/// How long connect() retries a Hello refused with lease_busy (see connect()).
constexpr std::chrono::milliseconds kLeaseBusyRetry{2000};

using detail::Impl;
using detail::UniqueFd;
using Kind = ConnectionError::Kind;

std::string default_client_name() {
  std::string name;
  std::ifstream comm("/proc/self/comm");
  if (comm) std::getline(comm, name);
  if (name.empty()) name = "client";
  return name + "[" + std::to_string(::getpid()) + "]";
}

std::string str(const flatbuffers::String* s) {
  return s != nullptr ? s->str() : std::string();
}

// Reply values that cannot be right: not a transport failure, but nothing to build on.
[[noreturn]] void inconsistent(const std::string& what) {
  throw Error(wire::Status::internal, "statepoold sent an inconsistent reply: " + what +
                                          " (client and daemon builds may differ; report it)");
}

/// A codec named in a reply; one this client does not know is an inconsistent reply.
kernels::CodecId reply_codec(wire::CodecId codec) {
  try {
    return protocol::from_wire(codec);
  } catch (const StatusError& e) {
    inconsistent(e.what());
  }
}

/// How to map the memory a reply describes.
kernels::MemoryDescriptor memory_descriptor(const wire::MemoryDescriptor* in, const char* what) {
  try {
    return protocol::from_wire(in);
  } catch (const StatusError& e) {
    inconsistent(std::string(what) + ": " + e.what());
  }
}

/// Memory this process maps with mmap: a host memfd. Device memory is imported with the
/// CUDA driver instead (the CUDA backend), and stays unmapped here.
bool host_mappable(const kernels::MemoryDescriptor& memory) noexcept {
  return memory.space == kernels::MemorySpace::host &&
         memory.handle_kind == kernels::HandleKind::memfd;
}

/// Memory this process imports with the CUDA driver (the cuda backend).
bool device_memory(const kernels::MemoryDescriptor& memory) noexcept {
  return memory.space == kernels::MemorySpace::device &&
         (memory.handle_kind == kernels::HandleKind::cuda_vmm_fd ||
          memory.handle_kind == kernels::HandleKind::cuda_ipc);
}

}  // namespace

const char* to_string(ConnectionError::Kind kind) noexcept {
  switch (kind) {
    case Kind::connect_failed: return "connect_failed";
    case Kind::closed: return "closed";
    case Kind::timed_out: return "timed_out";
    case Kind::bad_frame: return "bad_frame";
    case Kind::io_error: return "io_error";
  }
  return "unknown";
}

double LayoutInfo::compression_ratio() const noexcept {
  return page_bytes == 0 ? 0.0 : static_cast<double>(fp32_bytes) / static_cast<double>(page_bytes);
}

std::uint64_t LayoutInfo::state_bytes(kernels::DType dtype) const noexcept {
  switch (dtype) {
    case kernels::DType::f32: return state_bytes_f32;
    case kernels::DType::bf16: return state_bytes_bf16;
    case kernels::DType::f16: return 0;
  }
  return 0;
}

double ArenaStats::compression_ratio() const noexcept {
  const std::uint64_t stored = stored_bytes_used();
  return stored == 0 ? 0.0 : static_cast<double>(fp32_bytes_used) / static_cast<double>(stored);
}

double TenantStats::compression_ratio() const noexcept {
  return stored_bytes == 0 ? 0.0
                           : static_cast<double>(fp32_bytes) / static_cast<double>(stored_bytes);
}

// ---------------------------------------------------------------------------------------
// Connection

Connection Connection::connect(const Options& options) {
  // A client that resumes its lease right after its previous connection closed can reach
  // the daemon before the daemon has seen that close: the lease is still attached and
  // Hello answers lease_busy. That state lasts microseconds, so retry for a short while.
  using Clock = std::chrono::steady_clock;
  const auto retry_for = std::min<std::chrono::milliseconds>(
      options.timeout.count() > 0 ? options.timeout : kLeaseBusyRetry, kLeaseBusyRetry);
  const auto give_up = Clock::now() + retry_for;
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    UniqueFd fd = detail::connect_unix(options.socket_path, options.timeout);
    auto impl = std::make_shared<Impl>(std::move(fd), options);
    Connection connection(std::move(impl));
    try {
      connection.say_hello(options);
      return connection;
    } catch (const Error& e) {
      if (e.status() != wire::Status::lease_busy || options.lease_token.empty() ||
          Clock::now() + pause >= give_up)
        throw;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

Connection Connection::from_fd(int fd, const Options& options) {
  UniqueFd owned(fd);
  if (!owned) throw ConnectionError(Kind::connect_failed, "Connection::from_fd: invalid fd");
  detail::prepare_socket(owned.get());
  auto impl = std::make_shared<Impl>(std::move(owned), options);
  Connection connection(std::move(impl));
  connection.say_hello(options);
  return connection;
}

void Connection::say_hello(const Options& options) {
  Impl& i = impl();
  const std::string name =
      options.client_name.empty() ? default_client_name() : options.client_name;
  i.call<wire::Hello>(
      [&](auto& b) {
        return wire::CreateHelloDirect(b, protocol::kMinProtocolVersion,
                                       protocol::kMaxProtocolVersion, options.tenant.c_str(),
                                       options.lease_token.c_str(), name.c_str());
      },
      [&](const wire::HelloReply* hello) {
        if (hello->version() < protocol::kMinProtocolVersion ||
            hello->version() > protocol::kMaxProtocolVersion) {
          throw Error(wire::Status::unsupported_version,
                      "statepoold chose protocol version " + std::to_string(hello->version()) +
                          ", this client speaks " + std::to_string(protocol::kMinProtocolVersion) +
                          ".." + std::to_string(protocol::kMaxProtocolVersion) +
                          "; upgrade the client library");
        }
        i.version = hello->version();
        i.lease_token = str(hello->lease_token());
        i.lease_resumed = hello->lease_resumed();
        i.resumed_slots = hello->resumed_slots();
        i.server = str(hello->server());
        i.grace_period = std::chrono::milliseconds(hello->grace_period_ms());
        i.max_frame_bytes = hello->max_frame_bytes();
      });
}

Connection::~Connection() = default;

Impl& Connection::impl() const {
  if (!impl_) {
    throw ConnectionError(Kind::closed, "use of a moved-from statepool::client::Connection");
  }
  return *impl_;
}

const std::string& Connection::lease_token() const {
  return impl().lease_token;
}
bool Connection::lease_resumed() const {
  return impl().lease_resumed;
}
std::uint32_t Connection::resumed_slots() const {
  return impl().resumed_slots;
}
std::chrono::milliseconds Connection::grace_period() const {
  return impl().grace_period;
}
std::uint16_t Connection::protocol_version() const {
  return impl().version;
}
const std::string& Connection::server() const {
  return impl().server;
}
std::uint32_t Connection::max_frame_bytes() const {
  return impl().max_frame_bytes;
}
bool Connection::healthy() const noexcept {
  return impl_ != nullptr && impl_->healthy();
}

LayoutInfo Connection::register_layout(const kernels::StateLayout& layout) {
  const std::string invalid = kernels::validate(layout);
  if (!invalid.empty()) throw Error(wire::Status::invalid_argument, "invalid layout: " + invalid);
  std::shared_ptr<const kernels::PageCodec> codec;
  try {
    codec = std::make_shared<const kernels::PageCodec>(layout);
  } catch (const std::invalid_argument& e) {
    throw Error(wire::Status::invalid_argument, std::string("invalid layout: ") + e.what());
  }

  Impl& i = impl();
  const std::string plan_digest =
      layout.plan != nullptr ? kernels::stepquant::digest(*layout.plan) : std::string();
  auto send = [&] {
    return i.call<wire::RegisterLayout>(
        [&](auto& b) {
          return wire::CreateRegisterLayout(b, protocol::to_wire(b, layout, plan_digest));
        },
        [](const wire::RegisterLayoutReply* r) {
          LayoutInfo info;
          info.id = r->layout_id();
          info.page_bytes = r->page_bytes();
          info.fp32_bytes = r->fp32_bytes();
          info.state_bytes_f32 = r->state_bytes_f32();
          info.state_bytes_bf16 = r->state_bytes_bf16();
          return info;
        });
  };
  LayoutInfo info;
  try {
    info = send();
  } catch (const ConnectionError&) {
    throw;
  } catch (const Error& e) {
    // The daemon does not know the plan yet: install it from here, then register again.
    if (e.status() != wire::Status::not_found || layout.plan == nullptr) throw;
    (void)install_plan(*layout.plan);
    info = send();
  }
  info.layout = layout;
  if (info.page_bytes != codec->page_bytes() ||
      info.state_bytes_f32 != codec->staged_bytes(kernels::DType::f32)) {
    throw Error(wire::Status::internal,
                "page format mismatch for layout '" + layout.name + "': statepoold says " +
                    std::to_string(info.page_bytes) + " page bytes and " +
                    std::to_string(info.state_bytes_f32) + " staged bytes, this client computes " +
                    std::to_string(codec->page_bytes()) + " and " +
                    std::to_string(codec->staged_bytes(kernels::DType::f32)) +
                    "; client and daemon were built from different kernels");
  }
  {
    const std::lock_guard lock(i.codecs_mutex);
    i.codecs[info.id] = std::move(codec);
  }
  return info;
}

PlanInfo Connection::install_plan(const kernels::stepquant::Plan& plan) {
  const std::vector<std::byte> bytes = kernels::stepquant::to_bytes(plan);
  return impl().call<wire::InstallPlan>(
      [&](auto& b) {
        return wire::CreateInstallPlan(
            b, b.CreateVector(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
      },
      [](const wire::InstallPlanReply* r) {
        PlanInfo info;
        info.digest = str(r->digest());
        info.units = r->units();
        info.pivots = r->pivots();
        info.average_bits = r->average_bits();
        info.created = r->created();
        return info;
      });
}

Arena Connection::open_arena(const LayoutInfo& layout, std::uint32_t pages) {
  Impl& i = impl();
  auto codec = i.codec_for(layout.id);
  if (codec == nullptr && kernels::validate(layout.layout).empty()) {
    try {
      codec = std::make_shared<const kernels::PageCodec>(layout.layout);
    } catch (const std::invalid_argument&) {
      codec = nullptr;  // no local page format; the arena is still usable by id
    }
  }
  Arena arena = open_arena(layout.id, pages);
  if (arena.codec_ == nullptr && codec != nullptr) {
    if (codec->page_bytes() != arena.page_bytes()) {
      inconsistent("arena page_bytes " + std::to_string(arena.page_bytes()) +
                   " differ from the layout's " + std::to_string(codec->page_bytes()));
    }
    arena.codec_ = std::move(codec);
  }
  return arena;
}

Arena Connection::open_arena(LayoutId layout_id, std::uint32_t pages) {
  Impl& i = impl();
  Arena arena;
  UniqueFd fd;
  i.call<wire::OpenArena>(
      [&](auto& b) { return wire::CreateOpenArena(b, layout_id, pages, i.legacy_ipc); },
      [&](const wire::OpenArenaReply* r) {
        arena.id_ = r->arena_id();
        arena.layout_id_ = layout_id;
        arena.page_bytes_ = r->page_bytes();
        arena.page_stride_ = r->page_stride();
        arena.page_count_ = r->page_count();
        arena.bytes_ = r->bytes();
        arena.backend_ = str(r->backend());
        arena.created_ = r->created();
        arena.memory_ = memory_descriptor(r->memory(), "arena");
      },
      &fd);
  arena.fd_ = fd.release();  // owned by the arena from here on, also if a check throws
  if (arena.memory_.handle_is_fd() && arena.fd_ < 0) {
    inconsistent("open_arena's reply carries no file descriptor for a " +
                 std::string(kernels::to_string(arena.memory_.handle_kind)) + " arena");
  }

  if (arena.page_stride_ < arena.page_bytes_) {
    inconsistent("page_stride " + std::to_string(arena.page_stride_) + " < page_bytes " +
                 std::to_string(arena.page_bytes_));
  }
  if (arena.page_count_ != 0 && arena.page_stride_ > arena.bytes_ / arena.page_count_) {
    inconsistent("arena of " + std::to_string(arena.page_count_) + " pages of stride " +
                 std::to_string(arena.page_stride_) + " does not fit in " +
                 std::to_string(arena.bytes_) + " bytes");
  }
  if (auto codec = i.codec_for(layout_id)) {
    if (codec->page_bytes() != arena.page_bytes_) {
      inconsistent("arena page_bytes " + std::to_string(arena.page_bytes_) +
                   " differ from the layout's " + std::to_string(codec->page_bytes()));
    }
    arena.codec_ = std::move(codec);
  }
  if (host_mappable(arena.memory_) || (device_memory(arena.memory_) && i.map_device_memory)) {
    arena.map();
  }
  return arena;
}

ArenaClose Connection::close_arena(Arena arena) {
  const ArenaId id = arena.id();
  if (id == 0) {
    throw Error(wire::Status::invalid_argument, "close_arena: the Arena is empty (moved from?)");
  }
  arena.reset();  // unmapped before the daemon frees it (legacy CUDA IPC requires that order)
  return close_arena(id);
}

ArenaClose Connection::close_arena(ArenaId arena) {
  ArenaClose out;
  impl().call<wire::CloseArena>([&](auto& b) { return wire::CreateCloseArena(b, arena); },
                                [&](const wire::CloseArenaReply* r) {
                                  out.bytes = r->bytes();
                                  out.snapshots_dropped = r->snapshots_dropped();
                                });
  return out;
}

Staging Connection::open_staging(std::uint64_t bytes) {
  if (bytes == 0) {
    throw Error(wire::Status::invalid_argument, "open_staging: bytes must be greater than 0");
  }
  Impl& i = impl();
  Staging staging;
  UniqueFd fd;
  i.call<wire::OpenStaging>(
      [&](auto& b) { return wire::CreateOpenStaging(b, bytes, i.legacy_ipc); },
      [&](const wire::OpenStagingReply* r) {
        staging.id_ = r->staging_id();
        staging.size_ = r->bytes();
        staging.memory_ = memory_descriptor(r->memory(), "staging buffer");
      },
      &fd);
  // From here the Staging object owns the daemon-side buffer: if mapping fails, its
  // destructor closes the buffer on the daemon (the lock is no longer held).
  staging.impl_ = impl_;
  staging.fd_ = fd.release();
  if (staging.memory_.handle_is_fd() && staging.fd_ < 0) {
    inconsistent("open_staging's reply carries no file descriptor for a " +
                 std::string(kernels::to_string(staging.memory_.handle_kind)) + " buffer");
  }
  if (staging.size_ < bytes) {
    inconsistent("staging buffer of " + std::to_string(staging.size_) + " bytes for a request of " +
                 std::to_string(bytes));
  }
  if (host_mappable(staging.memory_) || (device_memory(staging.memory_) && i.map_device_memory)) {
    staging.map();
  }
  return staging;
}

std::vector<Slot> Connection::allocate(const Arena& arena, std::uint32_t count) {
  return allocate(arena.id(), count);
}

std::vector<Slot> Connection::allocate(ArenaId arena, std::uint32_t count) {
  if (count == 0) {
    throw Error(wire::Status::invalid_argument, "allocate: count must be greater than 0");
  }
  Impl& i = impl();
  const std::vector<SlotId> ids = i.call<wire::Allocate>(
      [&](auto& b) { return wire::CreateAllocate(b, arena, count); },
      [](const wire::AllocateReply* r) {
        return r->slots() == nullptr ? std::vector<SlotId>()
                                     : std::vector<SlotId>(r->slots()->begin(), r->slots()->end());
      });
  // Slots are built without the lock: a Slot destructor (on a throw below) takes it.
  std::vector<Slot> out;
  out.reserve(ids.size());
  for (const SlotId id : ids) out.push_back(Slot(impl_, arena, id));
  if (out.size() != count) {
    inconsistent("asked for " + std::to_string(count) + " slots, got " +
                 std::to_string(out.size()));
  }
  return out;
}

Slot Connection::adopt(ArenaId arena, SlotId slot) {
  (void)impl();
  return Slot(impl_, arena, slot);
}

std::uint32_t Connection::free(std::span<Slot> slots) {
  std::map<ArenaId, std::vector<SlotId>> mine;
  std::vector<Slot*> foreign;
  for (Slot& slot : slots) {
    if (!slot.valid()) continue;
    if (slot.impl_ == impl_) {
      mine[slot.arena_id_].push_back(slot.id_);
      slot.impl_.reset();
    } else {
      foreign.push_back(&slot);
    }
  }
  std::uint32_t freed = 0;
  Impl& i = impl();
  for (const auto& [arena, ids] : mine) freed += i.free_slots(arena, ids);
  for (Slot* slot : foreign) {
    slot->free();
    ++freed;
  }
  return freed;
}

std::uint32_t Connection::free(ArenaId arena, std::span<const SlotId> slots) {
  return impl().free_slots(arena, slots);
}

namespace {

void require_valid(const Slot& slot, const char* call) {
  if (!slot.valid()) {
    throw Error(wire::Status::invalid_argument,
                std::string(call) + ": the Slot is not valid (moved from, freed or released)");
  }
}

void require_valid(const Staging& staging, const char* call) {
  if (!staging.valid()) {
    throw Error(wire::Status::invalid_argument,
                std::string(call) + ": the Staging buffer is not valid (moved from or closed)");
  }
}

}  // namespace

namespace {

/// The request's `after` field: the event's bytes, or none.
flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> after_to_wire(
    flatbuffers::FlatBufferBuilder& b, const std::optional<IpcEventBytes>& after) {
  if (!after) return 0;
  return b.CreateVector(reinterpret_cast<const std::uint8_t*>(after->data()), after->size());
}

}  // namespace

std::uint64_t Connection::compress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                                   kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  require_valid(slot, "compress");
  require_valid(staging, "compress");
  return compress(slot.arena_id(), slot.id(), staging.id(), offset, dtype, after);
}

std::uint64_t Connection::compress(ArenaId arena, SlotId slot, StagingId staging,
                                   std::uint64_t offset, kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  return impl().call<wire::Compress>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateCompress(b, arena, slot, staging, offset, protocol::to_wire(dtype),
                                    /*event=*/false, event);
      },
      [](const wire::CompressReply* r) { return r->page_bytes(); });
}

std::uint64_t Connection::decompress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                                     kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  require_valid(slot, "decompress");
  require_valid(staging, "decompress");
  return decompress(slot.arena_id(), slot.id(), staging.id(), offset, dtype, after);
}

std::uint64_t Connection::decompress(ArenaId arena, SlotId slot, StagingId staging,
                                     std::uint64_t offset, kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  return impl().call<wire::Decompress>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateDecompress(b, arena, slot, staging, offset, protocol::to_wire(dtype),
                                      /*event=*/false, event);
      },
      [](const wire::DecompressReply* r) { return r->state_bytes(); });
}

void Connection::copy(const Slot& src, const Slot& dst, const std::optional<IpcEventBytes>& after) {
  require_valid(src, "copy");
  require_valid(dst, "copy");
  if (src.arena_id() != dst.arena_id()) {
    throw Error(wire::Status::invalid_argument, "copy: the slots belong to different arenas (" +
                                                    std::to_string(src.arena_id()) + " and " +
                                                    std::to_string(dst.arena_id()) +
                                                    "); pages are copied within one arena");
  }
  copy(src.arena_id(), src.id(), dst.id(), after);
}

void Connection::copy(ArenaId arena, SlotId src, SlotId dst,
                      const std::optional<IpcEventBytes>& after) {
  impl().call<wire::Copy>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateCopy(b, arena, src, dst, /*event=*/false, event);
      },
      [](const wire::CopyReply*) {});
}

namespace {

std::optional<IpcEventBytes> event_of(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return std::nullopt;
  if (bytes->size() != IpcEventBytes{}.size()) {
    inconsistent("an IPC event of " + std::to_string(bytes->size()) + " bytes (expected " +
                 std::to_string(IpcEventBytes{}.size()) + ")");
  }
  IpcEventBytes out;
  std::memcpy(out.data(), bytes->data(), out.size());
  return out;
}

}  // namespace

Pending Connection::compress_async(ArenaId arena, SlotId slot, StagingId staging,
                                   std::uint64_t offset, kernels::DType dtype,
                                   const std::optional<IpcEventBytes>& after) {
  return impl().call<wire::Compress>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateCompress(b, arena, slot, staging, offset, protocol::to_wire(dtype),
                                    /*event=*/true, event);
      },
      [](const wire::CompressReply* r) {
        return Pending{r->page_bytes(), event_of(r->event())};
      });
}

Pending Connection::decompress_async(ArenaId arena, SlotId slot, StagingId staging,
                                     std::uint64_t offset, kernels::DType dtype,
                                     const std::optional<IpcEventBytes>& after) {
  return impl().call<wire::Decompress>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateDecompress(b, arena, slot, staging, offset, protocol::to_wire(dtype),
                                      /*event=*/true, event);
      },
      [](const wire::DecompressReply* r) {
        return Pending{r->state_bytes(), event_of(r->event())};
      });
}

Pending Connection::copy_async(ArenaId arena, SlotId src, SlotId dst,
                               const std::optional<IpcEventBytes>& after) {
  return impl().call<wire::Copy>(
      [&](auto& b) {
        const auto event = after_to_wire(b, after);
        return wire::CreateCopy(b, arena, src, dst, /*event=*/true, event);
      },
      [](const wire::CopyReply* r) {
        return Pending{0, r == nullptr ? std::nullopt : event_of(r->event())};
      });
}

namespace {

flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> bytes_to_wire(
    flatbuffers::FlatBufferBuilder& b, std::string_view bytes) {
  return b.CreateVector(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

flatbuffers::Offset<wire::SnapshotKey> key_to_wire(flatbuffers::FlatBufferBuilder& b,
                                                   const SnapshotKey& key) {
  const auto prefix = bytes_to_wire(b, key.prefix);
  return wire::CreateSnapshotKey(b, prefix, key.position);
}

std::string bytes_of(const flatbuffers::Vector<std::uint8_t>* bytes) {
  if (bytes == nullptr) return {};
  return {reinterpret_cast<const char*>(bytes->data()), bytes->size()};
}

flatbuffers::Offset<wire::KvStaging> kv_staging_to_wire(flatbuffers::FlatBufferBuilder& b,
                                                        const KvStaging& where) {
  return wire::CreateKvStaging(b, where.staging, where.offset, protocol::to_wire(where.dtype));
}

/// A reply's KV blocks; an unknown codec (a newer daemon) is an inconsistent reply.
std::optional<kernels::KvBlocks> kv_of(const wire::KvBlocks* kv) {
  if (kv == nullptr) return std::nullopt;
  try {
    return protocol::from_wire(*kv);
  } catch (const StatusError& e) {
    inconsistent(e.what());
  }
}

}  // namespace

SnapshotPut Connection::put_snapshot(const Slot& slot, const SnapshotKey& key,
                                     const std::optional<SnapshotKv>& kv) {
  return put_snapshot(slot.arena_id(), slot.id(), key, kv);
}

SnapshotPut Connection::put_snapshot(ArenaId arena, SlotId slot, const SnapshotKey& key,
                                     const std::optional<SnapshotKv>& kv) {
  return impl().call<wire::PutSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto blocks = kv ? protocol::to_wire(b, kv->blocks) : 0;
        const auto where = kv ? kv_staging_to_wire(b, kv->values) : 0;
        return wire::CreatePutSnapshot(b, arena, slot, k, blocks, where);
      },
      [](const wire::PutSnapshotReply* r) {
        SnapshotPut out;
        out.created = r->created();
        out.evicted = r->evicted();
        out.page_bytes = r->page_bytes();
        out.kv = kv_of(r->kv());
        out.kv_bytes = r->kv_bytes();
        out.pages = r->pages();
        return out;
      });
}

SnapshotGet Connection::get_snapshot(const SnapshotKey& key, const Slot& slot,
                                     const std::optional<KvStaging>& kv) {
  return get_snapshot(key, slot.arena_id(), slot.id(), kv);
}

SnapshotGet Connection::get_snapshot(const SnapshotKey& key, ArenaId arena, SlotId slot,
                                     const std::optional<KvStaging>& kv) {
  return impl().call<wire::GetSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto where = kv ? kv_staging_to_wire(b, *kv) : 0;
        return wire::CreateGetSnapshot(b, arena, slot, k, where);
      },
      [](const wire::GetSnapshotReply* r) {
        SnapshotGet out;
        out.hit = r->hit();
        out.other_layouts = r->other_layouts();
        out.page_bytes = r->page_bytes();
        out.tier = str(r->tier());
        out.kv = kv_of(r->kv());
        out.kv_bytes = r->kv_bytes();
        out.kv_delivered = r->kv_delivered();
        return out;
      });
}

SnapshotExport Connection::export_snapshot(const SnapshotKey& key, const Staging* staging,
                                           std::uint64_t offset, std::string_view layout_digest) {
  return impl().call<wire::ExportSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        const auto digest = b.CreateString(layout_digest.data(), layout_digest.size());
        return wire::CreateExportSnapshot(b, k, digest, staging == nullptr ? 0 : staging->id(),
                                          offset);
      },
      [](const wire::ExportSnapshotReply* r) {
        SnapshotExport out;
        out.found = r->found();
        out.value_bytes = r->value_bytes();
        out.layout_digest = str(r->layout_digest());
        out.kv = kv_of(r->kv());
        return out;
      });
}

SnapshotImport Connection::import_snapshot(const Staging& staging, std::uint64_t offset,
                                           std::uint64_t bytes) {
  return impl().call<wire::ImportSnapshot>(
      [&](auto& b) { return wire::CreateImportSnapshot(b, staging.id(), offset, bytes); },
      [](const wire::ImportSnapshotReply* r) {
        SnapshotImport out;
        out.created = r->created();
        out.evicted = r->evicted();
        out.arena_id = r->arena_id();
        if (const auto* k = r->key()) out.key = SnapshotKey{bytes_of(k->prefix()), k->position()};
        out.kv = kv_of(r->kv());
        out.pages = r->pages();
        return out;
      });
}

std::uint32_t Connection::delete_snapshot(const SnapshotKey& key) {
  return impl().call<wire::DeleteSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        return wire::CreateDeleteSnapshot(b, k);
      },
      [](const wire::DeleteSnapshotReply* r) { return r->deleted(); });
}

std::uint32_t Connection::pin_snapshot(const SnapshotKey& key, bool pinned) {
  return impl().call<wire::PinSnapshot>(
      [&](auto& b) {
        const auto k = key_to_wire(b, key);
        return wire::CreatePinSnapshot(b, k, pinned);
      },
      [](const wire::PinSnapshotReply* r) { return r->changed(); });
}

SnapshotList Connection::list_snapshots(std::string_view prefix, std::uint32_t limit) {
  return impl().call<wire::ListSnapshots>(
      [&](auto& b) {
        const auto p = bytes_to_wire(b, prefix);
        return wire::CreateListSnapshots(b, p, limit);
      },
      [](const wire::ListSnapshotsReply* r) {
        SnapshotList out;
        out.truncated = r->truncated();
        out.snapshot_namespace = str(r->snapshot_namespace());
        if (const auto* entries = r->snapshots()) {
          out.snapshots.reserve(entries->size());
          for (const auto* e : *entries) {
            SnapshotInfo info;
            if (const auto* k = e->key())
              info.key = SnapshotKey{bytes_of(k->prefix()), k->position()};
            info.layout_id = e->layout_id();
            info.layout_name = str(e->layout_name());
            info.codec = reply_codec(e->codec());
            info.tenant = str(e->tenant());
            info.arena_id = e->arena_id();
            info.page_bytes = e->page_bytes();
            info.fp32_bytes = e->fp32_bytes();
            info.pinned = e->pinned();
            info.hits = e->hits();
            info.age_seconds = e->age_seconds();
            info.idle_seconds = e->idle_seconds();
            info.kv = kv_of(e->kv());
            info.kv_bytes = e->kv_bytes();
            info.pages = e->pages();
            info.layout_digest = str(e->layout_digest());
            out.snapshots.push_back(std::move(info));
          }
        }
        return out;
      });
}

std::string Connection::plan_capacity(const PlanRequest& request) {
  return impl().call<wire::PlanCapacity>(
      [&](auto& b) {
        const auto config = b.CreateString(request.model_config);
        const auto kv = b.CreateString(request.kv);
        const auto codecs = b.CreateVector(protocol::to_wire(request.codecs));
        wire::PlanCapacityBuilder pb(b);
        pb.add_model_config(config);
        pb.add_weight_bits(request.weight_bits);
        pb.add_kv_dtype(kv);
        pb.add_codecs(codecs);
        pb.add_slots(request.slots);
        pb.add_context(request.context);
        pb.add_gpu_memory(request.gpu_memory);
        if (request.reserved) pb.add_reserved(*request.reserved);
        pb.add_tp(request.tp);
        if (request.concurrency) pb.add_concurrency(*request.concurrency);
        return pb.Finish();
      },
      [](const wire::PlanCapacityReply* r) { return str(r->report_json()); });
}

Fits Connection::fits_now(const LayoutInfo& layout, std::uint32_t slots,
                          const std::vector<kernels::CodecId>& codecs) {
  return impl().call<wire::FitsNow>(
      [&](auto& b) {
        return wire::CreateFitsNow(b, layout.id, slots, b.CreateVector(protocol::to_wire(codecs)));
      },
      [](const wire::FitsNowReply* r) {
        Fits out;
        out.tenant = str(r->tenant());
        out.pool_capacity_bytes = r->pool_capacity_bytes();
        out.pool_free_bytes = r->pool_free_bytes();
        if (r->has_quota()) out.quota_free_bytes = r->quota_free_bytes();
        out.max_arena_pages = r->max_arena_pages();
        if (const auto* rows = r->fits()) {
          for (const auto* row : *rows) {
            CodecFit f;
            f.codec = reply_codec(row->codec());
            f.nominal_plan = row->nominal_plan();
            f.page_stride = row->page_stride();
            f.arena_free_pages = row->arena_free_pages();
            f.new_arena_pages = row->new_arena_pages();
            f.requests = row->requests();
            f.limited_by = str(row->limited_by());
            out.codecs.push_back(std::move(f));
          }
        }
        return out;
      });
}

Stats Connection::stats() {
  return impl().call<wire::Stats>([](auto& b) { return wire::CreateStats(b); },
                                  [](const wire::StatsReply* r) {
                                    Stats out;
                                    if (const auto* arenas = r->arenas()) {
                                      out.arenas.reserve(arenas->size());
                                      for (const auto* a : *arenas) {
                                        ArenaStats s;
                                        s.arena_id = a->arena_id();
                                        s.tenant = str(a->tenant());
                                        s.layout_id = a->layout_id();
                                        s.layout_name = str(a->layout_name());
                                        s.codec = reply_codec(a->codec());
                                        s.backend = str(a->backend());
                                        s.page_bytes = a->page_bytes();
                                        s.page_stride = a->page_stride();
                                        s.pages_total = a->pages_total();
                                        s.pages_used = a->pages_used();
                                        s.bytes_total = a->bytes_total();
                                        s.fp32_bytes_used = a->fp32_bytes_used();
                                        s.snapshot_pages = a->snapshot_pages();
                                        out.arenas.push_back(std::move(s));
                                      }
                                    }
                                    if (const auto* tenants = r->tenants()) {
                                      out.tenants.reserve(tenants->size());
                                      for (const auto* t : *tenants) {
                                        TenantStats s;
                                        s.tenant = str(t->tenant());
                                        s.quota_bytes = t->quota_bytes();
                                        s.reserved_bytes = t->reserved_bytes();
                                        s.pages_used = t->pages_used();
                                        s.stored_bytes = t->stored_bytes();
                                        s.fp32_bytes = t->fp32_bytes();
                                        s.snapshots = t->snapshots();
                                        s.snapshot_bytes = t->snapshot_bytes();
                                        s.pinned_snapshots = t->pinned_snapshots();
                                        s.snapshot_hits = t->snapshot_hits();
                                        s.snapshot_misses = t->snapshot_misses();
                                        s.snapshot_evictions = t->snapshot_evictions();
                                        s.snapshot_demotions = t->snapshot_demotions();
                                        s.snapshot_hits_host = t->snapshot_hits_host();
                                        s.snapshot_hits_remote = t->snapshot_hits_remote();
                                        out.tenants.push_back(std::move(s));
                                      }
                                    }
                                    out.clients_connected = r->clients_connected();
                                    out.leases_active = r->leases_active();
                                    out.leases_orphaned = r->leases_orphaned();
                                    out.pages_reclaimed_total = r->pages_reclaimed_total();
                                    out.pool_capacity_bytes = r->pool_capacity_bytes();
                                    out.pool_reserved_bytes = r->pool_reserved_bytes();
                                    out.uptime_seconds = r->uptime_seconds();
                                    return out;
                                  });
}

std::chrono::nanoseconds Connection::ping() {
  const auto start = detail::Clock::now();
  impl().call<wire::Ping>([](auto& b) { return wire::CreatePing(b); },
                          [](const wire::PingReply*) {});
  return std::chrono::duration_cast<std::chrono::nanoseconds>(detail::Clock::now() - start);
}

void Connection::drain() {
  impl().call<wire::Drain>([](auto& b) { return wire::CreateDrain(b); },
                           [](const wire::DrainReply*) {});
}

}  // namespace statepool::client
