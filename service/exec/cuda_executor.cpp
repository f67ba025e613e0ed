#include "exec/cuda_executor.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "statepool/kernels/codec.hpp"
#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/cuda/driver.hpp"
#include "statepool/kernels/cuda/kv_kernels.hpp"
#include "statepool/kernels/kv.hpp"
#include "statepool/kernels/numeric.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/status.hpp"

namespace statepool::service {
namespace {

using kernels::cuda::CudaError;

constexpr unsigned long long kAllFinite = std::numeric_limits<unsigned long long>::max();

/// Throws CudaError (kernels/cuda/driver.hpp, the one CUDA error helper) naming the
/// operation and the step of it that failed; the launcher turns it into the completion's
/// StatusError(internal) and notices a sticky one.
void check_op(cudaError_t status, const char* what, OperationKind kind, int device) {
  kernels::cuda::check(status, std::string(to_string(kind)) + ": " + what, device);
}

/// Throws CudaError for a failure while setting up.
void setup(cudaError_t status, const char* what, int device) {
  kernels::cuda::check(status, std::string("cuda executor: ") + what, device);
}

}  // namespace

struct CudaExecutor::Device {
  int device = -1;
  cudaStream_t stream = nullptr;
  std::array<cudaEvent_t, kMaxInFlight> events{};  // interprocess, one per ring slot
  std::array<IpcEventBytes, kMaxInFlight> event_handles{};
  std::shared_ptr<Allocation> results;           // device memory of the executor's resource
  unsigned long long* first_bad = nullptr;       // [kMaxInFlight] in `results`
  unsigned long long* first_bad_host = nullptr;  // pinned host [kMaxInFlight]

  ~Device() {
    using kernels::cuda::report_release_failure;
    try {
      const kernels::cuda::DeviceGuard on(device);
      for (cudaEvent_t event : events) {
        if (event != nullptr)
          report_release_failure("cudaEventDestroy", device, cudaEventDestroy(event));
      }
      if (stream != nullptr)
        report_release_failure("cudaStreamDestroy", device, cudaStreamDestroy(stream));
      if (first_bad_host != nullptr) {
        report_release_failure("cudaFreeHost", device, cudaFreeHost(first_bad_host));
      }
    } catch (const CudaError& e) {
      report_release_failure("making the device current to release the executor", device,
                             static_cast<cudaError_t>(e.code()));
    }
  }
};

/// The device tables of every page format seen, kept for the daemon's life (layouts are
/// never unregistered), in memory of the executor's resource; the PageCodec is held so its
/// address stays a valid key.
struct CudaExecutor::Formats {
  struct Entry {
    std::shared_ptr<const kernels::PageCodec> codec;
    std::shared_ptr<Allocation> tables;
    kernels::cuda::PageFormatView view;
  };
  std::map<std::pair<const kernels::PageCodec*, kernels::DType>, Entry> entries;

