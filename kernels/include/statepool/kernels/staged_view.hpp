#pragma once
// Staged states and KV blocks where an engine keeps them, so that the daemon encodes from
// and decodes into the engine's own host pool in one pass, with no copy into statepool's
// packed staging layout first (docs/protocol.md, "Batched snapshot requests").
//
// A StateView is a staged state in two places: the recurrent part, every layer's heads
// packed in page order, each head a row-major matrix either [K][V] (statepool's staged
// layout, page.hpp) or [V][K] (HeadOrder::value_major: SGLang's and vLLM's GDN and KDA
// state, key innermost); and the conv state [L][C][W] raw in the layout's conv dtype,
// anywhere (it may follow the recurrent part, as in page.hpp's staged layout, or live in
// another buffer, as in SGLang's MambaPoolHost). PageCodec's view functions (page.hpp)
// write exactly the page bytes of PageCodec::encode on the same values, and decode
// exactly the values PageCodec::decode gives, whatever the head order.
//
// A KvView is the plain values of KV blocks (kv.hpp) anywhere: for layer l and token t,
// the row of key_channels keys starts at keys + l * layer_stride + t * token_stride, the
// row of value_channels values likewise in `values`; a row's channels are contiguous in
// `dtype`. Statepool's packed order (kv.hpp: layer 0 keys, layer 0 values, layer 1 keys,
// ...) is one such view (kv_packed_view); SGLang's host KV layouts are others:
//   page_first         [2][size][L][H*D]: token_stride = L*H*D*s, layer_stride = H*D*s
//   page_first_direct  [2][pages][L][ps][H*D]: layer_stride = ps*H*D*s, token_stride = H*D*s
//                      (the tokens of one page: a view per page)
//   layer_first        [2][L][size][H*D]: layer_stride = size*H*D*s, token_stride = H*D*s
// kv_encode_view / kv_decode_view write exactly the bytes of kv_encode_blocks /
// kv_decode_blocks on the same values.
//
// Memory another process may rewrite: every value of a view is read once, into memory
// of the calling thread, and checked and encoded from there (as Codec::encode_staged_head
// and kv_encode do), so a rewritten view encodes some values that were there, or fails
// with NonFiniteError / KvNonFiniteError. Decoding writes each output byte once.
//
// Thread-safety: pure functions; concurrent calls on distinct outputs are fine.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/layout.hpp"

