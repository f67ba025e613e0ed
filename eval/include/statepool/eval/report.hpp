#pragma once
// What statepool-eval prints and writes: the results table, the markdown section of
// eval/RESULTS.md (table and the method's claims checked against the numbers), and the
// state error over time as CSV (eval/plot.py draws it).
//
// "Closer to FP32" (closer()): a lower mean state error over all positions AND a lower
// output error (total variation between next-byte distributions). The claims also list
// perplexity gaps, agreement and the greedy divergence step.
//
// Thread-safety: pure functions.

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "statepool/eval/fidelity.hpp"

namespace statepool::eval {

struct Report {
  std::string title;
  std::shared_ptr<const Model> model;
  FidelityOptions options;
  std::vector<CodecResult> results;
  /// The result of case `name`, or null.
  [[nodiscard]] const CodecResult* find(const std::string& name) const;
};

/// One statement of the method, checked on one model.
struct Claim {
  std::string statement;
  std::string bytes;  ///< "(39936 vs 37632 page bytes)" where two codecs are compared
  bool holds = false;
  std::string numbers;  ///< the measurements it rests on
};

/// a is closer to FP32 than b (see above).
[[nodiscard]] bool closer(const CodecResult& a, const CodecResult& b);
/// |perplexity(r) / perplexity(fp32) - 1|.
[[nodiscard]] double perplexity_gap(const CodecResult& r, const CodecResult& fp32);

/// The claims that the cases present in `report` allow checking (fp32 must be present).
[[nodiscard]] std::vector<Claim> claims(const Report& report);

[[nodiscard]] std::string results_table(const Report& report);
[[nodiscard]] std::string markdown(const Report& report);
[[nodiscard]] std::string state_error_csv(const Report& report);
/// One line per claim: "holds<TAB>statement" or "does not hold<TAB>statement" (eval/run
/// tabulates the models side by side).
[[nodiscard]] std::string claims_tsv(const Report& report);

}  // namespace statepool::eval
