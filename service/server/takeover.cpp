#include "server/takeover.hpp"

#include <exception>
#include <map>
#include <utility>

#include "handover/transfer.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/size.hpp"

namespace statepool::service {
namespace {

using std::chrono::steady_clock;

constexpr std::chrono::seconds kStateTimeout{120};  // the predecessor's pause included
/// Descriptors a hand-over may carry: the four listeners and the arenas (each tenant's
/// max-arenas is at most 64 by default; operators may raise it).
constexpr std::size_t kMaxHandoverFds = 1u << 16;
constexpr std::uint64_t kMaxImageBytes = 1ull << 30;

}  // namespace

std::optional<TakenOver> take_over(const Config& config, Pool& pool) {
  const auto started = steady_clock::now();
  TakenOver out;
  try {
    out.peer = handover::connect(config.handover_socket);
  } catch (const handover::NoPredecessor& e) {
    if (config.take_over_if_running) {
      LOG_INFO("handover", "no statepoold runs on ", config.handover_socket,
               " (--take-over=if-running): starting with an empty pool");
      return std::nullopt;
    }
    throw std::runtime_error(std::string("--take-over: ") + e.what());
  } catch (const handover::HandoverError& e) {
    throw std::runtime_error(std::string("--take-over: ") + e.what());
  }
  const auto refuse_back = [&](const std::string& why) {
    try {
      handover::send_text(out.peer.get(), handover::MessageKind::verdict, why,
                          steady_clock::now() + std::chrono::seconds(5));
    } catch (const std::exception&) {
      // The predecessor went away: it has nothing left to serve on either way.
    }
    return std::runtime_error("--take-over refused: " + why +
                              " (the running statepoold serves on)");
  };
  handover::ReceivedState received;
  try {
    std::array<std::byte, 4> version{};
    for (std::size_t i = 0; i < 4; ++i) {
      version[i] = static_cast<std::byte>(handover::kImageVersion >> (8 * i));
    }
    LOG_INFO("handover", "asking the statepoold on ", config.handover_socket,
             " to hand its pool over (it finishes its requests first, up to its drain timeout)");
    handover::send_message(out.peer.get(), handover::MessageKind::request, version, {},
                           steady_clock::now() + std::chrono::seconds(10));
    received = handover::receive_state(out.peer.get(), kMaxHandoverFds, kMaxImageBytes,
                                       steady_clock::now() + kStateTimeout);
  } catch (const handover::HandoverError& e) {
    throw std::runtime_error(std::string("--take-over: ") + e.what());
  }
  out.image_bytes = received.image.size();
  try {
    handover::DecodedImage image = handover::decode_image(received.image);
    out.meta = image.meta;
    if (const std::string differs =
            handover::backend_mismatch(image.meta, pool.backend_name(), pool.memory().device());
        !differs.empty()) {
      throw refuse_back("the running statepoold's pool is on " + differs);
    }
    std::map<std::string, support::UniqueFd, std::less<>> fds;
    for (auto& [name, fd] : received.fds) {
      if (!fds.emplace(name, std::move(fd)).second) {
        throw refuse_back("descriptor '" + name + "' sent twice");
      }
    }
    const auto take = [&](const std::string& name) {
      const auto it = fds.find(name);
      if (it == fds.end()) return support::UniqueFd();
      support::UniqueFd fd = std::move(it->second);
      fds.erase(it);
      return fd;
    };
    for (PoolStateArena& arena : image.state.arenas) {
      const auto it = fds.find("arena " + std::to_string(arena.id));
      if (it == fds.end()) throw refuse_back("no memory for arena " + std::to_string(arena.id));
      arena.fd = it->second.get();  // borrowed: restore_state takes its own copy
    }
    out.listeners.socket = take("listener");
    if (!out.listeners.socket) {
      out.listeners.socket = take("listener of a socket unit");
      out.listeners.socket_unit = static_cast<bool>(out.listeners.socket);
    }
    out.listeners.handover = take("handover");
    out.listeners.api = take("api");
    out.listeners.metrics = take("metrics");
    if (!out.listeners.socket) throw refuse_back("no listening socket was handed over");
    for (auto it = fds.begin(); it != fds.end(); ++it) {
      if (it->first.rfind("journal ", 0) == 0) {
        out.journal_name = it->first.substr(8);
        out.journal = std::move(it->second);
        fds.erase(it);
        break;
      }
    }
    for (const auto& [name, fd] : fds) {
      if (name.rfind("arena ", 0) != 0) throw refuse_back("unknown descriptor '" + name + "'");
    }
    if (fds.size() != image.state.arenas.size()) {
      throw refuse_back(std::to_string(fds.size()) + " arena descriptors for " +
                        std::to_string(image.state.arenas.size()) + " arenas");
    }
    out.report = pool.restore_state(image.state, Clock::now());
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("--take-over refused", 0) == 0) throw;
    throw refuse_back(e.what());
  }
  out.took = std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::now() - started);
  LOG_INFO("handover", "took over generation ", out.meta.generation, "'s pool: ", out.report.arenas,
           " arenas (", support::format_bytes(out.report.bytes), "), ", out.report.pages,
           " pages in use, ", out.report.leases, " leases, ", out.report.snapshots,
           " snapshots; image ", out.image_bytes, " bytes, ", out.took.count(), " ms");
  return out;
}

void confirm(TakenOver& taken) {
  try {
    handover::send_text(taken.peer.get(), handover::MessageKind::verdict, "ok",
                        steady_clock::now() + std::chrono::seconds(10));
    const handover::Message bye = handover::receive_message(
        taken.peer.get(), 16, steady_clock::now() + std::chrono::seconds(10));
    if (bye.kind != handover::MessageKind::verdict) {
      throw handover::HandoverError("the predecessor did not let go of the pool");
    }
  } catch (const handover::HandoverError& e) {
    throw std::runtime_error(std::string("--take-over: ") + e.what());
  }
  taken.peer.reset();
}

}  // namespace statepool::service