namespace statepool::kernels {

/// How each head's matrix is stored in a staged state.
enum class HeadOrder : std::uint8_t {
  key_major = 0,    ///< [K][V] row-major: statepool's staged layout (page.hpp)
  value_major = 1,  ///< [V][K] row-major: the head transposed (SGLang, vLLM)
};

[[nodiscard]] const char* to_string(HeadOrder order) noexcept;

/// A staged state in an engine's memory. `recurrent` holds exactly
/// num_layers * num_heads * key_dim * value_dim values in `dtype` (f32 or bf16), heads in
/// page order; `conv` exactly PageCodec::conv_bytes() bytes (empty without a conv state).
/// For encoding the spans are read, for decoding written; the caller checks that they lie
/// in memory it may use.
struct StateView {
  std::span<std::byte> recurrent;
  std::span<std::byte> conv;
  DType dtype = DType::f32;
  HeadOrder order = HeadOrder::key_major;
};

/// The view of a state in statepool's packed staged layout (page.hpp): `staged` holds
/// staged_bytes(dtype) bytes, recurrent part first, conv state after it. Throws
/// std::invalid_argument on a dtype other than f32 or bf16, or a wrong size.
[[nodiscard]] StateView packed_state_view(const StateLayout& layout, DType dtype,
                                          std::span<std::byte> staged);

/// The plain values of KV blocks in an engine's memory. `keys` spans exactly
/// kv_view_extent(kv.key_channels, ...) bytes from the first key row's first byte; `values`
/// likewise for value_channels (empty when kv.value_channels is 0).
struct KvView {
  std::span<std::byte> keys;
  std::span<std::byte> values;
  std::uint64_t layer_stride = 0;  ///< bytes from one layer's row of a token to the next layer's
  std::uint64_t token_stride = 0;  ///< bytes from one token's row to the next token's
  DType dtype = DType::bf16;       ///< f32, bf16 or f16
};

/// Bytes a view region of `channels` spans: (layers - 1) * layer_stride +
/// (tokens - 1) * token_stride + channels * size(dtype); 0 when channels, kv.layers or
/// kv.tokens is 0 or `dtype` is not f32, bf16 or f16; UINT64_MAX when it does not fit in
/// 64 bits.
[[nodiscard]] std::uint64_t kv_view_extent(const KvBlocks& kv, std::uint64_t channels, DType dtype,
                                           std::uint64_t layer_stride,
                                           std::uint64_t token_stride) noexcept;

/// Why strides cannot describe `kv` in `dtype`; nullptr when they can. Reasons: `kv` ill
/// formed (kv_blocks_problem); a dtype that is not f32, bf16 or f16; rows of one region
/// that would overlap, that is neither
///   token_stride >= row and layer_stride >= (tokens - 1) * token_stride + row
///   (tokens inside layers), nor
///   layer_stride >= row and token_stride >= (layers - 1) * layer_stride + row
///   (layers inside tokens)
/// holds, `row` being the bytes of the wider of the two rows (a stride over a dimension of
/// size 1 is never used and not looked at); an extent past 2^62 bytes. The key and value
/// regions may overlap each other (interleaved rows, as in kv_packed_view).
[[nodiscard]] const char* kv_view_problem(const KvBlocks& kv, DType dtype,
                                          std::uint64_t layer_stride,
                                          std::uint64_t token_stride) noexcept;

/// Throws std::invalid_argument unless `view` describes `kv`: kv_view_problem is null and
/// `keys` / `values` span exactly kv_view_extent bytes each (`values` empty for keys only).
void check_kv_view(const KvBlocks& kv, const KvView& view);

/// The view of KV blocks in statepool's packed order (kv.hpp) in `staged`
/// (kv_blocks_plain_bytes(kv, dtype) bytes). One pair of strides serves both regions, so
/// the packed order is a view only when keys and values have the same channels, or there
/// are no values; throws std::invalid_argument otherwise, and on a wrong size.
[[nodiscard]] KvView kv_packed_view(const KvBlocks& kv, DType dtype, std::span<std::byte> staged);

/// Encodes the KV blocks of `view` into `encoded` (kv_blocks_encoded_bytes(kv) bytes):
/// exactly kv_encode_blocks's bytes for the same values. Streams [first, last) of
/// kv_block_streams(kv, view.dtype) only, so that an executor can split the work (the
/// full range is [0, streams)). Throws std::invalid_argument on wrong sizes or strides,
/// KvNonFiniteError on NaN/Inf (`encoded` then holds unspecified bytes for that stream).
void kv_encode_view(const KvBlocks& kv, const KvView& view, std::span<std::byte> encoded,
                    std::size_t first, std::size_t last);

/// Decodes `encoded` (kv_blocks_encoded_bytes(kv) bytes) into `view`, streams
/// [first, last): exactly the values kv_decode_blocks gives. Throws std::invalid_argument
/// on wrong sizes or strides.
void kv_decode_view(const KvBlocks& kv, std::span<const std::byte> encoded, const KvView& view,
                    std::size_t first, std::size_t last);

/// One stream of kv_decode_view from its own encoded bytes (`encoded`: that stream's
/// kv_encoded_bytes, wherever they lie): stream `index` of kv_block_streams(kv,
/// view.dtype). For executors whose encoded blocks are in pieces. Throws
/// std::invalid_argument on wrong sizes, strides or index.
void kv_decode_view_stream(const KvBlocks& kv, std::size_t index,
                           std::span<const std::byte> encoded, const KvView& view);

}  // namespace statepool::kernels
