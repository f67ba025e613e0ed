#include "statepool/calibration/plan_builder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "parallel.hpp"
#include "statepool/calibration/statistics.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/kernels/page.hpp"
#include "statepool/kernels/stepquant/fit.hpp"

namespace statepool::calibration {
namespace sq = kernels::stepquant;

namespace {

std::vector<std::uint8_t> candidates(std::uint32_t budget_bits) {
  const std::span<const std::uint8_t> widths = sq::candidate_widths(budget_bits);
  if (widths.empty()) {
    throw std::invalid_argument("budget must be 6 or 4 bits, got " + std::to_string(budget_bits));
  }
  return {widths.begin(), widths.end()};
}

void check_options(const PlanOptions& options) {
  (void)candidates(options.budget_bits);
  if (!std::isfinite(options.gamma) || options.gamma < 0.0) {
    throw std::invalid_argument("gamma must be finite and >= 0");
  }
  if (options.horizon == 0) {
    throw std::invalid_argument("horizon must be positive");
  }
  if (!(options.min_gain >= 0.0 && options.min_gain < 1.0)) {
    throw std::invalid_argument("min_gain must be in [0, 1)");
  }
}

}  // namespace

const char* to_string(CostModel cost) noexcept {
  switch (cost) {
    case CostModel::relative: return "relative";
    case CostModel::absolute: return "absolute";
    case CostModel::output: return "output";
  }
  return "unknown";
}

bool parse_cost_model(std::string_view text, CostModel& out) noexcept {
  for (const CostModel cost : {CostModel::relative, CostModel::absolute, CostModel::output}) {
    if (text == to_string(cost)) {
      out = cost;
      return true;
    }
  }
  return false;
}

namespace {

float fp16_round(float x) {
  return kernels::half_bits_to_float(kernels::float_to_half_bits(x));
}

int histogram_slot(std::uint8_t width) {
  switch (width) {
    case 2: return 0;
    case 4: return 1;
    case 6: return 2;
    case 8: return 3;
    default: return 4;
  }
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string general(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", value);
  return buf;
}

std::string bytes_text(std::size_t bytes) {
  const std::string digits = std::to_string(bytes);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) {
      out.push_back(',');
    }
    out.push_back(digits[i]);
  }
  return out + " B";
}

}  // namespace

std::uint32_t PlanShape::units_per_head() const noexcept {
  return arch == kernels::Arch::gdn ? 1u : key_dim;
}

std::size_t PlanShape::units() const noexcept {
  return std::size_t{layers} * heads * units_per_head();
}

