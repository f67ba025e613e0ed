#pragma once
// statepool client library: the thin C++ API a serving engine links to talk to statepoold.
//
// One include, one link target (statepool::client); the plain result values are in
// statepool/client/results.hpp, which this header includes. Plain POSIX sockets, synchronous calls,
// no Boost, no background threads. Everything here speaks the wire protocol of
// protocol/statepool.fbs; docs/client.md is the walk-through.
//
//   auto conn = statepool::client::Connection::connect({.tenant = "team-a"});
//   auto layout = conn.register_layout(my_layout);         // kernels::StateLayout
//   auto arena = conn.open_arena(layout, 64);              // maps the arena (host backend)
//   auto staging = conn.open_staging(layout.state_bytes_f32);
//   auto slots = conn.allocate(arena, 1);                  // RAII: freed on destruction
//   /* write an FP32 state into staging.bytes() */
//   conn.compress(slots[0], staging, 0, kernels::DType::f32);   // park
//   conn.decompress(slots[0], staging, 0, kernels::DType::f32); // resume
//
// Errors
//   Error            the daemon answered with a status other than ok (status() says which:
//                    quota_exceeded, pool_exhausted, not_found, ...); what() is the
//                    daemon's message. The connection stays usable, except after
//                    protocol_error, not_hello, unsupported_version, too_many_connections
//                    or a reply with id 0, after which the daemon closes it.
//   ConnectionError  the transport failed: cannot connect, the daemon went away, a call
//                    timed out, or the daemon sent bytes that are not a valid frame. The
//                    connection is unusable afterwards (every later call throws
//                    ConnectionError at once); make a new Connection, passing the lease
//                    token to get the slots back within the grace period.
//   Calls never hang: every read and write is bounded by Options::timeout, and a daemon
//   killed mid-call gives ConnectionError, never SIGPIPE (MSG_NOSIGNAL).
//
// Thread-safety
//   Connection: every member function may be called from several threads at once; the
//   requests are serialized on the one socket (one in flight at a time).
//   Arena, Staging, Slot: const member functions may be called concurrently; the mapped
//   bytes are the caller's to synchronize. Destroying or moving an object while another
//   thread uses that same object is a race, as for any C++ value.
//
// Lifetimes
//   Slot and Staging objects share ownership of the connection's socket, so they may
//   outlive the Connection object that made them: their destructors still free the slot /
//   close the staging buffer on the daemon. The socket closes when the Connection and every
//   Slot and Staging made from it are gone; the daemon then keeps the lease's slots for its
//   grace period and reclaims them afterwards.
//   Arena objects own only the received file descriptor and its mapping; destroying one
//   unmaps it locally and changes nothing on the daemon; Connection::close_arena() gives
//   an arena back to the daemon (else it lives as long as the daemon).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "statepool/client/results.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/protocol/frame.hpp"
#include "statepool/support/status.hpp"

