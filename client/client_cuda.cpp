#include "statepool/client_cuda.hpp"

#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/fused_step.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace statepool::client {
namespace {

[[noreturn]] void fail(const char* what, cudaError_t status) {
  throw Error(Status::internal,
              std::string(what) + " failed: " + kernels::cuda::handled_error_text(status));
}

/// The daemon's event, opened in this process; destroyed (the import released) after use.
class OpenedEvent {
 public:
  explicit OpenedEvent(const IpcEventBytes& bytes) {
    cudaIpcEventHandle_t handle{};
    static_assert(sizeof(handle) == sizeof(IpcEventBytes));
    std::memcpy(&handle, bytes.data(), sizeof(handle));
    if (const cudaError_t s = cudaIpcOpenEventHandle(&event_, handle); s != cudaSuccess) {
      fail("cudaIpcOpenEventHandle (the daemon's event)", s);
    }
  }
  ~OpenedEvent() {
    kernels::cuda::report_release_failure("cudaEventDestroy (the daemon's event)", -1,
                                          cudaEventDestroy(event_));
  }
  OpenedEvent(const OpenedEvent&) = delete;
  OpenedEvent& operator=(const OpenedEvent&) = delete;
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

StreamFence::StreamFence(int device) : device_(device) {
  const kernels::cuda::DeviceGuard on(device);
  if (const cudaError_t s =
          cudaEventCreateWithFlags(&event_, cudaEventInterprocess | cudaEventDisableTiming);
      s != cudaSuccess) {
    fail("cudaEventCreateWithFlags (an interprocess event)", s);
  }
  cudaIpcEventHandle_t handle{};
  if (const cudaError_t s = cudaIpcGetEventHandle(&handle, event_); s != cudaSuccess) {
    kernels::cuda::report_release_failure("cudaEventDestroy", device_, cudaEventDestroy(event_));
    fail("cudaIpcGetEventHandle", s);
  }
  static_assert(sizeof(handle) == sizeof(IpcEventBytes));
  std::memcpy(handle_.data(), &handle, sizeof(handle));
}

StreamFence::~StreamFence() {
  try {
    const kernels::cuda::DeviceGuard on(device_);
    kernels::cuda::report_release_failure("cudaEventDestroy", device_, cudaEventDestroy(event_));
  } catch (const kernels::cuda::CudaError& e) {
    kernels::cuda::report_release_failure("making the device current for cudaEventDestroy", device_,
                                          static_cast<cudaError_t>(e.code()));
  }
}

IpcEventBytes StreamFence::record(cudaStream_t stream) {
  if (const cudaError_t s = cudaEventRecord(event_, stream); s != cudaSuccess) {
    fail("cudaEventRecord (the fence)", s);
  }
  return handle_;
}

void wait_on_stream(const Pending& pending, cudaStream_t stream) {
  if (!pending.event) return;
  const OpenedEvent event(*pending.event);
  // The wait is enqueued now; destroying the imported event afterwards does not undo it.
  if (const cudaError_t s = cudaStreamWaitEvent(stream, event.get(), 0); s != cudaSuccess) {
    fail("cudaStreamWaitEvent", s);
  }
}

void synchronize(const Pending& pending) {
  if (!pending.event) return;
  const OpenedEvent event(*pending.event);
  if (const cudaError_t s = cudaEventSynchronize(event.get()); s != cudaSuccess) {
    fail("cudaEventSynchronize (the daemon's work)", s);
  }
}

namespace {

const Arena& checked(const Arena& arena) {
  if (arena.device_data() == nullptr) {
    throw std::logic_error("DeviceDecoder: arena " + std::to_string(arena.id()) +
                           " has no device memory mapped in this process");
  }
  return arena;
}

/// The page format's tables on the arena's device, whatever device is current.
kernels::cuda::DevicePageFormat format_on_device(const Arena& arena, kernels::DType dtype) {
  const kernels::cuda::DeviceGuard on(arena.memory().device);
  return kernels::cuda::DevicePageFormat(arena.codec(), dtype);
}

/// Zeroed step counts of the arena's pages on its device, whatever device is current.
kernels::cuda::DeviceStepCounts counts_on_device(const Arena& arena) {
  const kernels::cuda::DeviceGuard on(arena.memory().device);
  return {arena.page_count(), static_cast<std::uint32_t>(arena.codec().head_count())};
}

}  // namespace

DeviceDecoder::DeviceDecoder(const Arena& arena, kernels::DType staged_dtype) try
    : arena_(&checked(arena)), format_(format_on_device(arena, staged_dtype)) {
} catch (const std::runtime_error& e) {
  throw Error(Status::internal, std::string("DeviceDecoder: ") + e.what());
}

void DeviceDecoder::decode(SlotId slot, void* staged, cudaStream_t stream) const {
  const std::byte* page = arena_->device_page(slot);  // std::out_of_range
  // The tables and the page are on the arena's device: launch there, whatever device the
  // caller has current (restored after).
  const kernels::cuda::DeviceGuard on(arena_->memory().device);
  if (const cudaError_t s = kernels::cuda::decode_page(format_.view(), page, staged, stream);
      s != cudaSuccess) {
    fail("decode_page", s);
  }
}

DeviceDecodeStep::DeviceDecodeStep(const Arena& arena) try
    : arena_(&checked(arena)),
      format_(format_on_device(arena, kernels::DType::f32)),
      default_(kernels::measured_step_policy(arena.codec().layout().codec)),
      counts_(counts_on_device(arena)) {
} catch (const std::runtime_error& e) {
  throw Error(Status::internal, std::string("DeviceDecodeStep: ") + e.what());
}

void DeviceDecodeStep::run(std::uint32_t layer, const DeviceStepInputs& in,
                           cudaStream_t stream) const {
  run(layer, in, stream, default_);
}

void DeviceDecodeStep::run(std::uint32_t layer, const DeviceStepInputs& in, cudaStream_t stream,
                           const kernels::StepPolicy& policy) const {
  const kernels::StateLayout& l = arena_->codec().layout();
  if (const std::string problem = kernels::step_problem(l, layer, in.qk_heads); !problem.empty()) {
    throw std::invalid_argument("DeviceDecodeStep::run: " + problem);
  }
  if (!policy.steps.empty()) {
    throw std::invalid_argument(
        "DeviceDecodeStep::run: per-request step numbers (StepPolicy::steps) are a host step "
        "feature; the device numbers each page's steps itself");
  }
  const std::uint32_t qk = in.qk_heads == 0 ? l.num_heads : in.qk_heads;
  if (in.batch == 0) return;
  if (in.slots == nullptr || in.q == nullptr || in.k == nullptr || in.v == nullptr ||
      in.log_decay == nullptr || in.beta == nullptr || in.out == nullptr) {
    throw std::invalid_argument(
        "DeviceDecodeStep::run: slots, q, k, v, log_decay, beta and "
        "out must all be device pointers");
  }
  const kernels::cuda::DeviceGuard on(arena_->memory().device);
  if (!kernels::cuda::step_fits_device(format_.view())) {
    throw std::invalid_argument("DeviceDecodeStep::run: a " + std::to_string(l.key_dim) + " x " +
                                std::to_string(l.value_dim) +
                                " head does not fit the device's shared memory per block");
  }
  const kernels::cuda::StepView s{.layer = layer,
                                  .num_heads = l.num_heads,
                                  .batch = in.batch,
                                  .qk_heads = qk,
                                  .q = in.q,
                                  .k = in.k,
                                  .v = in.v,
                                  .log_decay = in.log_decay,
                                  .beta = in.beta,
                                  .out = in.out,
                                  .pages = reinterpret_cast<std::uint8_t*>(arena_->device_data()),
                                  .page_stride = arena_->page_stride(),
                                  .page_count = arena_->page_count(),
                                  .slots = in.slots,
                                  .rejected = in.rejected,
                                  .step_counts = counts_.data(),
                                  // full: every step is a multiple of 1, counted all the same
                                  .full_every = policy.mode == kernels::StepMode::light
                                                    ? policy.full_every
                                                    : 1u};
  if (const cudaError_t status = kernels::cuda::fused_step_pages(format_.view(), s, stream);
      status != cudaSuccess) {
    fail("fused_step_pages", status);
  }
}

}  // namespace statepool::client