LayerCosts measure_layer(const LayerAccumulator& accumulator, const PlanOptions& options) {
  check_options(options);
  const kernels::Arch arch = accumulator.arch();
  const std::uint32_t K = accumulator.key_dim();
  const std::uint32_t V = accumulator.value_dim();
  const std::uint32_t H = accumulator.heads();
  const std::uint32_t per_head = accumulator.units_per_head();
  LayerCosts out;
  out.layer = accumulator.layer();
  out.widths = candidates(options.budget_bits);
  const std::size_t W = out.widths.size();
  out.tokens = accumulator.tokens(0);
  out.impact.assign(std::size_t{H} * K, 1.0f);
  out.mean_log_decay.assign(std::size_t{H} * per_head, 0.0);
  out.lifetime.assign(std::size_t{H} * per_head, 0.0);
  out.mse.assign(std::size_t{H} * per_head * W, 0.0);
  out.pivot_mse.assign(std::size_t{H} * per_head, 0.0);
  std::uint32_t min_snapshots = 0xFFFFFFFFu;
  for (std::uint32_t h = 0; h < H; ++h) {
    const std::size_t snapshots = accumulator.snapshots(h).size();
    if (snapshots == 0) {
      throw std::invalid_argument(
          "layer " + std::to_string(out.layer) + " head " + std::to_string(h) +
          " has no state snapshot: the trace needs at least as many tokens as the snapshot "
          "interval");
    }
    min_snapshots = std::min(min_snapshots, static_cast<std::uint32_t>(snapshots));
  }
  out.min_snapshots = min_snapshots;

  detail::HeadThreads(options.threads).for_each(H, [&](std::size_t h) {
    const auto head = static_cast<std::uint32_t>(h);
    const std::span<float> impact = std::span<float>(out.impact).subspan(h * K, K);
    const std::vector<double> omega = accumulator.omega(head);
    impact_factors(omega, options.gamma, impact);
    std::vector<double> weight2(K);
    for (std::uint32_t i = 0; i < K; ++i) {
      weight2[i] = static_cast<double>(impact[i]) * impact[i];
    }
    for (std::uint32_t u = 0; u < per_head; ++u) {
      const double g = accumulator.mean_log_decay(head, u);
      out.mean_log_decay[h * per_head + u] = g;
      out.lifetime[h * per_head + u] = lifetime_weight(g, options.horizon);
    }
    // The output cost: rows weighted by their readout weights W_i, relative to the
    // head's output energy (see the header comment).
    const bool output = options.cost == CostModel::output;
    std::vector<double> readout;
    double output_energy = 0.0;
    if (output) {
      readout = accumulator.readout_weight(head);
      output_energy = accumulator.output_energy(head);
      if (readout.size() != K) {
        throw std::invalid_argument("layer " + std::to_string(out.layer) + " head " +
                                    std::to_string(head) +
                                    ": the output cost needs readout probes (probe_every > 0)");
      }
    }
    // GDN row weights of the errors: w_i^2 (impact), or W_i under the output cost.
    std::vector<double> row_weight(K, 1.0);
    for (std::uint32_t i = 0; i < K; ++i) row_weight[i] = output ? readout[i] : weight2[i];

    const SnapshotReservoir& reservoir = accumulator.snapshots(head);
    const auto count = static_cast<double>(reservoir.size());
    std::vector<std::uint8_t> row_widths(K);
    std::vector<float> recon(std::size_t{K} * V);
    sq::HeadFit fit;
    for (std::size_t w = 0; w < W; ++w) {
      std::fill(row_widths.begin(), row_widths.end(), out.widths[w]);
      for (std::size_t s = 0; s < reservoir.size(); ++s) {
        const std::span<const float> x = reservoir.snapshot(s);
        sq::fit_head(arch, x, K, V, row_widths, impact, fit);
        sq::reconstruct(arch, fit, row_widths, recon);
        for (std::uint32_t i = 0; i < K; ++i) {
          double row_error = 0.0;
          for (std::uint32_t j = 0; j < V; ++j) {
            const double d =
                static_cast<double>(x[std::size_t{i} * V + j]) - recon[std::size_t{i} * V + j];
            row_error += d * d;
          }
          if (arch == kernels::Arch::gdn) {
            out.mse[h * W + w] += row_weight[i] * row_error / (static_cast<double>(K) * V) / count;
          } else {
            out.mse[(h * K + i) * W + w] += row_error / V / count;
          }
        }
      }
    }
    double energy = 0.0;  // E_h, weighted as the head's costs are
    for (std::size_t s = 0; s < reservoir.size(); ++s) {
      const std::span<const float> x = reservoir.snapshot(s);
      for (std::uint32_t i = 0; i < K; ++i) {
        double row_error = 0.0;
        double row_energy = 0.0;
        for (std::uint32_t j = 0; j < V; ++j) {
          const float value = x[std::size_t{i} * V + j];
          const double d = static_cast<double>(value) - fp16_round(value);
          row_error += d * d;
          row_energy += static_cast<double>(value) * value;
        }
        const double scale = arch == kernels::Arch::gdn ? weight2[i] : 1.0;
        energy += scale * row_energy / (static_cast<double>(K) * V) / count;
        if (arch == kernels::Arch::gdn) {
          out.pivot_mse[h] += row_weight[i] * row_error / (static_cast<double>(K) * V) / count;
        } else {
          out.pivot_mse[h * K + i] += row_error / V / count;
        }
      }
    }
    if (output) {
      // cost = mse x lifetime = (output error energy per token) / (output energy): GDN's
      // mse above is sum_i W_i e_i / (K V), KDA's row mse e_i / V (e_i: the row's summed
      // squared error).
      for (std::uint32_t u = 0; u < per_head; ++u) {
        const double scale = arch == kernels::Arch::gdn ? static_cast<double>(K) * V
                                                        : static_cast<double>(V) * readout[u];
        out.lifetime[h * per_head + u] = output_energy > 0.0 ? scale / output_energy : scale;
      }
    } else if (options.cost == CostModel::relative && energy > 0.0) {
      for (std::uint32_t u = 0; u < per_head; ++u) {
        for (std::size_t w = 0; w < W; ++w) out.mse[(h * per_head + u) * W + w] /= energy;
        out.pivot_mse[h * per_head + u] /= energy;
      }
    }
  });
  return out;
}