namespace statepool::client {

/// The default socket of statepoold.
inline constexpr const char* kDefaultSocketPath = "/run/statepool/statepool.sock";

struct Options {
  /// Unix socket of the daemon. A path starting with '@' names a Linux abstract socket
  /// ("@statepool" -> "\0statepool").
  std::string socket_path = kDefaultSocketPath;
  /// Tenant to act for; empty means the daemon's "default" tenant.
  std::string tenant;
  /// Empty starts a new lease. A token from an earlier Connection::lease_token() resumes
  /// that lease (and gets its slots back) if it is still within its grace period.
  std::string lease_token;
  /// Free text for the daemon's logs; empty means "<program name>[<pid>]".
  std::string client_name;
  /// Bound on each call: connecting plus Hello, or one request plus its reply.
  /// Zero or negative waits forever (not recommended).
  std::chrono::milliseconds timeout{10000};
  /// Largest reply payload accepted from the daemon, in bytes (capped at
  /// protocol::kAbsoluteMaxPayload). Stats replies of large pools are the biggest.
  std::uint32_t max_reply_bytes = 16u << 20;
  /// cuda backend: map arenas and staging buffers into this process's CUDA address space
  /// when they are opened (Arena::device_data()). Off, they are used by id only (Compress,
  /// Decompress, Copy), and this process needs no GPU.
  bool map_device_memory = true;
  /// cuda backend: ask for legacy cudaIpcMemHandle_t handles (cudaIpcOpenMemHandle)
  /// instead of VMM file descriptors for the arenas this connection creates and its
  /// staging buffers (docs/client.md, "Device memory").
  bool legacy_ipc = false;
};

// ---------------------------------------------------------------------------------------
// Errors

/// The daemon refused a request: status() is the reply's status, what() its message.
class Error : public StatusError {
 public:
  Error(Status status, const std::string& message) : StatusError(status, message) {}
};

/// The transport failed; the connection is unusable afterwards. status() is
/// Status::protocol_error for a malformed frame from the daemon and Status::internal for
/// everything else; kind() is the precise reason.
class ConnectionError : public Error {
 public:
  enum class Kind {
    connect_failed,  ///< socket() or connect() failed (daemon not running, permissions)
    closed,          ///< the daemon closed the connection (or it was already broken)
    timed_out,       ///< no progress within Options::timeout
    bad_frame,       ///< the daemon sent something that is not a valid reply
    io_error,        ///< another operating-system error on the socket
  };
  ConnectionError(Kind kind, const std::string& message)
      : Error(kind == Kind::bad_frame ? Status::protocol_error : Status::internal, message),
        kind_(kind) {}
  [[nodiscard]] Kind kind() const noexcept { return kind_; }

 private:
  Kind kind_;
};

/// Stable name of a ConnectionError::Kind ("timed_out", ...).
[[nodiscard]] const char* to_string(ConnectionError::Kind kind) noexcept;

class Connection;
class Arena;
class Staging;
class Slot;

namespace detail {
struct Impl;
}

// ---------------------------------------------------------------------------------------
// Arena

/// A mapped arena: page_count pages of page_bytes each, page_stride apart.
/// Owns the file descriptor received from the daemon and (host backend) its MAP_SHARED
/// mapping; both are released on destruction. Move-only.
class Arena {
 public:
  Arena() = default;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  [[nodiscard]] ArenaId id() const noexcept { return id_; }
  [[nodiscard]] LayoutId layout_id() const noexcept { return layout_id_; }
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] std::size_t page_stride() const noexcept { return page_stride_; }
  [[nodiscard]] std::uint32_t page_count() const noexcept { return page_count_; }
  /// Size of the whole region, page_count * page_stride.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// Memory backend of the daemon: "host" or "cuda".
  [[nodiscard]] const std::string& backend() const noexcept { return backend_; }
  /// Where the arena lives and how it is shared. A host memfd is mmap()ed here (data());
  /// device memory is imported into this process's CUDA address space (device_data())
  /// unless Options::map_device_memory is false.
  [[nodiscard]] const kernels::MemoryDescriptor& memory() const noexcept { return memory_; }
  /// False when open_arena returned an arena that existed already (one of the tenant's
  /// for the layout with at least the pages asked for).
  [[nodiscard]] bool created() const noexcept { return created_; }
  /// True when the region is mapped into this process (host memory).
  [[nodiscard]] bool mapped() const noexcept { return base_ != nullptr; }
  /// Device memory mapped into this process: the CUDA device address of the region (valid
  /// on device memory().device, which is then this process's ordinal of the daemon's GPU,
  /// found by its UUID), or nullptr (host memory, or not mapped).
  [[nodiscard]] std::byte* device_data() const noexcept { return device_base_; }
  /// Device address of page `slot` (page_bytes() long). Throws std::out_of_range when
  /// slot >= page_count(), std::logic_error when no device memory is mapped.
  [[nodiscard]] std::byte* device_page(SlotId slot) const;
  /// The received descriptor (owned by this object; dup() it to keep it longer); -1 when
  /// the handle kind is not a descriptor.
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// The whole mapping (empty when not mapped).
  [[nodiscard]] std::span<std::byte> data() const noexcept;

  /// The page_bytes() bytes of page `slot`. Throws std::out_of_range when
  /// slot >= page_count(), std::logic_error when the arena is not mapped.
  [[nodiscard]] std::span<std::byte> page(SlotId slot) const;
  /// Same, for a slot of this arena (std::invalid_argument if it belongs to another one).
  [[nodiscard]] std::span<std::byte> page(const Slot& slot) const;

