// STEPQuant calibration plans (stepquant/plan.hpp, docs/plans.md): accessors, validation
// messages, the plan file (round trip, truncation, identifier and version corruption,
// garbage, random byte corruption), the digest (stable, sensitive to what makes pages,
// blind to provenance), and load/save (atomic replace, errors naming the path).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/plans.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::kernels::stepquant {
namespace {

// GDN: 2 layers x 3 heads x 4 x 5, budget 6, heads 4, 6, 8, pivot, 6, 6; 24 key rows.
Plan gdn_sample() {
  const std::uint8_t w[] = {4, 6, 8, kPivotWidth, 6, 6};
  Plan plan = testing::make_plan(
      Arch::gdn, 2, 3, 4, 5, 6, [&](std::size_t u) { return w[u]; },
      [](std::size_t i) { return 0.5f + 0.125f * static_cast<float>(i); });
  plan.mean_log_decay = {-0.01f, -0.2f, -0.001f, -0.5f, -0.05f, -0.3f};
  plan.gamma = 0.25f;
  plan.horizon = 2048;
  plan.tokens = 65536;
  plan.source = "unit-test model / trace v1";
  return plan;
}

// KDA: 1 layer x 2 heads x 3 rows x 4, budget 4; units are rows.
Plan kda_sample() {
  const std::uint8_t w[] = {2, 4, kPivotWidth, 8, 6, 2};
  return testing::make_plan(
      Arch::kda, 1, 2, 3, 4, 4, [&](std::size_t u) { return w[u]; },
      [](std::size_t i) { return 2.0f - 0.25f * static_cast<float>(i); });
}

std::vector<std::byte> mutated(std::vector<std::byte> bytes, std::size_t at, std::uint32_t value) {
  bytes[at] = static_cast<std::byte>(value & 0xFFu);
  return bytes;
}

std::string message_of(const std::vector<std::byte>& bytes) {
  try {
    (void)from_bytes(bytes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

// Byte offset of the format_version field (the schema's first field) in a plan file:
// root uoffset -> table; table's soffset -> vtable; vtable entry 0 (after the two u16
// sizes) -> field offset inside the table.
// Offset of field `index` of the root table (0 = format_version), from its vtable.
std::size_t field_offset(const std::vector<std::byte>& b, std::size_t index) {
  const auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  const std::size_t table = u32(0);
  const auto soffset = static_cast<std::int32_t>(u32(table));
  const std::size_t vtable = static_cast<std::size_t>(static_cast<std::int64_t>(table) - soffset);
  std::uint16_t field = 0;
  std::memcpy(&field, b.data() + vtable + 4 + 2 * index, 2);
  EXPECT_NE(field, 0u) << "field " << index << " is written";
  return table + field;
}

std::size_t version_offset(const std::vector<std::byte>& b) {
  return field_offset(b, 0);
}

constexpr std::size_t kPageFormatField = 14;  // plan.fbs: the 15th field

TEST(StepQuantPlan, CandidateWidths) {
  EXPECT_EQ(std::vector<std::uint8_t>(candidate_widths(6).begin(), candidate_widths(6).end()),
            (std::vector<std::uint8_t>{4, 6, 8}));
  EXPECT_EQ(std::vector<std::uint8_t>(candidate_widths(4).begin(), candidate_widths(4).end()),
            (std::vector<std::uint8_t>{2, 4, 6, 8}));
  EXPECT_TRUE(candidate_widths(5).empty());
  EXPECT_TRUE(candidate_widths(8).empty());
}

TEST(StepQuantPlan, DefaultPivotsArePaperSharesScaledByUnits) {
  EXPECT_EQ(default_pivot_count(Arch::gdn, 48 * 48), 32u);         // 1.39% (the paper's share)
  EXPECT_EQ(default_pivot_count(Arch::gdn, 36 * 32), 16u);         // Qwen3-Next
  EXPECT_EQ(default_pivot_count(Arch::kda, 20 * 32 * 128), 512u);  // Kimi-Linear
  EXPECT_EQ(default_pivot_count(Arch::kda, 2 * 4 * 64), 3u);
  EXPECT_EQ(default_pivot_count(Arch::gdn, 8), 0u);
  EXPECT_EQ(default_pivot_count(Arch::gdn, 0), 0u);
}

TEST(StepQuantPlan, NominalPlanIsTheBudgetWithDefaultPivots) {
  StateLayout kimi;  // Kimi-Linear's shape; the codec is ignored
  kimi.arch = Arch::kda;
  kimi.num_layers = 20;
  kimi.num_heads = 32;
  kimi.key_dim = kimi.value_dim = 128;
  const Plan plan = nominal_plan(kimi, 4);
  EXPECT_EQ(validate(plan), "");
  EXPECT_EQ(plan.units(), 20u * 32 * 128);
  EXPECT_EQ(plan.pivots(), 512u);
  EXPECT_EQ(plan.width(0, 0, 0), kPivotWidth);                                 // first units
  EXPECT_EQ(plan.width(19, 31, 127), 4);
  EXPECT_EQ(std::count(plan.widths.begin(), plan.widths.end(), 4), 20 * 32 * 128 - 512);
  EXPECT_TRUE(std::all_of(plan.impact.begin(), plan.impact.end(), [](float w) { return w == 1.0f; }));
  EXPECT_THROW((void)nominal_plan(kimi, 5), std::invalid_argument);
}

TEST(StepQuantPlan, Accessors) {
  const Plan g = gdn_sample();
  EXPECT_EQ(validate(g), "");
  EXPECT_EQ(g.units(), 6u);
  EXPECT_EQ(g.pivots(), 1u);
  EXPECT_EQ(g.width(0, 2), 8);
  EXPECT_EQ(g.width(1, 0), kPivotWidth);
  EXPECT_EQ(g.width(1, 0, 3), kPivotWidth);  // the row is ignored for GDN
  EXPECT_DOUBLE_EQ(g.average_width(), (4 + 6 + 8 + 16 + 6 + 6) / 6.0);
  const auto impact = g.head_impact(1, 1);  // head 4: rows 16..19
  ASSERT_EQ(impact.size(), 4u);
  EXPECT_EQ(impact[0], 0.5f + 0.125f * 16);
  EXPECT_EQ(impact[3], 0.5f + 0.125f * 19);

  const Plan k = kda_sample();
  EXPECT_EQ(validate(k), "");
  EXPECT_EQ(k.units(), 6u);  // 1 x 2 x 3 rows
  EXPECT_EQ(k.width(0, 0, 2), kPivotWidth);
  EXPECT_EQ(k.width(0, 1, 0), 8);
  EXPECT_EQ(k.width(0, 1, 2), 2);
  EXPECT_EQ(k.pivots(), 1u);
  // stored widths per variant
  EXPECT_EQ(stored_width(k, StepQuantVariant::full, 0, 1, 2), 2);
  EXPECT_EQ(stored_width(k, StepQuantVariant::spatial_only, 0, 1, 2), 4);
  EXPECT_EQ(stored_width(k, StepQuantVariant::spatial_only, 0, 0, 2), kPivotWidth);
  EXPECT_EQ(stored_width(k, StepQuantVariant::temporal_only, 0, 1, 2), 2);
}

TEST(StepQuantPlan, ValidateNamesTheFieldAndIndex) {
  struct Bad {
    const char* what;
    Plan (*make)();
    void (*mutate)(Plan&);
    const char* message;
  };
  const Bad cases[] = {
      {"arch", gdn_sample, [](Plan& p) { p.arch = static_cast<Arch>(7); },
       "arch must be gdn or kda, got 7"},
      {"layers", gdn_sample, [](Plan& p) { p.num_layers = 0; },
       "num_layers must be between 1 and 1024, got 0"},
      {"heads", gdn_sample, [](Plan& p) { p.num_heads = 2000; },
       "num_heads must be between 1 and 1024, got 2000"},
      {"key_dim", gdn_sample, [](Plan& p) { p.key_dim = 5000; },
       "key_dim must be between 1 and 4096, got 5000"},
      {"value_dim", gdn_sample, [](Plan& p) { p.value_dim = 0; },
       "value_dim must be between 1 and 4096, got 0"},
      {"budget", gdn_sample, [](Plan& p) { p.budget_bits = 5; },
       "budget_bits must be 4 or 6, got 5"},
      {"budget 8", gdn_sample, [](Plan& p) { p.budget_bits = 8; },
       "budget_bits must be 4 or 6, got 8"},
      {"widths short", gdn_sample, [](Plan& p) { p.widths.pop_back(); },
       "widths has 5 entries, expected 6 (one per unit: heads)"},
      {"widths long kda", kda_sample, [](Plan& p) { p.widths.push_back(4); },
       "widths has 7 entries, expected 6 (one per unit: key rows)"},
      {"2 bits on budget 6", gdn_sample, [](Plan& p) { p.widths[1] = 2; },
       "widths[1] is 2; budget 6 allows 4, 6, 8 or 16 (pivot)"},
      {"width 5", kda_sample, [](Plan& p) { p.widths[4] = 5; },
       "widths[4] is 5; budget 4 allows 2, 4, 6, 8 or 16 (pivot)"},
      {"width 0", kda_sample, [](Plan& p) { p.widths[0] = 0; },
       "widths[0] is 0; budget 4 allows 2, 4, 6, 8 or 16 (pivot)"},
      {"width 32", gdn_sample, [](Plan& p) { p.widths[5] = 32; },
       "widths[5] is 32; budget 6 allows 4, 6, 8 or 16 (pivot)"},
      {"impact short", gdn_sample, [](Plan& p) { p.impact.pop_back(); },
       "impact has 23 entries, expected 24 (one per key row)"},
      {"impact negative", gdn_sample, [](Plan& p) { p.impact[13] = -0.5f; },
       "impact[13] is -0.5; impact factors must be finite and > 0"},
      {"impact zero", gdn_sample, [](Plan& p) { p.impact[0] = 0.0f; },
       "impact[0] is 0; impact factors must be finite and > 0"},
      {"impact nan", kda_sample,
       [](Plan& p) { p.impact[5] = std::numeric_limits<float>::quiet_NaN(); },
       "impact[5] is nan; impact factors must be finite and > 0"},
      {"impact inf", kda_sample,
       [](Plan& p) { p.impact[2] = std::numeric_limits<float>::infinity(); },
       "impact[2] is inf; impact factors must be finite and > 0"},
      {"decay size", gdn_sample, [](Plan& p) { p.mean_log_decay.push_back(0.0f); },
       "mean_log_decay has 7 entries, expected 0 or 6 (one per unit)"},
      {"decay nan", gdn_sample,
       [](Plan& p) { p.mean_log_decay[2] = std::numeric_limits<float>::quiet_NaN(); },
       "mean_log_decay[2] is nan; it must be finite"},
      {"gamma", gdn_sample, [](Plan& p) { p.gamma = std::numeric_limits<float>::infinity(); },
       "gamma is inf; it must be finite"},
  };
  for (const auto& c : cases) {
    Plan plan = c.make();
    c.mutate(plan);
    EXPECT_EQ(validate(plan), c.message) << c.what;
    // Nothing invalid is ever written.
    try {
      (void)to_bytes(plan);
      ADD_FAILURE() << "to_bytes accepted " << c.what;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("cannot serialize an invalid plan: ") + c.message);
    }
  }
  // A 4-bit budget allows 2-bit units; zero pivots and an empty decay are fine.
  Plan ok = kda_sample();
  ok.widths.assign(ok.widths.size(), 2);
  ok.mean_log_decay.clear();
  EXPECT_EQ(validate(ok), "");
}

TEST(StepQuantPlan, FileRoundTrip) {
  for (const Plan& plan : {gdn_sample(), kda_sample()}) {
    const auto bytes = to_bytes(plan);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()) + 4, 4), "SPQP");
    const Plan back = from_bytes(bytes);
    EXPECT_TRUE(back == plan);
    EXPECT_EQ(digest(back), digest(plan));
    // Deterministic bytes.
    EXPECT_EQ(to_bytes(back), bytes);
  }
  // Defaults survive: gamma and horizon at their schema defaults, empty source.
  Plan plain = kda_sample();
  plain.source.clear();
  EXPECT_TRUE(from_bytes(to_bytes(plain)) == plain);
}