PlanResult build_plan(const PlanShape& shape, std::span<const LayerCosts> layers,
                      const PlanOptions& options, std::uint64_t tokens) {
  check_options(options);
  const std::vector<std::uint8_t> widths = candidates(options.budget_bits);
  const std::size_t W = widths.size();
  const std::uint32_t per_head = shape.units_per_head();
  const std::size_t per_layer = std::size_t{shape.heads} * per_head;
  const std::size_t n = shape.units();
  if (n == 0 || shape.key_dim == 0 || shape.value_dim == 0) {
    throw std::invalid_argument("build_plan: empty model shape");
  }
  if (layers.size() != shape.layers) {
    throw std::invalid_argument("build_plan: costs of " + std::to_string(layers.size()) +
                                " layers for a model of " + std::to_string(shape.layers));
  }
  CostTable table(widths, n);
  std::vector<double> pivot_cost(n);
  std::vector<double> decay(n);
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const LayerCosts& c = layers[l];
    if (c.layer != l || c.widths != widths || c.mse.size() != per_layer * W ||
        c.pivot_mse.size() != per_layer || c.lifetime.size() != per_layer ||
        c.mean_log_decay.size() != per_layer ||
        c.impact.size() != std::size_t{shape.heads} * shape.key_dim) {
      throw std::invalid_argument("build_plan: costs of layer " + std::to_string(l) +
                                  " do not match the model shape or the budget");
    }
    for (std::size_t u = 0; u < per_layer; ++u) {
      const std::size_t unit = l * per_layer + u;
      for (std::size_t w = 0; w < W; ++w) {
        table.at(unit, w) = c.mse[u * W + w] * c.lifetime[u];
      }
      pivot_cost[unit] = c.pivot_mse[u] * c.lifetime[u];
      decay[unit] = c.mean_log_decay[u];
    }
  }

  const std::uint32_t pivots =
      options.pivots.value_or(kernels::stepquant::default_pivot_count(shape.arch, n));
  if (pivots > n) {
    throw std::invalid_argument("build_plan: " + std::to_string(pivots) +
                                " pivots requested, the " + "model has " + std::to_string(n) +
                                " units");
  }
  const std::uint64_t nominal = std::uint64_t{options.budget_bits} * n;
  const std::uint64_t charge = 8ull * pivots;
  const std::uint64_t minimum = std::uint64_t{widths.front()} * (n - pivots);
  if (nominal < charge || nominal - charge < minimum) {
    throw std::invalid_argument("build_plan: " + std::to_string(pivots) +
                                " pivots leave too few bits for the other units (budget " +
                                std::to_string(nominal) + " bits, 8 per pivot, " +
                                std::to_string(minimum) + " needed at the smallest width)");
  }
  const bool gdn = shape.arch == kernels::Arch::gdn;

  // Pivots by risk.
  std::vector<double> risk(n, 0.0);
  if (pivots > 0) {
    if (gdn) {
      const std::vector<std::uint8_t> first = allocate_dp(table, nominal);
      for (std::size_t u = 0; u < n; ++u) {
        risk[u] = table.at(u, table.index_of(first[u]));
      }
    } else {
      const std::size_t w8 = table.index_of(8);
      for (std::size_t u = 0; u < n; ++u) {
        risk[u] = table.at(u, w8) - pivot_cost[u];
      }
    }
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return risk[a] > risk[b]; });
  // Pivots are an option, not an obligation: with p of them (the p riskiest units) the
  // others share nominal - 8 p bits, and a pivot that saves less than the bits it takes
  // from the rest would raise the expected cost. So every p in [0, pivots] is allocated
  // and the cheapest kept (ties: fewer pivots); adding pivots never raises the cost.
  const auto allocate_with = [&](std::uint32_t p, std::vector<bool>& is_pivot,
                                 std::vector<std::size_t>& rest) {
    is_pivot.assign(n, false);
    for (std::uint32_t i = 0; i < p; ++i) is_pivot[order[i]] = true;
    rest.clear();
    for (std::size_t u = 0; u < n; ++u) {
      if (!is_pivot[u]) rest.push_back(u);
    }
    const CostTable sub = table.subset(rest);
    const std::uint64_t bits = nominal - 8ull * p;
    std::vector<std::uint8_t> chosen =
        gdn ? allocate_dp(sub, bits) : allocate_lagrangian(sub, bits);
    double cost = 0.0;
    for (std::size_t u = 0; u < n; ++u) {
      if (is_pivot[u]) cost += pivot_cost[u];
    }
    for (std::size_t i = 0; i < rest.size(); ++i) {
      cost += table.at(rest[i], table.index_of(chosen[i]));
    }
    return std::pair{cost, std::move(chosen)};
  };
  std::vector<bool> is_pivot;
  std::vector<std::size_t> rest;
  std::uint32_t used = 0;
  auto [best_cost, chosen] = allocate_with(0, is_pivot, rest);
  // Every p up to kPivotSteps; beyond, kPivotSteps evenly spaced counts ending at P (a
  // Kimi-sized plan allows 512 pivot rows; 512 allocations of 81,920 rows would dominate
  // the calibration time).
  const std::uint32_t steps = std::min(pivots, kPivotSteps);
  for (std::uint32_t step = 1; step <= steps; ++step) {
    const auto p = static_cast<std::uint32_t>(std::uint64_t{pivots} * step / steps);
    auto [cost, widths_p] = allocate_with(p, is_pivot, rest);
    if (cost < best_cost) {
      best_cost = cost;
      chosen = std::move(widths_p);
      used = p;
    }
  }
  allocate_with(used, is_pivot, rest);
  const std::size_t nominal_index = table.index_of(static_cast<std::uint8_t>(options.budget_bits));
  double uniform_cost = 0.0;
  for (std::size_t u = 0; u < n; ++u) {
    uniform_cost += table.at(u, nominal_index);
  }
  const double allocation_cost = best_cost;
  const bool uniform_kept = best_cost > (1.0 - options.min_gain) * uniform_cost;
  if (uniform_kept) {
    used = 0;
    allocate_with(0, is_pivot, rest);
    chosen.assign(rest.size(), static_cast<std::uint8_t>(options.budget_bits));
  }

  PlanResult result;
  sq::Plan& plan = result.plan;
  plan.arch = shape.arch;
  plan.num_layers = shape.layers;
  plan.num_heads = shape.heads;
  plan.key_dim = shape.key_dim;
  plan.value_dim = shape.value_dim;
  plan.budget_bits = options.budget_bits;
  plan.widths.assign(n, sq::kPivotWidth);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    plan.widths[rest[i]] = chosen[i];
  }
  plan.impact.reserve(std::size_t{shape.layers} * shape.heads * shape.key_dim);
  for (const LayerCosts& c : layers) {
    plan.impact.insert(plan.impact.end(), c.impact.begin(), c.impact.end());
  }
  plan.mean_log_decay.assign(decay.begin(), decay.end());
  plan.gamma = static_cast<float>(options.gamma);
  plan.horizon = options.horizon;
  plan.tokens = tokens;
  plan.source = options.source;
  if (const std::string problem = sq::validate(plan); !problem.empty()) {
    throw std::logic_error("build_plan made an invalid plan: " + problem);
  }

  Report& report = result.report;
  report.shape = shape;
  report.budget_bits = options.budget_bits;
  report.cost = options.cost;
  report.units = n;
  report.tokens = tokens;
  report.average_width = plan.average_width();
  report.allocation_cost = allocation_cost;
  report.min_gain = options.min_gain;
  report.uniform_kept = uniform_kept;
  report.uniform_cost = uniform_cost;
  for (std::size_t u = 0; u < n; ++u) {
    report.expected_cost +=
        is_pivot[u] ? pivot_cost[u] : table.at(u, table.index_of(plan.widths[u]));
  }
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    Report::Layer layer;
    layer.layer = l;
    layer.min_log_decay = 0.0;
    layer.max_log_decay = -INFINITY;
    double sum = 0.0;
    for (std::size_t u = l * per_layer; u < (l + 1) * per_layer; ++u) {
      ++layer.histogram[static_cast<std::size_t>(histogram_slot(plan.widths[u]))];
      sum += plan.widths[u];
      layer.min_log_decay = std::min(layer.min_log_decay, decay[u]);
      layer.max_log_decay = std::max(layer.max_log_decay, decay[u]);
    }
    layer.average_width = sum / static_cast<double>(per_layer);
    report.layers.push_back(layer);
  }
  report.pivots_requested = pivots;
  for (std::uint32_t p = 0; p < used; ++p) {
    const std::size_t u = order[p];
    Report::Pivot pivot;
    pivot.layer = static_cast<std::uint32_t>(u / per_layer);
    pivot.head = static_cast<std::uint32_t>((u % per_layer) / per_head);
    pivot.row = static_cast<std::uint32_t>(u % per_head);
    pivot.mean_log_decay = decay[u];
    pivot.risk = risk[u];
    report.pivots.push_back(pivot);
  }
  std::vector<std::size_t> by_decay(n);
  std::iota(by_decay.begin(), by_decay.end(), std::size_t{0});
  std::stable_sort(by_decay.begin(), by_decay.end(),
                   [&](std::size_t a, std::size_t b) { return decay[a] > decay[b]; });
  const std::size_t bands = std::min<std::size_t>(4, n);
  for (std::size_t b = 0; b < bands; ++b) {
    const std::size_t lo = b * n / bands;
    const std::size_t hi = (b + 1) * n / bands;
    Report::DecayBand band;
    band.units = hi - lo;
    band.max_log_decay = decay[by_decay[lo]];
    band.min_log_decay = decay[by_decay[hi - 1]];
    double sum = 0.0;
    for (std::size_t i = lo; i < hi; ++i) {
      sum += plan.widths[by_decay[i]];
    }
    band.average_width = sum / static_cast<double>(band.units);
    report.bands.push_back(band);
  }
  measure_pages(plan, report);
  return result;
}

