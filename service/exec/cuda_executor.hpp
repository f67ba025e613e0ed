#pragma once
// CudaExecutor: runs operations on one CUDA device's memory, on a stream of the daemon's.
//
//   submit()     queues the operation and returns (an I/O thread never touches CUDA);
//   after        an operation with the client's `after` event makes the stream wait for
//                it first (cudaIpcOpenEventHandle + cudaStreamWaitEvent): the engine's
//                own writes are ordered before the daemon's reads without a host wait;
//   launcher     a thread that checks sizes, finds the page format's device tables
//                (uploaded once per layout and staged dtype), and enqueues the work:
//                  compress    find_non_finite -> encode_page skipping a non-finite
//                              state (the page stays as it was) -> the check's result
//                              copied to pinned host memory -> event
//                  decompress  decode_page -> event
//                  copy        cudaMemcpyAsync device to device -> event
//                  kv_encode   kv_find_non_finite_streams, its result read at once (the
//                              launcher waits for it: a rejected put writes nothing) ->
//                              kv_encode_streams into scratch (the executor's memory
//                              resource, held until the job completes) -> copies
//                              into the chunks -> event
//                  kv_decode   chunks gathered into scratch unless there is one device
//                              chunk (host chunks allowed: a lower tier's value) ->
//                              kv_decode_streams -> event
//   completer    a thread that waits for the events in submission order (the stream is
//                in order), reads the check's result, lets the operation's memory go and
//                calls the completion.
// Operation::enqueued, when set, is called by the launcher right after the event is
// recorded, with the event's interprocess handle (early replies, protocol `event`). The
// ring's events are reused: a client that waits late on one may wait for later work of
// the same stream too, never for less.
// The bytes written are those of PageCodec::encode/decode (kernels/cuda/codec_kernels.hpp
// guarantees byte identity with the CPU codecs). A non-finite state is reported as
// not_finite with the same message as the host executor's (the first value in page
// order).
//
// At most kMaxInFlight operations are enqueued at once; the launcher waits for the oldest
// to finish beyond that (back-pressure stays off the I/O threads).
//
// CUDA failures are CudaErrors (kernels/cuda/driver.hpp) naming the operation and its
// step; every call is checked, so a launch's own error is never another call's. A sticky
// error (kernels::cuda::is_sticky: a device fault, an uncorrectable ECC error) makes the
// context unusable for the process: the executor logs it once (component "cuda"), that
// operation and every later one complete with StatusError(internal) saying so (fault()),
// and the daemon must be restarted. The threads select the device at start; a failure
// there is such a fault too. The constructor leaves the caller's current device as it
// found it.
//
// Thread-safety: as Executor.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "exec/executor.hpp"

namespace statepool::service {

class CudaExecutor final : public Executor {
 public:
  static constexpr std::uint32_t kMaxInFlight = 64;

  /// Creates the stream and the event ring on `device`. The executor's own device memory
  /// (the check results, every page format's tables, the KV blocks' scratch) comes from
  /// `memory`, which must be `device`'s memory and outlive the executor (the daemon gives
  /// it a TrackingResource, so that metrics and the exit check see it). Throws
  /// std::runtime_error naming the CUDA error when the device cannot be used,
  /// std::invalid_argument for a resource of other memory.
  CudaExecutor(int device, MemoryResource& memory);
  ~CudaExecutor() override;

  [[nodiscard]] std::string_view name() const noexcept override { return "cuda"; }
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Device memory of this executor's device only.
  [[nodiscard]] bool can_access(MemorySpace space, int device) const noexcept override;
  void submit(Operation op, Completion done) override;
  void wait_idle() override;
  /// Empty while the device is usable; otherwise why it is not (see the top).
  [[nodiscard]] std::string fault() const;

 private:
  struct Job {
    Operation op;
    Completion done;
    std::vector<std::shared_ptr<Allocation>> scratch;  // device scratch of its work
  };
  struct Device;   // the stream, the event ring and the result buffers (CUDA types)
  struct Formats;  // device tables per (page format, staged dtype)

  void launch_loop();
  void complete_loop();
  /// Enqueues `job` on the stream into ring slot `slot`; throws StatusError.
  /// `launched_any` is set once something of it is on the stream.
  void enqueue(Job& job, std::uint32_t slot, bool& launched_any);
  void enqueue_kv(Job& job, bool& launched_any);
  /// Makes the stream wait for the client's `after` event; throws StatusError.
  void wait_for_client(const Operation& op);
  /// Error of a finished compress whose check found a NaN/Inf (or nullptr).
  [[nodiscard]] std::exception_ptr check_result(const Job& job, std::uint32_t slot);
  /// Releases the operation's memory, calls its completion, counts it done.
  void finish(Job& job, std::exception_ptr error) noexcept;
  /// cudaSetDevice on a worker thread; a failure marks the executor unusable.
  void select_device(const char* thread);
  /// Records and logs (once) that the device is unusable.
  void mark_unusable(const std::string& reason);
  /// The completion's error for a failed operation: a CudaError becomes
  /// StatusError(internal) (and marks the executor unusable when sticky).
  std::exception_ptr failure(std::exception_ptr error);

  int device_;
  MemoryResource& memory_;
  std::unique_ptr<Device> cuda_;
  std::unique_ptr<Formats> formats_;  // launcher thread only

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Job> queued_;
  std::deque<std::pair<Job, std::uint32_t>> launched_;  // on the stream, oldest first
  std::uint32_t next_slot_ = 0;
  std::uint64_t in_flight_ = 0;  // submitted and not yet completed
  bool stopping_ = false;
  std::string fault_;  // empty while usable

  std::thread launcher_;
  std::thread completer_;
};

}  // namespace statepool::service
