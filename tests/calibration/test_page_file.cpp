// Page files of statepool-quant codec encode (page_file.hpp): the header round-trips, and
// version 1 files are read except the stepquant4 GDN pages whose 2-bit heads had the
// format before 2026-12-01.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/calibration/page_file.hpp"

namespace statepool::calibration {
namespace {

PageFileHeader header(kernels::CodecId codec, kernels::Arch arch,
                      kernels::StepQuantVariant variant) {
  PageFileHeader h;
  h.codec = codec;
  h.arch = arch;
  h.variant = variant;
  h.rank = 3;
  h.layers = 1;
  h.heads = 2;
  h.key_dim = 4;
  h.value_dim = 4;
  h.page_bytes = 8;
  return h;
}

std::vector<std::byte> as_version(std::vector<std::byte> file, std::uint32_t version) {
  std::memcpy(file.data() + 8, &version, 4);  // little-endian hosts only, as the format
  return file;
}

std::string error_of(const std::vector<std::byte>& file) {
  try {
    (void)parse_page_file(file, "page.spq");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(PageFile, RoundTripsAndReadsVersionOneWhereTheFormatIsUnchanged) {
  const std::vector<std::byte> page(8, std::byte{7});
  const auto file = make_page_file(
      header(kernels::CodecId::int8, kernels::Arch::gdn, kernels::StepQuantVariant::full), page);
  EXPECT_EQ(parse_page_file(file, "page.spq").codec, kernels::CodecId::int8);
  EXPECT_EQ(error_of(as_version(file, 1)), "");
  EXPECT_NE(error_of(as_version(file, 3)).find("page file version 3 is not supported"),
            std::string::npos);
  // KDA and the temporal_only / spatial_only variants never had the old 2-bit GDN format.
  for (const auto& h :
       {header(kernels::CodecId::stepquant4, kernels::Arch::kda, kernels::StepQuantVariant::full),
        header(kernels::CodecId::stepquant4, kernels::Arch::gdn,
               kernels::StepQuantVariant::temporal_only),
        header(kernels::CodecId::stepquant6, kernels::Arch::gdn,
               kernels::StepQuantVariant::full)}) {
    EXPECT_EQ(error_of(as_version(make_page_file(h, page), 1)), "");
  }
}

TEST(PageFile, VersionOneStepQuant4GdnPagesAreRefusedWithTheReason) {
  const std::vector<std::byte> page(8, std::byte{7});
  const auto file = make_page_file(
      header(kernels::CodecId::stepquant4, kernels::Arch::gdn, kernels::StepQuantVariant::full),
      page);
  EXPECT_EQ(error_of(file), "");
  const std::string e = error_of(as_version(file, 1));
  EXPECT_NE(e.find("page.spq: a version 1 stepquant4 GDN page"), std::string::npos) << e;
  EXPECT_NE(e.find("encode the state again"), std::string::npos) << e;
}

}  // namespace
}  // namespace statepool::calibration
