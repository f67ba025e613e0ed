// Staged views (staged_view.hpp): the checks of a view's sizes and strides, and KV blocks
// encoded from and decoded into rows wherever an engine keeps them. A stream whose rows are
// not back to back is gathered into a buffer of this thread's and encoded by kv_encode
// (decoded by kv_decode, then scattered), so the bytes are kv_encode_blocks's by
// construction. (PageCodec's view functions are in page.cpp, beside the packed ones.)

#include "statepool/kernels/staged_view.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "codecs_internal.hpp"

namespace statepool::kernels {
namespace {

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}

bool kv_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

/// a * b + c, or false when it does not fit in 64 bits.
bool mul_add(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t& out) {
  std::uint64_t product = 0;
  return !__builtin_mul_overflow(a, b, &product) && !__builtin_add_overflow(product, c, &out);
}

/// Bytes from the first byte of the first row to the end of the last, over `count` rows
/// `stride` apart: (count - 1) * stride + row; false past 64 bits.
bool span_of(std::uint64_t count, std::uint64_t stride, std::uint64_t row, std::uint64_t& out) {
  return mul_add(count - 1, stride, row, out);
}

/// Streams of kv_block_streams(kv, ...), without the vector: stream `index` is layer
/// index / per_layer, keys or values by index % per_layer.
struct StreamAt {
  KvStream stream;
  std::uint32_t layer = 0;
  std::uint64_t encoded_offset = 0;
  std::uint64_t encoded_bytes = 0;
};

std::size_t stream_count(const KvBlocks& kv) {
  return std::size_t{kv.layers} * kv_streams_per_layer(kv);
}

StreamAt stream_at(const KvBlocks& kv, std::size_t index) {
  const std::uint32_t per_layer = kv_streams_per_layer(kv);
  StreamAt s;
  s.layer = static_cast<std::uint32_t>(index / per_layer);
  const bool values = index % per_layer == 1;
  s.stream.codec = kv.codec;
  s.stream.role = values ? KvRole::values : KvRole::keys;
  s.stream.tokens = kv.tokens;
  s.stream.channels = values ? kv.value_channels : kv.key_channels;
  const std::uint64_t keys_bytes =
      kv_encoded_bytes(kv.codec, KvRole::keys, kv.tokens, kv.key_channels);
  const std::uint64_t layer_bytes =
      keys_bytes + kv_encoded_bytes(kv.codec, KvRole::values, kv.tokens, kv.value_channels);
  s.encoded_offset = s.layer * layer_bytes + (values ? keys_bytes : 0);
  s.encoded_bytes = kv_encoded_bytes(s.stream);
  return s;
}

void check_streams(const char* fn, const KvBlocks& kv, std::size_t first, std::size_t last) {
  if (first > last || last > stream_count(kv)) {
    fail(fn, "stream range [" + std::to_string(first) + ", " + std::to_string(last) +
                 ") is not within the " + std::to_string(stream_count(kv)) + " streams of " +
                 describe(kv));
  }
}

void check_encoded(const char* fn, const KvBlocks& kv, std::size_t bytes) {
  const std::uint64_t want = kv_blocks_encoded_bytes(kv);
  if (bytes != want) {
    fail(fn, describe(kv) + ": the encoded blocks must be " + std::to_string(want) +
                 " bytes, got " + std::to_string(bytes));
  }
}

/// Where a stream's rows lie in a view: row t at rows + t * stride, `row` bytes each.
struct Rows {
  std::byte* rows = nullptr;
  std::uint64_t stride = 0;
  std::uint64_t row = 0;
  std::uint64_t count = 0;

  /// True when the rows are back to back (one span of count * row bytes).
  [[nodiscard]] bool contiguous() const { return count == 1 || stride == row; }
  [[nodiscard]] std::uint64_t bytes() const { return count * row; }
};

Rows rows_of(const KvView& view, const StreamAt& s) {
  const std::span<std::byte> region = s.stream.role == KvRole::keys ? view.keys : view.values;
  return Rows{region.data() + s.layer * view.layer_stride, view.token_stride,
              s.stream.channels * dtype_bytes(view.dtype), s.stream.tokens};
}

/// Gathered rows of one stream: a buffer of this thread's, kept for the next streams up to
/// kKeptRowBytes (a KV page's streams are well under it; the bound keeps what every worker
/// holds outside the quotas small), else one for this stream alone (a long prefix's layer)
/// that goes with it.
constexpr std::size_t kKeptRowBytes = std::size_t{4} << 20;

class RowBuffer {
 public:
  explicit RowBuffer(std::size_t bytes) {
    if (bytes > kKeptRowBytes) {
      own_.reset(new std::byte[bytes]);  // NOLINT: a raw buffer, no value-initialization
      data_ = own_.get();
      return;
    }
    thread_local std::unique_ptr<std::byte[]> kept;
    thread_local std::size_t kept_bytes = 0;
    if (kept_bytes < bytes) {
      kept.reset();
      kept.reset(new std::byte[bytes]);  // NOLINT
      kept_bytes = bytes;
    }
    data_ = kept.get();
  }
  [[nodiscard]] std::byte* data() const { return data_; }