  /// True when a PageCodec for the layout is available (the layout was registered through
  /// the same Connection, or the arena was opened from a LayoutInfo).
  [[nodiscard]] bool has_codec() const noexcept { return codec_ != nullptr; }
  /// The page format of this arena, to encode/decode pages locally. Throws
  /// std::logic_error when has_codec() is false.
  [[nodiscard]] const kernels::PageCodec& codec() const;

 private:
  friend class Connection;
  void map();
  void reset() noexcept;

  ArenaId id_ = 0;
  LayoutId layout_id_ = 0;
  std::size_t page_bytes_ = 0;
  std::size_t page_stride_ = 0;
  std::uint32_t page_count_ = 0;
  std::size_t bytes_ = 0;
  std::string backend_;
  bool created_ = false;
  kernels::MemoryDescriptor memory_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::shared_ptr<const void> device_mapping_;  // owns device_base_'s mapping
  std::byte* device_base_ = nullptr;
  std::shared_ptr<const kernels::PageCodec> codec_;
};

// ---------------------------------------------------------------------------------------
// Staging

/// A staging buffer shared with the daemon: full-precision states are written here before
/// Compress and read from here after Decompress. Owns the received fd and its mapping.
/// The destructor asks the daemon to close the buffer (CloseStaging), best-effort: it never
/// throws and does nothing when the connection is broken. Move-only.
class Staging {
 public:
  Staging() = default;
  Staging(Staging&& other) noexcept;
  Staging& operator=(Staging&& other) noexcept;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();

  [[nodiscard]] StagingId id() const noexcept { return id_; }
  /// Size in bytes (what the daemon granted; at least what was asked for).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The mapped buffer (empty when it is not host memory: see memory()).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept;
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Device memory mapped into this process (as Arena::device_data()), or nullptr. An
  /// engine writes its state here with its own kernels before Compress.
  [[nodiscard]] std::byte* device_data() const noexcept { return device_base_; }
  /// Where the buffer lives and how it is shared (as Arena::memory()).
  [[nodiscard]] const kernels::MemoryDescriptor& memory() const noexcept { return memory_; }
  /// False for a default-constructed, moved-from or closed object.
  [[nodiscard]] bool valid() const noexcept { return impl_ != nullptr; }

  /// Closes the buffer on the daemon now and releases the mapping; throws Error or
  /// ConnectionError (the mapping is released in every case).
  void close();

 private:
  friend class Connection;
  void map();
  void release_local() noexcept;

  std::shared_ptr<detail::Impl> impl_;
  StagingId id_ = 0;
  std::size_t size_ = 0;
  kernels::MemoryDescriptor memory_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::shared_ptr<const void> device_mapping_;
  std::byte* device_base_ = nullptr;
};

// ---------------------------------------------------------------------------------------
// Slot

/// One allocated page of an arena, owned by this connection's lease.
/// The destructor frees the slot on the daemon, best-effort: it never throws and does
/// nothing when the connection is broken (the daemon reclaims the lease's slots after the
/// grace period anyway). Move-only.
class Slot {
 public:
  Slot() = default;
  Slot(Slot&& other) noexcept;
  Slot& operator=(Slot&& other) noexcept;
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot();

  [[nodiscard]] SlotId id() const noexcept { return id_; }
  [[nodiscard]] ArenaId arena_id() const noexcept { return arena_id_; }
  /// False for a default-constructed, moved-from, freed or released object.
  [[nodiscard]] bool valid() const noexcept { return impl_ != nullptr; }

  /// Gives up ownership without freeing and returns the id: the slot stays allocated to
  /// the lease (e.g. to find it again after a reconnect with the lease token, through
  /// Connection::adopt). Throws std::logic_error when !valid().
  SlotId release();
  /// Frees the slot on the daemon now; throws Error or ConnectionError. The object is
  /// invalid afterwards in every case.
  void free();

 private:
  friend class Connection;
  Slot(std::shared_ptr<detail::Impl> impl, ArenaId arena, SlotId id) noexcept
      : impl_(std::move(impl)), arena_id_(arena), id_(id) {}

