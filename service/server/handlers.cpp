#include "server/handlers.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>

#include "log.hpp"
#include "pool/accounting.hpp"
#include "server/capacity.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

using wire::Status;
namespace fb = flatbuffers;

constexpr std::uint32_t kMaxSlotsPerRequest = 65536;
constexpr const char* kServerName = "statepoold 0.1.0";

std::string str(const fb::String* s) {
  return s == nullptr ? std::string() : s->str();
}

kernels::StateLayout from_wire(const wire::Layout& in, const Pool& pool) {
  STATEPOOL_EXPECTS(in.arch() <= wire::Arch::MAX, Status::invalid_argument,
                    cat("unknown arch value ", static_cast<int>(in.arch())));
  STATEPOOL_EXPECTS(in.conv_dtype() <= wire::DType::MAX, Status::invalid_argument,
                    cat("unknown conv_dtype value ", static_cast<int>(in.conv_dtype())));
  STATEPOOL_EXPECTS(in.codec() <= wire::CodecId::MAX, Status::invalid_argument,
                    cat("unknown codec value ", static_cast<int>(in.codec())));
  kernels::StateLayout out;
  out.name = str(in.name());
  STATEPOOL_EXPECTS(out.name.size() <= 128, Status::invalid_argument,
                    "layout name longer than 128 bytes");
  out.arch = static_cast<kernels::Arch>(in.arch());
  out.num_layers = in.num_layers();
  out.num_heads = in.num_heads();
  out.key_dim = in.key_dim();
  out.value_dim = in.value_dim();
  out.conv_channels = in.conv_channels();
  out.conv_width = in.conv_width();
  out.conv_dtype = static_cast<kernels::DType>(in.conv_dtype());
  out.codec.id = static_cast<kernels::CodecId>(in.codec());
  out.codec.group_size = in.codec_params() != nullptr ? in.codec_params()->group_size() : 0;
  if (in.codec_params() != nullptr) {
    STATEPOOL_EXPECTS(
        in.codec_params()->variant() <= wire::StepQuantVariant::MAX, Status::invalid_argument,
        cat("unknown stepquant variant value ", static_cast<int>(in.codec_params()->variant())));
    out.codec.variant = static_cast<kernels::StepQuantVariant>(in.codec_params()->variant());
  }
  const std::string digest = str(in.plan_digest());
  if (!digest.empty()) {
    out.plan = pool.plan(digest);  // not_found names how to install it
  } else {
    STATEPOOL_EXPECTS(out.codec.id != kernels::CodecId::stepquant4 &&
                          out.codec.id != kernels::CodecId::stepquant6,
                      Status::invalid_argument,
                      cat("codec ", kernels::to_string(out.codec.id),
                          " needs a calibration plan: set the layout's plan_digest to an "
                          "installed plan (InstallPlan, or statepoold --plan FILE)"));
  }
  return out;
}

// Codecs a capacity request asks about; empty = the planner's list.
std::vector<kernels::CodecId> wire_codecs(const fb::Vector<wire::CodecId>* in) {
  std::vector<kernels::CodecId> out;
  if (in == nullptr) return out;
  STATEPOOL_EXPECTS(in->size() <= 64, Status::invalid_argument,
                    cat("at most 64 codecs per request, got ", in->size()));
  for (const wire::CodecId id : *in) {
    STATEPOOL_EXPECTS(id <= wire::CodecId::MAX, Status::invalid_argument,
                      cat("unknown codec value ", static_cast<int>(id)));
    out.push_back(static_cast<kernels::CodecId>(id));
  }
  return out;
}

kernels::DType staging_dtype(wire::DType dtype) {
  STATEPOOL_EXPECTS(
      dtype == wire::DType::f32 || dtype == wire::DType::bf16, Status::invalid_argument,
      cat("staged states are f32 or bf16, got dtype value ", static_cast<int>(dtype)));
  return static_cast<kernels::DType>(dtype);
}

Memory& staging_buffer(ConnectionState& c, std::uint32_t id) {
  const auto it = c.staging.find(id);
  STATEPOOL_EXPECTS(it != c.staging.end(), Status::not_found,
                    cat("no staging buffer ", id, " on this connection"));
  return *it->second;
}

