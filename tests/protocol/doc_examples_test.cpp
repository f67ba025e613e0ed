// docs/protocol.md against the protocol code. A client author works from that document
// alone, so what it shows must be what the code does:
//
//  - every hex example (a fenced block whose info string is `hex frame` or `hex header`,
//    format in the document's §12) is read from the document at test time, checked with
//    protocol/frame.hpp (header check, then Verifier) and decoded to the fields its
//    `expect:` lines state; each is also rebuilt here with the FlatBuffers C++ builder
//    and must be those bytes exactly, so changing one byte of the document fails;
//  - no other fenced block holds a hex dump (an unmarked dump would go unchecked);
//  - the tables of union members (§3.2), enum values (§3.4) and status codes (§6) list
//    exactly the schema's values and names, and §6's two views of which request returns
//    which status agree with each other.
//
// The document's path comes from CMake (STATEPOOL_PROTOCOL_DOC).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/protocol/frame.hpp"

namespace sp = statepool::protocol;
namespace wire = statepool::wire;

namespace {

// --- the document ----------------------------------------------------------------------

std::vector<std::string> document_lines() {
  std::ifstream in(STATEPOOL_PROTOCOL_DOC);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

const std::vector<std::string>& doc() {
  static const std::vector<std::string> lines = document_lines();
  return lines;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

struct Fence {
  std::string info;                ///< the opening fence's info string
  std::size_t first_line = 0;      ///< 1-based document line of the first content line
  std::vector<std::string> lines;  ///< content, without the fences
};

std::vector<Fence> fenced_blocks() {
  std::vector<Fence> out;
  const auto& lines = doc();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string line = trim(lines[i]);
    if (!starts_with(line, "```")) continue;
    Fence fence;
    fence.info = trim(std::string_view(line).substr(3));
    fence.first_line = i + 2;
    for (++i; i < lines.size() && trim(lines[i]) != "```"; ++i) fence.lines.push_back(lines[i]);
    out.push_back(std::move(fence));
  }
  return out;
}

/// Lines of the section whose heading starts with `heading` (up to the next heading of
/// the same or a higher level).
std::vector<std::string> section(std::string_view heading) {
  const auto& lines = doc();
  const std::size_t level = heading.find_first_not_of('#');
  std::vector<std::string> out;
  bool inside = false;
  bool fenced = false;  // '#' lines inside code blocks are no headings
  for (const std::string& line : lines) {
    if (starts_with(trim(line), "```")) fenced = !fenced;
    if (!fenced && starts_with(line, "#")) {
      const std::size_t l = line.find_first_not_of('#');
      if (inside && l <= level) break;
      if (starts_with(line, heading)) {
        inside = true;
        continue;
      }
    }
    if (inside) out.push_back(line);
  }
  return out;
}

/// The cells of a Markdown table row ("| a | b |" -> {"a", "b"}); empty if not a row.
std::vector<std::string> cells(std::string_view line) {
  std::string row = trim(line);
  if (row.size() < 2 || row.front() != '|' || row.back() != '|') return {};
  std::vector<std::string> out;
  std::string cell;
  for (std::size_t i = 1; i + 1 < row.size(); ++i) {
    if (row[i] == '|' && row[i - 1] != '\\') {
      out.push_back(trim(cell));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  out.push_back(trim(cell));
  return out;
}

std::string unquote_code(std::string_view s) {  // "`name`" -> "name"
  std::string t = trim(s);
  if (t.size() >= 2 && t.front() == '`' && t.back() == '`') return t.substr(1, t.size() - 2);
  return t;
}

std::vector<std::string> split_list(std::string_view s) {  // "a, `b`, c" -> {a, b, c}
  std::vector<std::string> out;
  std::string item;
  std::stringstream in{std::string(s)};
  while (std::getline(in, item, ',')) {
    item = unquote_code(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// --- decoded messages as flat fields -----------------------------------------------------

using Fields = std::map<std::string, std::string>;

std::string text(const flatbuffers::String* s) {
  return s == nullptr ? std::string() : s->str();
}
std::string boolean(bool b) {
  return b ? "true" : "false";
}
std::string real(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return {buf, r.ptr};
}
template <class T>
std::string list(const flatbuffers::Vector<T>* v) {
  std::string out = "[";
  if (v != nullptr) {
    for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
      if (i != 0) out += ",";
      if constexpr (std::is_same_v<T, wire::CodecId>) {
        out += wire::EnumNameCodecId(v->Get(i));
      } else if constexpr (std::is_same_v<T, wire::SnapshotTier>) {
        out += wire::EnumNameSnapshotTier(v->Get(i));
      } else {
        out += std::to_string(v->Get(i));
      }
    }
  }
  return out + "]";
}

void put_memory(Fields& f, const std::string& p, const wire::MemoryDescriptor* m) {
  if (m == nullptr) return;
  f[p + "space"] = wire::EnumNameMemorySpace(m->space());
  f[p + "device"] = std::to_string(m->device());
  f[p + "handle_kind"] = wire::EnumNameHandleKind(m->handle_kind());
  f[p + "granularity"] = std::to_string(m->granularity());
  f[p + "ipc_handle"] = list(m->ipc_handle());
  f[p + "device_uuid"] = list(m->device_uuid());
}

void put_layout(Fields& f, const wire::Layout* l) {
  if (l == nullptr) return;
  f["layout.name"] = text(l->name());
  f["layout.arch"] = wire::EnumNameArch(l->arch());
  f["layout.num_layers"] = std::to_string(l->num_layers());
  f["layout.num_heads"] = std::to_string(l->num_heads());
  f["layout.key_dim"] = std::to_string(l->key_dim());
  f["layout.value_dim"] = std::to_string(l->value_dim());
  f["layout.conv_channels"] = std::to_string(l->conv_channels());
  f["layout.conv_width"] = std::to_string(l->conv_width());
  f["layout.conv_dtype"] = wire::EnumNameDType(l->conv_dtype());
  f["layout.codec"] = wire::EnumNameCodecId(l->codec());
  if (const auto* p = l->codec_params()) {
    f["layout.codec_params.group_size"] = std::to_string(p->group_size());
    f["layout.codec_params.variant"] = wire::EnumNameStepQuantVariant(p->variant());
  }
  f["layout.plan_digest"] = text(l->plan_digest());
}

template <class CodecRequest>  // Compress, Decompress: the same fields
void put_codec_request(Fields& f, const CodecRequest& b) {
  f["arena_id"] = std::to_string(b.arena_id());
  f["slot"] = std::to_string(b.slot());
  f["staging_id"] = std::to_string(b.staging_id());
  f["offset"] = std::to_string(b.offset());
  f["dtype"] = wire::EnumNameDType(b.dtype());
  f["event"] = boolean(b.event());
}

void put_snapshot_key(Fields& f, const wire::SnapshotKey* key) {
  if (key == nullptr) return;
  f["key.prefix"] = list(key->prefix());
  f["key.position"] = std::to_string(key->position());
}

/// Every field of a request, named as in the schema ("layout.key_dim" for nested tables).
Fields request_fields(const wire::Request& r) {
  Fields f;
  f["id"] = std::to_string(r.id());
  f["body"] = wire::EnumNameRequestBody(r.body_type());
  if (r.body() == nullptr) return f;
  using B = wire::RequestBody;
  switch (r.body_type()) {
    case B::Hello: {
      const auto* b = r.body_as_Hello();
      f["min_version"] = std::to_string(b->min_version());
      f["max_version"] = std::to_string(b->max_version());
      f["tenant"] = text(b->tenant());
      f["lease_token"] = text(b->lease_token());
      f["client_name"] = text(b->client_name());
      break;
    }
    case B::RegisterLayout: put_layout(f, r.body_as_RegisterLayout()->layout()); break;
    case B::OpenArena: {
      const auto* b = r.body_as_OpenArena();
      f["layout_id"] = std::to_string(b->layout_id());
      f["pages"] = std::to_string(b->pages());
      f["legacy_ipc"] = boolean(b->legacy_ipc());
      break;
    }
    case B::Allocate: {
      const auto* b = r.body_as_Allocate();
      f["arena_id"] = std::to_string(b->arena_id());
      f["count"] = std::to_string(b->count());
      break;
    }
    case B::Free: {
      const auto* b = r.body_as_Free();
      f["arena_id"] = std::to_string(b->arena_id());
      f["slots"] = list(b->slots());
      break;
    }
    case B::OpenStaging: {
      const auto* b = r.body_as_OpenStaging();
      f["bytes"] = std::to_string(b->bytes());
      f["legacy_ipc"] = boolean(b->legacy_ipc());
      break;
    }
    case B::CloseStaging:
      f["staging_id"] = std::to_string(r.body_as_CloseStaging()->staging_id());
      break;
    case B::Compress: put_codec_request(f, *r.body_as_Compress()); break;
    case B::Decompress: put_codec_request(f, *r.body_as_Decompress()); break;
    case B::Copy: {
      const auto* b = r.body_as_Copy();
      f["arena_id"] = std::to_string(b->arena_id());
      f["src_slot"] = std::to_string(b->src_slot());
      f["dst_slot"] = std::to_string(b->dst_slot());
      f["event"] = boolean(b->event());
      break;
    }
    case B::InstallPlan: f["plan"] = list(r.body_as_InstallPlan()->plan()); break;
    case B::PlanCapacity: {
      const auto* b = r.body_as_PlanCapacity();
      f["model_config"] = text(b->model_config());
      f["weight_bits"] = std::to_string(b->weight_bits());
      f["kv_dtype"] = text(b->kv_dtype());
      f["codecs"] = list(b->codecs());
      f["slots"] = std::to_string(b->slots());
      f["context"] = std::to_string(b->context());
      f["gpu_memory"] = std::to_string(b->gpu_memory());
      if (b->reserved()) f["reserved"] = real(*b->reserved());
      f["tp"] = std::to_string(b->tp());
      if (b->concurrency()) f["concurrency"] = std::to_string(*b->concurrency());
      break;
    }
    case B::FitsNow: {
      const auto* b = r.body_as_FitsNow();
      f["layout_id"] = std::to_string(b->layout_id());
      f["slots"] = std::to_string(b->slots());
      f["codecs"] = list(b->codecs());
      break;
    }
    case B::PutSnapshot: {
      const auto* b = r.body_as_PutSnapshot();
      f["arena_id"] = std::to_string(b->arena_id());
      f["slot"] = std::to_string(b->slot());
      put_snapshot_key(f, b->key());
      break;
    }
    case B::GetSnapshot: {
      const auto* b = r.body_as_GetSnapshot();
      f["arena_id"] = std::to_string(b->arena_id());
      f["slot"] = std::to_string(b->slot());
      put_snapshot_key(f, b->key());
      break;
    }
    case B::DeleteSnapshot: put_snapshot_key(f, r.body_as_DeleteSnapshot()->key()); break;
    case B::PinSnapshot: {
      const auto* b = r.body_as_PinSnapshot();
      put_snapshot_key(f, b->key());
      f["pinned"] = boolean(b->pinned());
      break;
    }
    case B::ListSnapshots: {
      const auto* b = r.body_as_ListSnapshots();
      f["prefix"] = list(b->prefix());
      f["limit"] = std::to_string(b->limit());
      break;
    }
    case B::ExportSnapshot: {
      const auto* b = r.body_as_ExportSnapshot();
      put_snapshot_key(f, b->key());
      f["layout_digest"] = text(b->layout_digest());
      f["staging_id"] = std::to_string(b->staging_id());
      f["offset"] = std::to_string(b->offset());
      break;
    }
    case B::ImportSnapshot: {
      const auto* b = r.body_as_ImportSnapshot();
      f["staging_id"] = std::to_string(b->staging_id());
      f["offset"] = std::to_string(b->offset());
      f["bytes"] = std::to_string(b->bytes());
      break;
    }
    case B::CloseArena: f["arena_id"] = std::to_string(r.body_as_CloseArena()->arena_id()); break;
    case B::RegisterMemory: {
      const auto* b = r.body_as_RegisterMemory();
      f["bytes"] = std::to_string(b->bytes());
      f["name"] = text(b->name());
      break;
    }
    case B::LookupSnapshots: {
      const auto* b = r.body_as_LookupSnapshots();
      f["arena_id"] = std::to_string(b->arena_id());
      f["keys.length"] = std::to_string(b->keys() == nullptr ? 0 : b->keys()->size());
      if (b->keys() != nullptr) {
        for (flatbuffers::uoffset_t i = 0; i < b->keys()->size(); ++i) {
          const std::string p = "keys." + std::to_string(i) + ".";
          f[p + "prefix"] = list(b->keys()->Get(i)->prefix());
          f[p + "position"] = std::to_string(b->keys()->Get(i)->position());
        }
      }
      f["lower_tiers"] = boolean(b->lower_tiers());
      f["stop_at_miss"] = boolean(b->stop_at_miss());
      break;
    }
    case B::PutSnapshots: {
      const auto* b = r.body_as_PutSnapshots();
      f["arena_id"] = std::to_string(b->arena_id());
      f["entries.length"] = std::to_string(b->entries() == nullptr ? 0 : b->entries()->size());
      break;
    }
    case B::GetSnapshots: {
      const auto* b = r.body_as_GetSnapshots();
      f["arena_id"] = std::to_string(b->arena_id());
      f["entries.length"] = std::to_string(b->entries() == nullptr ? 0 : b->entries()->size());
      f["stop_at_miss"] = boolean(b->stop_at_miss());
      break;
    }
    case B::Stats:
    case B::Ping:
    case B::Drain:
    case B::NONE: break;
  }
  return f;
}

Fields reply_fields(const wire::Reply& r) {
  Fields f;
  f["id"] = std::to_string(r.id());
  f["status"] = wire::EnumNameStatus(r.status());
  f["message"] = text(r.message());
  f["body"] = wire::EnumNameReplyBody(r.body_type());
  if (r.body() == nullptr) return f;
  using B = wire::ReplyBody;
  switch (r.body_type()) {
    case B::HelloReply: {
      const auto* b = r.body_as_HelloReply();
      f["version"] = std::to_string(b->version());
      f["lease_token"] = text(b->lease_token());
      f["lease_resumed"] = boolean(b->lease_resumed());
      f["resumed_slots"] = std::to_string(b->resumed_slots());
      f["server"] = text(b->server());
      f["grace_period_ms"] = std::to_string(b->grace_period_ms());
      f["max_frame_bytes"] = std::to_string(b->max_frame_bytes());
      f["max_batch_keys"] = std::to_string(b->max_batch_keys());
      f["max_batch_bytes"] = std::to_string(b->max_batch_bytes());
      break;
    }
    case B::RegisterLayoutReply: {
      const auto* b = r.body_as_RegisterLayoutReply();
      f["layout_id"] = std::to_string(b->layout_id());
      f["page_bytes"] = std::to_string(b->page_bytes());
      f["fp32_bytes"] = std::to_string(b->fp32_bytes());
      f["state_bytes_f32"] = std::to_string(b->state_bytes_f32());
      f["state_bytes_bf16"] = std::to_string(b->state_bytes_bf16());
      break;
    }
    case B::OpenArenaReply: {
      const auto* b = r.body_as_OpenArenaReply();
      f["arena_id"] = std::to_string(b->arena_id());
      f["bytes"] = std::to_string(b->bytes());
      f["page_bytes"] = std::to_string(b->page_bytes());
      f["page_stride"] = std::to_string(b->page_stride());
      f["page_count"] = std::to_string(b->page_count());
      f["backend"] = text(b->backend());
      f["created"] = boolean(b->created());
      put_memory(f, "memory.", b->memory());
      break;
    }
    case B::AllocateReply: f["slots"] = list(r.body_as_AllocateReply()->slots()); break;
    case B::FreeReply: f["freed"] = std::to_string(r.body_as_FreeReply()->freed()); break;
    case B::OpenStagingReply: {
      const auto* b = r.body_as_OpenStagingReply();
      f["staging_id"] = std::to_string(b->staging_id());
      f["bytes"] = std::to_string(b->bytes());
      put_memory(f, "memory.", b->memory());
      break;
    }
    case B::CompressReply: {
      const auto* b = r.body_as_CompressReply();
      f["page_bytes"] = std::to_string(b->page_bytes());
      f["event"] = list(b->event());
      break;
    }
    case B::DecompressReply: {
      const auto* b = r.body_as_DecompressReply();
      f["state_bytes"] = std::to_string(b->state_bytes());
      f["event"] = list(b->event());
      break;
    }
    case B::CopyReply: f["event"] = list(r.body_as_CopyReply()->event()); break;
    case B::PingReply:
      f["server_time_ns"] = std::to_string(r.body_as_PingReply()->server_time_ns());
      break;
    case B::InstallPlanReply: {
      const auto* b = r.body_as_InstallPlanReply();
      f["digest"] = text(b->digest());
      f["units"] = std::to_string(b->units());
      f["pivots"] = std::to_string(b->pivots());
      f["average_bits"] = real(b->average_bits());
      f["created"] = boolean(b->created());
      break;
    }
    case B::PlanCapacityReply:
      f["report_json"] = text(r.body_as_PlanCapacityReply()->report_json());
      break;
    case B::StatsReply: {
      const auto* b = r.body_as_StatsReply();
      f["clients_connected"] = std::to_string(b->clients_connected());
      f["leases_active"] = std::to_string(b->leases_active());
      f["leases_orphaned"] = std::to_string(b->leases_orphaned());
      f["pages_reclaimed_total"] = std::to_string(b->pages_reclaimed_total());
      f["pool_capacity_bytes"] = std::to_string(b->pool_capacity_bytes());
      f["pool_reserved_bytes"] = std::to_string(b->pool_reserved_bytes());
      f["uptime_seconds"] = real(b->uptime_seconds());
      f["arenas.length"] = std::to_string(b->arenas() == nullptr ? 0 : b->arenas()->size());
      f["tenants.length"] = std::to_string(b->tenants() == nullptr ? 0 : b->tenants()->size());
      break;
    }
    case B::FitsNowReply: {
      const auto* b = r.body_as_FitsNowReply();
      f["tenant"] = text(b->tenant());
      f["pool_capacity_bytes"] = std::to_string(b->pool_capacity_bytes());
      f["pool_free_bytes"] = std::to_string(b->pool_free_bytes());
      f["has_quota"] = boolean(b->has_quota());
      f["quota_free_bytes"] = std::to_string(b->quota_free_bytes());
      f["max_arena_pages"] = std::to_string(b->max_arena_pages());
      f["fits.length"] = std::to_string(b->fits() == nullptr ? 0 : b->fits()->size());
      break;
    }
    case B::PutSnapshotReply: {
      const auto* b = r.body_as_PutSnapshotReply();
      f["created"] = boolean(b->created());
      f["evicted"] = std::to_string(b->evicted());
      f["page_bytes"] = std::to_string(b->page_bytes());
      break;
    }
    case B::GetSnapshotReply: {
      const auto* b = r.body_as_GetSnapshotReply();
      f["hit"] = boolean(b->hit());
      f["other_layouts"] = std::to_string(b->other_layouts());
      f["page_bytes"] = std::to_string(b->page_bytes());
      break;
    }
    case B::DeleteSnapshotReply:
      f["deleted"] = std::to_string(r.body_as_DeleteSnapshotReply()->deleted());
      break;
    case B::PinSnapshotReply:
      f["changed"] = std::to_string(r.body_as_PinSnapshotReply()->changed());
      break;
    case B::ListSnapshotsReply: {
      const auto* b = r.body_as_ListSnapshotsReply();
      f["snapshots.length"] =
          std::to_string(b->snapshots() == nullptr ? 0 : b->snapshots()->size());
      f["truncated"] = boolean(b->truncated());
      f["snapshot_namespace"] = text(b->snapshot_namespace());
      break;
    }
    case B::ExportSnapshotReply: {
      const auto* b = r.body_as_ExportSnapshotReply();
      f["found"] = boolean(b->found());
      f["value_bytes"] = std::to_string(b->value_bytes());
      break;
    }
    case B::ImportSnapshotReply: {
      const auto* b = r.body_as_ImportSnapshotReply();
      f["created"] = boolean(b->created());
      f["arena_id"] = std::to_string(b->arena_id());
      break;
    }
    case B::CloseArenaReply: {
      const auto* b = r.body_as_CloseArenaReply();
      f["bytes"] = std::to_string(b->bytes());
      f["snapshots_dropped"] = std::to_string(b->snapshots_dropped());
      break;
    }
    case B::RegisterMemoryReply: {
      const auto* b = r.body_as_RegisterMemoryReply();
      f["staging_id"] = std::to_string(b->staging_id());
      f["bytes"] = std::to_string(b->bytes());
      f["sealed"] = boolean(b->sealed());
      break;
    }
    case B::LookupSnapshotsReply: {
      const auto* b = r.body_as_LookupSnapshotsReply();
      f["found"] = list(b->found());
      f["leading"] = std::to_string(b->leading());
      break;
    }
    case B::PutSnapshotsReply: {
      const auto* b = r.body_as_PutSnapshotsReply();
      f["results.length"] = std::to_string(b->results() == nullptr ? 0 : b->results()->size());
      f["created"] = std::to_string(b->created());
      f["existing"] = std::to_string(b->existing());
      f["failed"] = std::to_string(b->failed());
      f["bytes"] = std::to_string(b->bytes());
      break;
    }
    case B::GetSnapshotsReply: {
      const auto* b = r.body_as_GetSnapshotsReply();
      f["results.length"] = std::to_string(b->results() == nullptr ? 0 : b->results()->size());
      f["hits"] = std::to_string(b->hits());
      f["bytes"] = std::to_string(b->bytes());
      break;
    }
    case B::CloseStagingReply:
    case B::DrainReply:
    case B::NONE: break;
  }
  return f;
}

// --- the examples, built with the real encoder ------------------------------------------

struct Generated {
  sp::FrameType type = sp::FrameType::request;
  std::uint32_t flags = sp::kFlagNone;
  std::function<void(flatbuffers::FlatBufferBuilder&)> build;
};

void finish_request(flatbuffers::FlatBufferBuilder& b, std::uint64_t id, wire::RequestBody type,
                    flatbuffers::Offset<void> body) {
  b.Finish(wire::CreateRequest(b, id, type, body));
}
void finish_reply(flatbuffers::FlatBufferBuilder& b, std::uint64_t id, wire::ReplyBody type,
                  flatbuffers::Offset<void> body) {
  b.Finish(wire::CreateReply(b, id, wire::Status::ok, 0, type, body));
}

/// One entry per example name the document uses; the bytes the document shows must be
/// these. (The daemon makes its replies with the same builder calls; its strings may be
/// laid out in another order, which any reader accepts.)
const std::map<std::string, Generated>& generated() {
  using RB = wire::RequestBody;
  using PB = wire::ReplyBody;
  static const std::map<std::string, Generated> examples = {
      {"hello-request",
       {sp::FrameType::request, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateHelloDirect(b, 1, 1, nullptr, nullptr, "example");
          finish_request(b, 1, RB::Hello, body.Union());
        }}},
      {"hello-reply",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body =
              wire::CreateHelloReplyDirect(b, 1, "bd31c0a2e5f64e1d9a7b3c8d2f10f033", false, 0,
                                           "statepoold 0.1.0", 30000, sp::kDefaultMaxPayload);
          finish_reply(b, 1, PB::HelloReply, body.Union());
        }}},
      {"register-layout-request",
       {sp::FrameType::request, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto layout =
              wire::CreateLayoutDirect(b, "tiny", wire::Arch::gdn, 2, 4, 64, 64, 200, 3,
                                       wire::DType::bf16, wire::CodecId::int6);
          const auto body = wire::CreateRegisterLayout(b, layout);
          finish_request(b, 2, RB::RegisterLayout, body.Union());
        }}},
      {"register-layout-reply",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateRegisterLayoutReply(b, 1, 27488, 135872, 133472, 67936);
          finish_reply(b, 2, PB::RegisterLayoutReply, body.Union());
        }}},
      {"open-arena-reply",
       {sp::FrameType::reply, sp::kFlagFdAttached,
        [](flatbuffers::FlatBufferBuilder& b) {
          // What the host backend's descriptor is: every field at its default.
          const auto memory = wire::CreateMemoryDescriptor(b);
          const auto body =
              wire::CreateOpenArenaReplyDirect(b, 1, 221184, 27488, 27648, 8, "host", true, memory);
          finish_reply(b, 3, PB::OpenArenaReply, body.Union());
        }}},
      {"allocate-request",
       {sp::FrameType::request, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateAllocate(b, 9, 2);
          finish_request(b, 4, RB::Allocate, body.Union());
        }}},
      {"not-found-reply",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          // As the daemon's build_error: status, message, no body.
          b.Finish(wire::CreateReplyDirect(b, 4, wire::Status::not_found, "arena 9 not found"));
        }}},
      {"ping-request",
       {sp::FrameType::request, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreatePing(b);
          finish_request(b, 5, RB::Ping, body.Union());
        }}},
      // Protocol version 2.
      {"hello-reply-v2",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateHelloReplyDirect(
              b, 2, "bd31c0a2e5f64e1d9a7b3c8d2f10f033", false, 0, "statepoold 0.1.0", 30000,
              sp::kDefaultMaxPayload, 8192, std::uint64_t{4} << 30);
          finish_reply(b, 1, PB::HelloReply, body.Union());
        }}},
      {"register-memory-request",
       {sp::FrameType::request, sp::kFlagFdAttached,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateRegisterMemoryDirect(b, std::uint64_t{1} << 30, "host-kv");
          finish_request(b, 6, RB::RegisterMemory, body.Union());
        }}},
      {"register-memory-reply",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const auto body = wire::CreateRegisterMemoryReply(b, 2, std::uint64_t{1} << 30, false);
          finish_reply(b, 6, PB::RegisterMemoryReply, body.Union());
        }}},
      {"lookup-snapshots-request",
       {sp::FrameType::request, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const std::vector<std::uint8_t> p0 = {'p', '/', '0'};
          const std::vector<std::uint8_t> p1 = {'p', '/', '1'};
          const std::vector<flatbuffers::Offset<wire::SnapshotKey>> keys = {
              wire::CreateSnapshotKeyDirect(b, &p0, 64),
              wire::CreateSnapshotKeyDirect(b, &p1, 128)};
          const auto body = wire::CreateLookupSnapshotsDirect(b, 1, &keys, true, true);
          finish_request(b, 7, RB::LookupSnapshots, body.Union());
        }}},
      {"lookup-snapshots-reply",
       {sp::FrameType::reply, sp::kFlagNone,
        [](flatbuffers::FlatBufferBuilder& b) {
          const std::vector<wire::SnapshotTier> found = {wire::SnapshotTier::pool,
                                                         wire::SnapshotTier::none};
          const auto body = wire::CreateLookupSnapshotsReplyDirect(b, &found, 1);
          finish_reply(b, 7, PB::LookupSnapshotsReply, body.Union());
        }}},
  };
  return examples;
}

