#pragma once
// The work of one block of the fused decode-step kernel (kernels/fused_step.hpp's step on
// the device): one (request, head) of one layer. Written for a team of threads like
// block_codec.hpp, whose head decoder and encoder it reuses, so that the GPU
// (kernels/cuda/step_kernels.cu) and the host (host_team.hpp's emulate_fused_step, run by
// the CPU tests against kernels::fused_step) execute the same code:
//
//   1. decode_head: the page's head -> `state`, K x V floats of block scratch (shared
//      memory on the GPU), and rank per row: d_i = decay_factor(g), k_i and q_i into 3 K
//      more floats of scratch (the update then reads per row only shared memory); sync;
//   2. rank per value column j: for every row i in row order, S_ij = S_ij d_i and
//      u_j += S_ij k_i; u_j = beta (v_j - u_j); then for every row in row order
//      S_ij += k_i u_j and o_j += S_ij q_i; a non-finite S_ij lowers the block's flag;
//      sync; (one rank owns column j through both passes, so no barrier is needed
//      between them, and every S_ij, u_j and o_j is computed with exactly the operations
//      and the order of kernels/cpu/step_internal.hpp's step_head);
//   3. if the new state is finite: encode_head: `state` -> the page's head (its scratch
//      where the decay was). Otherwise the page keeps its bytes and rank 0 marks the item
//      in `rejected`.
// A request whose slot index is not below page_count, or equals the slot of an earlier
// request of the batch, is skipped and marked (the device cannot throw, and the host
// cannot read the device's slot list to check it): two blocks stepping one page at once
// would race, so only the first request of a slot runs.
// d_i = decay_factor(g) (one g per head for GDN, one per key row for KDA).
//
// Thread-safety: blocks of different (request, head) pairs touch disjoint bytes.

#include <cstdint>

#include "statepool/kernels/cuda/block_codec.hpp"
#include "statepool/kernels/recurrence.hpp"

