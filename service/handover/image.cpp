#include "handover/image.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <flatbuffers/flatbuffers.h>
#include <boost/crc.hpp>

#include "image_generated.h"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/kernels/snapshot.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/support/byte_fields.hpp"

namespace statepool::service::handover {
namespace {

namespace wire = ::statepool::handover::wire;

static_assert(std::endian::native == std::endian::little,
              "statepool assumes a little-endian host (x86-64, aarch64)");
static_assert(kMaxImagePayloadBytes < FLATBUFFERS_MAX_BUFFER_SIZE);

// The schema's enums are the domain's, value for value.
template <class A, class B>
constexpr bool same(A a, B b) {
  return static_cast<unsigned>(a) == static_cast<unsigned>(b);
}
static_assert(same(wire::Arch::gdn, kernels::Arch::gdn) &&
              same(wire::Arch::MAX, kernels::Arch::kda));
static_assert(same(wire::DType::f32, kernels::DType::f32) &&
              same(wire::DType::bf16, kernels::DType::bf16) &&
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
              same(wire::CodecId::MAX, kernels::CodecId::dsq6));
static_assert(same(wire::StepQuantVariant::full, kernels::StepQuantVariant::full) &&
              same(wire::StepQuantVariant::spatial_only, kernels::StepQuantVariant::spatial_only) &&
              same(wire::StepQuantVariant::temporal_only,
                   kernels::StepQuantVariant::temporal_only) &&
              same(wire::StepQuantVariant::MAX, kernels::StepQuantVariant::no_refit));
static_assert(same(wire::HandleKind::memfd, kernels::HandleKind::memfd) &&
              same(wire::HandleKind::cuda_vmm_fd, kernels::HandleKind::cuda_vmm_fd) &&
              same(wire::HandleKind::MAX, kernels::HandleKind::cuda_ipc));
static_assert(same(wire::KvCodecId::bf16, kernels::KvCodecId::bf16) &&
              same(wire::KvCodecId::fp8, kernels::KvCodecId::fp8) &&
              same(wire::KvCodecId::kivi2, kernels::KvCodecId::kivi2) &&
              same(wire::KvCodecId::kivi4, kernels::KvCodecId::kivi4) &&
              same(wire::KvCodecId::MAX, kernels::KvCodecId::flexgen4));

constexpr char kMagic[8] = {'S', 'P', 'H', 'O', 'V', 'E', 'R', '\0'};
static_assert(sizeof kMagic == kImageVersionOffset);

using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

using support::load_field;
using support::store_field;

// --- encoding ---------------------------------------------------------------------------

// An upper bound (about) of the payload's size, known before anything is built, so that a
// state too large is refused before FlatBuffers' own 2 GiB limit can be reached.
std::uint64_t estimate_payload(const PoolState& state, const ImageMeta& meta) {
  constexpr std::uint64_t kTable = 512;  // a table, its vtable, its offset, alignment
  constexpr std::uint64_t kString = 16;  // length, terminator, alignment
  std::uint64_t n = 1024 + kTable + 2 * kString + meta.daemon_version.size() + meta.backend.size();
  for (const auto& p : state.plans) {
    n += kTable + kString + 1024;
    if (p.plan != nullptr) {
      n += p.plan->widths.size() + 4 * (p.plan->impact.size() + p.plan->mean_log_decay.size()) +
           p.plan->source.size();
    }
  }
  for (const auto& l : state.layouts) {
    n += kTable + 2 * kString + l.layout.name.size() + l.plan_digest.size();
  }
  for (const auto& a : state.arenas)
    n += kTable + 2 * kString + a.tenant.size() + 8 * a.owner.size();
  for (const auto& l : state.leases) {
    n += kTable + 3 * kString + l.tenant.size() + l.token.size() + 8 * l.slots.size();
  }
  for (const auto& s : state.snapshots) {
    n += kTable + 4 * kString + s.space.size() + s.prefix.size() + s.tenant.size() +
         4 * s.kv_pages.size();
  }
  for (const auto& t : state.tenants) n += kTable + kString + t.name.size();
  return n;
}

flatbuffers::Offset<flatbuffers::Vector<std::uint8_t>> bytes_vector(
    flatbuffers::FlatBufferBuilder& fbb, const void* data, std::size_t size) {
  return fbb.CreateVector(static_cast<const std::uint8_t*>(data), size);
}

flatbuffers::Offset<wire::Plan> encode_plan(flatbuffers::FlatBufferBuilder& fbb,
                                            const PoolStatePlan& entry, std::size_t index) {
  const std::string name = "plan " + std::to_string(index);
  if (entry.plan == nullptr) throw ImageError(name + " is null");
  std::vector<std::byte> bytes;
  try {
    bytes = kernels::stepquant::to_bytes(*entry.plan);
  } catch (const std::invalid_argument& e) {
    throw ImageError(name + ": " + e.what());
  }
  const auto data = bytes_vector(fbb, bytes.data(), bytes.size());
  wire::PlanBuilder b(fbb);
  b.add_bytes(data);
  return b.Finish();
}

flatbuffers::Offset<wire::Layout> encode_layout(flatbuffers::FlatBufferBuilder& fbb,
                                                const PoolStateLayout& entry) {
  const kernels::StateLayout& l = entry.layout;
  const auto name = fbb.CreateString(l.name);
  const auto digest = fbb.CreateString(entry.plan_digest);
  wire::LayoutBuilder b(fbb);
  b.add_id(entry.id);
  b.add_name(name);
  b.add_arch(static_cast<wire::Arch>(l.arch));
  b.add_num_layers(l.num_layers);
  b.add_num_heads(l.num_heads);
  b.add_key_dim(l.key_dim);
  b.add_value_dim(l.value_dim);
  b.add_conv_channels(l.conv_channels);
  b.add_conv_width(l.conv_width);
  b.add_conv_dtype(static_cast<wire::DType>(l.conv_dtype));
  b.add_codec(static_cast<wire::CodecId>(l.codec.id));
  b.add_group_size(l.codec.group_size);
  b.add_variant(static_cast<wire::StepQuantVariant>(l.codec.variant));
  b.add_plan_digest(digest);
  return b.Finish();
}

flatbuffers::Offset<wire::Arena> encode_arena(flatbuffers::FlatBufferBuilder& fbb,
                                              const PoolStateArena& a) {
  const auto tenant = fbb.CreateString(a.tenant);
  const auto owner = fbb.CreateVector(a.owner);
  wire::ArenaBuilder b(fbb);
  b.add_id(a.id);
  b.add_tenant(tenant);
  b.add_layout(a.layout);
  b.add_page_count(a.page_count);
  b.add_page_stride(a.page_stride);
  b.add_bytes(a.bytes);
  b.add_handle(static_cast<wire::HandleKind>(a.handle));
  b.add_owner(owner);
  return b.Finish();
}

flatbuffers::Offset<wire::Lease> encode_lease(flatbuffers::FlatBufferBuilder& fbb,
                                              const PoolStateLease& l) {
  const auto tenant = fbb.CreateString(l.tenant);
  const auto token = fbb.CreateString(l.token);
  std::vector<wire::SlotRef> refs;
  refs.reserve(l.slots.size());
  for (const auto& [arena, slot] : l.slots) refs.emplace_back(arena, slot);
  const auto slots = fbb.CreateVectorOfStructs(refs);
  wire::LeaseBuilder b(fbb);
  b.add_id(l.id);
  b.add_tenant(tenant);
  b.add_token(token);
  b.add_grace_left_ms(l.grace_left.count());
  b.add_slots(slots);
  return b.Finish();
}

flatbuffers::Offset<wire::Snapshot> encode_snapshot(flatbuffers::FlatBufferBuilder& fbb,
                                                    const PoolStateSnapshot& s) {
  const auto space = fbb.CreateString(s.space);
  const auto prefix = bytes_vector(fbb, s.prefix.data(), s.prefix.size());
  const auto tenant = fbb.CreateString(s.tenant);
  const auto kv_pages = fbb.CreateVector(s.kv_pages);
  wire::SnapshotBuilder b(fbb);
  b.add_space(space);
  b.add_prefix(prefix);
  b.add_position(s.position);
  b.add_layout(s.layout);
  b.add_tenant(tenant);
  b.add_arena(s.arena);
  b.add_slot(s.slot);
  if (s.kv) {
    const wire::KvBlocks kv(s.kv->tokens, s.kv->layers, s.kv->key_channels, s.kv->value_channels,
                            static_cast<wire::KvCodecId>(s.kv->codec));
    b.add_kv(&kv);  // copied into the buffer here
  }
  b.add_kv_pages(kv_pages);
  b.add_pinned(s.pinned);
  b.add_hits(s.hits);
  b.add_age_ms(s.age.count());
  b.add_idle_ms(s.idle.count());
  b.add_held_below(s.held_below);
  if (s.pages_crc) b.add_pages_crc(*s.pages_crc);
  return b.Finish();
}

flatbuffers::Offset<wire::Tenant> encode_tenant(flatbuffers::FlatBufferBuilder& fbb,
                                                const PoolStateTenant& t) {
  const auto name = fbb.CreateString(t.name);
  wire::TenantBuilder b(fbb);
  b.add_name(name);
  b.add_layouts_added(t.layouts_added);
  b.add_plans_added(t.plans_added);
  b.add_hits(t.hits);
  b.add_misses(t.misses);
  b.add_puts_created(t.puts_created);
  b.add_puts_existing(t.puts_existing);
  b.add_evictions(t.evictions);
  b.add_demotions(t.demotions);
  b.add_hits_host(t.hits_host);
  b.add_hits_remote(t.hits_remote);
  return b.Finish();
}

template <class Entry, class Encode>
auto encode_all(flatbuffers::FlatBufferBuilder& fbb, const std::vector<Entry>& entries,
                Encode encode) {
  std::vector<decltype(encode(entries.front(), std::size_t{0}))> offsets;
  offsets.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) offsets.push_back(encode(entries[i], i));
  return fbb.CreateVector(offsets);
}

// --- decoding ---------------------------------------------------------------------------

// Bytes from the image in a message: printable ASCII as it is, anything else as \xNN, at
// most 64 bytes of it.
std::string quoted(std::string_view text) {
  constexpr std::size_t kShown = 64;
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > kShown) out += "...";
  return out + "'";
}

