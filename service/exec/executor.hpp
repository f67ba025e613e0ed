#pragma once
// Executors: where compress, decompress and copy run — never on an I/O thread.
//
//   HostExecutor   a WorkerPool splits one state's heads across every core
//                  (host_executor.hpp); host memory only.
//   CudaExecutor   a stream per daemon, completion signalled by an event; device memory
//                  (cuda_executor.hpp).
//
// An Operation names its buffers by pointer and memory space and holds the allocations
// and the page format it uses, so nothing it touches can be freed while it runs. submit()
// returns at once; the completion is called exactly once when the work is complete
// (every byte written), or with the error that stopped it. Sessions await it through
// async_execute() (exec/async.hpp) and send their reply after it: one request in flight
// per connection stays the rule.
//
// Errors given to the completion:
//   StatusError(not_finite)        a state or KV blocks to encode hold NaN/Inf; nothing
//                                  written
//   StatusError(invalid_argument)  buffer sizes that do not match the page format,
//                                  memory this executor cannot reach, or an `after`
//                                  event it cannot wait for; nothing written
//   StatusError(internal)          anything else (a bug, a device error)
//
// Thread-safety: submit() may be called from any thread; completions run on the
// executor's threads and must not block.

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "memory/resource.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/memory.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/staged_view.hpp"

namespace statepool::service {

enum class OperationKind : std::uint8_t {
  compress,    ///< page <- codec.encode(staged)
  decompress,  ///< staged <- codec.decode(page)
  copy,        ///< page <- source (whole pages of one format)
  kv_encode,   ///< chunks <- kernels::kv_encode_blocks(kv, staged)
  kv_decode,   ///< staged <- kernels::kv_decode_blocks(kv, chunks)
};

[[nodiscard]] const char* to_string(OperationKind kind) noexcept;

/// The 64 bytes of a cudaIpcEventHandle_t.
using IpcEventBytes = std::array<std::byte, 64>;
/// Called at most once, before the completion, when the operation's work is on a device
/// stream, with an interprocess event that completes with that work. Must not block.
using Enqueued = std::function<void(const IpcEventBytes& event)>;

/// A staged state where an engine keeps it (kernels/staged_view.hpp): the recurrent part
/// (heads in page order, each [K][V] or [V][K]) and the conv state, each in a buffer of
/// its own (possibly the same memory). Sizes exactly as kernels::StateView says.
struct StateViewRef {
  kernels::BufferRef recurrent;
  kernels::BufferRef conv;  ///< size 0 when the layout has no conv state
  kernels::DType dtype = kernels::DType::f32;
  kernels::HeadOrder order = kernels::HeadOrder::key_major;
};

/// KV blocks' plain values where an engine keeps them (kernels::KvView): `keys` and
/// `values` span exactly kernels::kv_view_extent(...) bytes each.
struct KvViewRef {
  kernels::BufferRef keys;
  kernels::BufferRef values;  ///< size 0 when the blocks have no values (an MLA latent)
  std::uint64_t layer_stride = 0;
  std::uint64_t token_stride = 0;
  kernels::DType dtype = kernels::DType::bf16;
};

struct Operation {
  OperationKind kind = OperationKind::compress;
  /// compress/decompress: the page format.
  std::shared_ptr<const kernels::PageCodec> codec;
  /// compress/decompress: element type of the staged recurrent state (f32 or bf16).
  kernels::DType dtype = kernels::DType::f32;
  /// compress: read; decompress: written. Exactly codec->staged_bytes(dtype) bytes.
  kernels::BufferRef staged;
  /// compress and copy: written; decompress: read. Exactly one page.
  kernels::BufferRef page;
  /// copy: the page read. Same size as `page`.
  kernels::BufferRef source;
  /// kv_encode/kv_decode: the KV blocks (kernels/kv.hpp); `staged` holds their plain
  /// values in `dtype` (f32, bf16 or f16), exactly kv_blocks_plain_bytes(kv, dtype) bytes.
  kernels::KvBlocks kv;
  /// kv_encode: written; kv_decode: read. The encoded KV blocks in pieces (e.g. the pages
  /// a snapshot's KV blocks are spread over): their concatenation, in order, is the
  /// kv_blocks_encoded_bytes(kv) bytes of kv_encode_blocks. A non-finite value writes none.
  std::vector<kernels::BufferRef> chunks;
  /// The memory the buffers point into, held until the operation completes.
  std::vector<std::shared_ptr<const Allocation>> keep_alive;
  /// Set to be told early (an IPC event), by executors that can export events (the CUDA
  /// executor); others ignore it and only complete.
  Enqueued enqueued;
  /// compress/decompress/copy: an interprocess event of the client's stream (protocol
  /// `after`) that the work waits for on the executor's stream. Executors without device
  /// streams refuse it (invalid_argument).
  std::optional<IpcEventBytes> after;
  /// compress/decompress: when set, the staged state is where this view says instead of
  /// in `staged` (which is then empty). kv_encode/kv_decode: likewise `kv_view`. The
  /// bytes are those of the packed layout's operation on the same values. The host
  /// executor runs views; executors that cannot refuse them (invalid_argument).
  std::optional<StateViewRef> state_view;
  std::optional<KvViewRef> kv_view;
  /// compress: the page holds nothing to keep (a snapshot being published, which a failure
  /// forgets): it is encoded in place in one pass, and on not_finite its bytes are
  /// unspecified. Otherwise a rejected state leaves the page as it was.
  bool page_disposable = false;
};

/// Called once with nullptr on success or the error.
using Completion = std::function<void(std::exception_ptr)>;

class Executor {
 public:
  virtual ~Executor() = default;
  Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// "host", "cuda".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// True when operations may read and write memory in `space` (on `device`).
  [[nodiscard]] virtual bool can_access(MemorySpace space, int device) const noexcept = 0;
  /// Starts `op`; see the top of this file.
  virtual void submit(Operation op, Completion done) = 0;
  /// Blocks until every operation submitted so far has completed and its completion has
  /// returned (shutdown: afterwards nothing refers to the daemon's objects).
  virtual void wait_idle() = 0;
};

}  // namespace statepool::service
