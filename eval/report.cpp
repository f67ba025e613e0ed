#include "statepool/eval/report.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace statepool::eval {

namespace {

std::string format(const char* fmt, auto... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, fmt, args...);
  return buffer;
}

/// Positions at which the table shows the state error (those within the run).
std::vector<std::size_t> error_columns(std::size_t tokens) {
  std::vector<std::size_t> out;
  for (std::size_t t : {1, 16, 256, 1024, 4096}) {
    if (t <= tokens) out.push_back(t);
  }
  if (out.empty() || out.back() != tokens) out.push_back(tokens);
  return out;
}

std::string divergence_text(const CodecResult& r, const FidelityOptions& o) {
  return r.divergence ? std::to_string(*r.divergence) : "none in " + std::to_string(o.generate);
}

/// Later is better; no divergence is best.
bool diverges_later_or_never(const CodecResult& a, const CodecResult& b) {
  if (!a.divergence) return true;
  return b.divergence && *a.divergence >= *b.divergence;
}

std::string summary(const CodecResult& r, const CodecResult& fp32) {
  return format("%s: mean state error %.4f, output TV %.5f, perplexity %+.3f%%, agreement %.2f%%",
                r.name.c_str(), r.mean_state_error(1, r.state_error.size()), r.output_error,
                100.0 * (r.perplexity() / fp32.perplexity() - 1.0), 100.0 * r.agreement);
}

}  // namespace