void measure_pages(const sq::Plan& plan, Report& report) {
  kernels::StateLayout layout;
  layout.name = "calibration";
  layout.arch = plan.arch;
  layout.num_layers = plan.num_layers;
  layout.num_heads = plan.num_heads;
  layout.key_dim = plan.key_dim;
  layout.value_dim = plan.value_dim;
  const std::size_t values =
      std::size_t{plan.num_layers} * plan.num_heads * plan.key_dim * plan.value_dim;
  report.fp32_bytes = values * 4;
  report.bf16_bytes = values * 2;
  try {
    kernels::StateLayout uniform = layout;
    uniform.codec.id = plan.budget_bits == 4 ? kernels::CodecId::int4 : kernels::CodecId::int6;
    report.uniform_int_page_bytes = kernels::PageCodec(uniform).page_bytes();
    layout.codec.id =
        plan.budget_bits == 4 ? kernels::CodecId::stepquant4 : kernels::CodecId::stepquant6;
    layout.plan = std::make_shared<const sq::Plan>(plan);
    report.page_bytes = kernels::PageCodec(layout).page_bytes();
  } catch (const std::exception& e) {
    report.page_bytes = 0;
    report.page_note = std::string("page size unavailable: ") + e.what();
  }
}

std::string format_report(const Report& r) {
  std::ostringstream out;
  const PlanShape& s = r.shape;
  out << "STEPQuant plan: " << kernels::to_string(s.arch) << ", " << s.layers << " layers x "
      << s.heads << " heads, K=" << s.key_dim << " V=" << s.value_dim << ", budget "
      << r.budget_bits << " bits, " << r.units
      << (s.arch == kernels::Arch::gdn ? " heads" : " rows") << " (units), " << r.tokens
      << " calibration tokens, " << to_string(r.cost) << " costs\n";
  out << "average width " << fixed(r.average_width, 3) << " bits per value (pivots counted at 16), "
      << r.pivots.size() << " pivot" << (r.pivots.size() == 1 ? "" : "s") << "\n";
  char line[200];
  std::snprintf(line, sizeof line, "units per width:%4s%6s%6s%6s%6s%7s   %s\n", "2", "4", "6", "8",
                "fp16", "avg", "mean log-decay range");
  out << line;
  for (const Report::Layer& l : r.layers) {
    const std::string name = "  layer " + std::to_string(l.layer);
    std::snprintf(line, sizeof line, "%-16s%4u%6u%6u%6u%6u%7.2f   [%s, %s]\n", name.c_str(),
                  l.histogram[0], l.histogram[1], l.histogram[2], l.histogram[3], l.histogram[4],
                  l.average_width, general(l.min_log_decay).c_str(),
                  general(l.max_log_decay).c_str());
    out << line;
  }
  out << "units by mean log-decay (slowest-decaying quarter first):\n";
  for (const Report::DecayBand& b : r.bands) {
    out << "  g in [" << general(b.min_log_decay) << ", " << general(b.max_log_decay)
        << "]: " << b.units << " units, average width " << fixed(b.average_width, 2) << "\n";
  }
  if (!r.pivots.empty()) {
    out << "pivots (fp16):";
    const std::size_t shown = std::min<std::size_t>(r.pivots.size(), 16);
    for (std::size_t i = 0; i < shown; ++i) {
      const Report::Pivot& p = r.pivots[i];
      out << (i == 0 ? " " : ", ") << "L" << p.layer << "/H" << p.head;
      if (s.arch == kernels::Arch::kda) {
        out << "/R" << p.row;
      }
      out << " (g " << general(p.mean_log_decay) << ")";
    }
    if (shown < r.pivots.size()) {
      out << ", ... " << (r.pivots.size() - shown) << " more";
    }
    out << "\n";
  }
  if (r.pivots.size() < r.pivots_requested && !r.uniform_kept) {
    out << "pivots: " << r.pivots.size() << " of the " << r.pivots_requested
        << " allowed (more would raise the expected error)\n";
  }
  if (r.uniform_cost > 0.0 && r.uniform_kept) {
    out << "uniform " << r.budget_bits << "-bit widths kept: the allocation's expected error "
        << "on the calibration snapshots (lifetime-weighted) was "
        << fixed(r.allocation_cost / r.uniform_cost, 3) << " x theirs, a gain under the "
        << fixed(100.0 * r.min_gain, 0) << "% asked for (--min-gain)\n";
  } else if (r.uniform_cost > 0.0) {
    out << "expected error on the calibration snapshots (lifetime-weighted): "
        << fixed(r.expected_cost / r.uniform_cost, 3) << " x that of uniform " << r.budget_bits
        << "-bit widths\n";
  }
  if (r.page_bytes > 0) {
    const double values = static_cast<double>(r.fp32_bytes) / 4.0;
    out << "page: " << bytes_text(r.page_bytes) << " per state (stepquant" << r.budget_bits << ", "
        << fixed(8.0 * static_cast<double>(r.page_bytes) / values, 3)
        << " bits/value with metadata), "
        << fixed(static_cast<double>(r.fp32_bytes) / static_cast<double>(r.page_bytes), 2)
        << "x smaller than FP32 (" << bytes_text(r.fp32_bytes) << "), "
        << fixed(static_cast<double>(r.bf16_bytes) / static_cast<double>(r.page_bytes), 2)
        << "x than BF16; int" << r.budget_bits << " page " << bytes_text(r.uniform_int_page_bytes)
        << "\n";
  } else if (!r.page_note.empty()) {
    out << r.page_note << "\n";
  }
  return out.str();
}

}  // namespace statepool::calibration
