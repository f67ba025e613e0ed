#pragma once
// Page format and whole-page operations, shared by every codec.
//
// Page (exactly page_bytes()):
//   for layer in [0, L): for head in [0, H): encoded head (codec.head_bytes(layer, head))
//   conv state: [L][conv_channels][conv_width] raw in layout.conv_dtype
// Staged state (what a client places in its staging buffer), staged_bytes(dtype) bytes:
//   recurrent [L][H][K][V] in dtype (f32 or bf16), then the conv state exactly as above.
//
// Thread-safety: immutable after construction; encode/decode of different pages may run
// concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/staged_view.hpp"

namespace statepool::kernels {

class PageCodec {
 public:
  /// Validates the layout and builds its codec. Throws std::invalid_argument.
  explicit PageCodec(StateLayout layout);

  [[nodiscard]] const StateLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const Codec& codec() const noexcept { return *codec_; }

  /// Exact bytes of one page, metadata and conv state included.
  [[nodiscard]] std::size_t page_bytes() const noexcept { return page_bytes_; }
  [[nodiscard]] std::size_t head_offset(std::uint32_t layer, std::uint32_t head) const noexcept;
  [[nodiscard]] std::size_t conv_offset() const noexcept { return conv_offset_; }
  [[nodiscard]] std::size_t conv_bytes() const noexcept;
  /// Bytes of the same state with every value (recurrent and conv) in FP32: the
  /// denominator-free reference for compression ratios.
  [[nodiscard]] std::size_t fp32_bytes() const noexcept;
  /// Bytes of a staged state whose recurrent part is in `dtype` (f32 or bf16).
  [[nodiscard]] std::size_t staged_bytes(DType dtype) const noexcept;
  /// fp32_bytes() / page_bytes().
  [[nodiscard]] double compression_ratio() const noexcept;

  /// page <- staged. Checks every recurrent value for NaN/Inf first and throws
  /// NonFiniteError without touching `page`. Throws std::invalid_argument on a wrong
  /// dtype (f16 staging is not accepted) or wrong buffer sizes. `staged` may be memory
  /// another process rewrites meanwhile (a client's staging buffer): every decision is
  /// taken on values read once, so the result is then a page of some values that were
  /// there, or NonFiniteError (the page may then hold part of the new state).
  void encode(std::span<const std::byte> staged, DType dtype, std::span<std::byte> page) const;
  /// staged <- page. Any bytes are safe to decode (fuzzed: fuzz/fuzz_page_decode.cpp), but
  /// a page not written by encode() may decode to NaN or Inf: the output is finite only
  /// for pages this codec encoded. Every codec's decode is arithmetic on the bytes it
  /// reads: no index, bound or branch comes from them, so a page rewritten meanwhile (a
  /// client's arena) decodes to some values, never to an error or a read outside it.
  void decode(std::span<const std::byte> page, DType dtype, std::span<std::byte> staged) const;

  // --- the same work in pieces, for executors that split one state across threads -----
  // Heads are numbered in page order, index = layer * num_heads + head, and are
  // independent: any split of [0, head_count()) into ranges, run in any order or
  // concurrently, writes exactly the bytes of encode() / decode(). Every piece checks the
  // dtype and the buffer sizes like encode() / decode() (std::invalid_argument).

  /// num_layers * num_heads.
  [[nodiscard]] std::size_t head_count() const noexcept { return head_offsets_.size() - 1; }
  /// Throws NonFiniteError for the first NaN/Inf among the recurrent values of heads
  /// [first, last) of `staged`; reads nothing else, and each value once. encode() ==
  /// check_finite over every head, then encode_heads over every head, then encode_conv.
  void check_finite(std::span<const std::byte> staged, DType dtype, std::size_t first,
                    std::size_t last) const;
  /// Encodes heads [first, last) of `staged` into `page`, checking what it encodes: each
  /// value is read once into memory of the calling thread (a block, a group or the head,
  /// Codec::encode_staged_head), which the codec checks and encodes. Throws NonFiniteError for the
  /// first NaN/Inf of the first head that holds one; the heads before it in the range are then
  /// written, that one and the rest not (their bytes are unspecified). An executor that must leave
  /// the page unchanged either runs check_finite over every head first, or encodes into a scratch
  /// page.
  void encode_heads(std::span<const std::byte> staged, DType dtype, std::span<std::byte> page,
                    std::size_t first, std::size_t last) const;
  /// Copies the conv state of `staged` into `page`.
  void encode_conv(std::span<const std::byte> staged, DType dtype, std::span<std::byte> page) const;
  /// Decodes heads [first, last) of `page` into `staged`.
  void decode_heads(std::span<const std::byte> page, DType dtype, std::span<std::byte> staged,
                    std::size_t first, std::size_t last) const;
  /// Copies the conv state of `page` into `staged`.
  void decode_conv(std::span<const std::byte> page, DType dtype, std::span<std::byte> staged) const;

  // --- the same on a staged view (staged_view.hpp): the state where an engine keeps it,
  // each head [K][V] or [V][K], the conv state in a buffer of its own. The page bytes are
  // exactly encode()'s on the same values and decoding gives exactly decode()'s values,
  // whatever the head order; a NaN/Inf is reported in [K][V] terms (row = key index, col =
  // value index), the first in page order, as encode() reports it. Every function checks
  // the view (dtype f32 or bf16, a known head order, `recurrent` and `conv` of exactly
  // their sizes) and the page size (std::invalid_argument). A value-major head is read once,
  // transposed into a per-thread FP32 head, and encoded from there; decoding a value-major
  // head decodes into a per-thread FP32 head and writes it transposed (each output byte
  // once, converted to bf16 as decode() converts).

  /// page <- view, as encode(): every value checked before the page is written.
  void encode(const StateView& staged, std::span<std::byte> page) const;
  /// view <- page, as decode().
  void decode(std::span<const std::byte> page, const StateView& staged) const;
  void check_finite(const StateView& staged, std::size_t first, std::size_t last) const;
  void encode_heads(const StateView& staged, std::span<std::byte> page, std::size_t first,
                    std::size_t last) const;
  void encode_conv(const StateView& staged, std::span<std::byte> page) const;
  void decode_heads(std::span<const std::byte> page, const StateView& staged, std::size_t first,
                    std::size_t last) const;
  void decode_conv(std::span<const std::byte> page, const StateView& staged) const;

 private:
  void check_buffers(std::span<const std::byte> staged, DType dtype,
                     std::span<const std::byte> page) const;
  void check_view(const StateView& staged) const;
  void check_range(std::size_t first, std::size_t last) const;
  // The pieces' loops, once the sizes are checked: `recurrent` is the recurrent part.
  void check_finite_at(const std::byte* recurrent, DType dtype, HeadOrder order, std::size_t first,
                       std::size_t last) const;
  void encode_heads_at(const std::byte* recurrent, DType dtype, HeadOrder order,
                       std::span<std::byte> page, std::size_t first, std::size_t last) const;
  void decode_heads_at(std::span<const std::byte> page, std::byte* recurrent, DType dtype,
                       HeadOrder order, std::size_t first, std::size_t last) const;

  StateLayout layout_;
  std::unique_ptr<Codec> codec_;
  std::vector<std::size_t> head_offsets_;  // layers * heads + 1 prefix sums
  std::size_t conv_offset_ = 0;
  std::size_t page_bytes_ = 0;
};

}  // namespace statepool::kernels