template <class E>
bool known(E value) noexcept {
  return static_cast<unsigned>(value) <= static_cast<unsigned>(E::MAX);
}

template <class E>
void expect_known(E value, const std::string& entry, const char* field) {
  if (!known(value)) {
    throw ImageError(entry + ": " + field + " " + std::to_string(static_cast<unsigned>(value)) +
                     " unknown");
  }
}

std::string read_string(const flatbuffers::String* s, std::size_t limit, const std::string& entry,
                        const char* field) {
  if (s == nullptr) return {};
  if (s->size() > limit) {
    throw ImageError(entry + ": " + field + " of " + std::to_string(s->size()) +
                     " bytes, longer than the limit of " + std::to_string(limit));
  }
  return {s->data(), s->size()};
}

std::chrono::milliseconds read_duration(std::int64_t ms, const std::string& entry,
                                        const char* field) {
  if (ms < 0) throw ImageError(entry + ": " + field + " " + std::to_string(ms) + " is negative");
  return std::chrono::milliseconds{ms};
}

template <class T>
std::vector<T> read_vector(const flatbuffers::Vector<T>* v) {
  if (v == nullptr) return {};
  return {v->begin(), v->end()};
}

// Calls read(entry, index) for each table of an optional vector.
template <class T, class Read>
void for_each(const flatbuffers::Vector<flatbuffers::Offset<T>>* v, Read read) {
  if (v == nullptr) return;
  for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) read(*v->Get(i), std::size_t{i});
}

