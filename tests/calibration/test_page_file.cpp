// Page files of statepool-quant codec encode (page_file.hpp): the header round-trips, and
// files of versions 1 and 2 are read except the stepquant4 pages whose 2-bit units had an
// older format.
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

TEST(PageFile, RoundTripsAndReadsOlderVersionsWhereTheFormatIsUnchanged) {
  const std::vector<std::byte> page(8, std::byte{7});
  const auto file = make_page_file(
      header(kernels::CodecId::int8, kernels::Arch::gdn, kernels::StepQuantVariant::full), page);
  EXPECT_EQ(parse_page_file(file, "page.spq").codec, kernels::CodecId::int8);
  EXPECT_EQ(error_of(as_version(file, 1)), "");
  EXPECT_EQ(error_of(as_version(file, 2)), "");
  EXPECT_NE(error_of(as_version(file, 4)).find("page file version 4 is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(as_version(file, 0)).find("page file version 0 is not supported"),
            std::string::npos);
  // Pages without 2-bit units are the same in every version: stepquant6 plans have none,
  // spatial_only stores every unit at the budget width.
  for (const auto& h :
       {header(kernels::CodecId::stepquant4, kernels::Arch::kda,
               kernels::StepQuantVariant::spatial_only),
        header(kernels::CodecId::stepquant6, kernels::Arch::gdn, kernels::StepQuantVariant::full),
        header(kernels::CodecId::stepquant6, kernels::Arch::kda,
               kernels::StepQuantVariant::temporal_only),
        header(kernels::CodecId::dsq4, kernels::Arch::kda, kernels::StepQuantVariant::full)}) {
    for (const std::uint32_t version : {1u, 2u}) {
      EXPECT_EQ(error_of(as_version(make_page_file(h, page), version)), "") << version;
    }
  }
}

TEST(PageFile, OlderStepQuant4PagesAreRefusedWithTheVersionAndWhatToDo) {
  const std::vector<std::byte> page(8, std::byte{7});
  for (const auto arch : {kernels::Arch::gdn, kernels::Arch::kda}) {
    for (const auto variant :
         {kernels::StepQuantVariant::full, kernels::StepQuantVariant::temporal_only,
          kernels::StepQuantVariant::no_refit}) {
      const auto file = make_page_file(header(kernels::CodecId::stepquant4, arch, variant), page);
      EXPECT_EQ(error_of(file), "");
      for (const std::uint32_t version : {1u, 2u}) {
        const std::string e = error_of(as_version(file, version));
        EXPECT_NE(e.find("page.spq: a version " + std::to_string(version) + " stepquant4 page"),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find(version == 1 ? "before 2026-12-01" : "before 2026-12-05"),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("encode the state again"), std::string::npos) << e;
      }
    }
  }
}

}  // namespace
}  // namespace statepool::calibration