  std::shared_ptr<detail::Impl> impl_;
  ArenaId arena_id_ = 0;
  SlotId id_ = 0;
};

// ---------------------------------------------------------------------------------------
// Connection

/// One connection to statepoold, with its lease. Move-only; see the top of this file for
/// thread-safety and lifetimes. Every request method throws Error when the daemon refuses
/// and ConnectionError when the transport fails; using a moved-from Connection throws
/// ConnectionError(closed).
class Connection {
 public:
  /// Connects to options.socket_path and says Hello (protocol versions
  /// protocol::kMinProtocolVersion..kMaxProtocolVersion, tenant, lease token).
  /// With a lease token, a Hello refused as lease_busy is retried for up to 2 s (or
  /// Options::timeout if shorter): right after a reconnect the daemon may not yet have
  /// seen the old connection close. A lease really held by another live connection still
  /// ends in Error(lease_busy).
  [[nodiscard]] static Connection connect(const Options& options);
  /// Takes over an already connected stream socket `fd` (a socketpair end, for tests or
  /// embedding) and says Hello on it. `fd` is owned from now on, also when this throws.
  [[nodiscard]] static Connection from_fd(int fd, const Options& options);

  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  // --- what Hello said -----------------------------------------------------------------
  /// Keep it to resume this lease (Options::lease_token) after a reconnect.
  [[nodiscard]] const std::string& lease_token() const;
  /// True when Options::lease_token named a lease still within its grace period.
  [[nodiscard]] bool lease_resumed() const;
  /// Slots that came back with a resumed lease (take them over with adopt()).
  [[nodiscard]] std::uint32_t resumed_slots() const;
  /// How long the daemon keeps this lease's slots after the connection drops.
  [[nodiscard]] std::chrono::milliseconds grace_period() const;
  [[nodiscard]] std::uint16_t protocol_version() const;
  /// Daemon name and version.
  [[nodiscard]] const std::string& server() const;
  /// Largest frame the daemon accepts, in bytes.
  [[nodiscard]] std::uint32_t max_frame_bytes() const;
  /// False once the connection is broken (after a ConnectionError, or after the daemon
  /// answered protocol_error / not_hello / unsupported_version) or moved from.
  [[nodiscard]] bool healthy() const noexcept;

  // --- layouts and memory --------------------------------------------------------------
  /// Registers (or finds) a layout. The layout is validated locally first
  /// (Error(invalid_argument) without a round trip), and the daemon's page size is
  /// checked against the local page format (Error(internal) if client and daemon
  /// disagree, i.e. they were built from different kernels). A stepquant layout carries
  /// its plan (StateLayout::plan); when the daemon does not know the plan yet, it is
  /// installed first (install_plan) and the registration retried.
  [[nodiscard]] LayoutInfo register_layout(const kernels::StateLayout& layout);
  /// Sends a STEPQuant calibration plan to the daemon (idempotent). register_layout does
  /// this by itself when a stepquant layout's plan is unknown to the daemon.
  PlanInfo install_plan(const kernels::stepquant::Plan& plan);
  /// Opens an arena of the tenant for a layout with at least `pages` pages (the one with
  /// the most free pages), or creates one of `pages` pages when the tenant has none that
  /// large, and maps it. `pages` = 0 takes any existing arena, or the daemon's default
  /// size for a new one.
  [[nodiscard]] Arena open_arena(const LayoutInfo& layout, std::uint32_t pages = 0);
  /// Same by id. The arena has a codec() when the layout was registered through this
  /// connection.
  [[nodiscard]] Arena open_arena(LayoutId layout_id, std::uint32_t pages = 0);
  /// Gives an arena's memory back to the daemon (CloseArena). The arena is unmapped here
  /// first and is empty afterwards, whatever the daemon answers; after an error it still
  /// exists in the daemon, and open_arena maps it again. The daemon refuses with
  /// Error(in_use) while a lease holds one of its pages (free every Slot first; a
  /// disconnected lease's pages count until its grace period ends), while it holds a pinned
  /// snapshot or one being read or published, or while another connection that opened it
  /// is still connected. Its other snapshots are dropped from the pool. Its id is never
  /// used again. Slots of the arena still held here are stale afterwards.
  ArenaClose close_arena(Arena arena);
  /// Same by id, for an arena this process has not mapped (or has unmapped).
  ArenaClose close_arena(ArenaId arena);
  /// Opens a staging buffer of at least `bytes` bytes (> 0) and maps it.
  [[nodiscard]] Staging open_staging(std::uint64_t bytes);

