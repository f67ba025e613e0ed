// A client process for the CUDA memory tests: maps a daemon-side allocation the way a
// serving engine does (kernels::cuda::ImportedVmm / ImportedIpc), checks its bytes and
// writes its own. Started with posix_spawn (fork + exec), so it never inherits the test's
// CUDA context.
//
//   cuda_peer vmm <device> <bytes> <expect> <reply> exit|hold
//   cuda_peer ipc <device> <bytes> <expect> <reply> exit|hold <handle as 128 hex digits>
//
// Descriptor 3 is a Unix stream socket to the test. For vmm the test sends the VMM
// descriptor on it first (SCM_RIGHTS). The peer checks that every byte is <expect>,
// writes <reply> everywhere, waits for the device, and then sends one byte ('k') on the
// socket. With `exit` it unmaps and exits 0; with `hold` it keeps the memory mapped until
// it is killed. Failures exit non-zero with a message on stderr:
//   2 usage, 3 no descriptor received, 4 mapping failed, 5 unexpected bytes, 6 writing
//   failed, 7 the socket failed.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "statepool/kernels/cuda/vmm.hpp"
#include "statepool/support/fd_passing.hpp"

namespace {

using statepool::kernels::cuda::check;
using statepool::kernels::cuda::ImportedIpc;
using statepool::kernels::cuda::ImportedVmm;
using statepool::kernels::cuda::IpcHandleBytes;

constexpr int kSocket = 3;

[[noreturn]] void fail(int code, const std::string& why) {
  std::fprintf(stderr, "cuda_peer: %s\n", why.c_str());
  std::_Exit(code);
}

IpcHandleBytes parse_handle(std::string_view hex) {
  IpcHandleBytes out{};
  if (hex.size() != out.size() * 2) fail(2, "the IPC handle needs 128 hex digits");
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(std::stoul(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  }
  return out;
}

int run(int argc, char** argv) {
  if (argc < 7) fail(2, "usage: cuda_peer vmm|ipc <device> <bytes> <expect> <reply> exit|hold");
  const std::string_view kind = argv[1];
  const int device = std::stoi(argv[2]);
  const std::size_t bytes = std::stoull(argv[3]);
  const int expect = std::stoi(argv[4]);
  const int reply = std::stoi(argv[5]);
  const bool hold = std::string_view(argv[6]) == "hold";

  std::variant<std::monostate, ImportedVmm, ImportedIpc> mapping;
  std::byte* data = nullptr;
  try {
    if (kind == "vmm") {
      std::byte byte{};
      std::vector<statepool::support::UniqueFd> fds;
      if (statepool::support::recv_with_fds(kSocket, {&byte, 1}, fds, 0) != 1 || fds.size() != 1) {
        fail(3, "no VMM descriptor arrived");
      }
      data = mapping.emplace<ImportedVmm>(fds[0].get(), bytes, device).data();
      // fds[0] closes here: an imported allocation needs no descriptor any more.
    } else if (kind == "ipc") {
      if (argc < 8) fail(2, "ipc needs the handle");
      data = mapping.emplace<ImportedIpc>(parse_handle(argv[7]), device).data();
    } else {
      fail(2, "unknown kind " + std::string(kind));
    }
  } catch (const std::exception& e) {
    fail(4, e.what());
  }

  try {
    const statepool::kernels::cuda::DeviceGuard guard(device);
    std::vector<unsigned char> host(bytes);
    check(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", device);
    for (std::size_t i = 0; i < bytes; ++i) {
      if (host[i] != expect) {
        fail(5, "byte " + std::to_string(i) + " is " + std::to_string(host[i]) + ", expected " +
                    std::to_string(expect));
      }
    }
    check(cudaMemset(data, reply, bytes), "cudaMemset", device);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
  } catch (const std::exception& e) {
    fail(6, e.what());
  }

  const char done = 'k';
  if (::send(kSocket, &done, 1, MSG_NOSIGNAL) != 1) fail(7, "cannot report to the test");
  if (hold) {
    for (;;) ::pause();  // until the test kills us, memory mapped
  }
  return 0;  // `mapping` unmaps on the way out
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fail(2, e.what());
  }
}