// Plans carry the STEPQuant page format they were calibrated with: this build's by default;
// a file without the field (0, as a build before 2026-12-05 wrote it) reads as format 1
// and still loads; a later format is refused with what to do.
TEST(StepQuantPlan, CarriesThePageFormatItWasCalibratedWith) {
  EXPECT_EQ(Plan{}.page_format, kPageFormat);
  EXPECT_EQ(kPageFormat, 2u);
  const auto bytes = to_bytes(kda_sample());
  EXPECT_EQ(from_bytes(bytes).page_format, 2u);
  const std::size_t at = field_offset(bytes, kPageFormatField);
  EXPECT_EQ(std::to_integer<int>(bytes[at]), 2);
  const Plan old = from_bytes(mutated(bytes, at, 0));
  EXPECT_EQ(old.page_format, 1u);
  EXPECT_TRUE(same_codec_fields(old, kda_sample()));
  EXPECT_EQ(digest(old), digest(kda_sample()));  // provenance: the same pages
  EXPECT_EQ(message_of(mutated(bytes, at, 3)),
            "invalid STEPQuant plan: calibrated for STEPQuant page format 3, this build knows "
            "formats 1 to 2 (use a build of that format or newer, or calibrate again with this "
            "one)");
  Plan format1 = kda_sample();
  format1.page_format = 1;
  EXPECT_EQ(from_bytes(to_bytes(format1)).page_format, 1u);
  // statepoold warns about such a plan when it allocates 2-bit units, and only then.
  format1.budget_bits = 4;
  std::fill(format1.widths.begin(), format1.widths.end(), std::uint8_t{4});
  EXPECT_EQ(page_format_note(format1), "");
  format1.widths[1] = 2;
  EXPECT_EQ(page_format_note(format1),
            "calibrated with STEPQuant page format 1 (ternary 2-bit units); its pages are "
            "written in format 2. It works as it is; calibrating again (statepool-quant "
            "calibrate) sizes its 2-bit units by the current format's errors");
  format1.page_format = kPageFormat;
  EXPECT_EQ(page_format_note(format1), "");
}