using PlansByDigest =
    std::unordered_map<std::string, std::shared_ptr<const kernels::stepquant::Plan>>;

PoolStatePlan read_plan(const wire::Plan& p, std::size_t index, PlansByDigest& by_digest,
                        std::unordered_map<std::string, std::size_t>& first_with_digest) {
  const std::string name = "plan " + std::to_string(index);
  std::span<const std::byte> bytes;
  if (p.bytes() != nullptr) bytes = std::as_bytes(std::span(p.bytes()->data(), p.bytes()->size()));
  std::shared_ptr<const kernels::stepquant::Plan> plan;
  try {
    plan = std::make_shared<const kernels::stepquant::Plan>(kernels::stepquant::from_bytes(bytes));
  } catch (const std::invalid_argument& e) {
    throw ImageError(name + ": " + e.what());
  }
  std::string digest = kernels::stepquant::digest(*plan);
  if (const auto it = first_with_digest.find(digest); it != first_with_digest.end()) {
    throw ImageError(name + ": digest " + digest + " repeats plan " + std::to_string(it->second));
  }
  first_with_digest.emplace(digest, index);
  by_digest.emplace(std::move(digest), plan);
  return PoolStatePlan{std::move(plan)};
}

PoolStateLayout read_layout(const wire::Layout& l, const PlansByDigest& plans) {
  const std::string name = "layout " + std::to_string(l.id());
  expect_known(l.arch(), name, "arch");
  expect_known(l.conv_dtype(), name, "conv_dtype");
  expect_known(l.codec(), name, "codec");
  expect_known(l.variant(), name, "codec variant");
  PoolStateLayout out;
  out.id = l.id();
  kernels::StateLayout& layout = out.layout;
  layout.name = read_string(l.name(), kMaxImageStringBytes, name, "name");
  layout.arch = static_cast<kernels::Arch>(l.arch());
  layout.num_layers = l.num_layers();
  layout.num_heads = l.num_heads();
  layout.key_dim = l.key_dim();
  layout.value_dim = l.value_dim();
  layout.conv_channels = l.conv_channels();
  layout.conv_width = l.conv_width();
  layout.conv_dtype = static_cast<kernels::DType>(l.conv_dtype());
  layout.codec.id = static_cast<kernels::CodecId>(l.codec());
  layout.codec.group_size = l.group_size();
  layout.codec.variant = static_cast<kernels::StepQuantVariant>(l.variant());
  out.plan_digest = read_string(l.plan_digest(), kMaxPlanDigestBytes, name, "plan digest");
  if (!out.plan_digest.empty()) {
    const auto it = plans.find(out.plan_digest);
    if (it == plans.end()) {
      throw ImageError(name + ": plan digest " + quoted(out.plan_digest) + " unknown");
    }
    layout.plan = it->second;
  }
  if (std::string problem = kernels::validate(layout); !problem.empty()) {
    throw ImageError(name + ": " + problem);
  }
  return out;
}