std::vector<std::uint8_t> generated_frame(const Generated& g) {
  flatbuffers::FlatBufferBuilder b;
  g.build(b);
  const std::string frame = sp::make_frame(g.type, g.flags, {b.GetBufferPointer(), b.GetSize()});
  return {frame.begin(), frame.end()};
}

/// The dump lines the document should hold for `bytes` (16 bytes a line).
std::string dump(const std::vector<std::uint8_t>& bytes) {
  std::string out;
  char buf[24];
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i % 16 == 0) {
      if (i != 0) out += "\n";
      std::snprintf(buf, sizeof buf, "%04zx ", i);
      out += buf;
    }
    std::snprintf(buf, sizeof buf, " %02x", bytes[i]);
    out += buf;
  }
  return out + "\n";
}

// --- the document's example blocks ------------------------------------------------------

struct Example {
  std::string kind;  ///< "frame" or "header"
  std::string where;
  std::string name;
  std::string frame_line;  ///< "request flags=0 length=56"
  std::vector<std::string> expects;
  std::vector<std::uint8_t> bytes;
  std::vector<std::string> problems;  ///< parse errors
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// "0010  14 00 ..." -> true with the offset and bytes; a trailing "# ..." is a comment.
bool parse_dump_line(std::string_view line, std::size_t& offset, std::vector<std::uint8_t>& out) {
  std::string s = trim(line);
  if (const auto hash = s.find('#'); hash != std::string::npos) s = trim(s.substr(0, hash));
  if (s.size() < 4) return false;
  offset = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const int d = hex_digit(s[i]);
    if (d < 0) return false;
    offset = offset * 16 + static_cast<std::size_t>(d);
  }
  std::stringstream in(s.substr(4));
  std::vector<std::uint8_t> bytes;
  for (std::string tok; in >> tok;) {
    if (tok.size() != 2 || hex_digit(tok[0]) < 0 || hex_digit(tok[1]) < 0) return false;
    bytes.push_back(static_cast<std::uint8_t>(hex_digit(tok[0]) * 16 + hex_digit(tok[1])));
  }
  if (bytes.empty()) return false;
  out = std::move(bytes);
  return true;
}