  /// Throws std::invalid_argument (a dtype), StatusError (no memory), CudaError.
  const kernels::cuda::PageFormatView& view(const std::shared_ptr<const kernels::PageCodec>& codec,
                                            kernels::DType dtype, MemoryResource& memory,
                                            int device) {
    const auto key = std::make_pair(codec.get(), dtype);
    auto it = entries.find(key);
    if (it != entries.end()) return it->second.view;
    const kernels::cuda::PageFormatTables tables(*codec, dtype);
    const std::vector<std::byte> blob = tables.blob();
    std::shared_ptr<Allocation> copy = memory.allocate(blob.size(), "page format tables");
    // The launcher's own stream, waited for: the tables are complete before any launch
    // on the executor's stream reads them, and no running work is waited for.
    kernels::cuda::check(cudaMemcpyAsync(copy->info().data, blob.data(), blob.size(),
                                         cudaMemcpyHostToDevice, cudaStreamPerThread),
                         "uploading page format tables", device);
    kernels::cuda::check(cudaStreamSynchronize(cudaStreamPerThread), "uploading page format tables",
                         device);
    const kernels::cuda::PageFormatView view = tables.view_at(copy->info().data);
    it = entries.emplace(key, Entry{codec, std::move(copy), view}).first;
    return it->second.view;
  }
};

CudaExecutor::CudaExecutor(int device, MemoryResource& memory)
    : device_(device), memory_(memory), formats_(std::make_unique<Formats>()) {
  // The stream, the events and the buffers belong to `device`; the caller's current
  // device is its own again afterwards.
  const kernels::cuda::DeviceGuard on(device);
  if (memory.space() != MemorySpace::device || memory.device() != device) {
    throw std::invalid_argument("cuda executor on CUDA device " + std::to_string(device) +
                                ": its memory resource must be that device's memory, not " +
                                std::string(memory.name()) + " memory");
  }
  auto cuda = std::make_unique<Device>();
  cuda->device = device;
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
  cuda->results =
      memory.allocate(sizeof(unsigned long long) * kMaxInFlight, "executor check results");
  cuda->first_bad = reinterpret_cast<unsigned long long*>(cuda->results->info().data);
  void* results = nullptr;
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
    queued_.push_back(Job{std::move(op), std::move(done), {}});
  }
  wake_.notify_all();
}

void CudaExecutor::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [this] { return in_flight_ == 0; });
}

void CudaExecutor::select_device(const char* thread) {
  if (const cudaError_t status = cudaSetDevice(device_); status != cudaSuccess) {
    mark_unusable(std::string("the executor's ") + thread + " thread cannot select it (" +
                  kernels::cuda::handled_error_text(status) + ")");
  }
}

void CudaExecutor::mark_unusable(const std::string& reason) {
  {
    const std::lock_guard lock(mutex_);
    if (!fault_.empty()) return;
    fault_ = "CUDA device " + std::to_string(device_) + " is unusable: " + reason +
             "; every later operation on it fails until statepoold is restarted";
  }
  STATEPOOL_LOG(support::LogLevel::error, "cuda", fault_);
}

std::exception_ptr CudaExecutor::failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CudaError& e) {
    const auto status = static_cast<cudaError_t>(e.code());
    if (!e.from_driver() && kernels::cuda::is_sticky(status)) mark_unusable(e.what());
    return std::make_exception_ptr(StatusError(Status::internal, std::string("cuda ") + e.what()));
  } catch (...) {
    return std::current_exception();
  }
}

std::string CudaExecutor::fault() const {
  const std::lock_guard lock(mutex_);
  return fault_;
}

