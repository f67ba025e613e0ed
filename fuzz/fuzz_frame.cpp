// libFuzzer target: the bytes of one connection, through frame verification and request
// dispatch, as the daemon runs them (dispatch_harness.hpp says what is checked).
//
// Inputs are request frames back to back (the seed corpus has a session of every request
// type). A custom mutator keeps that structure most of the time: it mutates one frame's
// payload with libFuzzer's own mutations and rewrites the frame's length to match, or
// drops, repeats or swaps whole frames; one mutation in eight works on the raw bytes, so
// that headers, lengths and cut frames are fuzzed too.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <utility>

#include "dispatch_harness.hpp"
#include "frames.hpp"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static statepool::fuzz::DispatchHarness harness;
  harness.run(std::span<const std::uint8_t>(data, size));
  return 0;
}

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,
                                               std::size_t max_size, unsigned int seed) {
  using statepool::fuzz::SplitInput;
  std::minstd_rand rng(seed);
  const auto pick = [&rng](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  SplitInput in = statepool::fuzz::split_frames(std::span<const std::uint8_t>(data, size));
  const std::size_t choice = pick(8);
  if (in.frames.empty() || choice == 0) return LLVMFuzzerMutate(data, size, max_size);

  auto& frames = in.frames;
  if (choice == 1 && frames.size() > 1) {
    frames.erase(frames.begin() + static_cast<std::ptrdiff_t>(pick(frames.size())));
  } else if (choice == 2) {
    const auto copy = frames[pick(frames.size())];
    frames.insert(frames.begin() + static_cast<std::ptrdiff_t>(pick(frames.size() + 1)), copy);
  } else if (choice == 3 && frames.size() > 1) {
    std::swap(frames[pick(frames.size())], frames[pick(frames.size())]);
  } else {
    auto& payload = frames[pick(frames.size())].payload;
    const std::size_t others = size - payload.size();
    if (others >= max_size) return LLVMFuzzerMutate(data, size, max_size);
    if (payload.empty()) payload.push_back(0);
    const std::size_t before = payload.size();
    payload.resize(max_size - others);
    std::size_t after = LLVMFuzzerMutate(payload.data(), before, payload.size());
    if (after == 0) after = 1;
    payload.resize(after);
  }
  const std::vector<std::uint8_t> out = statepool::fuzz::join_frames(in);
  if (out.size() > max_size || out.empty()) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
