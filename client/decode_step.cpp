#include "statepool/decode_step.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "statepool/support/worker_pool.hpp"

namespace statepool::client {
namespace {

const kernels::PageCodec& host_codec(const Arena& arena) {
  if (arena.memory().space != kernels::MemorySpace::host || !arena.mapped()) {
    throw std::logic_error("DecodeStep: arena " + std::to_string(arena.id()) +
                           " is not mapped in this process as host memory (" +
                           kernels::to_string(arena.memory().space) +
                           " memory); step device pages with client::DeviceDecodeStep");
  }
  return arena.codec();  // throws std::logic_error when the page format is unknown
}

}  // namespace

DecodeStep::DecodeStep(const Arena& arena, Options options)
    : arena_(&arena),
      codec_(&host_codec(arena)),
      default_(kernels::measured_step_policy(codec_->layout().codec)),
      steps_(std::size_t{arena.page_count()} * codec_->layout().num_layers, 0) {
  unsigned threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // The calling thread runs chunks too, so a pool of threads - 1 helpers.
  if (threads > 1) workers_ = std::make_unique<support::WorkerPool>(threads - 1);
}

DecodeStep::~DecodeStep() = default;
DecodeStep::DecodeStep(DecodeStep&&) noexcept = default;
DecodeStep& DecodeStep::operator=(DecodeStep&&) noexcept = default;

unsigned DecodeStep::threads() const noexcept {
  return workers_ == nullptr ? 1u : workers_->size() + 1u;
}

std::uint64_t DecodeStep::steps(SlotId slot, std::uint32_t layer) const noexcept {
  const std::uint32_t layers = codec_->layout().num_layers;
  if (layer >= layers || slot >= arena_->page_count()) return 0;
  return steps_[std::size_t{slot} * layers + layer];
}

kernels::StepResult DecodeStep::run(std::uint32_t layer, std::span<const SlotId> slots,
                                    const kernels::StepInputs& inputs) {
  return run(layer, slots, inputs, default_);
}

kernels::StepResult DecodeStep::run(std::uint32_t layer, std::span<const SlotId> slots,
                                    const kernels::StepInputs& inputs,
                                    const kernels::StepPolicy& policy) {
  std::vector<std::byte*> pages;
  pages.reserve(slots.size());
  for (const SlotId slot : slots) pages.push_back(arena_->page(slot).data());
  std::vector<SlotId> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    throw std::invalid_argument("DecodeStep::run: slot " + std::to_string(*twice) +
                                " appears twice in one batch");
  }
  // The slots' own step numbers (fused_step refuses a layer that does not exist).
  const std::uint32_t layers = codec_->layout().num_layers;
  const bool counted = layer < layers;
  std::vector<std::uint64_t> numbers;
  kernels::StepPolicy numbered = policy;
  if (counted && policy.steps.empty()) {
    numbers.reserve(slots.size());
    for (const SlotId slot : slots) numbers.push_back(steps_[std::size_t{slot} * layers + layer]);
    numbered.steps = numbers;
  }
  kernels::StepResult result;
  if (workers_ == nullptr) {
    result = kernels::fused_step(*codec_, layer, pages, inputs, {}, numbered);
  } else {
    support::WorkerPool& pool = *workers_;
    result = kernels::fused_step(
        *codec_, layer, pages, inputs,
        [&pool](std::size_t count, std::size_t grain, const auto& fn) {
          pool.parallel_for(count, grain, fn);
        },
        numbered);
  }
  if (counted) {
    for (const SlotId slot : slots) ++steps_[std::size_t{slot} * layers + layer];
  }
  return result;
}

}  // namespace statepool::client
