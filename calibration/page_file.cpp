#include "statepool/calibration/page_file.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace statepool::calibration {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'Q', 'P', 'A', 'G', 'E', '\0'};

void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
  }
}

void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
  }
}

std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= std::to_integer<std::uint32_t>(p[i]) << (8 * i);
  }
  return v;
}

std::uint64_t get_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  }
  return v;
}

}  // namespace

std::vector<std::byte> make_page_file(const PageFileHeader& header,
                                      std::span<const std::byte> page) {
  if (page.size() != header.page_bytes) {
    throw std::invalid_argument("page file: page of " + std::to_string(page.size()) +
                                " bytes, header says " + std::to_string(header.page_bytes));
  }
  if (!header.plan_digest.empty() && header.plan_digest.size() != 16) {
    throw std::invalid_argument("page file: plan digest must be 16 characters");
  }
  std::vector<std::byte> out(kPageFileHeaderBytes + page.size());
  std::byte* p = out.data();
  std::memcpy(p, kMagic, sizeof kMagic);
  put_u32(p + 8, kPageFileVersion);
  p[12] = static_cast<std::byte>(header.codec);
  p[13] = static_cast<std::byte>(header.arch);
  p[14] = static_cast<std::byte>(header.variant);
  p[15] = static_cast<std::byte>(header.rank);
  put_u32(p + 16, header.group_size);
  put_u32(p + 20, header.layers);
  put_u32(p + 24, header.heads);
  put_u32(p + 28, header.key_dim);
  put_u32(p + 32, header.value_dim);
  put_u64(p + 40, header.page_bytes);
  std::memcpy(p + 48, header.plan_digest.data(), header.plan_digest.size());
  std::copy(page.begin(), page.end(), out.begin() + kPageFileHeaderBytes);
  return out;
}

PageFileHeader parse_page_file(std::span<const std::byte> file, const std::string& what) {
  const auto fail = [&](const std::string& message) {
    throw std::invalid_argument(what + ": " + message);
  };
  if (file.size() < kPageFileHeaderBytes || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    fail(
        "not a statepool-quant page file (missing the SPQPAGE header; encode one with "
        "'statepool-quant codec encode')");
  }
  const std::byte* p = file.data();
  const std::uint32_t version = get_u32(p + 8);
  if (version < 1 || version > kPageFileVersion) {
    fail("page file version " + std::to_string(version) + " is not supported");
  }
  PageFileHeader h;
  const auto codec = std::to_integer<std::uint8_t>(p[12]);
  const auto arch = std::to_integer<std::uint8_t>(p[13]);
  const auto variant = std::to_integer<std::uint8_t>(p[14]);
  if (codec > static_cast<std::uint8_t>(kernels::CodecId::dsq6)) {
    fail("unknown codec id " + std::to_string(codec));
  }
  if (arch > static_cast<std::uint8_t>(kernels::Arch::kda)) {
    fail("unknown arch " + std::to_string(arch));
  }
  if (variant > static_cast<std::uint8_t>(kernels::StepQuantVariant::no_refit)) {
    fail("unknown stepquant variant " + std::to_string(variant));
  }
  h.codec = static_cast<kernels::CodecId>(codec);
  h.arch = static_cast<kernels::Arch>(arch);
  h.variant = static_cast<kernels::StepQuantVariant>(variant);
  // Older versions differ only in their 2-bit units (version 1: GDN heads in the paper's
  // format; version 2: ternary levels), which only stepquant4 plans have and which every
  // variant but spatial_only stores.
  if (version < kPageFileVersion && h.codec == kernels::CodecId::stepquant4 &&
      h.variant != kernels::StepQuantVariant::spatial_only) {
    fail("a version " + std::to_string(version) +
         " stepquant4 page may hold 2-bit units of an older STEPQuant page format (before " +
         (version == 1 ? std::string("2026-12-01") : std::string("2026-12-05")) +
         "), which this build does not read; encode the state again with this build "
         "('statepool-quant codec encode')");
  }
  h.rank = std::to_integer<std::uint8_t>(p[15]);
  if (h.rank != 3 && h.rank != 4) {
    fail("rank " + std::to_string(h.rank) + " is not 3 or 4");
  }
  h.group_size = get_u32(p + 16);
  h.layers = get_u32(p + 20);
  h.heads = get_u32(p + 24);
  h.key_dim = get_u32(p + 28);
  h.value_dim = get_u32(p + 32);
  h.page_bytes = get_u64(p + 40);
  if (h.rank == 3 && h.layers != 1) {
    fail("a rank-3 state must have one layer");
  }
  const auto* digest = reinterpret_cast<const char*>(p + 48);
  if (std::any_of(digest, digest + 16, [](char c) { return c != '\0'; })) {
    h.plan_digest.assign(digest, 16);
  }
  if (file.size() - kPageFileHeaderBytes != h.page_bytes) {
    fail("holds " + std::to_string(file.size() - kPageFileHeaderBytes) +
         " page bytes, the header says " + std::to_string(h.page_bytes) + " (truncated?)");
  }
  return h;
}

}  // namespace statepool::calibration
