#pragma once
// KV-cache codecs for the full-attention layers of hybrid models (STEPQUANT.md,
// "KV-cache codecs"; docs/codecs.md, "KV-cache codecs", has the byte layouts): the
// encoded size of one stream (the one definition the capacity planner calls too), and
// the CPU encoder and decoder. The per-value math is kv_math.hpp's, shared with the CUDA
// kernels (cuda/kv_kernels.hpp), which write the same bytes.
//
// A stream is one layer's keys or values: `tokens` x `channels` values, row-major
// [token][channel], token 0 the oldest. `channels` are all KV heads of the layer
// flattened, head-major (channel = head * head_dim + d), as the engines lay out a
// [tokens][kv_heads][head_dim] tensor; an MLA latent is one stream of role keys. Groups
// of 32 channels never straddle two heads when head_dim is a multiple of 32.
//
//   bf16      2 B per value: bfloat16, round to nearest even (finite values saturate at
//             the largest finite bf16, never Inf)
//   fp8       1 B per value: OCP FP8 E4M3 (bias 7, no infinities, max finite 448),
//             round to nearest even, values beyond +-448 saturate to +-448; no per-tensor
//             scale (an engine that keeps one must fold it into the values first)
//   flexgen4  4-bit asymmetric groups of 32 consecutive channels of one token, both
//             roles alike: 20 B per group
//   kivi2/4   2/4-bit asymmetric groups; keys per channel (a group is 32 consecutive
//             tokens of one channel), values per token (32 consecutive channels); the
//             newest min(tokens, 128) tokens stay FP16 (the residual window)
// A quantized group stores an fp16 scale and an fp16 offset beside its codes
// (4 + 32 B / 8 bytes: 12 B at 2 bits, 20 B at 4); a partial group (the last channels
// of a row, or the newest quantized tokens of a key channel) is stored whole, its unused
// code slots zero. Every byte of metadata is inside the encoded buffer.
//
// Errors: kv_encode rejects wrong buffer sizes or arguments (std::invalid_argument) before
// writing anything, and NaN and +-Inf (KvNonFiniteError) as it meets them: each input
// value is read once, into a per-thread buffer, and checked and encoded from there (the
// input may be memory another process rewrites meanwhile), so after KvNonFiniteError the
// output holds unspecified bytes; callers that must keep it encode into a scratch buffer,
// as the daemon's executors do. kv_decode checks sizes only: any bytes decode without
// undefined behaviour (a corrupt scale may give non-finite values), and decoding is
// arithmetic on the bytes read, with no index or bound taken from them.
//
// Thread-safety: pure functions; concurrent calls on distinct output buffers are fine.

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/numeric.hpp"