PoolStateArena read_arena(const wire::Arena& a) {
  const std::string name = "arena " + std::to_string(a.id());
  expect_known(a.handle(), name, "handle kind");
  PoolStateArena out;
  out.id = a.id();
  out.tenant = read_string(a.tenant(), kMaxImageStringBytes, name, "tenant");
  out.layout = a.layout();
  out.page_count = a.page_count();
  out.page_stride = a.page_stride();
  out.bytes = a.bytes();
  out.handle = static_cast<kernels::HandleKind>(a.handle());
  out.owner = read_vector(a.owner());
  return out;  // memory null, fd -1: the descriptor travels beside the image
}

PoolStateLease read_lease(const wire::Lease& l) {
  const std::string name = "lease " + std::to_string(l.id());
  PoolStateLease out;
  out.id = l.id();
  out.tenant = read_string(l.tenant(), kMaxImageStringBytes, name, "tenant");
  out.token = read_string(l.token(), kMaxImageStringBytes, name, "token");
  out.grace_left = read_duration(l.grace_left_ms(), name, "grace_left_ms");
  if (l.slots() != nullptr) {
    out.slots.reserve(l.slots()->size());
    for (const wire::SlotRef* ref : *l.slots()) out.slots.emplace_back(ref->arena(), ref->slot());
  }
  return out;
}

