#include "exec/cuda_executor.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/protocol/status.hpp"

namespace statepool::service {
namespace {

constexpr unsigned long long kAllFinite = std::numeric_limits<unsigned long long>::max();

std::string cuda_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

/// Throws std::runtime_error for a failure while setting up.
void setup(cudaError_t status, const std::string& what, int device) {
  if (status != cudaSuccess) {
    throw std::runtime_error("cuda executor on device " + std::to_string(device) + ": " + what +
                             " failed (" + cuda_text(status) + ")");
  }
}

/// Throws StatusError(internal) for a failure of an operation.
void check_op(cudaError_t status, const char* what, OperationKind kind) {
  if (status != cudaSuccess) {
    throw StatusError(Status::internal, std::string("cuda ") + to_string(kind) + ": " + what +
                                            " failed (" + cuda_text(status) + ")");
  }
}

}  // namespace

struct CudaExecutor::Device {
  cudaStream_t stream = nullptr;
  std::array<cudaEvent_t, kMaxInFlight> events{};  // interprocess, one per ring slot
  std::array<IpcEventBytes, kMaxInFlight> event_handles{};
  unsigned long long* first_bad = nullptr;       // device [kMaxInFlight]
  unsigned long long* first_bad_host = nullptr;  // pinned host [kMaxInFlight]

  ~Device() {
    for (cudaEvent_t event : events) {
      if (event != nullptr) (void)cudaEventDestroy(event);
    }
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    if (first_bad != nullptr) (void)cudaFree(first_bad);
    if (first_bad_host != nullptr) (void)cudaFreeHost(first_bad_host);
  }
};

/// The device tables of every page format seen, kept for the daemon's life (layouts are
/// never unregistered); the PageCodec is held so its address stays a valid key.
struct CudaExecutor::Formats {
  struct Entry {
    std::shared_ptr<const kernels::PageCodec> codec;
    kernels::cuda::DevicePageFormat format;
  };
  std::map<std::pair<const kernels::PageCodec*, kernels::DType>, Entry> entries;

  const kernels::cuda::PageFormatView& view(const std::shared_ptr<const kernels::PageCodec>& codec,
                                            kernels::DType dtype) {
    const auto key = std::make_pair(codec.get(), dtype);
    auto it = entries.find(key);
    if (it == entries.end()) {
      it = entries.emplace(key, Entry{codec, kernels::cuda::DevicePageFormat(*codec, dtype)}).first;
    }
    return it->second.format.view();
  }
};

CudaExecutor::CudaExecutor(int device) : device_(device), formats_(std::make_unique<Formats>()) {
  setup(cudaSetDevice(device), "selecting the device", device);
  auto cuda = std::make_unique<Device>();
  setup(cudaStreamCreateWithFlags(&cuda->stream, cudaStreamNonBlocking), "creating a stream",
        device);
  for (std::uint32_t i = 0; i < kMaxInFlight; ++i) {
    // Interprocess (so that an early reply can hand the event to its client), which
    // requires disabling timing.
    // Blocking sync: the completer sleeps in cudaEventSynchronize instead of spinning.
    setup(
        cudaEventCreateWithFlags(&cuda->events[i], cudaEventDisableTiming | cudaEventInterprocess |
                                                       cudaEventBlockingSync),
        "creating events", device);
    cudaIpcEventHandle_t handle{};
    setup(cudaIpcGetEventHandle(&handle, cuda->events[i]), "exporting events", device);
    static_assert(sizeof(handle) == sizeof(IpcEventBytes));
    std::memcpy(cuda->event_handles[i].data(), &handle, sizeof(handle));
  }
  void* results = nullptr;
  setup(cudaMalloc(&results, sizeof(unsigned long long) * kMaxInFlight), "allocating check results",
        device);
  cuda->first_bad = static_cast<unsigned long long*>(results);
  setup(cudaMallocHost(&results, sizeof(unsigned long long) * kMaxInFlight),
        "allocating pinned check results", device);
  cuda->first_bad_host = static_cast<unsigned long long*>(results);
  cuda_ = std::move(cuda);
  launcher_ = std::thread([this] { launch_loop(); });
  completer_ = std::thread([this] { complete_loop(); });
}

CudaExecutor::~CudaExecutor() {
  wait_idle();
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  launcher_.join();
  completer_.join();
  formats_.reset();  // device tables, then the stream and buffers
  cuda_.reset();
}

bool CudaExecutor::can_access(MemorySpace space, int device) const noexcept {
  return space == MemorySpace::device && device == device_;
}

void CudaExecutor::submit(Operation op, Completion done) {
  {
    const std::lock_guard lock(mutex_);
    ++in_flight_;
    queued_.push_back(Job{std::move(op), std::move(done)});
  }
  wake_.notify_all();
}

void CudaExecutor::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return in_flight_ == 0; });
}

