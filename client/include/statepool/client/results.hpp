#pragma once
// The plain values of the client library (statepool/client.hpp): ids, and what requests
// return (layouts, plans, stats, capacity, snapshots). Each mirrors a reply of the wire
// protocol; the client fills them in (client/requests/) and the Python binding hands
// them out. Included by statepool/client.hpp; nothing here talks to a daemon.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/snapshot.hpp"
#include "statepool/support/status.hpp"

namespace statepool::client {

using LayoutId = std::uint32_t;
using ArenaId = std::uint32_t;
using SlotId = std::uint32_t;
using StagingId = std::uint32_t;

/// A layout registered with the daemon (RegisterLayoutReply plus the layout itself).
struct LayoutInfo {
  LayoutId id = 0;
  std::uint64_t page_bytes = 0;        ///< exact bytes of one page
  std::uint64_t fp32_bytes = 0;        ///< bytes of the same state with every value FP32
  std::uint64_t state_bytes_f32 = 0;   ///< bytes of a staged state, recurrent part in f32
  std::uint64_t state_bytes_bf16 = 0;  ///< bytes of a staged state, recurrent part in bf16
  kernels::StateLayout layout;         ///< what was registered

  /// fp32_bytes / page_bytes (0 if page_bytes is 0).
  [[nodiscard]] double compression_ratio() const noexcept;
  /// state_bytes_f32 or state_bytes_bf16 (f16 staging is not accepted by the daemon: 0).
  [[nodiscard]] std::uint64_t state_bytes(kernels::DType dtype) const noexcept;
};

/// What close_arena() gave back.
struct ArenaClose {
  std::uint64_t bytes = 0;              ///< the arena's bytes, charged to no quota any more
  std::uint32_t snapshots_dropped = 0;  ///< its unpinned snapshots, evicted from the pool
};

/// A STEPQuant plan the daemon holds (InstallPlanReply).
struct PlanInfo {
  std::string digest;        ///< what Layout.plan_digest names it by
  std::uint32_t units = 0;   ///< heads (GDN) or key rows (KDA)
  std::uint32_t pivots = 0;  ///< FP16 pivot units
  double average_bits = 0;   ///< nominal bits per value over the units
  bool created = false;      ///< false when the daemon already had it
};

/// One arena in a Stats reply (mirrors wire::ArenaStats).
struct ArenaStats {
  ArenaId arena_id = 0;
  std::string tenant;
  LayoutId layout_id = 0;
  std::string layout_name;
  kernels::CodecId codec = kernels::CodecId::fp32;
  std::string backend;
  std::uint64_t page_bytes = 0;
  std::uint64_t page_stride = 0;
  std::uint32_t pages_total = 0;
  std::uint32_t pages_used = 0;
  std::uint64_t bytes_total = 0;      ///< mapping size, page_count * page_stride
  std::uint64_t fp32_bytes_used = 0;  ///< FP32-equivalent bytes of the used pages
  std::uint32_t snapshot_pages = 0;   ///< of pages_used, those holding snapshots

  /// Page bytes of the used pages.
  [[nodiscard]] std::uint64_t stored_bytes_used() const noexcept { return page_bytes * pages_used; }
  /// fp32_bytes_used / stored_bytes_used (0 when no page is used).
  [[nodiscard]] double compression_ratio() const noexcept;
};

/// One tenant in a Stats reply (mirrors wire::TenantStats).
struct TenantStats {
  std::string tenant;
  std::uint64_t quota_bytes = 0;     ///< 0 = unlimited
  std::uint64_t reserved_bytes = 0;  ///< arena bytes held (counted against the quota)
  std::uint64_t pages_used = 0;
  std::uint64_t stored_bytes = 0;  ///< page bytes of used pages
  std::uint64_t fp32_bytes = 0;    ///< FP32-equivalent bytes of used pages
  // Prefix-state snapshots it published (their pages count above too), and counters.
  std::uint64_t snapshots = 0;
  std::uint64_t snapshot_bytes = 0;
  std::uint64_t pinned_snapshots = 0;
  std::uint64_t snapshot_hits = 0;    ///< get_snapshot hits by the tenant
  std::uint64_t snapshot_misses = 0;  ///< get_snapshot misses by the tenant
  std::uint64_t snapshot_evictions = 0;
  std::uint64_t snapshot_demotions = 0;    ///< evicted from the pool, kept by lower tiers
  std::uint64_t snapshot_hits_host = 0;    ///< of snapshot_hits, from the host tier
  std::uint64_t snapshot_hits_remote = 0;  ///< of snapshot_hits, from the remote store