PoolStateSnapshot read_snapshot(const wire::Snapshot& s, std::size_t index) {
  const std::string name = "snapshot " + std::to_string(index);
  PoolStateSnapshot out;
  out.space = read_string(s.space(), kMaxImageStringBytes, name, "namespace");
  if (s.prefix() != nullptr) {
    if (s.prefix()->size() > kernels::kMaxSnapshotPrefixBytes) {
      throw ImageError(name + ": prefix of " + std::to_string(s.prefix()->size()) +
                       " bytes, longer than the limit of " +
                       std::to_string(kernels::kMaxSnapshotPrefixBytes));
    }
    const auto* data = reinterpret_cast<const char*>(s.prefix()->data());
    out.prefix.assign(data, s.prefix()->size());
  }
  out.position = s.position();
  out.layout = s.layout();
  out.tenant = read_string(s.tenant(), kMaxImageStringBytes, name, "tenant");
  out.arena = s.arena();
  out.slot = s.slot();
  if (const wire::KvBlocks* kv = s.kv(); kv != nullptr) {
    expect_known(kv->codec(), name, "KV codec");
    kernels::KvBlocks blocks;
    blocks.codec = static_cast<kernels::KvCodecId>(kv->codec());
    blocks.layers = kv->layers();
    blocks.key_channels = kv->key_channels();
    blocks.value_channels = kv->value_channels();
    blocks.tokens = kv->tokens();
    if (const char* problem = kernels::kv_blocks_problem(blocks)) {
      throw ImageError(name + ": " + problem);
    }
    out.kv = blocks;
  }
  out.kv_pages = read_vector(s.kv_pages());
  out.pinned = s.pinned();
  out.hits = s.hits();
  out.age = read_duration(s.age_ms(), name, "age_ms");
  out.idle = read_duration(s.idle_ms(), name, "idle_ms");
  out.held_below = s.held_below();
  if (const auto crc = s.pages_crc(); crc.has_value()) out.pages_crc = *crc;
  return out;
}

PoolStateTenant read_tenant(const wire::Tenant& t, std::size_t index) {
  const std::string name = "tenant " + std::to_string(index);
  PoolStateTenant out;
  out.name = read_string(t.name(), kMaxImageStringBytes, name, "name");
  out.layouts_added = t.layouts_added();
  out.plans_added = t.plans_added();
  out.hits = t.hits();
  out.misses = t.misses();
  out.puts_created = t.puts_created();
  out.puts_existing = t.puts_existing();
  out.evictions = t.evictions();
  out.demotions = t.demotions();
  out.hits_host = t.hits_host();
  out.hits_remote = t.hits_remote();
  return out;
}

DecodedImage read_image(const wire::Image& image) {
  DecodedImage out;
  const wire::Meta& meta = *image.meta();  // required: the verifier checked it is there
  out.meta.generation = meta.generation();
  out.meta.daemon_version =
      read_string(meta.daemon_version(), kMaxImageStringBytes, "meta", "daemon_version");
  out.meta.backend = read_string(meta.backend(), kMaxImageStringBytes, "meta", "backend");
  out.meta.device = meta.device();

  PoolState& state = out.state;
  PlansByDigest plans;
  std::unordered_map<std::string, std::size_t> first_with_digest;
  for_each(image.plans(), [&](const wire::Plan& p, std::size_t i) {
    state.plans.push_back(read_plan(p, i, plans, first_with_digest));
  });
  for_each(image.layouts(), [&](const wire::Layout& l, std::size_t) {
    state.layouts.push_back(read_layout(l, plans));
  });
  for_each(image.arenas(),
           [&](const wire::Arena& a, std::size_t) { state.arenas.push_back(read_arena(a)); });
  for_each(image.leases(),
           [&](const wire::Lease& l, std::size_t) { state.leases.push_back(read_lease(l)); });
  for_each(image.snapshots(), [&](const wire::Snapshot& s, std::size_t i) {
    state.snapshots.push_back(read_snapshot(s, i));
  });
  for_each(image.tenants(), [&](const wire::Tenant& t, std::size_t i) {
    state.tenants.push_back(read_tenant(t, i));
  });
  state.next_arena = image.next_arena();
  state.next_lease = image.next_lease();
  state.pages_reclaimed_total = image.pages_reclaimed_total();
  return out;
}

}  // namespace