const CodecResult* Report::find(const std::string& name) const {
  for (const CodecResult& r : results) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

bool closer(const CodecResult& a, const CodecResult& b) {
  return a.mean_state_error(1, a.state_error.size()) <
             b.mean_state_error(1, b.state_error.size()) &&
         a.output_error < b.output_error;
}

double perplexity_gap(const CodecResult& r, const CodecResult& fp32) {
  return std::fabs(r.perplexity() / fp32.perplexity() - 1.0);
}

std::vector<Claim> claims(const Report& report) {
  std::vector<Claim> out;
  const CodecResult* fp32 = report.find("fp32");
  if (fp32 == nullptr) return out;
  const auto pair = [&](const std::string& a, const std::string& b, const std::string& statement) {
    const CodecResult* ra = report.find(a);
    const CodecResult* rb = report.find(b);
    if (ra == nullptr || rb == nullptr) return;
    out.push_back({statement, format("(%zu vs %zu page bytes)", ra->page_bytes, rb->page_bytes),
                   closer(*ra, *rb), summary(*ra, *fp32) + "; " + summary(*rb, *fp32)});
  };
  const auto within = [&](const std::string& a, double percent, const std::string& statement) {
    const CodecResult* r = report.find(a);
    if (r == nullptr) return;
    out.push_back(
        {statement, "", perplexity_gap(*r, *fp32) <= percent / 100.0, summary(*r, *fp32)});
  };
  pair("stepquant6", "int6", "stepquant6 is closer to FP32 than int6");
  pair("stepquant4", "int4", "stepquant4 is closer to FP32 than int4");
  pair("stepquant6", "dsq6", "stepquant6 is closer to FP32 than dsq6 (dual scales without a plan)");
  pair("stepquant4", "dsq4", "stepquant4 is closer to FP32 than dsq4");
  within("stepquant6", 1.0, "stepquant6 is within 1% of FP32 perplexity");
  within("stepquant4", 2.0, "stepquant4 is within 2% of FP32 perplexity");
  // Format v2's fidelity goals (docs/codecs.md).
  if (const CodecResult* r = report.find("stepquant6")) {
    out.push_back({"stepquant6 is within +0.05% of FP32 perplexity", "",
                   r->perplexity() / fp32->perplexity() - 1.0 <= 0.0005, summary(*r, *fp32)});
  }
  if (const CodecResult* a = report.find("stepquant4"), *b = report.find("int4"),
      *c = report.find("dsq4");
      a && b && c) {
    const auto at_or_below = [&](const CodecResult& other) {
      return a->perplexity() <= other.perplexity() && a->agreement >= other.agreement &&
             a->output_error <= other.output_error;
    };
    out.push_back(
        {"stepquant4 is at or below int4 and dsq4 on perplexity, agreement and output TV",
         format("(%zu vs %zu and %zu page bytes)", a->page_bytes, b->page_bytes, c->page_bytes),
         at_or_below(*b) && at_or_below(*c),
         summary(*a, *fp32) + "; " + summary(*b, *fp32) + "; " + summary(*c, *fp32)});
  }
  if (const CodecResult* a = report.find("stepquant4"), *b = report.find("int6"); a && b) {
    const bool holds = closer(*a, *b) && perplexity_gap(*a, *fp32) <= perplexity_gap(*b, *fp32) &&
                       a->agreement >= b->agreement && diverges_later_or_never(*a, *b);
    out.push_back({"stepquant4 is closer to FP32 than int6 on every measure",
                   format("(%zu vs %zu page bytes)", a->page_bytes, b->page_bytes), holds,
                   summary(*a, *fp32) + ", divergence " + divergence_text(*a, report.options) +
                       "; " + summary(*b, *fp32) + ", divergence " +
                       divergence_text(*b, report.options)});
  }
  for (const char* bits : {"6", "4"}) {
    const std::string base = std::string("stepquant") + bits;
    pair(base, base + "-spatial", base + ": both axes beat the spatial axis alone");
    pair(base, base + "-temporal", base + ": both axes beat the temporal axis alone");
    pair(base, base + "-nopivots", base + ": fp16 pivots help");
    pair(base, base + "-norefit", base + ": the refit of the column scales helps");
  }
  return out;
}

std::string results_table(const Report& report) {
  const CodecResult* fp32 = report.find("fp32");
  const std::vector<std::size_t> columns = error_columns(report.options.tokens);
  std::ostringstream os;
  os << format("%-20s %10s %6s %11s %9s %8s %9s", "codec", "page B", "bits", "perplexity",
               "vs fp32", "agree", "out TV");
  for (std::size_t t : columns) os << format(" %9s", ("err@" + std::to_string(t)).c_str());
  os << format(" %10s\n", "diverge");
  for (const CodecResult& r : report.results) {
    const double gap = fp32 ? 100.0 * (r.perplexity() / fp32->perplexity() - 1.0) : 0.0;
    os << format("%-20s %10zu %6.2f %11.4f %+8.3f%% %7.2f%% %9.5f", r.name.c_str(), r.page_bytes,
                 r.bits_per_value, r.perplexity(), gap, 100.0 * r.agreement, r.output_error);
    for (std::size_t t : columns) os << format(" %9.5f", r.state_error[t - 1]);
    os << format(" %10s", divergence_text(r, report.options).c_str());
    if (r.rejected_heads != 0) os << "  (" << r.rejected_heads << " heads not finite)";
    os << "\n";
  }
  return os.str();
}

std::string markdown(const Report& report) {
  const CodecResult* fp32 = report.find("fp32");
  const std::vector<std::size_t> columns = error_columns(report.options.tokens);
  const ModelConfig& c = report.model->config();
  std::ostringstream os;
  os << "## " << report.title << "\n\n";
  os << format(
      "%s, %u layers x %u heads, K = %u, V = %u, d_model %u; %llu teacher-forced "
      "bytes, greedy generation of %u bytes after a %u-byte prompt.\n\n",
      c.arch == kernels::Arch::gdn ? "GDN (one gate per head)" : "KDA (one gate per key channel)",
      c.layers, c.heads, c.key_dim, c.value_dim, c.d_model,
      static_cast<unsigned long long>(report.options.tokens), report.options.generate,
      report.options.prompt);
  os << "| codec | page bytes | bits/value | perplexity | vs FP32 | next-byte agreement | "
        "output TV |";
  for (std::size_t t : columns) os << " state error t=" << t << " |";
  os << " mean state error | greedy divergence |\n|---|--:|--:|--:|--:|--:|--:|";
  for (std::size_t i = 0; i < columns.size(); ++i) os << "--:|";
  os << "--:|--:|\n";
  for (const CodecResult& r : report.results) {
    const double gap = fp32 ? 100.0 * (r.perplexity() / fp32->perplexity() - 1.0) : 0.0;
    os << format("| %s | %zu | %.2f | %.4f | %+.3f%% | %.2f%% | %.5f |", r.name.c_str(),
                 r.page_bytes, r.bits_per_value, r.perplexity(), gap, 100.0 * r.agreement,
                 r.output_error);
    for (std::size_t t : columns) os << format(" %.5f |", r.state_error[t - 1]);
    os << format(" %.5f | %s |", r.mean_state_error(1, r.state_error.size()),
                 divergence_text(r, report.options).c_str());
    if (r.rejected_heads != 0) os << " " << r.rejected_heads << " heads not finite";
    os << "\n";
  }
  const std::vector<Claim> list = claims(report);
  if (!list.empty()) {
    os << "\nClaims on this model (closer = lower mean state error and lower output TV):\n\n";
    for (const Claim& claim : list) {
      os << "- **" << (claim.holds ? "holds" : "does not hold") << "**: " << claim.statement
         << (claim.bytes.empty() ? "" : " ") << claim.bytes << ". " << claim.numbers << ".\n";
    }
  }
  os << "\n";
  return os.str();
}

std::string claims_tsv(const Report& report) {
  std::ostringstream os;
  for (const Claim& claim : claims(report)) {
    os << (claim.holds ? "holds" : "does not hold") << "\t" << claim.statement << "\n";
  }
  return os.str();
}

std::string state_error_csv(const Report& report) {
  std::ostringstream os;
  os << "t";
  for (const CodecResult& r : report.results) os << "," << r.name;
  os << "\n";
  for (std::size_t t = 1; t <= report.options.tokens; ++t) {
    os << t;
    for (const CodecResult& r : report.results) os << format(",%.6g", r.state_error[t - 1]);
    os << "\n";
  }
  return os.str();
}

}  // namespace statepool::eval