TEST(StepQuantPlan, RejectsTruncation) {
  const auto bytes = to_bytes(gdn_sample());
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    const std::vector<std::byte> cut(bytes.begin(),
                                     bytes.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW((void)from_bytes(cut), std::invalid_argument) << "length " << len;
  }
  EXPECT_NE(message_of({}).find("too short"), std::string::npos);
}

TEST(StepQuantPlan, RejectsAWrongIdentifier) {
  const auto bytes = to_bytes(kda_sample());
  for (std::size_t at = 4; at < 8; ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      const auto bad = mutated(bytes, at, std::to_integer<std::uint32_t>(bytes[at]) ^ (1u << bit));
      const std::string m = message_of(bad);
      EXPECT_NE(m.find("not a STEPQuant plan: file identifier '"), std::string::npos) << m;
      EXPECT_NE(m.find("expected 'SPQP'"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(message_of(mutated(bytes, 7, 0x01)),
            "not a STEPQuant plan: file identifier 'SPQ\\x01', expected 'SPQP'");
}

TEST(StepQuantPlan, RejectsOtherFormatVersions) {
  const auto bytes = to_bytes(gdn_sample());
  const std::size_t at = version_offset(bytes);
  EXPECT_EQ(std::to_integer<int>(bytes[at]), 1);
  EXPECT_EQ(message_of(mutated(bytes, at, 7)),
            "unsupported plan format version 7 (this build reads 1)");
  for (std::size_t byte = 0; byte < 4; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      const auto bad =
          mutated(bytes, at + byte, std::to_integer<std::uint32_t>(bytes[at + byte]) ^ (1u << bit));
      std::uint32_t version = 0;
      std::memcpy(&version, bad.data() + at, 4);
      EXPECT_EQ(message_of(bad), "unsupported plan format version " + std::to_string(version) +
                                     " (this build reads 1)");
    }
  }
}

TEST(StepQuantPlan, RejectsGarbageAndSurvivesCorruption) {
  std::mt19937_64 rng(12345);
  // Random bytes, with and without the right identifier.
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::byte> junk(rng() % 300);
    for (auto& b : junk) {
      b = static_cast<std::byte>(rng());
    }
    if (round % 2 == 0 && junk.size() >= 8) {
      std::memcpy(junk.data() + 4, "SPQP", 4);
    }
    EXPECT_THROW((void)from_bytes(junk), std::invalid_argument);
  }
  // Every single-byte corruption of a valid file is either rejected with
  // std::invalid_argument or gives a plan that validates (never anything else).
  const auto bytes = to_bytes(gdn_sample());
  int accepted = 0;
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    for (const std::uint32_t mask : {0xFFu, 0x80u, 0x10u, 0x01u}) {
      const auto bad = mutated(bytes, at, std::to_integer<std::uint32_t>(bytes[at]) ^ mask);
      try {
        const Plan p = from_bytes(bad);
        EXPECT_EQ(validate(p), "");
        ++accepted;
      } catch (const std::invalid_argument&) {
      }
    }
  }
  RecordProperty("accepted_corruptions", accepted);  // e.g. a flipped impact or source byte
}