ImageError::ImageError(const std::string& what)
    : StatusError(Status::invalid_argument, "hand-over image: " + what) {}

std::uint32_t image_crc32c(std::span<const std::byte> bytes) noexcept {
  Crc32c crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

std::vector<std::byte> wrap_payload(std::span<const std::byte> payload, std::uint32_t version) {
  if (payload.size() > kMaxImagePayloadBytes) {
    throw ImageError("payload of " + std::to_string(payload.size()) +
                     " bytes exceeds the limit of " + std::to_string(kMaxImagePayloadBytes));
  }
  std::vector<std::byte> image(kImageHeaderBytes + payload.size());
  std::byte* head = image.data();
  std::memcpy(head, kMagic, sizeof kMagic);
  store_field(head + kImageVersionOffset, version);
  store_field(head + kImageFlagsOffset, std::uint32_t{0});
  store_field(head + kImageLengthOffset, std::uint64_t{payload.size()});
  store_field(head + kImagePayloadCrcOffset, image_crc32c(payload));
  store_field(head + kImageHeaderCrcOffset, image_crc32c({head, kImageHeaderCrcOffset}));
  if (!payload.empty()) std::memcpy(head + kImageHeaderBytes, payload.data(), payload.size());
  return image;
}

std::vector<std::byte> encode_image(const PoolState& state, const ImageMeta& meta) {
  const std::uint64_t estimate = estimate_payload(state, meta);
  if (estimate > kMaxImagePayloadBytes) {
    throw ImageError("the state needs about " + std::to_string(estimate) +
                     " bytes, more than the limit of " + std::to_string(kMaxImagePayloadBytes));
  }
  flatbuffers::FlatBufferBuilder fbb(
      static_cast<std::size_t>(std::min<std::uint64_t>(estimate, std::uint64_t{64} << 20)));
  const auto plans = encode_all(fbb, state.plans, [&](const PoolStatePlan& p, std::size_t i) {
    return encode_plan(fbb, p, i);
  });
  const auto layouts = encode_all(fbb, state.layouts, [&](const PoolStateLayout& l, std::size_t) {
    return encode_layout(fbb, l);
  });
  const auto arenas = encode_all(fbb, state.arenas, [&](const PoolStateArena& a, std::size_t) {
    return encode_arena(fbb, a);
  });
  const auto leases = encode_all(fbb, state.leases, [&](const PoolStateLease& l, std::size_t) {
    return encode_lease(fbb, l);
  });
  const auto snapshots =
      encode_all(fbb, state.snapshots,
                 [&](const PoolStateSnapshot& s, std::size_t) { return encode_snapshot(fbb, s); });
  const auto tenants = encode_all(fbb, state.tenants, [&](const PoolStateTenant& t, std::size_t) {
    return encode_tenant(fbb, t);
  });
  const auto version = fbb.CreateString(meta.daemon_version);
  const auto backend = fbb.CreateString(meta.backend);
  wire::MetaBuilder mb(fbb);
  mb.add_generation(meta.generation);
  mb.add_daemon_version(version);
  mb.add_backend(backend);
  mb.add_device(meta.device);
  const auto meta_offset = mb.Finish();

  wire::ImageBuilder b(fbb);
  b.add_meta(meta_offset);
  b.add_plans(plans);
  b.add_layouts(layouts);
  b.add_arenas(arenas);
  b.add_leases(leases);
  b.add_snapshots(snapshots);
  b.add_tenants(tenants);
  b.add_next_arena(state.next_arena);
  b.add_next_lease(state.next_lease);
  b.add_pages_reclaimed_total(state.pages_reclaimed_total);
  wire::FinishImageBuffer(fbb, b.Finish());
  return wrap_payload(std::as_bytes(std::span(fbb.GetBufferPointer(), fbb.GetSize())));
}

DecodedImage decode_image(std::span<const std::byte> bytes) {
  if (bytes.size() < kImageHeaderBytes) {
    throw ImageError(std::to_string(bytes.size()) + " bytes, shorter than its " +
                     std::to_string(kImageHeaderBytes) + "-byte header");
  }
  const std::byte* head = bytes.data();
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0) {
    throw ImageError("bad magic (not a statepool hand-over image)");
  }
  // Before the header's checksum: another version's header may be laid out differently.
  if (const auto version = load_field<std::uint32_t>(head + kImageVersionOffset);
      version != kImageVersion) {
    throw ImageError("version " + std::to_string(version) + ", this statepoold reads version " +
                     std::to_string(kImageVersion) + " only");
  }
  if (load_field<std::uint32_t>(head + kImageHeaderCrcOffset) !=
      image_crc32c(bytes.first(kImageHeaderCrcOffset))) {
    throw ImageError("header checksum mismatch");
  }
  if (const auto flags = load_field<std::uint32_t>(head + kImageFlagsOffset); flags != 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%x", flags);
    throw ImageError(std::string("unknown flags ") + buf + " (this version defines none)");
  }
  const auto length = load_field<std::uint64_t>(head + kImageLengthOffset);
  const std::size_t received = bytes.size() - kImageHeaderBytes;
  if (length > kMaxImagePayloadBytes) {
    throw ImageError("payload length " + std::to_string(length) + " exceeds the limit of " +
                     std::to_string(kMaxImagePayloadBytes));
  }
  if (length != received) {
    throw ImageError("payload length " + std::to_string(length) + " but " +
                     std::to_string(received) + " bytes received");
  }
  const auto payload = bytes.subspan(kImageHeaderBytes);
  if (load_field<std::uint32_t>(head + kImagePayloadCrcOffset) != image_crc32c(payload)) {
    throw ImageError("payload checksum mismatch");
  }

  // FlatBuffers reads scalars in place: it needs the payload at an 8-byte boundary (the
  // widest scalar of the schema).
  std::vector<std::uint64_t> aligned;
  const auto* data = reinterpret_cast<const std::uint8_t*>(payload.data());
  if (reinterpret_cast<std::uintptr_t>(data) % alignof(std::uint64_t) != 0) {
    aligned.resize((payload.size() + 7) / 8);
    std::memcpy(aligned.data(), payload.data(), payload.size());
    data = reinterpret_cast<const std::uint8_t*>(aligned.data());
  }
  flatbuffers::Verifier::Options options;
  options.max_depth = kMaxImageDepth;
  options.max_tables = kMaxImageTables;
  options.check_alignment = true;
  flatbuffers::Verifier verifier(data, payload.size(), options);
  if (!wire::VerifyImageBuffer(verifier)) {
    throw ImageError("malformed (FlatBuffers verifier)");
  }
  return read_image(*wire::GetImage(data));
}

std::string backend_mismatch(const ImageMeta& meta, std::string_view backend, int device) {
  if (meta.backend == backend && (device < 0 || meta.device == device)) return {};
  return "backend " + meta.backend + " device " + std::to_string(meta.device) +
         ", this one's backend " + std::string(backend) + " device " + std::to_string(device);
}

}  // namespace statepool::service::handover
