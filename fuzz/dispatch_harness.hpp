#pragma once
// The daemon in process, for the frame fuzzer: the real host backend (make_backend), the
// real pool and the real request handlers (handle_request), fed the bytes one connection
// sends. The session's receive loop (service/server/session.cpp, Session::run and
// read_frame) is replayed over those bytes without a socket, step for step: header
// decoded and checked against --max-frame-bytes, payload copied into a buffer of its own,
// verify_request, the FD_ATTACHED refusal, dispatch, and the reply. Where the session
// would wait for bytes that never come (a partial header or payload), the connection
// ends, as the session's I/O timeout would end it. Not replayed: timers (the Hello and I/O
// timeouts), the server's connection limits and the metrics, which sit around the
// session loop rather than in it.
//
// State is bounded by construction: every input gets a fresh Pool and connection; at the
// end of the input the connection ends as a session's does (staging released on a
// worker, lease detached), the lease's grace period is let pass, and the harness checks
// that every page and every staging byte came back. The worker pool, the backend and the
// staging memory (its tracking adaptor, the daemon's staging capacity and the tenants'
// staging budgets over it, built as the server builds them) live for the whole process.
//
// Invariants checked after every request (a broken one aborts, which libFuzzer reports as
// a crash with the input): the reply verifies as a Reply, echoes the request id, carries
// the handler's status, has the reply body matching the request on success and a message
// on failure; a descriptor is attached only to a successful OpenArena / OpenStaging; no
// request ends in Status::internal (a bug, or an OS failure, which none of these inputs
// should cause). After every input: Pool::check() finds nothing, no page is used, no lease
// is left, and the staging memory's live bytes are back to zero.
//
// STATEPOOL_FUZZ_TRACE=1 in the environment prints every request and its reply's status.
//
// Thread-safety: one harness per process, run() from one thread (libFuzzer's).

#include <cstdint>
#include <memory>
#include <span>

namespace statepool::fuzz {

/// Limits of the in-process daemon (small, so that an input cannot hold much memory).
struct HarnessLimits {
  static constexpr std::uint32_t kMaxFrameBytes = 64u << 10;        ///< --max-frame-bytes
  static constexpr std::uint64_t kPoolCapacity = 16ull << 20;       ///< --pool-capacity
  static constexpr std::uint64_t kMaxStagingBytes = 8ull << 20;     ///< --max-staging-bytes
  static constexpr std::uint64_t kStagingCapacity = 16ull << 20;    ///< --staging-capacity
  static constexpr std::uint32_t kDefaultArenaPages = 4;            ///< --arena-pages
  static constexpr std::uint32_t kMaxArenaPages = 64;               ///< --max-arena-pages
  static constexpr std::uint64_t kSmallTenantQuota = 64ull << 10;   ///< tenant "small"
  static constexpr std::uint64_t kSmallTenantStaging = 1ull << 20;  ///< tenant "small"
  static constexpr std::uint32_t kLockedTenantUid = 4242424;        ///< tenant "locked"
};

class DispatchHarness {
 public:
  DispatchHarness();
  ~DispatchHarness();
  DispatchHarness(const DispatchHarness&) = delete;
  DispatchHarness& operator=(const DispatchHarness&) = delete;

  /// Feeds `input` as everything one connection sends, then ends the connection and
  /// checks the invariants above (aborting with a message on stderr when one fails).
  void run(std::span<const std::uint8_t> input);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace statepool::fuzz