namespace statepool::kernels::cuda {

/// One layer's step inputs for a batch (kernels::StepInputs's shapes and meaning), and
/// where the pages are: request b's page is pages + slots[b] * page_stride. Pointers are
/// device pointers on the GPU, host pointers in the emulation.
struct StepView {
  std::uint32_t layer = 0;
  std::uint32_t num_heads = 0;  ///< H, state heads per layer
  std::uint32_t batch = 0;
  std::uint32_t qk_heads = 0;            ///< q/k heads; H is a multiple of it
  const float* q = nullptr;              ///< [batch][qk_heads][K]
  const float* k = nullptr;              ///< [batch][qk_heads][K]
  const float* v = nullptr;              ///< [batch][H][V]
  const float* log_decay = nullptr;      ///< [batch][H] (GDN) or [batch][H][K] (KDA)
  const float* beta = nullptr;           ///< [batch][H]
  float* out = nullptr;                  ///< [batch][H][V]
  std::uint8_t* pages = nullptr;         ///< the arena's first page
  std::uint64_t page_stride = 0;         ///< bytes from one page to the next
  std::uint32_t page_count = 0;          ///< pages of the arena: slots must be below it
  const std::uint32_t* slots = nullptr;  ///< [batch] page index of every request, distinct
  /// [batch][H], or null: kStepStored (0) where the new state was stored,
  /// kStepNotFinite (1) where it was not finite (the page keeps its bytes),
  /// kStepBadSlot (2) where the request's slot is not below page_count, kStepDuplicateSlot
  /// (3) where an earlier request of the batch has the same slot (nothing touched, no
  /// output written).
  std::uint8_t* rejected = nullptr;
  /// The step mode's count (kernels::StepMode::light), or null: every block encodes with
  /// the launch's format. Otherwise [page_count][head_count] counts of the steps each
  /// (page, layer, head) has had, read before the block writes anything and incremented
  /// after it (stored or not): a block whose count is a multiple of full_every (never when
  /// full_every is 0) encodes with the launch's format, every other with
  /// light_step_view's; the counts are the caller's memory (DeviceStepCounts), never a
  /// page's.
  std::uint32_t* step_counts = nullptr;
  std::uint32_t full_every = 0;
};

inline constexpr std::uint8_t kStepStored = 0;
inline constexpr std::uint8_t kStepNotFinite = 1;
inline constexpr std::uint8_t kStepBadSlot = 2;
inline constexpr std::uint8_t kStepDuplicateSlot = 3;

namespace detail {

/// Block scratch of one head seen as "staged values": index first + i is scratch[i].
struct ScratchHead {
  float* data;
  std::uint64_t first;
};

struct StagedScratch {
  static constexpr std::uint32_t kBytes = 4;
  STATEPOOL_HD static const void* address(const void* base, std::uint64_t i) noexcept {
    const auto* s = static_cast<const ScratchHead*>(base);
    return s->data + (i - s->first);
  }
  STATEPOOL_HD static void* address(void* base, std::uint64_t i) noexcept {
    const auto* s = static_cast<const ScratchHead*>(base);
    return s->data + (i - s->first);
  }
  STATEPOOL_HD static float load(const void* base, std::uint64_t i) noexcept {
    const auto* s = static_cast<const ScratchHead*>(base);
    return s->data[i - s->first];
  }
  STATEPOOL_HD static void store(void* base, std::uint64_t i, float v) noexcept {
    const auto* s = static_cast<const ScratchHead*>(base);
    s->data[i - s->first] = v;
  }
  STATEPOOL_HD static bool non_finite(const void* base, std::uint64_t i) noexcept {
    return is_non_finite_bits(float_bits(load(base, i)));
  }
};

}  // namespace detail

/// Floats of the head's state at the start of the step's scratch: K V, rounded up to 4,
/// so that the encode's scratch after it starts 16-byte aligned whatever K V is (its
/// KDA RowLevels are read with 16-byte loads).
STATEPOOL_HD inline std::uint64_t step_state_floats(const PageFormatView& f) noexcept {
  return (std::uint64_t{f.key_dim} * f.value_dim + 3) & ~std::uint64_t{3};
}

/// Floats of block scratch the step needs for `view`'s heads: the state
/// (step_state_floats), then encode_scratch_floats: the decode's scratch, then the decay,
/// k and q of every row (3 K), then the encode's scratch once the update has read them.
STATEPOOL_HD inline std::uint64_t step_scratch_floats(const PageFormatView& f) noexcept {
  return step_state_floats(f) + encode_scratch_floats(f);
}

/// Block (request, h) of a step. `scratch` is step_scratch_floats(f) floats of block
/// scratch and `flags` two values of block-shared scratch (the first non-finite column,
/// the first earlier request with this slot), all visible to every rank of the team. A
/// team may run several blocks one after the other with the same scratch. `Family`: any,
/// or codec_family(f) (block_io.hpp).
template <CodecFamily Family = CodecFamily::any, class Team>
STATEPOOL_HD void step_block(const Team& t, const PageFormatView& f, const StepView& s,
                             float* scratch, unsigned long long* flags, std::uint32_t request,
                             std::uint32_t h) noexcept {
  const std::uint32_t K = f.key_dim;
  const std::uint32_t V = f.value_dim;
  const std::uint32_t head = s.layer * s.num_heads + h;
  const std::uint64_t item = std::uint64_t{request} * s.num_heads + h;
  const std::uint32_t slot = s.slots[request];
  if (slot >= s.page_count) {  // the same for every rank: no barrier is skipped unevenly
    if (t.rank() == 0 && s.rejected != nullptr) s.rejected[item] = kStepBadSlot;
    return;
  }
  std::uint8_t* page = s.pages + std::uint64_t{slot} * s.page_stride;
  float* state = scratch;
  float* decay = scratch + step_state_floats(f);
  detail::ScratchHead values{state, detail::head_first_value(f, head)};
  unsigned long long* flag = flags;         // the first non-finite column
  unsigned long long* earlier = flags + 1;  // the first earlier request with this slot

  t.sync();  // the team's previous block is done with the scratch and the flags
  if (t.rank() == 0) {
    *flag = kAllFinite;
    *earlier = kAllFinite;
  }
  t.sync();
  for (std::uint32_t b = t.rank(); b < request; b += t.size()) {
    if (s.slots[b] == slot) t.atomic_min(earlier, b);
  }
  t.sync();
  if (*earlier != kAllFinite) {  // the same for every rank after the barrier
    if (t.rank() == 0 && s.rejected != nullptr) s.rejected[item] = kStepDuplicateSlot;
    return;
  }
  // The mode of this (page, layer, head)'s step, from its count (every rank reads it here;
  // rank 0 increments it at the end, after the barriers between).
  std::uint32_t* count = s.step_counts == nullptr
                              ? nullptr
                              : s.step_counts + std::uint64_t{slot} * f.head_count + head;
  const bool light = count != nullptr && (s.full_every == 0 || *count % s.full_every != 0);
  // The decay's place (encode_scratch_floats(f) >= decode_scratch_floats(f)) is free
  // until the decode is done.
  decode_head<detail::StagedScratch, Family>(t, f, page, &values, head, decay);
  // The decay d_i, k_i and q_i of every row side by side in the block scratch (3 K floats
  // of the encode's place), so the update reads per row only shared memory.
  const bool per_row = f.arch == Arch::kda;
  const float* g = per_row ? s.log_decay + item * K : s.log_decay + item;
  const std::uint32_t group = s.num_heads / s.qk_heads;
  const std::uint64_t qk = std::uint64_t{request} * s.qk_heads + h / group;
  float* key = decay + K;
  float* query = decay + 2 * K;
  for (std::uint32_t i = t.rank(); i < K; i += t.size()) {
    decay[i] = decay_factor(per_row ? g[i] : *g);
    key[i] = s.k[qk * K + i];
    query[i] = s.q[qk * K + i];
  }
  t.sync();

  const float beta = s.beta[item];
  // The per-row constants four rows at a time (one 16-byte shared load for four values)
  // when K is a multiple of 4; the same operations in the same order either way.
  const bool rows4 = K % 4 == 0 && detail::aligned16(decay);  // the same for every rank
  for (std::uint32_t j = t.rank(); j < V; j += t.size()) {
    float* column = state + j;  // S_ij at column[i V]: K V < 2^24
    float u = 0.0f;
    if (rows4) {
      // kernel-report: step 4 x2
      STATEPOOL_UNROLL_BY(2)
      for (std::uint32_t i = 0; i < K; i += 4) {
        const detail::Words4 d = detail::load16(decay + i);
        const detail::Words4 k4 = detail::load16(key + i);
        STATEPOOL_UNROLL
        for (std::uint32_t n = 0; n < 4; ++n) {
          float& x = column[(i + n) * V];
          x *= bits_float(d.w[n]);
          u += x * bits_float(k4.w[n]);
        }
      }
    } else {
      // kernel-report: step-any-k 1 x4 fallback
      STATEPOOL_UNROLL_BY(4)
      for (std::uint32_t i = 0; i < K; ++i) {
        float& x = column[i * V];
        x *= decay[i];
        u += x * key[i];
      }
    }
    u = beta * (s.v[item * V + j] - u);
    float o = 0.0f;
    if (rows4) {
      // kernel-report: step 4 x2
      STATEPOOL_UNROLL_BY(2)
      for (std::uint32_t i = 0; i < K; i += 4) {
        const detail::Words4 k4 = detail::load16(key + i);
        const detail::Words4 q4 = detail::load16(query + i);
        STATEPOOL_UNROLL
        for (std::uint32_t n = 0; n < 4; ++n) {
          float& x = column[(i + n) * V];
          x += bits_float(k4.w[n]) * u;
          o += x * bits_float(q4.w[n]);
        }
      }
    } else {
      // kernel-report: step-any-k 1 x4 fallback
      STATEPOOL_UNROLL_BY(4)
      for (std::uint32_t i = 0; i < K; ++i) {
        float& x = column[i * V];
        x += key[i] * u;
        o += x * query[i];
      }
    }
    s.out[item * V + j] = o;
    // A NaN or +-Inf in the column makes its term q_i x_i NaN or +-Inf (0 Inf is NaN), and
    // a sum that takes such a term stays NaN or +-Inf, so a finite o proves the column
    // finite. A non-finite o (the column's, or q's, or an overflow of finite terms) is
    // rare: the column is then checked value by value.
    if (is_non_finite_bits(float_bits(o))) {
      bool finite = true;
      for (std::uint32_t i = 0; i < K; ++i) {
        finite = finite && !is_non_finite_bits(float_bits(column[i * V]));
      }
      if (!finite) t.atomic_min(flag, j);
    }
  }
  t.sync();
  const bool finite = *flag == kAllFinite;  // the same for every rank after the barrier
  if (t.rank() == 0 && s.rejected != nullptr) {
    s.rejected[item] = finite ? kStepStored : kStepNotFinite;
  }
  if (finite) {
    // One call site (the encode is most of the kernel's code): the format picks the fit.
    const PageFormatView encoding = light ? light_step_view(f) : f;
    encode_head<detail::StagedScratch, Family>(t, encoding, &values, page, head, decay);
  }
  if (count != nullptr && t.rank() == 0) *count += 1;
}

}  // namespace statepool::kernels::cuda