void CudaExecutor::launch_loop() {
  (void)cudaSetDevice(device_);
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] {
      return stopping_ || (!queued_.empty() && launched_.size() < kMaxInFlight);
    });
    if (stopping_ && queued_.empty()) return;
    Job job = std::move(queued_.front());
    queued_.pop_front();
    // The slot of the oldest job that can no longer be in flight (launched_ holds fewer
    // than kMaxInFlight); taken for good only when the job is on the stream.
    const std::uint32_t slot = next_slot_;
    lock.unlock();
    std::exception_ptr error;
    bool launched_any = false;
    try {
      enqueue(job, slot, launched_any);
    } catch (...) {
      error = std::current_exception();
    }
    if (error) {
      // A refusal enqueues nothing. A failure after a first launch leaves kernels that may
      // still read the job's memory: wait for the stream before letting it go.
      if (launched_any) (void)cudaStreamSynchronize(cuda_->stream);
      finish(job, error);
      lock.lock();
      continue;
    }
    // The work is on the stream: an early listener may reply now (before the job is
    // handed to the completer, so the completion cannot come first).
    if (job.op.enqueued) {
      try {
        job.op.enqueued(cuda_->event_handles[slot]);
      } catch (...) {
        // As with completions: the listener's failure must not stop the executor.
      }
    }
    lock.lock();
    next_slot_ = (next_slot_ + 1) % kMaxInFlight;
    launched_.emplace_back(std::move(job), slot);
    wake_.notify_all();
  }
}

void CudaExecutor::enqueue(const Job& job, std::uint32_t slot, bool& launched_any) {
  const Operation& op = job.op;
  for (const kernels::BufferRef* buffer : {&op.staged, &op.page, &op.source}) {
    // A copy may have one end in the daemon's host memory (prefix-state snapshots moving
    // between the pool and its host and remote tiers): cudaMemcpyDefault handles that.
    const bool host_copy = op.kind == OperationKind::copy && buffer->space == MemorySpace::host;
    if (buffer->data != nullptr && !host_copy && !can_access(buffer->space, buffer->device)) {
      throw StatusError(Status::invalid_argument,
                        std::string("the cuda executor (device ") + std::to_string(device_) +
                            ") cannot " + to_string(op.kind) + " " +
                            (buffer->space == MemorySpace::host
                                 ? std::string("host memory")
                                 : "memory on CUDA device " + std::to_string(buffer->device)));
    }
  }
  cudaStream_t stream = cuda_->stream;
  if (op.kind == OperationKind::copy) {
    if (op.source.size != op.page.size) {
      throw StatusError(Status::invalid_argument,
                        "copy: source page of " + std::to_string(op.source.size) +
                            " bytes, destination of " + std::to_string(op.page.size));
    }
    if (op.page.data != op.source.data && op.page.size != 0) {
      check_op(
          cudaMemcpyAsync(op.page.data, op.source.data, op.page.size, cudaMemcpyDefault, stream),
          "cudaMemcpyAsync", op.kind);
      launched_any = true;
    }
    check_op(cudaEventRecord(cuda_->events[slot], stream), "cudaEventRecord", op.kind);
    return;
  }

  if (op.kind == OperationKind::kv_encode || op.kind == OperationKind::kv_decode) {
    // The device kernels exist (kernels/cuda/kv_kernels.hpp, byte-identical to the CPU's);
    // this executor does not launch them yet (docs/prefix-store.md, "Hybrid entries").
    throw StatusError(Status::invalid_argument,
                      "snapshots with KV blocks are not supported on the cuda backend yet");
  }
  const kernels::PageCodec& codec = *op.codec;
  if (op.dtype != kernels::DType::f32 && op.dtype != kernels::DType::bf16) {
    throw StatusError(Status::invalid_argument, std::string("staged states are f32 or bf16, got ") +
                                                    kernels::to_string(op.dtype));
  }
  // The kernels read staged values as whole elements; the host executor copies instead.
  const std::uintptr_t element = op.dtype == kernels::DType::f32 ? 4 : 2;
  if (reinterpret_cast<std::uintptr_t>(op.staged.data) % element != 0) {
    throw StatusError(Status::invalid_argument,
                      std::string(to_string(op.kind)) +
                          ": on the cuda backend a staged state must start at an offset that "
                          "is a multiple of " +
                          std::to_string(element) + " bytes for " + kernels::to_string(op.dtype));
  }
  if (op.staged.size != codec.staged_bytes(op.dtype) || op.page.size != codec.page_bytes()) {
    throw StatusError(Status::invalid_argument,
                      std::string(to_string(op.kind)) + ": staged buffer of " +
                          std::to_string(op.staged.size) + " bytes and page of " +
                          std::to_string(op.page.size) + " bytes, the layout needs " +
                          std::to_string(codec.staged_bytes(op.dtype)) + " and " +
                          std::to_string(codec.page_bytes()));
  }
  const kernels::cuda::PageFormatView* view = nullptr;
  try {
    view = &formats_->view(op.codec, op.dtype);
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, e.what());
  } catch (const std::exception& e) {
    throw StatusError(Status::internal, e.what());
  }
  if (op.kind == OperationKind::compress) {
    unsigned long long* first_bad = cuda_->first_bad + slot;
    check_op(kernels::cuda::find_non_finite(*view, op.staged.data, first_bad, stream),
             "the non-finite check", op.kind);
    launched_any = true;
    check_op(kernels::cuda::encode_page(*view, op.staged.data, op.page.data, first_bad, stream),
             "the encode kernel", op.kind);
    check_op(cudaMemcpyAsync(cuda_->first_bad_host + slot, first_bad, sizeof(*first_bad),
                             cudaMemcpyDeviceToHost, stream),
             "reading the check", op.kind);
  } else {
    check_op(kernels::cuda::decode_page(*view, op.page.data, op.staged.data, stream),
             "the decode kernel", op.kind);
    launched_any = true;
  }
  check_op(cudaEventRecord(cuda_->events[slot], stream), "cudaEventRecord", op.kind);
}

