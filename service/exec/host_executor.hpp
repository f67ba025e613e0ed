#pragma once
// HostExecutor: runs operations on host memory with a WorkerPool. One operation becomes
// chunks of consecutive heads (heads and layers are independent), run by every idle
// worker at once; several operations share the workers. The bytes written are those of
// PageCodec::encode/decode exactly, whatever the split (kernels/page.hpp).
//
// Compress checks every value for NaN/Inf (in parallel) before writing anything, and
// reports the first non-finite value in page order, as PageCodec::encode does.
//
// Staged views (Operation::state_view, kv_view; kernels/staged_view.hpp) run the same way
// with the view's dtype (Operation::dtype is then not used): heads split over the workers
// for states, whatever their head order, and streams for KV blocks, whose rows are gathered
// per stream where they are not back to back. A view must reach host memory, like every
// buffer, and replaces `staged`, which must then be empty.
//
// Thread-safety: as Executor.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "exec/executor.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::service {

class HostExecutor final : public Executor {
 public:
  /// `workers` must outlive this executor. `chunks_per_worker` sets how finely one state
  /// is split (more chunks balance better, fewer cost less scheduling).
  explicit HostExecutor(support::WorkerPool& workers, unsigned chunks_per_worker = 4);
  ~HostExecutor() override;

  [[nodiscard]] std::string_view name() const noexcept override { return "host"; }
  [[nodiscard]] bool can_access(MemorySpace space, int device) const noexcept override;
  void submit(Operation op, Completion done) override;
  void wait_idle() override;

  /// Runs `op` on the calling thread plus idle workers and returns when it is complete;
  /// throws the errors a completion would receive. (submit() runs this on a worker.)
  void run(const Operation& op);

 private:
  void run_compress(const Operation& op);
  void run_decompress(const Operation& op);
  void run_copy(const Operation& op);
  void run_kv_encode(const Operation& op);
  void run_kv_decode(const Operation& op);
  [[nodiscard]] std::size_t grain(std::size_t items) const noexcept;
  /// memcpy split over the workers.
  void copy_parallel(std::byte* dst, const std::byte* src, std::size_t bytes);

  /// Scratch pages of compress, a few kept for the next ones (allocating and faulting in
  /// a 40 MB buffer per request would cost as much as the copy it serves). take_scratch
  /// returns nullptr when the memory is not there.
  using Scratch = std::unique_ptr<std::byte[]>;
  [[nodiscard]] Scratch take_scratch(std::size_t bytes);
  void give_back_scratch(Scratch scratch, std::size_t bytes) noexcept;

  support::WorkerPool& workers_;
  unsigned chunks_per_worker_;
  std::mutex mutex_;  // guards in_flight_ and scratch_
  std::condition_variable idle_;
  std::uint64_t in_flight_ = 0;
  std::vector<std::pair<Scratch, std::size_t>> scratch_;
};

}  // namespace statepool::service