// [offset, offset + bytes) must lie inside the staging buffer (overflow-safe).
std::span<std::byte> staging_range(Memory& memory, std::uint64_t offset, std::size_t bytes) {
  const auto all = memory.bytes();
  STATEPOOL_EXPECTS(offset <= all.size() && bytes <= all.size() - offset, Status::invalid_argument,
                    cat("staging range [", offset, ", ", offset + bytes, ") exceeds the ",
                        all.size(), "-byte staging buffer"));
  return all.subspan(offset, bytes);
}

void require_hello(const ConnectionState& c) {
  STATEPOOL_EXPECTS(c.hello_done, Status::not_hello,
                    "the first request on a connection must be hello");
}

void hello(ServerContext& s, ConnectionState& c, const wire::Hello& in, HandlerResult& r,
           std::uint64_t id) {
  STATEPOOL_EXPECTS(!c.hello_done, Status::invalid_argument,
                    "hello was already done on this connection");
  if (in.max_version() < protocol::kMinProtocolVersion ||
      in.min_version() > protocol::kMaxProtocolVersion || in.min_version() > in.max_version()) {
    throw StatusError(Status::unsupported_version,
                      cat("client speaks protocol versions ", in.min_version(), "..",
                          in.max_version(), ", daemon speaks ", protocol::kMinProtocolVersion, "..",
                          protocol::kMaxProtocolVersion));
  }
  const std::string tenant = in.tenant() == nullptr || in.tenant()->size() == 0
                                 ? std::string("default")
                                 : in.tenant()->str();
  s.pool.check_peer(tenant, c.uid, c.gid);  // unknown_tenant / permission_denied
  const LeaseGrant grant = s.pool.attach_lease(tenant, str(in.lease_token()));
  c.hello_done = true;
  c.tenant = tenant;
  c.lease = grant.id;
  c.client_name = str(in.client_name()).substr(0, 128);
  c.version = std::min(in.max_version(), protocol::kMaxProtocolVersion);
  LOG_INFO("session", "connection ", c.id, ": client '", c.client_name, "' (pid ", c.pid, ", uid ",
           c.uid, ") tenant '", tenant, "', lease ", grant.token.substr(0, 8), "… ",
           grant.resumed ? cat("resumed with ", grant.slots, " slots") : std::string("new"));
  auto& b = r.builder;
  const auto reply = wire::CreateHelloReply(
      b, c.version, b.CreateString(grant.token), grant.resumed, grant.slots,
      b.CreateString(kServerName), static_cast<std::uint32_t>(s.config.pool.grace_period.count()),
      s.config.max_frame_bytes);
  b.Finish(wire::CreateReply(b, id, Status::ok, 0, wire::ReplyBody::HelloReply, reply.Union()));
}

template <class Body>
void finish(HandlerResult& r, std::uint64_t id, fb::Offset<Body> body) {
  r.builder.Finish(wire::CreateReply(r.builder, id, Status::ok, 0,
                                     wire::ReplyBodyTraits<Body>::enum_value, body.Union()));
}