 private:
  std::unique_ptr<std::byte[]> own_;
  std::byte* data_ = nullptr;
};

/// The bf16 codec over bf16 values keeps the bits: rows go to and from the stream directly,
/// with no gathering.
bool bf16_kept(const KvView& view, const StreamAt& s) {
  return s.stream.codec == KvCodecId::bf16 && view.dtype == DType::bf16;
}

void encode_stream(const KvView& view, const StreamAt& s, std::byte* encoded) {
  const Rows r = rows_of(view, s);
  const std::span<std::byte> out(encoded + s.encoded_offset, s.encoded_bytes);
  if (bf16_kept(view, s) && !r.contiguous()) {
    for (std::uint64_t t = 0; t < r.count; ++t) {
      float value = 0.0f;
      const std::size_t bad = detail::copy_bf16_checked(r.rows + t * r.stride, s.stream.channels,
                                                        out.data() + t * r.row, value);
      if (bad != s.stream.channels) throw KvNonFiniteError(s.stream, t, bad, value);
    }
    return;
  }
  if (r.contiguous()) {
    kv_encode(s.stream, view.dtype, {r.rows, r.bytes()}, out);
    return;
  }
  // One reading of each row, into memory of this thread's (kv_encode reads it once more,
  // from there).
  const RowBuffer buffer(r.bytes());
  for (std::uint64_t t = 0; t < r.count; ++t) {
    std::memcpy(buffer.data() + t * r.row, r.rows + t * r.stride, r.row);
  }
  kv_encode(s.stream, view.dtype, {buffer.data(), r.bytes()}, out);
}

void decode_stream(const KvView& view, const StreamAt& s, std::span<const std::byte> encoded) {
  const Rows r = rows_of(view, s);
  if (bf16_kept(view, s) && !r.contiguous()) {
    for (std::uint64_t t = 0; t < r.count; ++t) {
      detail::copy_bf16_quieting(encoded.data() + t * r.row, s.stream.channels,
                                 r.rows + t * r.stride);
    }
    return;
  }
  if (r.contiguous()) {
    kv_decode(s.stream, encoded, view.dtype, {r.rows, r.bytes()});
    return;
  }
  const RowBuffer buffer(r.bytes());
  kv_decode(s.stream, encoded, view.dtype, {buffer.data(), r.bytes()});
  for (std::uint64_t t = 0; t < r.count; ++t) {
    std::memcpy(r.rows + t * r.stride, buffer.data() + t * r.row, r.row);
  }
}

}  // namespace

const char* to_string(HeadOrder order) noexcept {
  switch (order) {
    case HeadOrder::key_major: return "key_major";
    case HeadOrder::value_major: return "value_major";
  }
  return "?";
}

StateView packed_state_view(const StateLayout& layout, DType dtype, std::span<std::byte> staged) {
  detail::check_staged_dtype(dtype);
  const std::size_t recurrent = std::size_t{layout.num_layers} * layout.num_heads * layout.key_dim *
                                layout.value_dim * dtype_bytes(dtype);
  const std::size_t conv = std::size_t{layout.num_layers} * layout.conv_channels *
                           layout.conv_width * dtype_bytes(layout.conv_dtype);
  if (staged.size() != recurrent + conv) {
    throw std::invalid_argument("staged state must be " + std::to_string(recurrent + conv) +
                                " bytes for this layout, got " + std::to_string(staged.size()));
  }
  return StateView{staged.first(recurrent), staged.subspan(recurrent), dtype, HeadOrder::key_major};
}

std::uint64_t kv_view_extent(const KvBlocks& kv, std::uint64_t channels, DType dtype,
                             std::uint64_t layer_stride, std::uint64_t token_stride) noexcept {
  if (channels == 0 || kv.layers == 0 || kv.tokens == 0 || !kv_dtype(dtype)) return 0;
  std::uint64_t row = 0;
  std::uint64_t tokens = 0;
  std::uint64_t extent = 0;
  if (!mul_add(channels, dtype_bytes(dtype), 0, row) ||
      !span_of(kv.tokens, token_stride, row, tokens) ||
      !span_of(kv.layers, layer_stride, tokens, extent)) {
    return UINT64_MAX;
  }
  return extent;
}