  /// fp32_bytes / stored_bytes (0 when nothing is stored).
  [[nodiscard]] double compression_ratio() const noexcept;
};

/// The daemon's state (mirrors wire::StatsReply).
struct Stats {
  std::vector<ArenaStats> arenas;
  std::vector<TenantStats> tenants;
  std::uint32_t clients_connected = 0;
  std::uint32_t leases_active = 0;
  std::uint32_t leases_orphaned = 0;  ///< disconnected, waiting for the grace period
  std::uint64_t pages_reclaimed_total = 0;
  std::uint64_t pool_capacity_bytes = 0;
  std::uint64_t pool_reserved_bytes = 0;
  double uptime_seconds = 0.0;
  /// Hand-overs since the pool was created: 0 for a daemon that started fresh (and from
  /// daemons that do not say), its predecessor's + 1 for one that took the pool over.
  std::uint64_t generation = 0;
};

/// A capacity plan to ask the daemon for (PlanCapacity, docs/capacity.md). Fields left
/// at 0 / empty / unset take the planner's defaults (those of `statepoolctl plan`).
struct PlanRequest {
  std::string model_config;                  ///< the text of the model's config.json
  std::uint32_t weight_bits = 0;             ///< 16, 8 or 4; 0 = 16
  std::string kv;                            ///< bf16 fp8 kivi2 kivi4 flexgen4; "" = bf16
  std::vector<kernels::CodecId> codecs;      ///< state codecs compared; empty = the default six
  std::uint32_t slots = 0;                   ///< state slots per request; 0 = 1
  std::uint64_t context = 0;                 ///< tokens per request; 0 = 32768
  std::uint64_t gpu_memory = 0;              ///< bytes per GPU; 0 = 141 GiB
  std::optional<double> reserved;            ///< fraction kept back; unset = 0.1
  std::uint32_t tp = 0;                      ///< tensor-parallel degree; 0 = 1
  std::optional<std::uint64_t> concurrency;  ///< breakdown at; unset = each codec's maximum
};

/// How many more requests fit under one codec (mirrors wire::CodecFit).
struct CodecFit {
  kernels::CodecId codec = kernels::CodecId::fp32;
  bool nominal_plan = false;           ///< stepquant without an arena: nominal plan bytes
  std::uint64_t page_stride = 0;       ///< bytes one slot takes in an arena
  std::uint64_t arena_free_pages = 0;  ///< free pages in the tenant's arena(s) of this codec
  std::uint64_t new_arena_pages = 0;   ///< pages a new arena could take now
  std::uint64_t requests = 0;          ///< (arena_free_pages + new_arena_pages) / slots
  std::string limited_by;              ///< arena, pool, quota or max_arena_pages
};

/// What fits now for this connection's tenant (mirrors wire::FitsNowReply).
struct Fits {
  std::string tenant;
  std::uint64_t pool_capacity_bytes = 0;
  std::uint64_t pool_free_bytes = 0;              ///< capacity minus all arenas
  std::optional<std::uint64_t> quota_free_bytes;  ///< unset: the tenant has no quota
  std::uint32_t max_arena_pages = 0;
  std::vector<CodecFit> codecs;
};

/// The name of a prefix-state snapshot (docs/prefix-store.md): prefix hash and position.
using kernels::SnapshotKey;

/// KV block values in a staging buffer of this connection: where a hybrid put reads them
/// and a get writes them (docs/prefix-store.md, "Hybrid entries": streams layer 0 keys,
/// layer 0 values, layer 1 keys, ... back to back, each [tokens][channels] row-major).
struct KvStaging {
  StagingId staging = 0;
  std::uint64_t offset = 0;
  kernels::DType dtype = kernels::DType::bf16;  ///< f32, bf16 or f16
};

/// The attention layers' KV blocks of a hybrid snapshot: their shape and codec, and where
/// their values are.
struct SnapshotKv {
  kernels::KvBlocks blocks;
  KvStaging values;
};

/// What put_snapshot did.
struct SnapshotPut {
  bool created = false;       ///< false: the key had a snapshot for this layout already
  std::uint32_t evicted = 0;  ///< older snapshots evicted from the arena to make room
  std::uint64_t page_bytes = 0;
  /// The key's entry (the new one, or the one that stood): its KV blocks, their encoded
  /// bytes, and the pages of the arena it holds (1 + the KV blocks' pages).
  std::optional<kernels::KvBlocks> kv;
  std::uint64_t kv_bytes = 0;
  std::uint32_t pages = 1;
};

/// What get_snapshot found.
struct SnapshotGet {
  bool hit = false;                 ///< true: the slot now holds the snapshot's state
  std::uint32_t other_layouts = 0;  ///< miss only: snapshots of the key for other layouts
  std::uint64_t page_bytes = 0;
  std::string tier;  ///< hit only: "pool", "host" or "remote" (docs/prefix-store.md, "Tiers")
  /// Hit on a hybrid entry: its KV blocks and their encoded bytes; `kv_delivered` when they
  /// were decoded into the KvStaging the call gave.
  std::optional<kernels::KvBlocks> kv;
  std::uint64_t kv_bytes = 0;
  bool kv_delivered = false;
  explicit operator bool() const noexcept { return hit; }
};

/// One snapshot in a list_snapshots reply.
using kernels::SnapshotInfo;

/// What export_snapshot found (docs/prefix-store.md, "Moving snapshots").
struct SnapshotExport {
  bool found = false;
  std::uint64_t value_bytes = 0;  ///< the value's size (written, or needed)
  std::string layout_digest;      ///< the entry's
  std::optional<kernels::KvBlocks> kv;
  explicit operator bool() const noexcept { return found; }
};

/// What import_snapshot did.
struct SnapshotImport {
  bool created = false;  ///< false: the key had an entry for this layout already
  std::uint32_t evicted = 0;
  ArenaId arena_id = 0;  ///< the caller's tenant's arena that holds it
  SnapshotKey key;
  std::optional<kernels::KvBlocks> kv;
  std::uint32_t pages = 1;
};

struct SnapshotList {
  std::vector<SnapshotInfo> snapshots;
  bool truncated = false;          ///< more matched than the limit
  std::string snapshot_namespace;  ///< the namespace this tenant's keys live in
};

// --- protocol version 2: batched snapshot requests (docs/protocol.md) -----------------

/// Where a state's values are (put_snapshots reads them) or go (get_snapshots writes them):
/// in a staging buffer or registered memory of this connection, in the engine's own
/// layout: the recurrent part, heads in page order, each [K][V] or (value_major) [V][K];
/// the conv state [L][C][W] right after it (conv_staging 0) or anywhere else.
struct StateRange {
  StagingId staging = 0;
  std::uint64_t offset = 0;
  kernels::DType dtype = kernels::DType::f32;  ///< of the recurrent part: f32 or bf16
  bool value_major = false;
  StagingId conv_staging = 0;
  std::uint64_t conv_offset = 0;
};

/// Where KV blocks' plain values are: for layer l and token t, the row of keys at
/// key_offset + l * layer_stride + t * token_stride of `staging`, the row of values at
/// value_offset of value_staging (0: `staging`). Both strides 0: statepool's packed order
/// (KvStaging's) from key_offset.
struct KvRange {
  StagingId staging = 0;
  kernels::DType dtype = kernels::DType::bf16;  ///< f32, bf16 or f16
  std::uint64_t key_offset = 0;
  StagingId value_staging = 0;
  std::uint64_t value_offset = 0;
  std::uint64_t layer_stride = 0;
  std::uint64_t token_stride = 0;
};

/// Where a snapshot was found.
enum class SnapshotTier : std::uint8_t { none = 0, pool = 1, host = 2, remote = 3 };
/// "none", "pool", "host", "remote".
[[nodiscard]] const char* to_string(SnapshotTier tier) noexcept;

/// Keys of another pool of the same pages, looked up with lookup_snapshots in the same
/// round trip: keys[i] belongs to the page of the call's keys[i] (at most as many).
struct LookupAlso {
  ArenaId arena = 0;
  std::vector<SnapshotKey> keys;
};

/// What lookup_snapshots found.
struct SnapshotLookup {
  std::vector<SnapshotTier> found;  ///< per key, in order
  std::uint32_t leading = 0;        ///< keys present from the first on
  /// Per LookupAlso, per key (with stop_at_miss: none from `leading` on).
  std::vector<std::vector<SnapshotTier>> also;
};

/// One snapshot to publish (put_snapshots): its state from `state`, or (without) a copy
/// of `slot` of the arena; KV blocks from kv_range when `kv` is set.
struct SnapshotPutEntry {
  SnapshotKey key;
  std::optional<StateRange> state;
  SlotId slot = 0;
  std::optional<kernels::KvBlocks> kv;
  KvRange kv_range;
};

struct SnapshotPutResult {
  Status status = Status::ok;  ///< not ok: this entry failed (the others are unaffected)
  std::string message;
  bool created = false;  ///< false with ok: the key had a snapshot, which stays
  std::uint32_t evicted = 0;
};

struct SnapshotPuts {
  std::vector<SnapshotPutResult> results;  ///< per entry, in order
  std::uint32_t created = 0;
  std::uint32_t existing = 0;
  std::uint32_t failed = 0;
  std::uint64_t bytes = 0;  ///< state and KV bytes the daemon read
};

/// One snapshot to read (get_snapshots): its state into `state`, its KV blocks into
/// `kv_range` (each optional).
struct SnapshotGetEntry {
  SnapshotKey key;
  std::optional<StateRange> state;
  std::optional<KvRange> kv_range;
};

struct SnapshotGetResult {
  Status status = Status::ok;  ///< not ok: this entry failed (e.g. its KV blocks do not fit)
  std::string message;
  bool hit = false;
  SnapshotTier tier = SnapshotTier::none;
  std::optional<kernels::KvBlocks> kv;  ///< a hit's KV blocks
  bool kv_delivered = false;            ///< decoded into kv_range
};

struct SnapshotGets {
  std::vector<SnapshotGetResult> results;  ///< per entry, in order
  std::uint32_t hits = 0;
  std::uint64_t bytes = 0;  ///< state and KV bytes the daemon wrote
};

/// The 64 bytes of a cudaIpcEventHandle_t.
using IpcEventBytes = std::array<std::byte, 64>;

/// An operation the daemon may still be running on its device (Connection::*_async).
struct Pending {
  std::uint64_t bytes = 0;  ///< as compress() / decompress() return (0 for copy)
  /// The IPC event that completes with the work; empty when the work was done already.
  std::optional<IpcEventBytes> event;
};

}  // namespace statepool::client