namespace statepool::kernels {

/// KV-cache codec. Same names and order as planner::KvDtype.
enum class KvCodecId : std::uint8_t { bf16 = 0, fp8 = 1, kivi2 = 2, kivi4 = 3, flexgen4 = 4 };

/// Which half of an attention layer's cache a stream holds. Only KIVI quantizes the two
/// differently (keys per channel, values per token); for the others the role is ignored.
enum class KvRole : std::uint8_t { keys = 0, values = 1 };

/// "bf16", "fp8", "kivi2", "kivi4", "flexgen4" ("?" for a value outside the enum).
[[nodiscard]] const char* to_string(KvCodecId codec) noexcept;
/// "keys", "values".
[[nodiscard]] const char* to_string(KvRole role) noexcept;
/// Parses a name printed by to_string(KvCodecId); false (out untouched) otherwise.
[[nodiscard]] bool parse_kv_codec(std::string_view text, KvCodecId& out) noexcept;

/// Values per quantization group.
inline constexpr std::uint32_t kKvGroupSize = 32;
/// KIVI keeps the newest min(tokens, kKvResidualTokens) tokens in FP16.
inline constexpr std::uint64_t kKvResidualTokens = 128;

/// One stream: `tokens` x `channels` values of one role under one codec.
struct KvStream {
  KvCodecId codec = KvCodecId::bf16;
  KvRole role = KvRole::keys;
  std::uint64_t tokens = 0;
  std::uint64_t channels = 0;
};

/// True for the codecs that quantize in groups (kivi2, kivi4, flexgen4).
STATEPOOL_HD constexpr bool is_kv_group_codec(KvCodecId codec) noexcept {
  return codec == KvCodecId::kivi2 || codec == KvCodecId::kivi4 || codec == KvCodecId::flexgen4;
}

/// Bits per stored code or value: 16, 8, 2, 4, 4 (0 outside the enum).
STATEPOOL_HD constexpr std::uint32_t kv_code_bits(KvCodecId codec) noexcept {
  switch (codec) {
    case KvCodecId::bf16: return 16;
    case KvCodecId::fp8: return 8;
    case KvCodecId::kivi2: return 2;
    case KvCodecId::kivi4:
    case KvCodecId::flexgen4: return 4;
  }
  return 0;
}

/// Bytes of one quantization group: fp16 scale, fp16 offset, 32 codes of `bits` bits.
STATEPOOL_HD constexpr std::uint32_t kv_group_bytes(std::uint32_t bits) noexcept {
  return 4u + kKvGroupSize * bits / 8u;
}

/// Where everything of one encoded stream lies (docs/codecs.md, "KV-cache codecs").
/// All counts and offsets in values, groups or bytes of the encoded buffer.
struct KvGeometry {
  std::uint32_t bits = 0;             ///< kv_code_bits(codec)
  bool per_channel = false;           ///< KIVI keys: groups run along tokens
  std::uint64_t tokens = 0;           ///< of the stream
  std::uint64_t channels = 0;         ///< of the stream
  std::uint64_t quantized = 0;        ///< tokens in groups (the oldest ones); 0 for bf16/fp8
  std::uint64_t residual = 0;         ///< KIVI: newest tokens kept FP16, min(tokens, 128)
  std::uint64_t groups_per_row = 0;   ///< per token: ceil(channels/32); per channel: 0
  std::uint64_t token_groups = 0;     ///< per channel: ceil(quantized/32); per token: 0
  std::uint64_t groups = 0;           ///< group records in the buffer
  std::uint32_t group_bytes = 0;      ///< bytes of one record (0 for bf16/fp8)
  std::uint64_t residual_offset = 0;  ///< first byte of the FP16 residual window
  std::uint64_t bytes = 0;            ///< the whole encoded stream
};

STATEPOOL_HD constexpr std::uint64_t kv_ceil_div(std::uint64_t a, std::uint64_t b) noexcept {
  return (a + b - 1) / b;
}

/// The geometry of a stream. A codec outside the enum gives bits == 0 and 0 bytes.
/// Exact while tokens * channels * 2 and tokens * ceil(channels / 32) * 20 fit in 64 bits.
STATEPOOL_HD constexpr KvGeometry kv_geometry(KvCodecId codec, KvRole role, std::uint64_t tokens,
                                              std::uint64_t channels) noexcept {
  KvGeometry g;
  g.bits = kv_code_bits(codec);
  g.tokens = tokens;
  g.channels = channels;
  if (g.bits == 0) {
    return g;
  }
  if (!is_kv_group_codec(codec)) {
    g.bytes = tokens * channels * (g.bits / 8u);
    return g;
  }
  const bool kivi = codec != KvCodecId::flexgen4;
  g.residual = kivi ? (tokens < kKvResidualTokens ? tokens : kKvResidualTokens) : 0;
  g.quantized = tokens - g.residual;
  g.per_channel = kivi && role == KvRole::keys;
  g.group_bytes = kv_group_bytes(g.bits);
  if (g.per_channel) {
    g.token_groups = kv_ceil_div(g.quantized, kKvGroupSize);
    g.groups = g.token_groups * channels;
  } else {
    g.groups_per_row = kv_ceil_div(channels, kKvGroupSize);
    g.groups = g.quantized * g.groups_per_row;
  }
  g.residual_offset = g.groups * g.group_bytes;
  g.bytes = g.residual_offset + g.residual * channels * 2u;
  return g;
}

STATEPOOL_HD constexpr KvGeometry kv_geometry(const KvStream& s) noexcept {
  return kv_geometry(s.codec, s.role, s.tokens, s.channels);
}

/// Exact bytes of the encoded stream, every byte of metadata included (0 for tokens == 0
/// or channels == 0, and for a codec outside the enum). planner::kv_stream_bytes is this.
[[nodiscard]] STATEPOOL_HD constexpr std::uint64_t kv_encoded_bytes(
    KvCodecId codec, KvRole role, std::uint64_t tokens, std::uint64_t channels) noexcept {
  return kv_geometry(codec, role, tokens, channels).bytes;
}
[[nodiscard]] STATEPOOL_HD constexpr std::uint64_t kv_encoded_bytes(const KvStream& s) noexcept {
  return kv_geometry(s).bytes;
}

/// Thrown by kv_encode for a NaN or +-Inf input value: the first in row-major order of the
/// first tile that holds one (tiles span every channel of up to 1024-channel streams, so
/// there it is the first of the stream). The output then holds unspecified bytes.
class KvNonFiniteError : public std::invalid_argument {
 public:
  /// Message: "kv_encode: non-finite value inf at token 12 channel 40 (kivi2 keys)".
  KvNonFiniteError(const KvStream& stream, std::uint64_t token, std::uint64_t channel, float value);
  [[nodiscard]] std::uint64_t token() const noexcept { return token_; }
  [[nodiscard]] std::uint64_t channel() const noexcept { return channel_; }
  /// The value found there (NaN or +-Inf), as it was read.
  [[nodiscard]] float value() const noexcept { return value_; }

