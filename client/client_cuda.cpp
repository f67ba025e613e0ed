#include "statepool/client_cuda.hpp"

#include "statepool/kernels/cuda/driver.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace statepool::client {
namespace {

[[noreturn]] void fail(const char* what, cudaError_t status) {
  throw Error(wire::Status::internal, std::string(what) + " failed: " + cudaGetErrorName(status) +
                                          " (" + cudaGetErrorString(status) + ")");
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
  ~OpenedEvent() { (void)cudaEventDestroy(event_); }
  OpenedEvent(const OpenedEvent&) = delete;
  OpenedEvent& operator=(const OpenedEvent&) = delete;
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

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

}  // namespace

DeviceDecoder::DeviceDecoder(const Arena& arena, kernels::DType staged_dtype) try
    : arena_(&checked(arena)), format_(format_on_device(arena, staged_dtype)) {
} catch (const std::runtime_error& e) {
  throw Error(wire::Status::internal, std::string("DeviceDecoder: ") + e.what());
}

void DeviceDecoder::decode(SlotId slot, void* staged, cudaStream_t stream) const {
  const std::byte* page = arena_->device_page(slot);  // std::out_of_range
  if (const cudaError_t s = kernels::cuda::decode_page(format_.view(), page, staged, stream);
      s != cudaSuccess) {
    fail("decode_page", s);
  }
}

}  // namespace statepool::client