const char* kv_view_problem(const KvBlocks& kv, DType dtype, std::uint64_t layer_stride,
                            std::uint64_t token_stride) noexcept {
  if (const char* problem = kv_blocks_problem(kv)) return problem;
  if (!kv_dtype(dtype)) return "KV views hold f32, bf16 or f16 values";
  // At most 2^20 channels of 4 bytes: no overflow.
  const std::uint64_t row =
      std::uint64_t{std::max(kv.key_channels, kv.value_channels)} * dtype_bytes(dtype);
  // Tokens inside layers (a layer's rows, then the next layer's), or layers inside tokens.
  std::uint64_t layer_rows = 0;  // a layer's rows, first byte to last
  std::uint64_t token_rows = 0;  // a token's rows over every layer
  const bool tokens_inside =
      (kv.tokens == 1 || token_stride >= row) &&
      (kv.layers == 1 ||
       (span_of(kv.tokens, token_stride, row, layer_rows) && layer_stride >= layer_rows));
  const bool layers_inside =
      (kv.layers == 1 || layer_stride >= row) &&
      (kv.tokens == 1 ||
       (span_of(kv.layers, layer_stride, row, token_rows) && token_stride >= token_rows));
  if (!tokens_inside && !layers_inside) {
    return "KV view strides make rows overlap: either token_stride >= row bytes and "
           "layer_stride >= a layer's rows, or layer_stride >= row bytes and token_stride >= "
           "a token's rows over every layer";
  }
  const std::uint64_t extent = kv_view_extent(kv, std::max(kv.key_channels, kv.value_channels),
                                              dtype, layer_stride, token_stride);
  if (extent > (std::uint64_t{1} << 62)) return "a KV view spans at most 2^62 bytes";
  return nullptr;
}

void check_kv_view(const KvBlocks& kv, const KvView& view) {
  constexpr const char* fn = "KV view";
  if (const char* problem = kv_view_problem(kv, view.dtype, view.layer_stride, view.token_stride)) {
    fail(fn, problem);
  }
  const auto check = [&](const char* what, std::size_t got, std::uint32_t channels) {
    const std::uint64_t want =
        kv_view_extent(kv, channels, view.dtype, view.layer_stride, view.token_stride);
    if (got != want) {
      fail(fn, describe(kv) + " in " + to_string(view.dtype) + " with layer stride " +
                   std::to_string(view.layer_stride) + " and token stride " +
                   std::to_string(view.token_stride) + ": the " + what + " must span " +
                   std::to_string(want) + " bytes, got " + std::to_string(got));
    }
  };
  check("keys", view.keys.size(), kv.key_channels);
  check("values", view.values.size(), kv.value_channels);
}

KvView kv_packed_view(const KvBlocks& kv, DType dtype, std::span<std::byte> staged) {
  constexpr const char* fn = "kv_packed_view";
  if (const char* problem = kv_blocks_problem(kv)) fail(fn, problem);
  if (!kv_dtype(dtype)) fail(fn, "values are f32, bf16 or f16");
  if (kv.value_channels != 0 && kv.value_channels != kv.key_channels) {
    fail(fn, describe(kv) +
                 ": keys and values of different widths are not one view (one pair of strides)");
  }
  const std::uint64_t plain = kv_blocks_plain_bytes(kv, dtype);
  if (staged.size() != plain) {
    fail(fn, describe(kv) + ": the values must be " + std::to_string(plain) + " bytes, got " +
                 std::to_string(staged.size()));
  }
  const std::uint64_t row = std::uint64_t{kv.key_channels} * dtype_bytes(dtype);
  const std::uint64_t stream = row * kv.tokens;
  KvView view;
  view.layer_stride = stream * kv_streams_per_layer(kv);
  view.token_stride = row;
  view.dtype = dtype;
  const std::uint64_t extent = (kv.layers - 1) * view.layer_stride + stream;
  view.keys = staged.first(extent);
  if (kv.value_channels != 0) view.values = staged.subspan(stream, extent);
  return view;
}

void kv_encode_view(const KvBlocks& kv, const KvView& view, std::span<std::byte> encoded,
                    std::size_t first, std::size_t last) {
  constexpr const char* fn = "kv_encode_view";
  check_kv_view(kv, view);
  check_encoded(fn, kv, encoded.size());
  check_streams(fn, kv, first, last);
  for (std::size_t i = first; i < last; ++i) encode_stream(view, stream_at(kv, i), encoded.data());
}

void kv_decode_view(const KvBlocks& kv, std::span<const std::byte> encoded, const KvView& view,
                    std::size_t first, std::size_t last) {
  constexpr const char* fn = "kv_decode_view";
  check_kv_view(kv, view);
  check_encoded(fn, kv, encoded.size());
  check_streams(fn, kv, first, last);
  for (std::size_t i = first; i < last; ++i) {
    const StreamAt s = stream_at(kv, i);
    decode_stream(view, s, encoded.subspan(s.encoded_offset, s.encoded_bytes));
  }
}

void kv_decode_view_stream(const KvBlocks& kv, std::size_t index,
                           std::span<const std::byte> encoded, const KvView& view) {
  constexpr const char* fn = "kv_decode_view_stream";
  check_kv_view(kv, view);
  check_streams(fn, kv, index, index + 1);
  const StreamAt s = stream_at(kv, index);
  if (encoded.size() != s.encoded_bytes) {
    fail(fn, describe(kv) + ": stream " + std::to_string(index) + " takes " +
                 std::to_string(s.encoded_bytes) + " encoded bytes, got " +
                 std::to_string(encoded.size()));
  }
  decode_stream(view, s, encoded);
}

}  // namespace statepool::kernels
