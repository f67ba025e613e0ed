// libFuzzer target: pages with arbitrary bytes, as a hostile client can leave them in its
// mapped arena, decoded by every codec (page_input.hpp: the first bytes choose a valid
// layout, the rest is the page).
//
// Must hold for any page bytes (a failure aborts: libFuzzer reports the input):
//   - PageCodec::decode neither crashes nor has undefined behaviour (ASan + UBSan) and
//     throws nothing for buffers of the right sizes;
//   - decoding in pieces (decode_heads over a split of the heads, then decode_conv)
//     writes exactly the bytes of decode() (page.hpp promises it for any split);
//   - the device kernels' decode bodies, run on the host (kernels/cuda/host_team.hpp),
//     write exactly the bytes of PageCodec::decode (docs/codecs.md: no tolerance);
//   - the decoded state encodes again: encode() throws nothing but NonFiniteError, and
//     that only when the decoded state holds a NaN or an Inf.
// Decoded values may be NaN or Inf: a page's values and scales are IEEE floats (fp32,
// bf16, fp16 bits) and hostile bytes can hold any of them; page.hpp does not promise
// finite output, so that is not checked here.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "page_input.hpp"
#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/cuda/host_team.hpp"
#include "statepool/kernels/cuda/page_format.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"

namespace {

namespace kernels = statepool::kernels;

[[noreturn]] void fail(const char* what, const kernels::StateLayout& layout, std::ptrdiff_t at) {
  std::fprintf(stderr,
               "statepool fuzz_page_decode: %s (codec %s, arch %s, %ux%ux%ux%u, conv %ux%u %s, "
               "group %u, variant %s; first difference at staged byte %td)\n",
               what, kernels::to_string(layout.codec.id), kernels::to_string(layout.arch),
               layout.num_layers, layout.num_heads, layout.key_dim, layout.value_dim,
               layout.conv_channels, layout.conv_width, kernels::to_string(layout.conv_dtype),
               layout.codec.group_size, kernels::to_string(layout.codec.variant), at);
  std::fflush(stderr);
  std::abort();
}

std::ptrdiff_t first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

/// True when the recurrent part of a staged state (the first `values` values) holds a
/// NaN or an Inf.
bool has_non_finite(const std::vector<std::byte>& staged, kernels::DType dtype,
                    std::size_t values) {
  for (std::size_t i = 0; i < values; ++i) {
    if (dtype == kernels::DType::f32) {
      float v = 0;
      std::memcpy(&v, staged.data() + 4 * i, sizeof v);
      if (!std::isfinite(v)) return true;
    } else {
      std::uint16_t bits = 0;
      std::memcpy(&bits, staged.data() + 2 * i, sizeof bits);
      if (kernels::is_non_finite_bf16(bits)) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto input = statepool::fuzz::parse_page_input(std::span<const std::uint8_t>(data, size));
  if (!input) return 0;
  const kernels::StateLayout& layout = input->layout;
  const kernels::DType dtype = input->staged;
  const kernels::PageCodec codec(layout);  // valid by construction: a throw is a bug here
  const std::vector<std::byte> page = statepool::fuzz::fill_page(*input, codec.page_bytes());
  const std::size_t staged_bytes = codec.staged_bytes(dtype);

  std::vector<std::byte> whole(staged_bytes, std::byte{0xA5});
  codec.decode(page, dtype, whole);

  // Any split of the heads writes the same bytes; the split point comes from the input.
  const std::size_t heads = codec.head_count();
  const std::size_t split = size % (heads + 1);
  std::vector<std::byte> pieces(staged_bytes, std::byte{0x5A});
  codec.decode_heads(page, dtype, pieces, split, heads);
  codec.decode_heads(page, dtype, pieces, 0, split);
  codec.decode_conv(page, dtype, pieces);
  if (pieces != whole) {
    fail("decode_heads + decode_conv differ from decode", layout, first_difference(pieces, whole));
  }

  // The bodies of the CUDA decode kernels, on the host, one rank per block.
  const kernels::cuda::PageFormatTables tables(codec, dtype);
  std::vector<std::byte> device(staged_bytes, std::byte{0x3C});
  const void* in = page.data();
  void* out = device.data();
  kernels::cuda::emulate_decode_pages(tables.view(), &in, &out, 1, 1);
  if (device != whole) {
    fail("the device decode (host emulation) differs from PageCodec::decode", layout,
         first_difference(device, whole));
  }

  // What was decoded can be stored again.
  const std::size_t values = heads * std::size_t{layout.key_dim} * layout.value_dim;
  std::vector<std::byte> again(codec.page_bytes());
  try {
    codec.encode(whole, dtype, again);
  } catch (const kernels::NonFiniteError&) {
    if (!has_non_finite(whole, dtype, values)) {
      fail("encode refused a finite decoded state as non-finite", layout, -1);
    }
  }
  return 0;
}