 private:
  std::uint64_t token_;
  std::uint64_t channel_;
  float value_;
};

/// Encodes a stream. `in`: tokens * channels values, row-major [token][channel], in
/// `in_dtype` (f32, bf16 or f16; native little-endian, any alignment); `out`:
/// exactly kv_encoded_bytes(stream) bytes, every one of which is written. Throws
/// std::invalid_argument for a codec, role or dtype outside its enum or a buffer of the
/// wrong size, writing nothing, and KvNonFiniteError for NaN / +-Inf (`out` is then
/// unspecified).
void kv_encode(const KvStream& stream, DType in_dtype, std::span<const std::byte> in,
               std::span<std::byte> out);
/// The same from FP32 values.
void kv_encode(const KvStream& stream, std::span<const float> in, std::span<std::byte> out);

/// Decodes a stream written by kv_encode into tokens * channels values in `out_dtype`
/// (f32 exactly as reconstructed; bf16 and f16 rounded to nearest even from that FP32
/// value, saturating). Throws std::invalid_argument for wrong sizes or arguments,
/// writing nothing.
void kv_decode(const KvStream& stream, std::span<const std::byte> in, DType out_dtype,
               std::span<std::byte> out);
/// The same into FP32 values.
void kv_decode(const KvStream& stream, std::span<const std::byte> in, std::span<float> out);

// --- KV blocks: every full-attention layer of one prefix ------------------------------
//
// What a hybrid prefix snapshot carries beside the recurrent state (docs/prefix-store.md,
// "Hybrid entries"): the keys and values of `layers` attention layers over `tokens`
// tokens, all under one codec. Streams are in this order, both in the plain buffer (values
// of one dtype) and in the encoded one (each stream's kv_encode bytes), back to back with
// no padding:
//   layer 0 keys, layer 0 values, layer 1 keys, layer 1 values, ...
// Keys have `key_channels` channels (kv_heads * head_dim), values `value_channels`; 0
// value channels means keys only (an MLA latent), one stream per layer.

/// Largest KV-block dimensions accepted (a bound on buffer sizes, far above real models).
inline constexpr std::uint32_t kKvMaxLayers = 1024;
inline constexpr std::uint32_t kKvMaxChannels = 1u << 20;
inline constexpr std::uint64_t kKvMaxTokens = 1ull << 32;
/// ... and at most 2^48 bytes of FP32 values in all.
inline constexpr unsigned kKvMaxBytesLog2 = 48;

struct KvBlocks {
  KvCodecId codec = KvCodecId::bf16;
  std::uint32_t layers = 0;
  std::uint32_t key_channels = 0;
  std::uint32_t value_channels = 0;  ///< 0: keys only
  std::uint64_t tokens = 0;

  friend bool operator==(const KvBlocks&, const KvBlocks&) = default;
};

/// Where one stream of a KvBlocks lies.
struct KvBlockStream {
  KvStream stream;
  std::uint32_t layer = 0;
  std::uint64_t plain_offset = 0;  ///< in the plain buffer, bytes
  std::uint64_t plain_bytes = 0;
  std::uint64_t encoded_offset = 0;  ///< in the encoded buffer, bytes
  std::uint64_t encoded_bytes = 0;
};

/// Null when `blocks` is well formed (known codec, 1..kKvMaxLayers layers, 1..kKvMaxChannels
/// key channels, at most kKvMaxChannels value channels, 1..kKvMaxTokens tokens, at most
/// 2^kKvMaxBytesLog2 bytes as FP32); else why
/// not ("KV blocks need at least 1 token", ...).
[[nodiscard]] const char* kv_blocks_problem(const KvBlocks& blocks) noexcept;
/// Streams per layer: 2, or 1 for keys only.
[[nodiscard]] constexpr std::uint32_t kv_streams_per_layer(const KvBlocks& b) noexcept {
  return b.value_channels == 0 ? 1u : 2u;
}
/// Every stream, in order, with its offsets for plain values of `plain` (f32, bf16, f16).
/// Throws std::invalid_argument when kv_blocks_problem(blocks) is not null.
[[nodiscard]] std::vector<KvBlockStream> kv_block_streams(const KvBlocks& blocks, DType plain);
/// Bytes of every stream encoded (every byte of metadata included); 0 if ill formed.
[[nodiscard]] std::uint64_t kv_blocks_encoded_bytes(const KvBlocks& blocks) noexcept;
/// Bytes of the plain values in `plain`; 0 if ill formed or `plain` is not f32/bf16/f16.
[[nodiscard]] std::uint64_t kv_blocks_plain_bytes(const KvBlocks& blocks, DType plain) noexcept;
/// "kivi2 KV blocks: 12 layers x 10000 tokens, keys 512 / values 512 channels".
[[nodiscard]] std::string describe(const KvBlocks& blocks);

/// Every stream of `blocks`, one after the other: kv_encode / kv_decode per stream, with
/// their errors (sizes are checked first, writing nothing; after a non-finite value `out`
/// is unspecified). An executor may run the streams in
/// parallel instead (kv_block_streams has their offsets).
void kv_encode_blocks(const KvBlocks& blocks, DType in_dtype, std::span<const std::byte> in,
                      std::span<std::byte> out);
void kv_decode_blocks(const KvBlocks& blocks, std::span<const std::byte> in, DType out_dtype,
                      std::span<std::byte> out);

}  // namespace statepool::kernels
