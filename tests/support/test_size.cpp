// support::parse_size and support::format_bytes: the one unit convention of statepool
// (support/include/statepool/support/size.hpp, docs/operations.md "Sizes").

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "statepool/support/size.hpp"

namespace statepool::support {
namespace {

constexpr std::uint64_t kKi = 1024;
constexpr std::uint64_t kMax = 18'446'744'073'709'551'615ull;

// The message of the std::invalid_argument that parse_size(text) throws ("" if none).
std::string refusal(const std::string& text) {
  try {
    (void)parse_size(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ParseSize, PlainNumbersAreBytes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("0004096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size("4096 b"), 4096u);
  EXPECT_EQ(parse_size("18446744073709551615"), kMax);
}

TEST(ParseSize, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(parse_size("1KiB"), kKi);
  EXPECT_EQ(parse_size("1MiB"), kKi * kKi);
  EXPECT_EQ(parse_size("1GiB"), kKi * kKi * kKi);
  EXPECT_EQ(parse_size("1TiB"), kKi * kKi * kKi * kKi);
  EXPECT_EQ(parse_size("1PiB"), kKi * kKi * kKi * kKi * kKi);  // refused by the old config
  EXPECT_EQ(parse_size("141GiB"), 141ull << 30);
  EXPECT_EQ(parse_size("16383PiB"), 16383ull << 50);
}

TEST(ParseSize, SingleLettersAreBinaryToo) {
  // The daemon's flags always read "1G" as 1 GiB; that stays.
  EXPECT_EQ(parse_size("1K"), kKi);
  EXPECT_EQ(parse_size("1M"), 1ull << 20);
  EXPECT_EQ(parse_size("1G"), 1ull << 30);
  EXPECT_EQ(parse_size("1T"), 1ull << 40);
  EXPECT_EQ(parse_size("1P"), 1ull << 50);
}

TEST(ParseSize, DecimalUnitsArePowersOf1000) {
  // The change: the config used to read "GB" as 2^30; now GB is 10^9 everywhere.
  EXPECT_EQ(parse_size("1kB"), 1'000u);
  EXPECT_EQ(parse_size("1MB"), 1'000'000u);
  EXPECT_EQ(parse_size("1GB"), 1'000'000'000u);
  EXPECT_EQ(parse_size("1TB"), 1'000'000'000'000u);
  EXPECT_EQ(parse_size("1PB"), 1'000'000'000'000'000u);
  EXPECT_EQ(parse_size("80GB"), 80'000'000'000u);
  EXPECT_NE(parse_size("1GB"), parse_size("1GiB"));
}

TEST(ParseSize, UnitsIgnoreCaseButTheIDecides) {
  for (const char* text : {"1gib", "1GIB", "1GiB", "1gIb", "1g", "1G"})
    EXPECT_EQ(parse_size(text), 1ull << 30) << text;
  for (const char* text : {"1gb", "1GB", "1Gb", "1gB"})
    EXPECT_EQ(parse_size(text), 1'000'000'000u) << text;
  EXPECT_EQ(parse_size("2KB"), 2'000u);
  EXPECT_EQ(parse_size("2kb"), 2'000u);
  EXPECT_EQ(parse_size("2KIB"), 2'048u);
}

TEST(ParseSize, SpacesAroundAndBeforeTheUnit) {
  EXPECT_EQ(parse_size("1.5 KiB"), 1536u);
  EXPECT_EQ(parse_size("  8GiB  "), 8ull << 30);
  EXPECT_EQ(parse_size("\t64 \t MiB\t"), 64ull << 20);
  EXPECT_EQ(parse_size(" 12 "), 12u);
  EXPECT_NE(refusal("1 G iB"), "");  // not inside the unit
  EXPECT_NE(refusal("1 2"), "");     // nor inside the number
}

TEST(ParseSize, FractionsAreExactAndRoundDown) {
  EXPECT_EQ(parse_size("1.5GiB"), 1'610'612'736u);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size(".5KiB"), 512u);
  EXPECT_EQ(parse_size("2.KiB"), 2048u);
  EXPECT_EQ(parse_size("1.1GB"), 1'100'000'000u);  // exact: no floating point
  EXPECT_EQ(parse_size("0.29GB"), 290'000'000u);
  EXPECT_EQ(parse_size("1.000000001GB"), 1'000'000'001u);
  // Not a whole number of bytes: rounded down.
  EXPECT_EQ(parse_size("1.5"), 1u);
  EXPECT_EQ(parse_size("0.9B"), 0u);
  EXPECT_EQ(parse_size("0.3KiB"), 307u);     // 307.2
  EXPECT_EQ(parse_size("0.999KiB"), 1022u);  // 1022.976
  // Digits past what a byte can show change nothing, however many there are...
  EXPECT_EQ(parse_size("1.00000000000000000000000000000000000001KiB"), 1024u);
  EXPECT_EQ(parse_size("0.99999999999999999999999999999999999999KiB"), 1023u);
  // ...but are still counted exactly: 2^-50 PiB is 1 byte, one digit less is not.
  EXPECT_EQ(parse_size("0.00000000000000088817841970012523233890533447265625PiB"), 1u);
  EXPECT_EQ(parse_size("0.00000000000000088817841970012523233890533447265624PiB"), 0u);
  EXPECT_EQ(parse_size("16383.999999999999999999PiB"), kMax);  // 2^64 - 1
}

TEST(ParseSize, TooLargeIsRefused) {
  EXPECT_NE(refusal("18446744073709551616").find("too large"), std::string::npos);
  EXPECT_NE(refusal("16384PiB").find("too large"), std::string::npos);
  EXPECT_NE(refusal("18446744073709551615.5KiB").find("too large"), std::string::npos);
  EXPECT_NE(refusal("99999999999999999999999999").find("too large"), std::string::npos);
  EXPECT_NE(refusal("18446744073709551616PB").find("too large"), std::string::npos);
  EXPECT_NE(refusal("18446.744073709551616PB").find("too large"), std::string::npos);
  EXPECT_EQ(parse_size("18446.744073709551615PB"), kMax);
}

TEST(ParseSize, BadTextIsRefusedWithTheTextAndTheUnits) {
  const std::string units =
      "B; KiB MiB GiB TiB PiB or K M G T P (powers of 1024); kB MB GB TB PB (powers of 1000)";
  EXPECT_EQ(size_units_text(), units);
  const auto says = [&](const std::string& text, const std::string& first) {
    const std::string message = refusal(text);
    EXPECT_EQ(message.rfind(first, 0), 0u) << text << ": " << message;
    EXPECT_NE(message.find(units), std::string::npos) << text << ": " << message;
  };
  says("", "empty size ''");
  says("   ", "empty size '   '");
  says("-1GiB", "negative size '-1GiB'");
  says(" -0", "negative size ' -0'");
  says("lots", "not a size: 'lots'");
  says("GiB", "not a size: 'GiB'");
  says(".", "not a size: '.'");
  says("+1", "not a size: '+1'");
  says("1.2.3", "not a size: '1.2.3'");
  says("12 34", "not a size: '12 34'");
  says("12XB", "unknown size unit 'XB' in '12XB'");
  says("80 XB", "unknown size unit 'XB' in '80 XB'");
  says("1e9", "unknown size unit 'e9' in '1e9'");
  says("1EiB", "unknown size unit 'EiB' in '1EiB'");
  says("1Ki", "unknown size unit 'Ki' in '1Ki'");
  says("1KiBs", "unknown size unit 'KiBs' in '1KiBs'");
  says("1,000", "unknown size unit ',000' in '1,000'");
  says("99999999999999999999XB", "unknown size unit 'XB'");  // the unit first
  says("16384PiB", "size '16384PiB' is too large: more than 18446744073709551615 bytes");
}

TEST(FormatBytes, BinaryUnitsOneDecimalBelowTen) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(4096), "4.0 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(10 * kKi), "10 KiB");
  EXPECT_EQ(format_bytes(512ull << 20), "512 MiB");
  EXPECT_EQ(format_bytes(1ull << 30), "1.0 GiB");
  EXPECT_EQ(format_bytes((1ull << 30) + (1ull << 30) / 5), "1.2 GiB");
  EXPECT_EQ(format_bytes(1ull << 50), "1.0 PiB");
  EXPECT_EQ(format_bytes(1ull << 60), "1.0 EiB");
  EXPECT_EQ(format_bytes(kMax), "16 EiB");
}

TEST(FormatBytes, RoundingNeverShowsTenPointZeroOr1024) {
  EXPECT_EQ(format_bytes(10 * kKi - 1), "10 KiB");    // 9.999 KiB
  EXPECT_EQ(format_bytes(kKi * kKi - 1), "1.0 MiB");  // 1023.999 KiB
  EXPECT_EQ(format_bytes(1023 * kKi), "1023 KiB");
  EXPECT_EQ(format_bytes((1ull << 30) - 1), "1.0 GiB");
}

TEST(FormatBytes, ParsesBackToAboutTheSameSize) {
  for (const std::uint64_t bytes : {1ull << 20, 3ull << 30, 5ull << 40, 7ull << 50}) {
    const std::string text = format_bytes(bytes);
    EXPECT_EQ(parse_size(text), bytes) << text;
  }
}

}  // namespace
}  // namespace statepool::support
