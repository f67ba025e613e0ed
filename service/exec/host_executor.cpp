#include "exec/host_executor.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/staged_view.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

std::span<const std::byte> in(const kernels::BufferRef& buffer) noexcept {
  return {buffer.data, buffer.size};
}
std::span<std::byte> out(const kernels::BufferRef& buffer) noexcept {
  return {buffer.data, buffer.size};
}

/// Copies are split into pieces of this size: big enough to stream, small enough that a
/// 150 MB page spreads over every worker.
constexpr std::size_t kCopyPiece = std::size_t{4} << 20;

/// Scratch pages kept between compresses (two concurrent compresses reuse theirs).
constexpr std::size_t kKeptScratch = 2;

/// Throws std::invalid_argument when `op` holds a view it cannot use: a view of the other
/// kind of operation, or a view beside a staged range (a view replaces it).
void check_views(const Operation& op) {
  const bool state = op.kind == OperationKind::compress || op.kind == OperationKind::decompress;
  const bool kv = op.kind == OperationKind::kv_encode || op.kind == OperationKind::kv_decode;
  const std::string fn = to_string(op.kind);
  if (op.state_view && !state) {
    throw std::invalid_argument(fn + ": a state view is for compress and decompress");
  }
  if (op.kv_view && !kv) {
    throw std::invalid_argument(fn + ": a KV view is for kv_encode and kv_decode");
  }
  if ((op.state_view || op.kv_view) && op.staged.size != 0) {
    throw std::invalid_argument(fn +
                                ": a staged view replaces the staged range, which must be "
                                "empty (it has " +
                                std::to_string(op.staged.size) + " bytes)");
  }
}

/// The staged state of a compress or decompress: op.state_view, or `staged` in the packed
/// layout (checked by the codec's functions either way).
kernels::StateView state_of(const Operation& op) {
  if (const auto& view = op.state_view) {
    return {out(view->recurrent), out(view->conv), view->dtype, view->order};
  }
  return kernels::packed_state_view(op.codec->layout(), op.dtype, out(op.staged));
}

/// The KV view of a kv_encode or kv_decode, if it has one.
std::optional<kernels::KvView> kv_view_of(const Operation& op) {
  if (!op.kv_view) return std::nullopt;
  const KvViewRef& v = *op.kv_view;
  return kernels::KvView{out(v.keys), out(v.values), v.layer_stride, v.token_stride, v.dtype};
}

}  // namespace

const char* to_string(OperationKind kind) noexcept {
  switch (kind) {
    case OperationKind::compress: return "compress";
    case OperationKind::decompress: return "decompress";
    case OperationKind::copy: return "copy";
    case OperationKind::kv_encode: return "kv_encode";
    case OperationKind::kv_decode: return "kv_decode";
  }
  return "unknown";
}

HostExecutor::HostExecutor(support::WorkerPool& workers, unsigned chunks_per_worker)
    : workers_(workers), chunks_per_worker_(std::max(1u, chunks_per_worker)) {}

HostExecutor::~HostExecutor() {
  wait_idle();
}

bool HostExecutor::can_access(MemorySpace space, int /*device*/) const noexcept {
  return space == MemorySpace::host;
}

std::size_t HostExecutor::grain(std::size_t items) const noexcept {
  const std::size_t chunks = std::size_t{workers_.size() + 1} * chunks_per_worker_;
  return std::max<std::size_t>(1, (items + chunks - 1) / chunks);
}

void HostExecutor::submit(Operation op, Completion done) {
  {
    const std::lock_guard lock(mutex_);
    ++in_flight_;
  }
  workers_.post([this, op = std::move(op), done = std::move(done)]() mutable {
    std::exception_ptr error;
    try {
      run(op);
    } catch (...) {
      error = std::current_exception();
    }
    op.keep_alive.clear();  // release the memory before the session hears of completion
    try {
      done(error);
    } catch (...) {
      // A completion that cannot be delivered (out of memory posting it) must not keep
      // wait_idle() waiting forever; the session it belonged to is closed by its timeout.
    }
    const std::lock_guard lock(mutex_);
    if (--in_flight_ == 0) idle_.notify_all();
  });
}