  // --- slots ---------------------------------------------------------------------------
  /// Allocates `count` (> 0) slots of an arena to this lease, all or none.
  [[nodiscard]] std::vector<Slot> allocate(const Arena& arena, std::uint32_t count);
  [[nodiscard]] std::vector<Slot> allocate(ArenaId arena, std::uint32_t count);
  /// Takes ownership of a slot id this lease already holds (a released slot, or one that
  /// came back with a resumed lease). Sends nothing; the daemon checks ownership on use.
  [[nodiscard]] Slot adopt(ArenaId arena, SlotId slot);
  /// Frees several slots in one request per arena; they are invalid afterwards. Returns
  /// the number the daemon freed.
  std::uint32_t free(std::span<Slot> slots);
  /// Frees slot ids of one arena (released ones). Returns the number the daemon freed.
  std::uint32_t free(ArenaId arena, std::span<const SlotId> slots);

  // --- data movement -------------------------------------------------------------------
  /// page[slot] <- the state staged at staging[offset, offset + state_bytes(dtype)).
  /// dtype is the recurrent part's element type (f32 or bf16); the conv part is in the
  /// layout's conv_dtype. Returns the page bytes written. Error(not_finite) when the state
  /// holds NaN or Inf (the page is then unchanged, unless the staging range was rewritten
  /// during the call: docs/protocol.md section 7.6).
  /// `after` (cuda backend): an interprocess event the engine recorded on its stream after
  /// writing the state (client_cuda.hpp's StreamFence); the daemon's stream waits for it
  /// before reading, with no host synchronisation. The same for the other data calls:
  /// the memory they touch may still be in use by the engine's stream until that event.
  /// The host backend refuses it (Error(invalid_argument)).
  std::uint64_t compress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                         kernels::DType dtype = kernels::DType::f32,
                         const std::optional<IpcEventBytes>& after = std::nullopt);
  std::uint64_t compress(ArenaId arena, SlotId slot, StagingId staging, std::uint64_t offset,
                         kernels::DType dtype = kernels::DType::f32,
                         const std::optional<IpcEventBytes>& after = std::nullopt);
  /// staging[offset, ...) <- the state of page[slot] in `dtype`. Returns the state bytes
  /// written.
  std::uint64_t decompress(const Slot& slot, const Staging& staging, std::uint64_t offset,
                           kernels::DType dtype = kernels::DType::f32,
                           const std::optional<IpcEventBytes>& after = std::nullopt);
  std::uint64_t decompress(ArenaId arena, SlotId slot, StagingId staging, std::uint64_t offset,
                           kernels::DType dtype = kernels::DType::f32,
                           const std::optional<IpcEventBytes>& after = std::nullopt);
  /// Copies a whole page (prefix checkpoint / fork). Both slots must be of one arena
  /// (Error(invalid_argument) otherwise, without a round trip).
  void copy(const Slot& src, const Slot& dst,
            const std::optional<IpcEventBytes>& after = std::nullopt);
  void copy(ArenaId arena, SlotId src, SlotId dst,
            const std::optional<IpcEventBytes>& after = std::nullopt);

  /// The same three without waiting for the device (the cuda backend): the daemon replies
  /// as soon as the work is on its stream, and `event` is an IPC event that completes with
  /// it. Make a stream wait for it with statepool/client_cuda.hpp's wait_on_stream()
  /// before the next request on this connection (the bytes stay valid until then). A
  /// host-backend daemon replies when the work is done and `event` is empty. Errors the
  /// device finds after the reply (a NaN/Inf state: the page stays unchanged) are logged
  /// by the daemon, not reported: use compress() where that matters.
  [[nodiscard]] Pending compress_async(ArenaId arena, SlotId slot, StagingId staging,
                                       std::uint64_t offset,
                                       kernels::DType dtype = kernels::DType::f32,
                                       const std::optional<IpcEventBytes>& after = std::nullopt);
  [[nodiscard]] Pending decompress_async(ArenaId arena, SlotId slot, StagingId staging,
                                         std::uint64_t offset,
                                         kernels::DType dtype = kernels::DType::f32,
                                         const std::optional<IpcEventBytes>& after = std::nullopt);
  [[nodiscard]] Pending copy_async(ArenaId arena, SlotId src, SlotId dst,
                                   const std::optional<IpcEventBytes>& after = std::nullopt);

  // --- prefix-state snapshots (docs/prefix-store.md) -----------------------------------
  /// Publishes the state in `slot` under `key`: the daemon copies the page into a page of
  /// the same arena that no lease owns (immutable; evicted least recently used when the
  /// arena needs room, unless pinned). Idempotent: a key that has a snapshot for this
  /// arena's layout keeps it (created = false). Error(pool_exhausted) when every page of
  /// the arena holds a slot or a pinned snapshot.
  /// With `kv`, a hybrid entry: the attention layers' KV blocks are read from the staging
  /// range, encoded with kv->blocks.codec and kept in further pages of the arena
  /// (Error(not_finite) for a NaN/Inf value, Error(invalid_argument) for blocks that need
  /// more pages than the arena has; in both cases nothing is published).
  SnapshotPut put_snapshot(const Slot& slot, const SnapshotKey& key,
                           const std::optional<SnapshotKv>& kv = std::nullopt);
  SnapshotPut put_snapshot(ArenaId arena, SlotId slot, const SnapshotKey& key,
                           const std::optional<SnapshotKv>& kv = std::nullopt);
  /// Copies the key's snapshot for the slot's layout into `slot` (any client of the
  /// tenant's snapshot namespace may have published it). A miss is no error: hit = false
  /// and the slot is unchanged. With `kv`, a hit on a hybrid entry also decodes its KV
  /// blocks into that staging range (kv_blocks_plain_bytes(blocks, dtype) bytes; a range
  /// too small is Error(invalid_argument) and leaves the slot unchanged); the reply's
  /// `kv` says what they are, with or without `kv`.
  SnapshotGet get_snapshot(const SnapshotKey& key, const Slot& slot,
                           const std::optional<KvStaging>& kv = std::nullopt);
  SnapshotGet get_snapshot(const SnapshotKey& key, ArenaId arena, SlotId slot,
                           const std::optional<KvStaging>& kv = std::nullopt);
  /// Writes the key's snapshot (under the layout of `layout_digest`; empty: the first)
  /// into `staging` at `offset` as one self-checking value (header, page, KV blocks,
  /// CRC-32: the tiers' format), for a file or another daemon. With `staging` null, only
  /// the size: found and value_bytes. Error(invalid_argument) when the range is too small.
  SnapshotExport export_snapshot(const SnapshotKey& key, const Staging* staging,
                                 std::uint64_t offset = 0, std::string_view layout_digest = {});
  /// Publishes a value made by export_snapshot (here or on another daemon), `bytes` bytes
  /// of `staging` at `offset`, into this tenant's namespace and its arena of the value's
  /// layout. Error(invalid_argument) for a value that is corrupt, truncated or of another
  /// format; Error(not_found) when the tenant has no arena of that layout.
  SnapshotImport import_snapshot(const Staging& staging, std::uint64_t offset, std::uint64_t bytes);
  /// Deletes the key's snapshots (every layout, pinned ones too). Returns how many.
  std::uint32_t delete_snapshot(const SnapshotKey& key);
  /// Pins (never evicted) or unpins the key's snapshots. Returns how many changed.
  /// Error(quota_exceeded) past the publisher's max-pinned-snapshots.
  std::uint32_t pin_snapshot(const SnapshotKey& key, bool pinned = true);
  /// Snapshots of the namespace whose prefix starts with `prefix` (every one when empty),
  /// in key order, at most `limit` (0 = 1000; at most 10000).
  [[nodiscard]] SnapshotList list_snapshots(std::string_view prefix = {}, std::uint32_t limit = 0);

  // --- protocol version 2: memory lent to the daemon, snapshots N at a time -----------
  // (docs/protocol.md, "Batched snapshot requests"; docs/client.md). Against a daemon that
  // speaks only version 1 these throw Error(invalid_argument) without a round trip.
  /// Lends the daemon the first `bytes` of the memory `fd` refers to (this process's memfd
  /// or tmpfs file; the caller keeps `fd`): the daemon maps it and names it like a staging
  /// buffer, so that batched requests read and write this memory in place. The returned
  /// Staging maps it here too (bytes()); closing it ends the loan. A memfd made with
  /// MFD_ALLOW_SEALING is sealed against shrinking (sealed = true); otherwise shrinking
  /// the file breaks the loan (requests on it fail), never the daemon.
  [[nodiscard]] Staging register_memory(int fd, std::uint64_t bytes, std::string_view name = {},
                                        bool* sealed = nullptr);
  /// The caps of one batched request (the daemon's --max-batch-keys and
  /// --max-batch-bytes); 0 when the daemon speaks only version 1.
  [[nodiscard]] std::uint32_t max_batch_keys() const;
  [[nodiscard]] std::uint64_t max_batch_bytes() const;
  /// Which keys have a snapshot for the layout of `arena`, from the indexes: nothing is
  /// read or copied. `lower_tiers`: keys not in the pool are looked for in the host tier
  /// and the remote store. `stop_at_miss`: keys after the first absent one are not looked
  /// up (answered none). Any number of keys: split into requests of max_batch_keys().
  /// `also`: other pools' keys of the same pages (a hybrid engine's state beside its KV
  /// pages), in the same round trips; with stop_at_miss only for the pages before the first
  /// absent key.
  [[nodiscard]] SnapshotLookup lookup_snapshots(ArenaId arena, std::span<const SnapshotKey> keys,
                                                bool lower_tiers = true, bool stop_at_miss = false,
                                                std::span<const LookupAlso> also = {});
  /// Publishes the entries into `arena` (split as lookup_snapshots): keys already published
  /// are skipped before their bytes are read; an entry that fails (a full arena, a
  /// non-finite state) says why in its result, and the others go on. A malformed entry
  /// (a range outside this connection's memory, ill-formed KV blocks) refuses the request
  /// it is in with Error(invalid_argument), with nothing done.
  [[nodiscard]] SnapshotPuts put_snapshots(ArenaId arena,
                                           std::span<const SnapshotPutEntry> entries);
  /// Reads the entries' snapshots of the layout of `arena` straight into their ranges (no
  /// slot in between). A miss is no error. `stop_at_miss`: nothing after the first miss
  /// is read.
  [[nodiscard]] SnapshotGets get_snapshots(ArenaId arena, std::span<const SnapshotGetEntry> entries,
                                           bool stop_at_miss = false);

  // --- operations ----------------------------------------------------------------------
  [[nodiscard]] Stats stats();
  /// The daemon's capacity plan for a model, as the JSON report of docs/capacity.md
  /// (the same document `statepoolctl plan --json` prints, plus "fits_now" for this
  /// connection's tenant). A bad config or input: Error(invalid_argument) naming it.
  [[nodiscard]] std::string plan_capacity(const PlanRequest& request);
  /// How many more requests with the state shape of `layout` (any codec) fit in the pool
  /// now for this connection's tenant, per codec (empty = fp32 bf16 int8 int6 stepquant6
  /// stepquant4), with `slots` state slots per request.
  [[nodiscard]] Fits fits_now(const LayoutInfo& layout, std::uint32_t slots = 1,
                              const std::vector<kernels::CodecId>& codecs = {});
  /// One round trip; returns its duration measured here (steady clock).
  std::chrono::nanoseconds ping();
  /// Asks the daemon to drain and exit (needs the daemon's uid or root).
  void drain();

 private:
  explicit Connection(std::shared_ptr<detail::Impl> impl) noexcept : impl_(std::move(impl)) {}
  [[nodiscard]] detail::Impl& impl() const;
  void say_hello(const Options& options);

  std::shared_ptr<detail::Impl> impl_;
};

}  // namespace statepool::client
