#pragma once
// The file `statepool-quant codec encode` writes: one packed page (kernels::PageCodec
// format, no conv state) behind a fixed 64-byte header that says how to decode it.
//
//   offset size
//   0      8    magic "SPQPAGE\0"
//   8      4    version (3; 1 and 2 are read, see kPageFileVersion), little-endian u32
//   12     1    codec id (kernels::CodecId)
//   13     1    arch (kernels::Arch)
//   14     1    stepquant variant (kernels::StepQuantVariant; 0 for other codecs)
//   15     1    rank of the state array: 3 ([heads, K, V]) or 4 ([layers, heads, K, V])
//   16     4    group size of the int codecs as given (0 = default)
//   20     16   layers, heads, key_dim, value_dim (u32 each)
//   36     4    zero
//   40     8    page bytes (u64)
//   48     16   plan digest (16 lowercase hex characters) or 16 zero bytes without a plan
//   64          the page
// The file is exactly 64 + page bytes long.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "statepool/kernels/layout.hpp"

namespace statepool::calibration {

inline constexpr std::size_t kPageFileHeaderBytes = 64;
/// 3 since 2026-12-05: pages of STEPQuant page format 2 (four-level 2-bit units,
/// docs/codecs.md "Format versions"). Versions 1 (2-bit GDN heads in the paper's format)
/// and 2 (ternary 2-bit units, page format 1) differ only in their 2-bit units: they are
/// read, except stepquant4 pages of a variant that has 2-bit units (all but
/// spatial_only), which are refused with the version and what to do.
inline constexpr std::uint32_t kPageFileVersion = 3;

struct PageFileHeader {
  kernels::CodecId codec = kernels::CodecId::fp32;
  kernels::Arch arch = kernels::Arch::gdn;
  kernels::StepQuantVariant variant = kernels::StepQuantVariant::full;
  std::uint8_t rank = 4;
  std::uint32_t group_size = 0;
  std::uint32_t layers = 0;
  std::uint32_t heads = 0;
  std::uint32_t key_dim = 0;
  std::uint32_t value_dim = 0;
  std::uint64_t page_bytes = 0;
  std::string plan_digest;  ///< empty without a plan
};

/// Header followed by the page. Throws std::invalid_argument when page.size() differs
/// from header.page_bytes or the digest is not 16 characters (or empty).
[[nodiscard]] std::vector<std::byte> make_page_file(const PageFileHeader& header,
                                                    std::span<const std::byte> page);

/// Parses and checks the header of a whole page file (magic, version, known codec, arch
/// and variant, rank, sizes, total length). Throws std::invalid_argument("<what>: ...").
[[nodiscard]] PageFileHeader parse_page_file(std::span<const std::byte> file,
                                             const std::string& what);

}  // namespace statepool::calibration