void HostExecutor::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return in_flight_ == 0; });
}

void HostExecutor::run(const Operation& op) {
  const auto check_access = [&](const kernels::BufferRef& buffer) {
    if (buffer.data != nullptr && !can_access(buffer.space, buffer.device)) {
      throw StatusError(Status::invalid_argument,
                        std::string("the host executor cannot ") + to_string(op.kind) +
                            " memory on CUDA device " + std::to_string(buffer.device));
    }
  };
  for (const kernels::BufferRef* buffer : {&op.staged, &op.page, &op.source}) {
    check_access(*buffer);
  }
  for (const kernels::BufferRef& chunk : op.chunks) check_access(chunk);
  if (op.state_view) {
    check_access(op.state_view->recurrent);
    check_access(op.state_view->conv);
  }
  if (op.kv_view) {
    check_access(op.kv_view->keys);
    check_access(op.kv_view->values);
  }
  if (op.after) {
    throw StatusError(Status::invalid_argument,
                      std::string(to_string(op.kind)) +
                          ": the host backend has no device stream to order after the client's "
                          "event (`after`); finish writing the memory before the request");
  }
  try {
    check_views(op);
    switch (op.kind) {
      case OperationKind::compress: return run_compress(op);
      case OperationKind::decompress: return run_decompress(op);
      case OperationKind::copy: return run_copy(op);
      case OperationKind::kv_encode: return run_kv_encode(op);
      case OperationKind::kv_decode: return run_kv_decode(op);
    }
  } catch (const kernels::NonFiniteError& e) {
    throw StatusError(Status::not_finite, e.what());
  } catch (const kernels::KvNonFiniteError& e) {
    throw StatusError(Status::not_finite, e.what());
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, e.what());
  }
  throw StatusError(Status::internal, "unknown operation kind");
}

void HostExecutor::run_compress(const Operation& op) {
  const kernels::PageCodec& codec = *op.codec;
  const std::size_t heads = codec.head_count();
  const kernels::StateView staged = state_of(op);
  // Sizes and dtype first (an empty range checks them and writes nothing).
  codec.encode_heads(staged, out(op.page), 0, 0);
  // The staged state is a client's memory, which it may rewrite while this runs:
  // encode_heads reads each value once into memory of its own and checks what it encodes,
  // so the page is made of values that were there, or the compress fails with not_finite
  // (docs/architecture.md, "Memory a client can write").
  //
  // A page that holds nothing to keep (op.page_disposable: a snapshot being published) is
  // encoded in place in one pass: the state read once, the page written once.
  //
  // Otherwise a rejected state must leave the page as it was, so every value is checked
  // before the first page byte is written. Two ways to do that:
  //  - a page much smaller than the state (the compressed codecs): encode every head into
  //    a scratch page, checking it in the same pass, then copy the scratch into the page:
  //    the state is read from memory once, the (small) page bytes move twice;
  //  - otherwise (fp32, bf16): check every head, then encode every head (checking again:
  //    a value rewritten in between fails there, with the page partly written): the state
  //    is read twice, the (large) page bytes move once.
  Scratch scratch;
  if (!op.page_disposable && 2 * codec.page_bytes() < codec.staged_bytes(staged.dtype)) {
    scratch = take_scratch(codec.page_bytes());
  }
  if (op.page_disposable) {
    workers_.parallel_for(heads, grain(heads), [&](std::size_t first, std::size_t last) {
      codec.encode_heads(staged, out(op.page), first, last);
    });
  } else if (scratch != nullptr) {
    const std::span<std::byte> staging_page(scratch.get(), codec.page_bytes());
    // A NonFiniteError of the lowest failing chunk is the one reported: the first in page
    // order, as PageCodec::encode reports it.
    workers_.parallel_for(heads, grain(heads), [&](std::size_t first, std::size_t last) {
      codec.encode_heads(staged, staging_page, first, last);
    });
    copy_parallel(op.page.data, staging_page.data(), codec.conv_offset());
    give_back_scratch(std::move(scratch), codec.page_bytes());
  } else {
    workers_.parallel_for(heads, grain(heads), [&](std::size_t first, std::size_t last) {
      codec.check_finite(staged, first, last);
    });
    workers_.parallel_for(heads, grain(heads), [&](std::size_t first, std::size_t last) {
      codec.encode_heads(staged, out(op.page), first, last);
    });
  }
  codec.encode_conv(staged, out(op.page));
}