TEST(StepQuantPlan, DigestIsStableAndSensitiveToWhatMakesPages) {
  const Plan plan = gdn_sample();
  const std::string d = digest(plan);
  ASSERT_EQ(d.size(), 16u);
  for (const char c : d) {
    EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << d;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest_value(plan)));
  EXPECT_EQ(d, hex);
  // Pinned: the canonical encoding (docs/plans.md) must not change silently; daemons and
  // clients name plans by this string.
  EXPECT_EQ(d, "8335db9a09f8d95a");
  EXPECT_EQ(digest(kda_sample()), "8554d1867382c8ec");

  const auto differs = [&](void (*mutate)(Plan&)) {
    Plan p = gdn_sample();
    mutate(p);
    return digest(p) != d;
  };
  EXPECT_TRUE(differs([](Plan& p) { p.widths[0] = 6; }));
  EXPECT_TRUE(differs([](Plan& p) { p.widths[3] = 8; }));  // pivot -> 8 bits
  EXPECT_TRUE(differs([](Plan& p) { p.impact[7] = std::nextafter(p.impact[7], 100.0f); }));
  EXPECT_TRUE(differs([](Plan& p) { p.budget_bits = 4; }));
  EXPECT_TRUE(differs([](Plan& p) { p.arch = Arch::kda; }));
  EXPECT_TRUE(differs([](Plan& p) { std::swap(p.num_layers, p.num_heads); }));
  EXPECT_TRUE(differs([](Plan& p) { std::swap(p.key_dim, p.value_dim); }));
  // Provenance does not change a page byte, nor the digest.
  EXPECT_FALSE(differs([](Plan& p) { p.source = "another"; }));
  EXPECT_FALSE(differs([](Plan& p) { p.gamma = 0.5f; }));
  EXPECT_FALSE(differs([](Plan& p) { p.tokens = 1; }));
  EXPECT_FALSE(differs([](Plan& p) { p.horizon = 4096; }));
  EXPECT_FALSE(differs([](Plan& p) { p.mean_log_decay.clear(); }));
  EXPECT_TRUE(same_codec_fields(plan, gdn_sample()));
  Plan other = plan;
  other.source = "x";
  EXPECT_TRUE(same_codec_fields(plan, other));
  EXPECT_FALSE(plan == other);
}