void dispatch(ServerContext& s, ConnectionState& c, const wire::Request& req, HandlerResult& r) {
  const std::uint64_t id = req.id();
  auto& b = r.builder;
  if (req.body() == nullptr) {
    // The verifier accepts a union type without its table; every request needs one.
    r.close_after = true;
    throw StatusError(
        Status::protocol_error,
        cat("request of type ", protocol::request_name(req.body_type()), " has no body"));
  }
  if (req.body_type() == wire::RequestBody::Hello) {
    try {
      hello(s, c, *req.body_as_Hello(), r, id);
    } catch (...) {
      r.close_after = true;  // a connection without a lease is of no use: say why, then close
      throw;
    }
    return;
  }
  if (!c.hello_done) r.close_after = true;
  require_hello(c);

  switch (req.body_type()) {
    case wire::RequestBody::RegisterLayout: {
      const auto* in = req.body_as_RegisterLayout();
      STATEPOOL_EXPECTS(in->layout() != nullptr, Status::invalid_argument,
                        "register_layout without a layout");
      const LayoutId layout_id = s.pool.register_layout(from_wire(*in->layout(), s.pool));
      const auto codec = s.pool.layout(layout_id);
      finish(r, id,
             wire::CreateRegisterLayoutReply(b, layout_id, codec->page_bytes(), codec->fp32_bytes(),
                                             codec->staged_bytes(kernels::DType::f32),
                                             codec->staged_bytes(kernels::DType::bf16)));
      return;
    }
    case wire::RequestBody::OpenArena: {
      const auto* in = req.body_as_OpenArena();
      const ArenaInfo a = s.pool.open_arena(c.tenant, in->layout_id(), in->pages());
      if (a.created) {
        LOG_INFO("pool", "arena ", a.id, " created for tenant '", a.tenant, "', layout '",
                 a.layout_name, "' (", kernels::to_string(a.codec), "): ", a.page_count,
                 " pages of ", a.page_bytes, " B, ", format_bytes(a.bytes));
      }
      r.fd = a.fd;
      finish(r, id,
             wire::CreateOpenArenaReply(b, a.id, a.bytes, a.page_bytes, a.page_stride, a.page_count,
                                        b.CreateString(a.backend), a.created));
      return;
    }
    case wire::RequestBody::Allocate: {
      const auto* in = req.body_as_Allocate();
      STATEPOOL_EXPECTS(
          in->count() >= 1 && in->count() <= kMaxSlotsPerRequest, Status::invalid_argument,
          cat("allocate count must be between 1 and ", kMaxSlotsPerRequest, ", got ", in->count()));
      const auto slots = s.pool.allocate(c.lease, in->arena_id(), in->count());
      finish(r, id, wire::CreateAllocateReply(b, b.CreateVector(slots)));
      return;
    }
    case wire::RequestBody::Free: {
      const auto* in = req.body_as_Free();
      STATEPOOL_EXPECTS(in->slots() != nullptr && in->slots()->size() > 0, Status::invalid_argument,
                        "free without slots");
      const std::vector<SlotId> slots(in->slots()->begin(), in->slots()->end());
      const std::uint32_t freed = s.pool.free(c.lease, in->arena_id(), slots);
      finish(r, id, wire::CreateFreeReply(b, freed));
      return;
    }
    case wire::RequestBody::OpenStaging: {
      const auto* in = req.body_as_OpenStaging();
      STATEPOOL_EXPECTS(in->bytes() > 0, Status::invalid_argument,
                        "staging bytes must be positive");
      STATEPOOL_EXPECTS(
          in->bytes() <=
              s.config.max_staging_bytes - std::min(c.staging_bytes, s.config.max_staging_bytes),
          Status::quota_exceeded,
          cat("staging limit of this connection exceeded: ", format_bytes(c.staging_bytes),
              " held + ", format_bytes(in->bytes()), " requested > ",
              format_bytes(s.config.max_staging_bytes), " (--max-staging-bytes)"));
      const std::uint32_t staging_id = c.next_staging_id++;
      auto memory = s.staging_backend.allocate(static_cast<std::size_t>(in->bytes()),
                                               cat("statepool-staging-", c.id, "-", staging_id));
      r.fd = memory->share_fd();
      c.staging_bytes += in->bytes();
      c.staging.emplace(staging_id, std::move(memory));
      finish(r, id, wire::CreateOpenStagingReply(b, staging_id, in->bytes()));
      return;
    }
    case wire::RequestBody::CloseStaging: {
      const auto* in = req.body_as_CloseStaging();
      const auto it = c.staging.find(in->staging_id());
      STATEPOOL_EXPECTS(it != c.staging.end(), Status::not_found,
                        cat("no staging buffer ", in->staging_id(), " on this connection"));
      c.staging_bytes -= it->second->bytes().size();
      c.staging.erase(it);
      finish(r, id, wire::CreateCloseStagingReply(b));
      return;
    }
    case wire::RequestBody::Compress: {
      const auto* in = req.body_as_Compress();
      const kernels::DType dtype = staging_dtype(in->dtype());
      const PageRef page = s.pool.page(c.lease, in->arena_id(), in->slot());
      Memory& staging = staging_buffer(c, in->staging_id());
      const auto src = staging_range(staging, in->offset(), page.codec->staged_bytes(dtype));
      try {
        page.codec->encode(src, dtype, page.bytes);
      } catch (const kernels::NonFiniteError& e) {
        throw StatusError(Status::not_finite, e.what());
      } catch (const std::invalid_argument& e) {
        throw StatusError(Status::invalid_argument, e.what());
      }
      finish(r, id, wire::CreateCompressReply(b, page.codec->page_bytes()));
      return;
    }
    case wire::RequestBody::Decompress: {
      const auto* in = req.body_as_Decompress();
      const kernels::DType dtype = staging_dtype(in->dtype());
      const PageRef page = s.pool.page(c.lease, in->arena_id(), in->slot());
      Memory& staging = staging_buffer(c, in->staging_id());
      const std::size_t bytes = page.codec->staged_bytes(dtype);
      const auto dst = staging_range(staging, in->offset(), bytes);
      try {
        page.codec->decode(page.bytes, dtype, dst);
      } catch (const std::invalid_argument& e) {
        throw StatusError(Status::invalid_argument, e.what());
      }
      finish(r, id, wire::CreateDecompressReply(b, bytes));
      return;
    }
    case wire::RequestBody::Copy: {
      const auto* in = req.body_as_Copy();
      const PageRef src = s.pool.page(c.lease, in->arena_id(), in->src_slot());
      const PageRef dst = s.pool.page(c.lease, in->arena_id(), in->dst_slot());
      if (src.bytes.data() != dst.bytes.data())
        std::memcpy(dst.bytes.data(), src.bytes.data(), src.bytes.size());
      finish(r, id, wire::CreateCopyReply(b));
      return;
    }
    case wire::RequestBody::Stats: {
      PoolStats stats = s.pool.stats();
      // Tenants see only themselves; the daemon's own uid and root (operators) see all.
      if (c.uid != 0 && c.uid != geteuid()) {
        std::erase_if(stats.arenas, [&](const ArenaInfo& a) { return a.tenant != c.tenant; });
        std::erase_if(stats.tenants, [&](const TenantUsage& t) { return t.name != c.tenant; });
      }
      std::vector<fb::Offset<wire::ArenaStats>> arenas;
      for (const auto& a : stats.arenas) {
        arenas.push_back(wire::CreateArenaStats(
            b, a.id, b.CreateString(a.tenant), a.layout, b.CreateString(a.layout_name),
            static_cast<wire::CodecId>(a.codec), b.CreateString(a.backend), a.page_bytes,
            a.page_stride, a.page_count, a.pages_used, a.bytes,
            static_cast<std::uint64_t>(a.pages_used) * a.fp32_page_bytes));
      }
      std::vector<fb::Offset<wire::TenantStats>> tenants;
      for (const auto& t : stats.tenants) {
        tenants.push_back(wire::CreateTenantStats(b, b.CreateString(t.name), t.quota_bytes,
                                                  t.reserved_bytes, t.pages_used, t.stored_bytes,
                                                  t.fp32_bytes));
      }
      const double uptime =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
      finish(r, id,
             wire::CreateStatsReply(b, b.CreateVector(arenas), b.CreateVector(tenants),
                                    s.clients_connected(), stats.leases_active,
                                    stats.leases_orphaned, stats.pages_reclaimed_total,
                                    stats.capacity_bytes, stats.reserved_bytes, uptime));
      return;
    }
    case wire::RequestBody::InstallPlan: {
      const auto* in = req.body_as_InstallPlan();
      STATEPOOL_EXPECTS(in->plan() != nullptr && in->plan()->size() > 0, Status::invalid_argument,
                        "install_plan without plan bytes");
      std::shared_ptr<const kernels::stepquant::Plan> plan;
      try {
        plan = std::make_shared<const kernels::stepquant::Plan>(kernels::stepquant::from_bytes(
            {reinterpret_cast<const std::byte*>(in->plan()->data()), in->plan()->size()}));
      } catch (const std::invalid_argument& e) {
        throw StatusError(Status::invalid_argument, cat("invalid plan: ", e.what()));
      }
      const PlanInfo info = s.pool.install_plan(plan);
      if (info.created) {
        LOG_INFO("pool", "plan ", info.digest, " installed by connection ", c.id, ": ",
                 kernels::to_string(plan->arch), " ", plan->num_layers, "x", plan->num_heads, "x",
                 plan->key_dim, "x", plan->value_dim, ", ", info.units, " units, ", info.pivots,
                 " pivots, ", info.average_bits, " bits on average");
      }
      finish(r, id,
             wire::CreateInstallPlanReply(b, b.CreateString(info.digest), info.units, info.pivots,
                                          info.average_bits, info.created));
      return;
    }
    case wire::RequestBody::PlanCapacity: {
      const auto* in = req.body_as_PlanCapacity();
      planner::PlanInputs inputs;
      if (in->weight_bits() != 0) inputs.weight_bits = in->weight_bits();
      if (in->kv_dtype() != nullptr && in->kv_dtype()->size() > 0) {
        STATEPOOL_EXPECTS(planner::parse_kv_dtype(in->kv_dtype()->string_view(), inputs.kv),
                          Status::invalid_argument,
                          cat("unknown kv_dtype '", in->kv_dtype()->str().substr(0, 32),
                              "' (bf16, fp8, kivi2, kivi4, flexgen4)"));
      }
      inputs.codecs = wire_codecs(in->codecs());
      if (in->slots() != 0) inputs.slots = in->slots();
      if (in->context() != 0) inputs.context = in->context();
      if (in->gpu_memory() != 0) inputs.gpu_memory = in->gpu_memory();
      if (in->reserved()) inputs.reserved = *in->reserved();
      if (in->tp() != 0) inputs.tp = in->tp();
      if (in->concurrency()) inputs.concurrency = *in->concurrency();
      const std::string report = plan_capacity_json(
          s.pool,
          in->model_config() == nullptr ? std::string_view() : in->model_config()->string_view(),
          inputs, c.tenant);
      finish(r, id, wire::CreatePlanCapacityReply(b, b.CreateString(report)));
      return;
    }
    case wire::RequestBody::FitsNow: {
      const auto* in = req.body_as_FitsNow();
      const auto layout = s.pool.layout(in->layout_id());  // not_found
      const planner::FitsReport fits =
          fits_now(s.pool, layout->layout(), c.tenant, in->slots() == 0 ? 1 : in->slots(),
                   wire_codecs(in->codecs()));
      std::vector<fb::Offset<wire::CodecFit>> rows;
      for (const planner::FitRow& row : fits.rows) {
        rows.push_back(wire::CreateCodecFit(b, static_cast<wire::CodecId>(row.codec),
                                            row.nominal_plan, row.page_stride, row.arena_pages,
                                            row.new_pages, row.requests,
                                            b.CreateString(planner::to_string(row.limit))));
      }
      finish(r, id,
             wire::CreateFitsNowReply(b, b.CreateString(fits.live.tenant), fits.live.capacity,
                                      fits.live.free, fits.live.quota_free.has_value(),
                                      fits.live.quota_free.value_or(0), fits.live.max_arena_pages,
                                      b.CreateVector(rows)));
      return;
    }
    case wire::RequestBody::Ping: {
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      finish(r, id,
             wire::CreatePingReply(
                 b, static_cast<std::uint64_t>(
                        std::chrono::duration_cast<std::chrono::nanoseconds>(now).count())));
      return;
    }
    case wire::RequestBody::Drain: {
      STATEPOOL_EXPECTS(
          c.uid == 0 || c.uid == geteuid(), Status::permission_denied,
          cat("drain needs uid 0 or the daemon's uid ", geteuid(), "; peer uid is ", c.uid));
      s.request_drain(cat("drain request from connection ", c.id, " (pid ", c.pid, ")"));
      finish(r, id, wire::CreateDrainReply(b));
      return;
    }
    case wire::RequestBody::Hello:
    case wire::RequestBody::NONE: break;
  }
  r.close_after = true;
  throw StatusError(Status::protocol_error,
                    cat("unknown request type ", static_cast<int>(req.body_type())));
}

}  // namespace

void build_error(fb::FlatBufferBuilder& builder, std::uint64_t id, Status status,
                 const std::string& message) {
  builder.Clear();
  builder.Finish(wire::CreateReply(builder, id, status, builder.CreateString(message)));
}

void handle_request(ServerContext& server, ConnectionState& connection,
                    const wire::Request& request, HandlerResult& result) {
  try {
    dispatch(server, connection, request, result);
    result.status = Status::ok;
    return;
  } catch (const StatusError& e) {
    result.status = e.status();
    build_error(result.builder, request.id(), e.status(), e.what());
  } catch (const std::exception& e) {
    result.status = Status::internal;
    LOG_ERROR("session", "connection ", connection.id, ": internal error in ",
              protocol::request_name(request.body_type()), ": ", e.what());
    build_error(result.builder, request.id(), Status::internal, cat("internal error: ", e.what()));
  }
  result.fd = -1;
}

}  // namespace statepool::service