HostExecutor::Scratch HostExecutor::take_scratch(std::size_t bytes) {
  {
    const std::lock_guard lock(mutex_);
    for (auto it = scratch_.begin(); it != scratch_.end(); ++it) {
      if (it->second >= bytes) {
        Scratch out = std::move(it->first);
        scratch_.erase(it);
        return out;
      }
    }
  }
  // A raw buffer, no value-initialization. Without the memory for it, compress takes the
  // two-pass way instead (nullptr).
  return Scratch(new (std::nothrow) std::byte[bytes]);  // NOLINT
}

void HostExecutor::give_back_scratch(Scratch scratch, std::size_t bytes) noexcept {
  try {
    const std::lock_guard lock(mutex_);
    // Keep a few for the next compresses, the largest ones: scratch memory is outside
    // every quota, so it stays bounded (kKeptScratch pages).
    if (scratch_.size() < kKeptScratch) {
      scratch_.emplace_back(std::move(scratch), bytes);
    } else {
      auto smallest =
          std::min_element(scratch_.begin(), scratch_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      if (smallest->second < bytes) *smallest = {std::move(scratch), bytes};
    }
  } catch (...) {
    // The buffer is freed instead of kept.
  }
}

void HostExecutor::copy_parallel(std::byte* dst, const std::byte* src, std::size_t bytes) {
  if (dst == src || bytes == 0) return;
  const std::size_t pieces = (bytes + kCopyPiece - 1) / kCopyPiece;
  workers_.parallel_for(pieces, grain(pieces), [&](std::size_t first, std::size_t last) {
    const std::size_t begin = first * kCopyPiece;
    const std::size_t end = std::min(bytes, last * kCopyPiece);
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

void HostExecutor::run_decompress(const Operation& op) {
  const kernels::PageCodec& codec = *op.codec;
  const std::size_t heads = codec.head_count();
  const kernels::StateView staged = state_of(op);
  codec.decode_heads(in(op.page), staged, 0, 0);
  workers_.parallel_for(heads, grain(heads), [&](std::size_t first, std::size_t last) {
    codec.decode_heads(in(op.page), staged, first, last);
  });
  codec.decode_conv(in(op.page), staged);
}

void HostExecutor::run_copy(const Operation& op) {
  if (op.source.size != op.page.size) {
    throw std::invalid_argument("copy: source page of " + std::to_string(op.source.size) +
                                " bytes, destination of " + std::to_string(op.page.size));
  }
  copy_parallel(op.page.data, op.source.data, op.page.size);
}

namespace {

/// The KV streams of `op` after checking the sizes of its buffers (its view's, when it
/// has one).
std::vector<kernels::KvBlockStream> kv_streams(const Operation& op,
                                               const std::optional<kernels::KvView>& view) {
  const char* fn = to_string(op.kind);
  if (const char* problem = kernels::kv_blocks_problem(op.kv)) {
    throw std::invalid_argument(std::string(fn) + ": " + problem);
  }
  if (view) {
    kernels::check_kv_view(op.kv, *view);
  } else {
    const std::uint64_t plain = kernels::kv_blocks_plain_bytes(op.kv, op.dtype);
    if (plain == 0) throw std::invalid_argument(std::string(fn) + ": values are f32, bf16 or f16");
    if (op.staged.size != plain) {
      throw std::invalid_argument(std::string(fn) + ": " + kernels::describe(op.kv) + " in " +
                                  kernels::to_string(op.dtype) + " take " + std::to_string(plain) +
                                  " bytes, the staged range has " + std::to_string(op.staged.size));
    }
  }
  std::uint64_t chunked = 0;
  for (const kernels::BufferRef& chunk : op.chunks) chunked += chunk.size;
  const std::uint64_t encoded = kernels::kv_blocks_encoded_bytes(op.kv);
  if (chunked != encoded) {
    throw std::invalid_argument(std::string(fn) + ": " + kernels::describe(op.kv) + " encode to " +
                                std::to_string(encoded) + " bytes, the chunks hold " +
                                std::to_string(chunked));
  }
  return kernels::kv_block_streams(op.kv, view ? view->dtype : op.dtype);
}

}  // namespace

// KV blocks are encoded into one contiguous buffer, stream by stream on every worker, then
// spread over the chunks: a non-finite value (found while encoding) leaves the chunks as
// they were. Decoding reads each stream where it lies, gathering only the streams that
// straddle two chunks (a snapshot's KV pages).
void HostExecutor::run_kv_encode(const Operation& op) {
  const std::optional<kernels::KvView> view = kv_view_of(op);
  const std::vector<kernels::KvBlockStream> streams = kv_streams(op, view);
  const std::size_t bytes = kernels::kv_blocks_encoded_bytes(op.kv);
  const std::unique_ptr<std::byte[]> encoded(new std::byte[bytes]);  // NOLINT
  workers_.parallel_for(streams.size(), 1, [&](std::size_t first, std::size_t last) {
    if (view) {
      kernels::kv_encode_view(op.kv, *view, {encoded.get(), bytes}, first, last);
      return;
    }
    for (std::size_t i = first; i < last; ++i) {
      const kernels::KvBlockStream& s = streams[i];
      kernels::kv_encode(s.stream, op.dtype, in(op.staged).subspan(s.plain_offset, s.plain_bytes),
                         {encoded.get() + s.encoded_offset, s.encoded_bytes});
    }
  });
  std::size_t at = 0;
  for (const kernels::BufferRef& chunk : op.chunks) {
    copy_parallel(chunk.data, encoded.get() + at, chunk.size);
    at += chunk.size;
  }
}

void HostExecutor::run_kv_decode(const Operation& op) {
  const std::optional<kernels::KvView> view = kv_view_of(op);
  const std::vector<kernels::KvBlockStream> streams = kv_streams(op, view);
  // Where each chunk starts in the encoded blocks.
  std::vector<std::uint64_t> starts;
  starts.reserve(op.chunks.size() + 1);
  std::uint64_t at = 0;
  for (const kernels::BufferRef& chunk : op.chunks) {
    starts.push_back(at);
    at += chunk.size;
  }
  starts.push_back(at);
  workers_.parallel_for(streams.size(), 1, [&](std::size_t first, std::size_t last) {
    std::vector<std::byte> gathered;  // a stream that straddles chunks
    for (std::size_t i = first; i < last; ++i) {
      const kernels::KvBlockStream& s = streams[i];
      const std::uint64_t begin = s.encoded_offset;
      const std::uint64_t end = begin + s.encoded_bytes;
      // The chunk holding the stream's first byte.
      std::size_t c = static_cast<std::size_t>(
          std::upper_bound(starts.begin(), starts.end() - 1, begin) - starts.begin() - 1);
      std::span<const std::byte> encoded;
      if (end <= starts[c + 1]) {
        encoded = {op.chunks[c].data + (begin - starts[c]), s.encoded_bytes};
      } else {
        gathered.resize(s.encoded_bytes);
        for (std::uint64_t done = 0; done < s.encoded_bytes; ++c) {
          const std::uint64_t from = begin + done - starts[c];
          const std::uint64_t n = std::min(op.chunks[c].size - from, s.encoded_bytes - done);
          std::memcpy(gathered.data() + done, op.chunks[c].data + from, n);
          done += n;
        }
        encoded = gathered;
      }
      if (view) {
        kernels::kv_decode_view_stream(op.kv, i, encoded, *view);
      } else {
        kernels::kv_decode(s.stream, encoded, op.dtype,
                           out(op.staged).subspan(s.plain_offset, s.plain_bytes));
      }
    }
  });
}

}  // namespace statepool::service
