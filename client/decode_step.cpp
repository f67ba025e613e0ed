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
    : arena_(&arena), codec_(&host_codec(arena)) {
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
  if (workers_ == nullptr) return kernels::fused_step(*codec_, layer, pages, inputs, {}, policy);
  support::WorkerPool& pool = *workers_;
  return kernels::fused_step(
      *codec_, layer, pages, inputs,
      [&pool](std::size_t count, std::size_t grain, const auto& fn) {
        pool.parallel_for(count, grain, fn);
      },
      policy);
}

}  // namespace statepool::client
