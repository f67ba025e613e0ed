#pragma once
// What the benchmarks share: the one way they time a piece of work (one warm-up run for
// page faults and caches, then the median of `iters` timed runs, in seconds), the GDN
// layout they measure on, and the fused-step shapes. Their synthetic data come from
// statepool::testing (random.hpp, plans.hpp).
// Header-only, benchmarks only.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "statepool/kernels/fused_step.hpp"
#include "statepool/kernels/layout.hpp"
#include "statepool/kernels/stepquant/format.hpp"
#include "statepool/kernels/stepquant/plan.hpp"
#include "statepool/testing/plans.hpp"

namespace statepool::bench {

template <class Fn>
double median_seconds(std::uint32_t iters, Fn&& run) {
  run();
  std::vector<double> t;
  t.reserve(iters);
  for (std::uint32_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const auto stop = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

/// `layers` x `heads` GDN heads of 128 x 128 with a bf16 conv state of `conv_channels` x 3
/// (Qwen3-Next: 8192 channels; Qwen3.5-27B: 10240), under `codec`.
inline kernels::StateLayout gdn_layout(std::uint32_t layers, std::uint32_t heads,
                                       std::uint32_t conv_channels, kernels::CodecId codec) {
  kernels::StateLayout layout;
  layout.name = "bench";
  layout.num_layers = layers;
  layout.num_heads = heads;
  layout.key_dim = 128;
  layout.value_dim = 128;
  layout.conv_channels = conv_channels;
  layout.conv_width = 3;
  layout.conv_dtype = kernels::DType::bf16;
  layout.codec = {codec, 0};
  return layout;
}

/// The items of a comma-separated list ("1,32,128" -> "1", "32", "128").
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

/// A comma-separated list of batch sizes in [1, 65536]; std::invalid_argument naming
/// `option` otherwise.
inline std::vector<std::uint32_t> parse_batches(const std::string& text, const char* option) {
  std::vector<std::uint32_t> out;
  for (const std::string& item : split_list(text)) {
    std::size_t used = 0;
    unsigned long value = 0;
    try {
      value = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value == 0 || value > 65536) {
      throw std::invalid_argument(std::string(option) + ": '" + item +
                                  "' is not a batch size between 1 and 65536");
    }
    out.push_back(static_cast<std::uint32_t>(value));
  }
  if (out.empty()) throw std::invalid_argument(std::string(option) + ": no batch size given");
  return out;
}

/// A codec to measure: for stepquant4/6 also an ablation variant (docs/codecs.md).
struct CodecChoice {
  kernels::CodecId id = kernels::CodecId::fp32;
  kernels::StepQuantVariant variant = kernels::StepQuantVariant::full;
  /// "int6", "stepquant6", "stepquant6:spatial_only".
  [[nodiscard]] std::string name() const {
    std::string out = kernels::to_string(id);
    if (variant != kernels::StepQuantVariant::full) out += std::string(":") + to_string(variant);
    return out;
  }
};

/// A comma-separated list of codec names (kernels::parse_codec), a stepquant one
/// optionally with ":spatial_only", ":temporal_only", ":no_refit" or ":full";
/// std::invalid_argument
/// naming `option` otherwise.
inline std::vector<CodecChoice> parse_codec_choices(const std::string& text, const char* option) {
  std::vector<CodecChoice> out;
  for (const std::string& item : split_list(text)) {
    const std::size_t colon = item.find(':');
    CodecChoice c;
    if (!kernels::parse_codec(item.substr(0, colon), c.id)) {
      throw std::invalid_argument(std::string(option) + ": unknown codec '" + item + "'");
    }
    if (colon != std::string::npos) {
      const std::string variant = item.substr(colon + 1);
      bool known = false;
      for (const auto v :
           {kernels::StepQuantVariant::full, kernels::StepQuantVariant::spatial_only,
            kernels::StepQuantVariant::temporal_only, kernels::StepQuantVariant::no_refit}) {
        if (variant == to_string(v)) {
          c.variant = v;
          known = true;
        }
      }
      const bool stepquant =
          c.id == kernels::CodecId::stepquant4 || c.id == kernels::CodecId::stepquant6;
      if (!known || !stepquant) {
        throw std::invalid_argument(std::string(option) + ": '" + item +
                                    "': only stepquant4/6 take a variant, one of full, "
                                    "spatial_only, temporal_only, no_refit");
      }
    }
    out.push_back(c);
  }
  if (out.empty()) throw std::invalid_argument(std::string(option) + ": no codec given");
  return out;
}

/// The same without variants: the codec ids.
inline std::vector<kernels::CodecId> parse_codecs(const std::string& text, const char* option) {
  std::vector<kernels::CodecId> out;
  for (const CodecChoice& c : parse_codec_choices(text, option)) {
    if (c.variant != kernels::StepQuantVariant::full) {
      throw std::invalid_argument(std::string(option) + ": '" + c.name() +
                                  "': this benchmark measures the full codecs only");
    }
    out.push_back(c.id);
  }
  return out;
}

/// The lists of the fused-step benchmarks (--batches, --codecs).
struct StepLists {
  std::vector<std::uint32_t> batches;
  std::vector<kernels::CodecId> codecs;
};
inline StepLists parse_step_lists(const std::string& batches, const std::string& codecs) {
  return {parse_batches(batches, "--batches"), parse_codecs(codecs, "--codecs")};
}

/// One step mode of --modes (docs/codecs.md, "Step modes"): `full`, the full fit every
/// step; `light`, the light fit the measurement chose (no refit); `carried`, the carried
/// column scales with fresh absmax row scales and no clamp trigger, which the measurement
/// rejected (timed so that what it would have saved stands beside the light fit).
struct BenchStepMode {
  std::string name;
  kernels::StepMode mode = kernels::StepMode::full;
  kernels::LightOptions light;
};

/// The step modes of --modes, comma-separated. `carried`: only where the benchmark has a
/// carried step (`with_carried`; the device has none). Throws std::invalid_argument naming
/// an unknown or unavailable mode.
inline std::vector<BenchStepMode> parse_step_modes(const std::string& list, bool with_carried) {
  std::vector<BenchStepMode> modes;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    BenchStepMode m;
    m.name = name;
    if (name == "light" || name == "carried") {
      m.mode = kernels::StepMode::light;
    } else if (name != "full") {
      throw std::invalid_argument("--modes: unknown mode '" + name + "' (full, light" +
                                  (with_carried ? ", carried)" : ")"));
    }
    if (name == "carried") {
      if (!with_carried) {
        throw std::invalid_argument(
            "--modes: 'carried' has no device kernel (the carried column scales were "
            "rejected by measurement: docs/codecs.md, \"Step modes\"); full, light");
      }
      m.light.fit = kernels::LightFit::carried;
      m.light.rule = kernels::stepquant::RowRule::absmax;
    }
    modes.push_back(std::move(m));
  }
  if (modes.empty()) throw std::invalid_argument("--modes is empty");
  return modes;
}

/// The heading of a mode's tables when a run prints more than one mode or a light one;
/// the light tables time light steps alone (the full fit runs on 1 step in `every`).
inline void print_step_mode(const BenchStepMode& mode, std::size_t modes, std::uint32_t every) {
  if (mode.name == "carried") {
    std::printf(
        "\n== step mode carried: light steps with the page's column scales and fresh "
        "absmax row scales, no clamp trigger (rejected by measurement); the full fit "
        "runs on 1 step in %u\n",
        every);
  } else if (mode.mode == kernels::StepMode::light) {
    std::printf("\n== step mode light: light steps (the fit without the refit); the full fit "
                "runs on 1 step in %u\n",
                every);
  } else if (modes > 1) {
    std::printf("\n== step mode full: the full fit every step\n");
  }
}

/// The layer shapes of the fused-step benchmarks (one linear layer, K = V = 128).
struct StepShape {
  const char* name;
  kernels::Arch arch;
  std::uint32_t heads;     ///< state (value) heads
  std::uint32_t qk_heads;  ///< q/k heads
};
inline constexpr StepShape kStepShapes[] = {
    {"qwen3-next", kernels::Arch::gdn, 32, 16},   // 32 value heads share 16 q/k heads
    {"kimi-linear", kernels::Arch::kda, 32, 32},  // a gate per key channel
};

/// One layer of `shape` under `codec` (no conv state: the step does not touch it), with
/// testing::mixed_width_plan for the stepquant codecs.
inline kernels::StateLayout step_layout(const StepShape& shape, kernels::CodecId codec,
                                        const std::string& who) {
  kernels::StateLayout l = gdn_layout(1, shape.heads, 0, codec);
  l.name = shape.name;
  l.arch = shape.arch;
  l.conv_width = 0;
  if (codec == kernels::CodecId::stepquant6 || codec == kernels::CodecId::stepquant4) {
    l.plan = testing::mixed_width_plan(shape.arch, 1, shape.heads,
                                       codec == kernels::CodecId::stepquant6 ? 6 : 4, who);
  }
  return l;
}

/// One measured row of a fused-step table: seconds per call, bytes the call must move
/// (StepRow::moved_bytes), one request's page bytes of the layer.
struct StepRow {
  double seconds = 0;
  double moved = 0;
  double layer_bytes = 0;

  /// Each page's layer read and written once, plus every input and output float.
  [[nodiscard]] static double moved_bytes(double layer_bytes, std::uint32_t batch,
                                          std::size_t io_floats) {
    return 2.0 * layer_bytes * batch + 4.0 * static_cast<double>(io_floats);
  }
};

/// The fused-step benchmarks' tables, one per shape of kStepShapes: for every batch,
/// copy(bytes) (bytes per second a copy of the batch's FP32 layer moves, read + write),
/// then measure(shape, codec, batch) for every codec, printed with the speed-up over the
/// fp32 row of the same batch (codecs should start with fp32) and the moved rate over the
/// copy rate. `time_unit` is "ms" or "us".
inline void print_step_tables(
    const std::vector<std::uint32_t>& batches, const std::vector<kernels::CodecId>& codecs,
    const char* time_unit, const char* copy_name, const std::function<double(std::size_t)>& copy,
    const std::function<StepRow(const StepShape&, kernels::CodecId, std::uint32_t)>& measure) {
  const double scale = std::string(time_unit) == "us" ? 1e6 : 1e3;
  for (const StepShape& shape : kStepShapes) {
    std::printf("\n%s (%s, %u heads, %u q/k heads)\n", shape.name, kernels::to_string(shape.arch),
                shape.heads, shape.qk_heads);
    std::printf("%-11s %6s %12s %8s/layer %7s %11s %7s\n", "codec", "batch", "KB/request",
                time_unit, "x fp32", "moved GB/s", "x copy");
    for (const std::uint32_t batch : batches) {
      const double copy_rate = copy(std::size_t{batch} * shape.heads * 128 * 128 * 4);
      double fp32_seconds = 0;
      for (const kernels::CodecId id : codecs) {
        const StepRow m = measure(shape, id, batch);
        if (id == kernels::CodecId::fp32) fp32_seconds = m.seconds;
        const double rate = m.moved / m.seconds;
        const double speedup = fp32_seconds > 0 ? fp32_seconds / m.seconds : 0.0;
        std::printf("%-11s %6u %12.1f %14.3f %7.2f %11.2f %7.2f\n", kernels::to_string(id), batch,
                    m.layer_bytes / 1024.0, m.seconds * scale, speedup, rate / 1e9,
                    rate / copy_rate);
      }
      std::printf("%-11s %6u %12s %14s %7s %11.2f %7.2f\n", copy_name, batch, "", "", "",
                  copy_rate / 1e9, 1.0);
    }
  }
}

}  // namespace statepool::bench