class PlanFiles : public ::testing::Test {
 protected:
  // Names in the directory (an interrupted save would leave its temporary here).
  [[nodiscard]] std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      out.push_back(entry.path().filename().string());
    }
    return out;
  }
  testing::TempDir dir_;
};

TEST_F(PlanFiles, SaveAndLoad) {
  const std::string path = dir_.file("model.spqp");
  save(gdn_sample(), path);
  EXPECT_TRUE(load(path) == gdn_sample());
  // Replacing an existing file leaves exactly the new file, no temporaries.
  save(kda_sample(), path);
  EXPECT_TRUE(load(path) == kda_sample());
  EXPECT_EQ(entries(), std::vector<std::string>{"model.spqp"});
}

TEST_F(PlanFiles, ErrorsNameThePath) {
  const std::string missing = dir_.file("missing.spqp");
  try {
    (void)load(missing);
    ADD_FAILURE() << "loaded a missing file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string junk = dir_.file("junk.spqp");
  std::ofstream(junk) << "this is not a plan file at all";
  try {
    (void)load(junk);
    ADD_FAILURE() << "loaded garbage";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "plan file " + junk + ": not a STEPQuant plan: file identifier ' is ', expected 'SPQP'");
  }
  const std::string nowhere = dir_.file("no/such/dir/plan.spqp");
  try {
    save(gdn_sample(), nowhere);
    ADD_FAILURE() << "saved into a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(nowhere), std::string::npos) << e.what();
  }
  Plan bad = gdn_sample();
  bad.budget_bits = 3;
  const std::string invalid = dir_.file("invalid.spqp");
  try {
    save(bad, invalid);
    ADD_FAILURE() << "saved an invalid plan";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "plan file " + invalid +
                                         ": cannot serialize an invalid plan: budget_bits must "
                                         "be 4 or 6, got 3");
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"junk.spqp"});
}

}  // namespace
}  // namespace statepool::kernels::stepquant