void CudaExecutor::launch_loop() {
  select_device("launcher");
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
    const std::string fault = fault_;
    lock.unlock();
    std::exception_ptr error;
    bool launched_any = false;
    if (!fault.empty()) {
      error = std::make_exception_ptr(StatusError(Status::internal, fault));
    } else {
      try {
        enqueue(job, slot, launched_any);
      } catch (...) {
        error = failure(std::current_exception());
      }
    }
    if (error) {
      // A refusal enqueues nothing. A failure after a first launch leaves kernels that may
      // still read the job's memory: wait for the stream before letting it go.
      if (launched_any) {
        if (const cudaError_t status = cudaStreamSynchronize(cuda_->stream);
            status != cudaSuccess) {
          const std::string text = kernels::cuda::handled_error_text(status);
          if (kernels::cuda::is_sticky(status)) mark_unusable("cudaStreamSynchronize: " + text);
        }
      }
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

void CudaExecutor::wait_for_client(const Operation& op) {
  cudaIpcEventHandle_t handle{};
  static_assert(sizeof(handle) == sizeof(IpcEventBytes));
  std::memcpy(&handle, op.after->data(), sizeof(handle));
  cudaEvent_t event = nullptr;
  if (const cudaError_t status = cudaIpcOpenEventHandle(&event, handle); status != cudaSuccess) {
    throw StatusError(Status::invalid_argument,
                      std::string(to_string(op.kind)) + ": the `after` event cannot be opened (" +
                          kernels::cuda::handled_error_text(status) +
                          "): it must be the IPC handle of an interprocess event "
                          "(cudaEventInterprocess | cudaEventDisableTiming) of a live process "
                          "on this machine");
  }
  // The wait is enqueued now (it waits for the event's last record before this call);
  // destroying the imported event afterwards does not undo it.
  const cudaError_t wait = cudaStreamWaitEvent(cuda_->stream, event, 0);
  kernels::cuda::report_release_failure("cudaEventDestroy (an `after` event)", device_,
                                        cudaEventDestroy(event));
  check_op(wait, "waiting for the `after` event (cudaStreamWaitEvent)", op.kind, device_);
}

void CudaExecutor::enqueue(Job& job, std::uint32_t slot, bool& launched_any) {
  const Operation& op = job.op;
  if (op.state_view || op.kv_view) {
    // Before anything else: nothing waits, nothing is launched.
    throw StatusError(Status::invalid_argument,
                      std::string(to_string(op.kind)) +
                          ": staged views (a value-major state, a conv state apart, strided KV "
                          "rows) need the host backend; the cuda executor takes the packed "
                          "staged layout (kernels/page.hpp, kernels/kv.hpp) in device memory");
  }
  for (const kernels::BufferRef* buffer : {&op.staged, &op.page, &op.source}) {
    // A copy may have one end in the daemon's host memory (prefix-state snapshots moving
    // between the pool and its host and remote tiers): cudaMemcpyDefault handles that.
    // (KV chunks may be host memory too: enqueue_kv copies them.)
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
  if (op.after) wait_for_client(op);
  if (op.kind == OperationKind::copy) {
    if (op.source.size != op.page.size) {
      throw StatusError(Status::invalid_argument,
                        "copy: source page of " + std::to_string(op.source.size) +
                            " bytes, destination of " + std::to_string(op.page.size));
    }
    if (op.page.data != op.source.data && op.page.size != 0) {
      check_op(
          cudaMemcpyAsync(op.page.data, op.source.data, op.page.size, cudaMemcpyDefault, stream),
          "cudaMemcpyAsync", op.kind, device_);
      launched_any = true;
    }
    check_op(cudaEventRecord(cuda_->events[slot], stream), "cudaEventRecord", op.kind, device_);
    return;
  }

  if (op.kind == OperationKind::kv_encode || op.kind == OperationKind::kv_decode) {
    enqueue_kv(job, launched_any);
    check_op(cudaEventRecord(cuda_->events[slot], stream), "cudaEventRecord", op.kind, device_);
    return;
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
    view = &formats_->view(op.codec, op.dtype, memory_, device_);
  } catch (const StatusError&) {
    throw;
  } catch (const CudaError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw StatusError(Status::invalid_argument, e.what());
  } catch (const std::exception& e) {
    throw StatusError(Status::internal, e.what());
  }
  if (op.kind == OperationKind::compress) {
    unsigned long long* first_bad = cuda_->first_bad + slot;
    check_op(kernels::cuda::find_non_finite(*view, op.staged.data, first_bad, stream),
             "the non-finite check", op.kind, device_);
    launched_any = true;
    check_op(kernels::cuda::encode_page(*view, op.staged.data, op.page.data, first_bad, stream),
             "the encode kernel", op.kind, device_);
    check_op(cudaMemcpyAsync(cuda_->first_bad_host + slot, first_bad, sizeof(*first_bad),
                             cudaMemcpyDeviceToHost, stream),
             "reading the check", op.kind, device_);
  } else {
    check_op(kernels::cuda::decode_page(*view, op.page.data, op.staged.data, stream),
             "the decode kernel", op.kind, device_);
    launched_any = true;
  }
  check_op(cudaEventRecord(cuda_->events[slot], stream), "cudaEventRecord", op.kind, device_);
}

namespace {

/// The per-stream pointer arrays of one batched launch (one role: every layer's keys, or
/// every layer's values), as the kernels read them from device memory.
struct KvArrays {
  std::vector<const void*> plain;
  std::vector<void*> encoded;
  std::vector<kernels::KvRole> roles;
};

}  // namespace

// KV blocks: two batched launches (keys of every layer, values of every layer: the
// kernels take one shape per launch). Rare operations (a hybrid put or get), so the
// launcher may wait here: for a put, the finiteness scan's result is read before anything
// is written, as the host executor guarantees.
void CudaExecutor::enqueue_kv(Job& job, bool& launched_any) {
  const Operation& op = job.op;
  cudaStream_t stream = cuda_->stream;
  const OperationKind kind = op.kind;
  const char* fn = to_string(kind);
  if (!can_access(op.staged.space, op.staged.device)) {
    throw StatusError(Status::invalid_argument, std::string("the cuda executor (device ") +
                                                    std::to_string(device_) + ") cannot " + fn +
                                                    " KV values in host memory");
  }
  if (const char* problem = kernels::kv_blocks_problem(op.kv)) {
    throw StatusError(Status::invalid_argument, std::string(fn) + ": " + problem);
  }
  const std::uint64_t plain_bytes = kernels::kv_blocks_plain_bytes(op.kv, op.dtype);
  if (plain_bytes == 0 || op.staged.size != plain_bytes) {
    throw StatusError(Status::invalid_argument,
                      std::string(fn) + ": " + kernels::describe(op.kv) + " in " +
                          kernels::to_string(op.dtype) + " take " + std::to_string(plain_bytes) +
                          " bytes, the staged range has " + std::to_string(op.staged.size));
  }
  const std::uintptr_t element = kernels::dtype_bytes(op.dtype);
  if (reinterpret_cast<std::uintptr_t>(op.staged.data) % element != 0) {
    throw StatusError(Status::invalid_argument,
                      std::string(fn) +
                          ": on the cuda backend KV values must start at an "
                          "offset that is a multiple of " +
                          std::to_string(element) + " bytes for " + kernels::to_string(op.dtype));
  }
  const std::uint64_t encoded_bytes = kernels::kv_blocks_encoded_bytes(op.kv);
  std::uint64_t chunked = 0;
  for (const kernels::BufferRef& chunk : op.chunks) {
    if (chunk.space == MemorySpace::device && !can_access(chunk.space, chunk.device)) {
      throw StatusError(Status::invalid_argument, std::string("the cuda executor (device ") +
                                                      std::to_string(device_) + ") cannot " + fn +
                                                      " memory on CUDA device " +
                                                      std::to_string(chunk.device));
    }
    chunked += chunk.size;
  }
  if (chunked != encoded_bytes) {
    throw StatusError(Status::invalid_argument, std::string(fn) + ": " + kernels::describe(op.kv) +
                                                    " encode to " + std::to_string(encoded_bytes) +
                                                    " bytes, the chunks hold " +
                                                    std::to_string(chunked));
  }

  // The encoded blocks in one device buffer: the only chunk when it is device memory,
  // else scratch after the tables (below).
  const bool in_place = op.chunks.size() == 1 && op.chunks[0].space == MemorySpace::device;

  // Device copies of the arrays, the scan's results and (unless in place) the encoded
  // blocks: one scratch allocation of the executor's memory resource, held by the job
  // until its work is complete.
  const std::size_t layers = op.kv.layers;
  const std::size_t pointers = 2 * layers * sizeof(void*);
  const std::size_t results = layers * sizeof(unsigned long long);
  // Per role: [plain pointers][encoded pointers][scan results][roles], each role's block
  // starting 256-byte aligned; then the encoded blocks.
  const std::size_t block = (pointers + results + layers + 255) / 256 * 256;
  const std::shared_ptr<Allocation> scratch =
      memory_.allocate(2 * block + (in_place ? 0 : encoded_bytes), "KV scratch");
  job.scratch.push_back(scratch);
  std::byte* const tables = scratch->info().data;
  std::array<std::byte*, 2> base{tables, tables + block};
  std::byte* encoded = in_place ? op.chunks[0].data : tables + 2 * block;
  const std::vector<kernels::KvBlockStream> streams = kernels::kv_block_streams(op.kv, op.dtype);
  std::array<KvArrays, 2> roles;  // [keys, values]
  for (const kernels::KvBlockStream& s : streams) {
    KvArrays& a = roles[s.stream.role == kernels::KvRole::keys ? 0 : 1];
    a.plain.push_back(op.staged.data + s.plain_offset);
    a.encoded.push_back(encoded + s.encoded_offset);
    a.roles.push_back(s.stream.role);
  }
  for (std::size_t r = 0; r < 2; ++r) {
    const KvArrays& a = roles[r];
    if (a.plain.empty()) continue;
    check_op(cudaMemcpyAsync(base[r], a.plain.data(), layers * sizeof(void*),
                             cudaMemcpyHostToDevice, stream),
             "uploading the stream table", kind, device_);
    check_op(cudaMemcpyAsync(base[r] + layers * sizeof(void*), a.encoded.data(),
                             layers * sizeof(void*), cudaMemcpyHostToDevice, stream),
             "uploading the stream table", kind, device_);
    check_op(cudaMemcpyAsync(base[r] + pointers + results, a.roles.data(), layers,
                             cudaMemcpyHostToDevice, stream),
             "uploading the stream table", kind, device_);
  }
  launched_any = true;
  const auto view = [&](std::size_t r) {
    return kernels::cuda::KvBatchView{op.kv.codec, op.dtype, op.kv.tokens,
                                      r == 0 ? op.kv.key_channels : op.kv.value_channels};
  };
  const auto plain_of = [&](std::size_t r) {
    return reinterpret_cast<const void* const*>(base[r]);  // NOLINT
  };
  const auto encoded_of = [&](std::size_t r) {
    return reinterpret_cast<void* const*>(base[r] + layers * sizeof(void*));  // NOLINT
  };
  const auto first_of = [&](std::size_t r) {
    return reinterpret_cast<unsigned long long*>(base[r] + pointers);  // NOLINT
  };
  const auto roles_of = [&](std::size_t r) {
    return reinterpret_cast<const kernels::KvRole*>(base[r] + pointers + results);  // NOLINT
  };
  const auto count = [&](std::size_t r) {
    return static_cast<std::uint32_t>(roles[r].plain.size());
  };

  if (kind == OperationKind::kv_encode) {
    for (std::size_t r = 0; r < 2; ++r) {
      if (count(r) == 0) continue;
      check_op(kernels::cuda::kv_find_non_finite_streams(view(r), plain_of(r), count(r),
                                                         first_of(r), stream),
               "the non-finite scan", kind, device_);
    }
    std::vector<unsigned long long> first(2 * layers, kAllFinite);
    for (std::size_t r = 0; r < 2; ++r) {
      if (count(r) == 0) continue;
      check_op(cudaMemcpyAsync(first.data() + r * layers, first_of(r), results,
                               cudaMemcpyDeviceToHost, stream),
               "reading the scan", kind, device_);
    }
    check_op(cudaStreamSynchronize(stream), "the non-finite scan", kind, device_);
    for (const kernels::KvBlockStream& s : streams) {  // in stream order: the first bad one
      const std::size_t r = s.stream.role == kernels::KvRole::keys ? 0 : 1;
      const unsigned long long bad = first[r * layers + s.layer];
      if (bad == kAllFinite) continue;
      float value = std::numeric_limits<float>::quiet_NaN();
      const std::byte* at = op.staged.data + s.plain_offset + bad * element;
      if (op.dtype == kernels::DType::f32) {
        check_op(cudaMemcpy(&value, at, 4, cudaMemcpyDeviceToHost), "reading the non-finite value",
                 kind, device_);
      } else {
        std::uint16_t bits = 0;
        check_op(cudaMemcpy(&bits, at, 2, cudaMemcpyDeviceToHost), "reading the non-finite value",
                 kind, device_);
        value = op.dtype == kernels::DType::bf16 ? kernels::bf16_bits_to_float(bits)
                                                 : kernels::half_bits_to_float(bits);
      }
      const kernels::KvNonFiniteError error(s.stream, bad / s.stream.channels,
                                            bad % s.stream.channels, value);
      throw StatusError(Status::not_finite, error.what());
    }
    for (std::size_t r = 0; r < 2; ++r) {
      if (count(r) == 0) continue;
      check_op(kernels::cuda::kv_encode_streams(view(r), roles_of(r), plain_of(r), encoded_of(r),
                                                count(r), nullptr, stream),
               "the KV encode kernel", kind, device_);
    }
    if (!in_place) {
      std::uint64_t at = 0;
      for (const kernels::BufferRef& chunk : op.chunks) {
        check_op(cudaMemcpyAsync(chunk.data, encoded + at, chunk.size, cudaMemcpyDefault, stream),
                 "copying into the chunks", kind, device_);
        at += chunk.size;
      }
    }
    return;
  }
  if (!in_place) {
    std::uint64_t at = 0;
    for (const kernels::BufferRef& chunk : op.chunks) {
      check_op(cudaMemcpyAsync(encoded + at, chunk.data, chunk.size, cudaMemcpyDefault, stream),
               "gathering the chunks", kind, device_);
      at += chunk.size;
    }
  }
  for (std::size_t r = 0; r < 2; ++r) {
    if (count(r) == 0) continue;
    check_op(
        kernels::cuda::kv_decode_streams(view(r), roles_of(r), encoded_of(r),
                                         const_cast<void* const*>(plain_of(r)), count(r), stream),
        "the KV decode kernel", kind, device_);
  }
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
    check_op(cudaMemcpy(&value, op.staged.data + bad * 4, 4, cudaMemcpyDeviceToHost),
             "reading the non-finite value", op.kind, device_);
  } else {
    std::uint16_t bits = 0;
    check_op(cudaMemcpy(&bits, op.staged.data + bad * 2, 2, cudaMemcpyDeviceToHost),
             "reading the non-finite value", op.kind, device_);
    value = kernels::bf16_bits_to_float(bits);
  }
  // The value is read again to name it: an engine that rewrote it since finds it named
  // as it is now, and told so (the scan's index is what counts).
  const bool rewritten = !kernels::is_non_finite_bits(kernels::float_bits(value));
  const kernels::NonFiniteError error(head_index / layout.num_heads, head_index % layout.num_heads,
                                      static_cast<std::size_t>(bad % per_head), value,
                                      layout.value_dim);
  return std::make_exception_ptr(StatusError(
      Status::not_finite,
      std::string(error.what()) +
          (rewritten ? " (read again after the check: the state changed while it was compressed)"
                     : "")));
}

void CudaExecutor::complete_loop() {
  select_device("completer");
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
    try {
      check_op(cudaEventSynchronize(cuda_->events[slot]),
               "waiting for the work (cudaEventSynchronize)", job.op.kind, device_);
      error = check_result(job, slot);
    } catch (...) {
      error = failure(std::current_exception());
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
  job.scratch.clear();
  try {
    job.done(error);
  } catch (...) {
    // As in HostExecutor: an undeliverable completion must not keep wait_idle() waiting.
  }
  const std::lock_guard lock(mutex_);
  if (--in_flight_ == 0) idle_.notify_all();
}

}  // namespace statepool::service