std::exception_ptr CudaExecutor::check_result(const Job& job, std::uint32_t slot) {
  const Operation& op = job.op;
  if (op.kind != OperationKind::compress) return nullptr;
  const unsigned long long bad = cuda_->first_bad_host[slot];
  if (bad == kAllFinite) return nullptr;
  // The first NaN/Inf in page order, named as the CPU codecs name it.
  const kernels::StateLayout& layout = op.codec->layout();
  const std::uint64_t per_head = std::uint64_t{layout.key_dim} * layout.value_dim;
  const auto head_index = static_cast<std::uint32_t>(bad / per_head);
  float value = std::numeric_limits<float>::quiet_NaN();
  if (op.dtype == kernels::DType::f32) {
    (void)cudaMemcpy(&value, op.staged.data + bad * 4, 4, cudaMemcpyDeviceToHost);
  } else {
    std::uint16_t bits = 0;
    if (cudaMemcpy(&bits, op.staged.data + bad * 2, 2, cudaMemcpyDeviceToHost) == cudaSuccess) {
      value = kernels::bf16_bits_to_float(bits);
    }
  }
  const kernels::NonFiniteError error(head_index / layout.num_heads, head_index % layout.num_heads,
                                      static_cast<std::size_t>(bad % per_head), value,
                                      layout.value_dim);
  return std::make_exception_ptr(StatusError(Status::not_finite, error.what()));
}

void CudaExecutor::complete_loop() {
  (void)cudaSetDevice(device_);
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !launched_.empty(); });
    if (launched_.empty()) {
      if (stopping_) return;
      continue;
    }
    // Stays at the front (counted against kMaxInFlight, its slot reserved) until done.
    Job& job = launched_.front().first;
    const std::uint32_t slot = launched_.front().second;
    lock.unlock();
    std::exception_ptr error;
    const cudaError_t status = cudaEventSynchronize(cuda_->events[slot]);
    if (status != cudaSuccess) {
      error = std::make_exception_ptr(StatusError(
          Status::internal, std::string("cuda ") + to_string(job.op.kind) + " on device " +
                                std::to_string(device_) + " failed (" + cuda_text(status) + ")"));
    } else {
      error = check_result(job, slot);
    }
    Job done = std::move(job);
    lock.lock();
    launched_.pop_front();
    wake_.notify_all();  // a ring slot is free for the launcher
    lock.unlock();
    finish(done, error);
    lock.lock();
  }
}

void CudaExecutor::finish(Job& job, std::exception_ptr error) noexcept {
  job.op.keep_alive.clear();  // release the memory before the session hears of completion
  try {
    job.done(error);
  } catch (...) {
    // As in HostExecutor: an undeliverable completion must not keep wait_idle() waiting.
  }
  const std::lock_guard lock(mutex_);
  if (--in_flight_ == 0) idle_.notify_all();
}

}  // namespace statepool::service