/// Looks like hex bytes, whatever follows them: four or more two-digit hex tokens at the
/// start of the line, after an optional offset ("0000  53 50 4c 31 ...", "53 50 4c 31").
bool looks_like_dump(std::string_view line) {
  std::stringstream in{std::string(line)};
  std::string tok;
  int bytes = 0;
  bool first = true;
  while (in >> tok) {
    const bool hex = std::all_of(tok.begin(), tok.end(), [](char c) { return hex_digit(c) >= 0; });
    if (first && hex && tok.size() == 4) {
      first = false;
      continue;
    }
    first = false;
    if (!hex || tok.size() != 2) break;
    ++bytes;
  }
  return bytes >= 4;
}

std::vector<Example> examples() {
  std::vector<Example> out;
  for (const Fence& f : fenced_blocks()) {
    if (f.info != "hex frame" && f.info != "hex header") continue;
    Example e;
    e.kind = f.info.substr(4);
    e.where = "docs/protocol.md:" + std::to_string(f.first_line);
    for (std::size_t i = 0; i < f.lines.size(); ++i) {
      const std::string line = trim(f.lines[i]);
      const std::string at = "line " + std::to_string(f.first_line + i) + ": ";
      if (line.empty() || line[0] == '#') continue;
      if (starts_with(line, "example:")) {
        e.name = trim(line.substr(8));
      } else if (starts_with(line, "frame:")) {
        e.frame_line = trim(line.substr(6));
      } else if (starts_with(line, "expect:")) {
        e.expects.push_back(trim(line.substr(7)));
      } else {
        std::size_t offset = 0;
        std::vector<std::uint8_t> bytes;
        if (!parse_dump_line(line, offset, bytes)) {
          e.problems.push_back(at + "neither a comment, a keyword line nor a dump line");
        } else if (offset != e.bytes.size()) {
          e.problems.push_back(at + "offset " + std::to_string(offset) + ", expected " +
                               std::to_string(e.bytes.size()));
        } else {
          e.bytes.insert(e.bytes.end(), bytes.begin(), bytes.end());
        }
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

/// "a=1 b="two words" c=[1,2]" -> {{a, 1}, {b, two words}, {c, [1,2]}}.
std::vector<std::pair<std::string, std::string>> key_values(std::string_view s,
                                                            std::string& problem) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t i = 0;
  while (i < s.size()) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    const std::size_t eq = s.find('=', i);
    if (eq == std::string_view::npos) {
      problem = "no '=' in '" + std::string(s.substr(i)) + "'";
      return out;
    }
    std::string key(s.substr(i, eq - i));
    std::string value;
    i = eq + 1;
    if (i < s.size() && s[i] == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        value += s[i];
      }
      if (i >= s.size()) {
        problem = "unterminated string for " + key;
        return out;
      }
      ++i;
    } else {
      while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) value += s[i++];
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

/// The fields of a message of this type whose body is an empty table: every field at its
/// default (an empty table reads as any table).
Fields default_fields(sp::FrameType type, const std::string& body) {
  flatbuffers::FlatBufferBuilder b;
  const auto empty = flatbuffers::Offset<void>(b.EndTable(b.StartTable()));
  if (type == sp::FrameType::request) {
    for (const auto v : wire::EnumValuesRequestBody()) {
      if (body != wire::EnumNameRequestBody(v)) continue;
      b.Finish(wire::CreateRequest(b, 0, v, v == wire::RequestBody::NONE ? 0 : empty));
      return request_fields(*flatbuffers::GetRoot<wire::Request>(b.GetBufferPointer()));
    }
  } else {
    for (const auto v : wire::EnumValuesReplyBody()) {
      if (body != wire::EnumNameReplyBody(v)) continue;
      b.Finish(
          wire::CreateReply(b, 0, wire::Status::ok, 0, v, v == wire::ReplyBody::NONE ? 0 : empty));
      return reply_fields(*flatbuffers::GetRoot<wire::Reply>(b.GetBufferPointer()));
    }
  }
  return {};
}

/// Checks one example; returns the problems found (empty: it is right).
std::vector<std::string> check(const Example& e) {
  std::vector<std::string> problems = e.problems;
  const auto fail = [&](const std::string& what) { problems.push_back(what); };

  // Header line: "request|reply flags=N length=N".
  std::string kind_word;
  std::stringstream frame_in(e.frame_line);
  frame_in >> kind_word;
  std::string rest;
  std::getline(frame_in, rest);
  std::string kv_problem;
  const auto frame_kv = key_values(rest, kv_problem);
  if (!kv_problem.empty()) fail("frame: " + kv_problem);
  if (kind_word != "request" && kind_word != "reply") {
    fail("frame: line must start with request or reply, got '" + kind_word + "'");
    return problems;
  }
  const sp::FrameType type = kind_word == "request" ? sp::FrameType::request : sp::FrameType::reply;
  if (e.bytes.size() < sp::kHeaderBytes) {
    fail("fewer than 16 bytes");
    return problems;
  }
  std::array<std::byte, sp::kHeaderBytes> head{};
  std::memcpy(head.data(), e.bytes.data(), sp::kHeaderBytes);
  const sp::FrameHeader header = sp::decode_header(head);
  if (const auto error = sp::check_header(header, type, sp::kDefaultMaxPayload);
      error != sp::FrameError::none) {
    fail(std::string("header refused: ") + sp::to_string(error));
  }
  bool saw_flags = false;
  bool saw_length = false;
  for (const auto& [key, value] : frame_kv) {
    if (key == "flags") {
      saw_flags = true;
      if (value != std::to_string(header.flags))
        fail("frame: flags=" + value + " but the header says " + std::to_string(header.flags));
    } else if (key == "length") {
      saw_length = true;
      if (value != std::to_string(header.length))
        fail("frame: length=" + value + " but the header says " + std::to_string(header.length));
    } else {
      fail("frame: unknown key " + key);
    }
  }
  if (!saw_flags || !saw_length) fail("frame: line must give flags= and length=");

  if (e.kind == "header") {
    if (e.bytes.size() != sp::kHeaderBytes) fail("a header example holds exactly 16 bytes");
    if (!e.expects.empty()) fail("a header example has no expect: lines");
    return problems;
  }

  if (e.bytes.size() != sp::kHeaderBytes + header.length) {
    fail("frame holds " + std::to_string(e.bytes.size() - sp::kHeaderBytes) +
         " payload bytes, header says " + std::to_string(header.length));
    return problems;
  }
  const std::span<const std::byte> payload(
      reinterpret_cast<const std::byte*>(e.bytes.data()) + sp::kHeaderBytes, header.length);
  sp::FrameError error = sp::FrameError::none;
  Fields fields;
  if (type == sp::FrameType::request) {
    const wire::Request* r = sp::verify_request(payload, error);
    if (r != nullptr) fields = request_fields(*r);
  } else {
    const wire::Reply* r = sp::verify_reply(payload, error);
    if (r != nullptr) fields = reply_fields(*r);
  }
  if (error != sp::FrameError::none) {
    fail(std::string("payload refused: ") + sp::to_string(error));
    return problems;
  }
  if (e.expects.empty()) fail("a frame example states its fields in expect: lines");
  std::set<std::string> stated;
  for (const std::string& line : e.expects) {
    const auto kv = key_values(line, kv_problem);
    if (!kv_problem.empty()) fail("expect: " + kv_problem);
    for (const auto& [key, value] : kv) {
      stated.insert(key);
      const auto it = fields.find(key);
      if (it == fields.end()) {
        fail("expect: " + key + " is no field of this message");
      } else if (it->second != value) {
        fail(cat("expect: ", key, "=", value, " but the bytes say ", key, "=", it->second));
      }
    }
  }
  for (const char* key : {"id", "body"}) {
    if (!stated.contains(key)) fail(std::string("expect: lines must state ") + key);
  }
  // What an example does not state is at its default: compare with the same message
  // whose body is an empty table (every field at its default). Fields of nested tables
  // that the empty body does not have must be stated.
  const Fields defaults = default_fields(type, fields.at("body"));
  for (const auto& [key, value] : fields) {
    if (stated.contains(key)) continue;
    const auto it = defaults.find(key);
    if (it == defaults.end()) {
      fail(cat("expect: state ", key, " (it is ", value, ")"));
    } else if (it->second != value && key != "id") {
      fail(cat("expect: ", key, " is ", value, ", not its default ", it->second, ": state it"));
    }
  }
  if (type == sp::FrameType::reply && !stated.contains("status"))
    fail("expect: lines of a reply must state status");
  return problems;
}

TEST(ProtocolDocExamples, EveryHexExampleVerifiesAndDecodesToWhatTheDocumentSays) {
  const std::vector<Example> all = examples();
  ASSERT_FALSE(doc().empty()) << "cannot read " << STATEPOOL_PROTOCOL_DOC;
  ASSERT_GE(all.size(), 4u) << "docs/protocol.md has lost its hex examples";
  std::set<std::pair<std::string, std::string>> names;
  for (const Example& e : all) {
    SCOPED_TRACE(e.where + " (example " + e.name + ")");
    EXPECT_FALSE(e.name.empty()) << "an example needs an 'example: NAME' line";
    EXPECT_TRUE(names.emplace(e.kind, e.name).second) << "example name used twice";
    for (const std::string& problem : check(e)) ADD_FAILURE() << problem;
  }
}

TEST(ProtocolDocExamples, EveryHexExampleIsWhatTheEncoderMakes) {
  std::set<std::string> frames;
  for (const Example& e : examples()) {
    SCOPED_TRACE(e.where + " (example " + e.name + ")");
    const auto it = generated().find(e.name);
    if (it == generated().end()) {
      ADD_FAILURE() << "no generator for example '" << e.name
                    << "' in tests/protocol/doc_examples_test.cpp";
      continue;
    }
    const std::vector<std::uint8_t> expected = generated_frame(it->second);
    if (e.kind == "header") {
      const std::vector<std::uint8_t> head(expected.begin(), expected.begin() + sp::kHeaderBytes);
      EXPECT_EQ(dump(e.bytes), dump(head)) << "the header of example " << e.name;
    } else {
      frames.insert(e.name);
      EXPECT_EQ(dump(e.bytes), dump(expected)) << "(right: what the FlatBuffers builder makes)";
    }
  }
  for (const auto& [name, g] : generated()) {
    EXPECT_TRUE(frames.contains(name)) << "example " << name << " is missing from the document:\n"
                                       << dump(generated_frame(g));
  }
}

TEST(ProtocolDocExamples, CoverTheHeaderHelloARequestWithABodyAndAnErrorReply) {
  bool header = false, hello = false, request_with_fields = false, error_reply = false;
  for (const Example& e : examples()) {
    if (e.kind == "header") header = true;
    if (e.kind != "frame" || e.bytes.size() <= sp::kHeaderBytes) continue;
    const std::span<const std::byte> payload(
        reinterpret_cast<const std::byte*>(e.bytes.data()) + sp::kHeaderBytes,
        e.bytes.size() - sp::kHeaderBytes);
    sp::FrameError error = sp::FrameError::none;
    if (const wire::Request* r = sp::verify_request(payload, error);
        r != nullptr && starts_with(e.frame_line, "request")) {
      hello = hello || r->body_type() == wire::RequestBody::Hello;
      request_with_fields = request_with_fields || (r->body_type() != wire::RequestBody::Hello &&
                                                    request_fields(*r).size() > 2);
    }
    if (const wire::Reply* r = sp::verify_reply(payload, error);
        r != nullptr && starts_with(e.frame_line, "reply")) {
      error_reply = error_reply || r->status() != wire::Status::ok;
    }
  }
  EXPECT_TRUE(header) << "no `hex header` example";
  EXPECT_TRUE(hello) << "no Hello request example";
  EXPECT_TRUE(request_with_fields) << "no example of a request (other than Hello) with fields";
  EXPECT_TRUE(error_reply) << "no example of an error reply";
}

TEST(ProtocolDocExamples, NoUnmarkedHexDumps) {
  for (const Fence& f : fenced_blocks()) {
    if (f.info == "hex frame" || f.info == "hex header") continue;
    for (std::size_t i = 0; i < f.lines.size(); ++i) {
      EXPECT_FALSE(looks_like_dump(f.lines[i]))
          << "docs/protocol.md:" << f.first_line + i
          << " is a hex dump outside a ```hex frame / ```hex header block, so no test checks "
             "it: "
          << f.lines[i];
    }
  }
}

TEST(ProtocolDocExamples, ParsersRejectABrokenExample) {
  // The checks above are only worth something if they fail on a wrong document.
  Example e;
  e.kind = "frame";
  e.name = "hello-request";
  e.frame_line = "request flags=0 length=" +
                 std::to_string(generated_frame(generated().at(e.name)).size() - 16);
  e.expects = {"id=1 body=Hello min_version=1 max_version=1 client_name=\"example\""};
  e.bytes = generated_frame(generated().at(e.name));
  EXPECT_TRUE(check(e).empty()) << join(check(e), "\n");

  Example wrong_field = e;
  wrong_field.expects = {"id=1 body=Hello max_version=2"};
  EXPECT_FALSE(check(wrong_field).empty());
  Example unknown_field = e;
  unknown_field.expects = {"id=1 body=Hello colour=blue"};
  EXPECT_FALSE(check(unknown_field).empty());
  Example flipped = e;
  flipped.bytes[sp::kHeaderBytes + 3] = 0x7f;  // the root offset now points far outside
  EXPECT_FALSE(check(flipped).empty());
  Example bad_magic = e;
  bad_magic.bytes[0] = 'X';
  EXPECT_FALSE(check(bad_magic).empty());

  std::size_t offset = 0;
  std::vector<std::uint8_t> bytes;
  ASSERT_TRUE(parse_dump_line("0010  14 00 0a 00  # comment", offset, bytes));
  EXPECT_EQ(offset, 16u);
  EXPECT_EQ(bytes, (std::vector<std::uint8_t>{0x14, 0x00, 0x0a, 0x00}));
  EXPECT_FALSE(parse_dump_line("table Request { id: ulong; }", offset, bytes));
  EXPECT_TRUE(looks_like_dump("0000  53 50 4c 31 01 00 01 00   header: request"));
  EXPECT_TRUE(looks_like_dump("53 50 4c 31  01 00  01 00  00 00 00 00  58 00 00 00"));
  EXPECT_FALSE(looks_like_dump("page i  = base + i * page_stride"));
}

// --- tables -------------------------------------------------------------------------------

TEST(ProtocolDocTables, UnionTableListsEveryBodyType) {
  std::map<int, std::vector<std::string>> rows;
  for (const std::string& line : section("### 3.2")) {
    const auto c = cells(line);
    if (c.size() != 4 || c[0].empty() || !std::isdigit(static_cast<unsigned char>(c[0][0])))
      continue;
    rows[std::stoi(c[0])] = {unquote_code(c[1]), unquote_code(c[2]), unquote_code(c[3])};
  }
  const int max = static_cast<int>(wire::RequestBody::MAX);
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(max) + 1) << "§3.2 must list 0.." << max;
  for (const auto& [value, row] : rows) {
    SCOPED_TRACE("body_type " + std::to_string(value));
    ASSERT_LE(value, max);
    EXPECT_EQ(row[0], wire::EnumNameRequestBody(static_cast<wire::RequestBody>(value)));
    EXPECT_EQ(row[1], wire::EnumNameReplyBody(static_cast<wire::ReplyBody>(value)));
    EXPECT_EQ(row[2], sp::request_name(static_cast<wire::RequestBody>(value)));
  }
  // "a value above N" in §3.2 names the last member.
  for (const std::string& line : section("### 3.2")) {
    for (auto at = line.find("above "); at != std::string::npos; at = line.find("above ", at + 1)) {
      const std::string rest = line.substr(at + 6);
      if (rest.empty() || !std::isdigit(static_cast<unsigned char>(rest[0]))) continue;
      EXPECT_EQ(std::stoi(rest), max) << line;
    }
  }
}

template <class E, std::size_t N>
std::set<std::pair<std::string, int>> schema_enum(const E (&values)[N], const char* (*name)(E)) {
  std::set<std::pair<std::string, int>> out;
  for (const E v : values) out.emplace(name(v), static_cast<int>(v));
  return out;
}

TEST(ProtocolDocTables, EnumTableListsEverySchemaValue) {
  std::map<std::string, std::set<std::pair<std::string, int>>> documented;
  for (const std::string& line : section("### 3.4")) {
    const auto c = cells(line);
    if (c.size() != 3 || !starts_with(c[0], "`")) continue;
    auto& values = documented[unquote_code(c[0])];
    for (const std::string& item : split_list(c[2])) {  // `name`=N
      const auto eq = item.rfind('=');
      ASSERT_NE(eq, std::string::npos) << line;
      values.emplace(unquote_code(item.substr(0, eq)), std::stoi(item.substr(eq + 1)));
    }
  }
  const std::map<std::string, std::set<std::pair<std::string, int>>> schema = {
      {"Arch", schema_enum(wire::EnumValuesArch(), wire::EnumNameArch)},
      {"DType", schema_enum(wire::EnumValuesDType(), wire::EnumNameDType)},
      {"CodecId", schema_enum(wire::EnumValuesCodecId(), wire::EnumNameCodecId)},
      {"StepQuantVariant",
       schema_enum(wire::EnumValuesStepQuantVariant(), wire::EnumNameStepQuantVariant)},
      {"MemorySpace", schema_enum(wire::EnumValuesMemorySpace(), wire::EnumNameMemorySpace)},
      {"HandleKind", schema_enum(wire::EnumValuesHandleKind(), wire::EnumNameHandleKind)},
      {"KvCodec", schema_enum(wire::EnumValuesKvCodec(), wire::EnumNameKvCodec)},
      {"SnapshotTier", schema_enum(wire::EnumValuesSnapshotTier(), wire::EnumNameSnapshotTier)},
  };
  EXPECT_EQ(documented, schema);
}

/// §6 status table: value -> {name, sent-by cell}.
std::map<int, std::pair<std::string, std::string>> status_rows() {
  std::map<int, std::pair<std::string, std::string>> rows;
  for (const std::string& line : section("## 6.")) {
    const auto c = cells(line);
    if (c.size() != 5 || c[0].empty() || !std::isdigit(static_cast<unsigned char>(c[0][0])))
      continue;
    rows[std::stoi(c[0])] = {unquote_code(c[1]), c[3]};
  }
  return rows;
}

TEST(ProtocolDocTables, StatusTableListsEveryStatus) {
  const auto rows = status_rows();
  std::set<std::pair<std::string, int>> documented;
  for (const auto& [value, row] : rows) documented.emplace(row.first, value);
  EXPECT_EQ(documented, schema_enum(wire::EnumValuesStatus(), wire::EnumNameStatus));
}

std::set<std::string> request_names() {
  std::set<std::string> out;
  for (const auto v : wire::EnumValuesRequestBody()) {
    if (v != wire::RequestBody::NONE) out.insert(wire::EnumNameRequestBody(v));
  }
  return out;
}

TEST(ProtocolDocTables, StatusesByRequestAgreeWithTheStatusTable) {
  const std::set<std::string> requests = request_names();
  // "Statuses by request" (§6): request -> the statuses it can get besides the ones that
  // every request can get.
  std::map<std::string, std::set<std::string>> by_request;
  for (const std::string& line : section("### 6.1")) {
    const auto c = cells(line);
    if (c.size() != 2 || !starts_with(c[0], "`")) continue;
    const std::string request = unquote_code(c[0]);
    EXPECT_TRUE(requests.contains(request)) << "no request " << request;
    std::set<std::string>& statuses = by_request[request];
    if (c[1] != "–") {
      for (const std::string& s : split_list(c[1])) statuses.insert(s);
    }
  }
  for (const std::string& r : requests) {
    EXPECT_TRUE(by_request.contains(r)) << "§6.1 has no row for " << r;
    by_request[r].insert({"ok", "protocol_error", "internal"});
    if (r != "Hello") by_request[r].insert("not_hello");
  }

  // The status table's "Sent by" cells, read with the same words.
  std::map<std::string, std::set<std::string>> sent_by;  // status -> requests
  for (const auto& [value, row] : status_rows()) {
    std::set<std::string>& who = sent_by[row.first];
    for (const std::string& item : split_list(row.second)) {
      if (item == "every request" || item == "any request") {
        who.insert(requests.begin(), requests.end());
      } else if (item == "any request but Hello") {
        who.insert(requests.begin(), requests.end());
        who.erase("Hello");
      } else if (item == "connect" || item == "–") {
        // not a request
      } else {
        EXPECT_TRUE(requests.contains(item))
            << "status " << row.first << ": '" << item << "' in \"Sent by\" is no request name";
        who.insert(item);
      }
    }
  }
  for (const std::string& r : requests) {
    for (const auto& [status, who] : sent_by) {
      EXPECT_EQ(who.contains(r), by_request[r].contains(status))
          << status << " / " << r << ": the status table and §6.1 disagree";
    }
  }
}

}  // namespace
