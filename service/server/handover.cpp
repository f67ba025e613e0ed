// The predecessor's side of a hand-over (server.hpp, handover/transfer.hpp): the
// hand-over listener, the conversation with a successor on a thread of its own, and the
// pause of the server while it runs. The successor's side is server/takeover.cpp.
//
// Order of events, and who does what:
//   handover_loop (control_)   accepts a successor of the same uid (or root), starts the
//                              conversation thread; a second one meanwhile is refused
//   hand_over (its thread)     reads the request, asks the server to pause and waits
//   begin_handover (control_)  stops accepting (the listener stays open: connections
//                              wait in its backlog for the successor), stops reclaiming,
//                              closes idle sessions, lets busy ones finish their request
//   check_paused (control_)    once every session has ended: the listeners to send
//   hand_over                  saves the pool's state, sends it with every descriptor,
//                              waits for the verdict
//   end_handover (control_)    ok: run() returns and the process exits leaving the
//                              socket files; otherwise the server serves on

#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <future>
#include <utility>

#include "handover/image.hpp"
#include "handover/transfer.hpp"
#include "http/server.hpp"
#include "server/crash_journal.hpp"
#include "server/server.hpp"
#include "server/session.hpp"
#include "server/systemd.hpp"
#include "statepool/support/log.hpp"
#include "statepool/support/version.hpp"

namespace statepool::service {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using std::chrono::steady_clock;

namespace {

/// How long a successor may take to send its request, and to judge what it received
/// (mapping a large pool's memory takes a while).
constexpr std::chrono::seconds kRequestTimeout{10};
constexpr std::chrono::seconds kVerdictTimeout{120};

/// The peer of a Unix socket (pid and uid -1 when unknown).
ucred peer_of(int socket) {
  ucred cred{-1, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
  socklen_t length = sizeof cred;
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    cred.pid = -1;
    cred.uid = static_cast<uid_t>(-1);
  }
  return cred;
}

}  // namespace

void Server::bind_handed_over(Listeners listeners) {
  boost::system::error_code ec;
  acceptor_.assign(local(), listeners.socket.get(), ec);
  if (ec) throw std::runtime_error("cannot serve the handed-over socket: " + ec.message());
  (void)listeners.socket.release();
  socket_unit_ = listeners.socket_unit;
  if (listeners.handover) {
    handover_acceptor_.assign(local(), listeners.handover.get(), ec);
    if (ec)
      throw std::runtime_error("cannot serve the handed-over hand-over socket: " + ec.message());
    (void)listeners.handover.release();
  }
  bind_http(std::move(listeners.api), std::move(listeners.metrics));
  spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

asio::awaitable<void> Server::handover_loop() {
  for (;;) {
    auto [ec, socket] =
        co_await handover_acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) {
      if (ec == asio::error::operation_aborted || !handover_acceptor_.is_open()) co_return;
      LOG_WARN("handover", "accept failed on ", config_.handover_socket, ": ", ec.message());
      asio::steady_timer pause(control_, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      continue;
    }
    support::UniqueFd peer(socket.release());
    const uid_t uid = peer_of(peer.get()).uid;
    if (uid != ::geteuid() && uid != 0) {
      LOG_WARN("handover", "refused a hand-over to uid ", uid, ": only this daemon's user (",
               ::geteuid(), ") or root may take it over");
      continue;
    }
    if (handover_busy_.exchange(true)) {
      handover::send_text(peer.get(), handover::MessageKind::refusal,
                          "another hand-over is under way", steady_clock::now() + kRequestTimeout);
      continue;
    }
    if (handover_thread_.joinable()) handover_thread_.join();  // the last one has ended
    handover_thread_ =
        std::thread([this, fd = std::move(peer)]() mutable { hand_over(std::move(fd)); });
  }
}

void Server::hand_over(support::UniqueFd peer) {
  const auto started = steady_clock::now();
  bool paused = false;
  try {
    const handover::Message request =
        handover::receive_message(peer.get(), 64, started + kRequestTimeout);
    std::uint32_t version = 0;
    for (std::size_t i = 0; i < 4 && i < request.body.size(); ++i) {
      version |= std::uint32_t{std::to_integer<std::uint8_t>(request.body[i])} << (8 * i);
    }
    if (request.kind != handover::MessageKind::request || request.body.size() != 4) {
      throw handover::HandoverError("the successor did not send a hand-over request");
    }
    if (version != handover::kImageVersion) {
      const std::string why = "the successor reads hand-over images of version " +
                              std::to_string(version) + ", this statepoold writes version " +
                              std::to_string(handover::kImageVersion);
      handover::send_text(peer.get(), handover::MessageKind::refusal, why,
                          steady_clock::now() + kRequestTimeout);
      throw handover::HandoverError(why);
    }
    LOG_INFO("handover",
             "a successor asks to take over: pausing (every connection finishes "
             "its request and closes; new ones wait for the successor)");
    auto promise = std::make_shared<std::promise<Pause>>();
    std::future<Pause> ready = promise->get_future();
    asio::post(control_, [this, promise] { begin_handover(promise); });
    // The drain timer closes what is still busy after --drain-timeout; a drain that ends
    // the process meanwhile stops io_ (then the pause never comes).
    const auto give_up = steady_clock::now() + config_.drain_timeout + kStopMargin;
    while (ready.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (io_.stopped() || steady_clock::now() > give_up) {
        throw handover::HandoverError("the server did not pause (it is stopping)");
      }
    }
    Pause pause = ready.get();
    if (!pause.refusal.empty()) {
      handover::send_text(peer.get(), handover::MessageKind::refusal, pause.refusal,
                          steady_clock::now() + kRequestTimeout);
      LOG_WARN("handover", "refused a hand-over: ", pause.refusal);
      handover_busy_.store(false);
      return;
    }
    paused = true;
    // The successor continues the journal (the store keeps it under the same name).
    std::pair<int, std::string> journal{-1, {}};
    if (crash_journal_ != nullptr) journal = crash_journal_->pause();
    const auto saved_at = steady_clock::now();
    const PoolState state = pool_.save_state();
    for (const PoolStateArena& arena : state.arenas) {
      if (arena.fd < 0) {
        const std::string why = "arena " + std::to_string(arena.id) +
                                " is shared as legacy CUDA IPC handles, which cannot change "
                                "owners: drain and restart this daemon instead";
        handover::send_text(peer.get(), handover::MessageKind::refusal, why,
                            steady_clock::now() + kRequestTimeout);
        throw handover::HandoverError(why);
      }
    }
    handover::ImageMeta meta;
    meta.generation = generation_;
    meta.daemon_version = std::string("statepoold ") + statepool::support::version();
    meta.backend = std::string(pool_.backend_name());
    meta.device = pool_.memory().device();
    const std::vector<std::byte> image = handover::encode_image(state, meta);
    std::vector<handover::NamedFd> fds;
    for (const auto& [name, fd] : pause.listeners) fds.push_back({name, fd});
    if (journal.first >= 0) fds.push_back({"journal " + journal.second, journal.first});
    std::uint64_t pages = 0;
    for (const PoolStateArena& arena : state.arenas) {
      fds.push_back({"arena " + std::to_string(arena.id), arena.fd});
      for (const LeaseId owner : arena.owner) pages += owner != 0 ? 1 : 0;
    }
    handover::send_state(peer.get(), fds, image, steady_clock::now() + kVerdictTimeout);
    const handover::Message verdict =
        handover::receive_message(peer.get(), 4096, steady_clock::now() + kVerdictTimeout);
    const std::string said(reinterpret_cast<const char*>(verdict.body.data()), verdict.body.size());
    if (verdict.kind != handover::MessageKind::verdict || said != "ok") {
      throw handover::HandoverError("the successor refused: " + said);
    }
    // A service manager follows the pool to its new process: the successor is the
    // unit's main process before this one exits (systemd processes the message first).
    if (const pid_t successor = peer_of(peer.get()).pid; successor > 0) {
      systemd::notify_and_wait("MAINPID=" + std::to_string(successor));
    }
    // The last word is ours: the successor serves only once it has read it, so the two
    // never serve at once (a verdict that came too late finds the socket closed instead).
    handover::send_text(peer.get(), handover::MessageKind::verdict, "bye",
                        steady_clock::now() + kRequestTimeout);
    const auto ms = [](steady_clock::duration d) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    };
    LOG_INFO("handover", "handed over to the successor: ", state.arenas.size(), " arenas, ", pages,
             " pages, ", state.leases.size(), " leases, ", state.snapshots.size(),
             " snapshots; image ", image.size(), " bytes; paused ",
             ms(steady_clock::now() - started), " ms, of which ",
             ms(steady_clock::now() - saved_at), " ms to save, send and hear back");
    asio::post(control_, [this] { end_handover(true, ""); });
  } catch (const std::exception& e) {
    LOG_ERROR("handover", "hand-over failed: ", e.what(), paused ? "; serving on" : "");
    if (paused) {
      if (crash_journal_ != nullptr) crash_journal_->resume();
      const std::string why = e.what();
      asio::post(control_, [this, why] { end_handover(false, why); });
    } else {
      handover_busy_.store(false);
    }
  }
}

void Server::begin_handover(std::shared_ptr<std::promise<Pause>> paused) {
  if (draining_.load() || handing_over_) {
    paused->set_value({"the running statepoold is draining (" + drain_reason_ + ")", {}});
    return;
  }
  handing_over_ = true;
  paused_ = std::move(paused);
  draining_.store(true);  // /readyz answers 503, the accept and reclaim loops end
  if (metrics_ != nullptr) metrics_->set_draining(true);
  systemd::notify("STATUS=handing over to a successor");
  if (!accept_loop_done_) {
    boost::system::error_code ignored;
    acceptor_.cancel(ignored);
  }
  reclaim_timer_.cancel();
  listener_closed_.store(true);  // a client that reconnects lands in the successor's backlog
  {
    const std::lock_guard lock(sessions_mutex_);
    for (auto& [id, weak] : sessions_)
      if (auto session = weak.lock()) session->close_when_idle();
  }
  arm_drain_timer();
  check_paused();
}

void Server::check_paused() {
  if (!handing_over_ || paused_ == nullptr || !accept_loop_done_ || sessions_live_.load() != 0) {
    return;
  }
  drain_timer_.cancel();
  Pause pause;
  pause.listeners.emplace_back(socket_unit_ ? "listener of a socket unit" : "listener",
                               acceptor_.native_handle());
  pause.listeners.emplace_back("handover", handover_acceptor_.native_handle());
  // Waiting after the hand-over (Kubernetes), this daemon keeps its HTTP listeners: they
  // are in its own network namespace, and its probes must answer until it is deleted.
  if (!config_.wait_after_handover) {
    if (api_) pause.listeners.emplace_back("api", api_->native_handle());
    if (metrics_http_) pause.listeners.emplace_back("metrics", metrics_http_->native_handle());
  }
  std::exchange(paused_, nullptr)->set_value(std::move(pause));
}

void Server::end_handover(bool done, const std::string& why) {
  handover_busy_.store(false);
  if (done) {
    handed_over_.store(true);
    owns_socket_file_ = false;  // the successor's now
    owns_handover_file_ = false;
    // A SIGTERM that came during the hand-over ends this process now, waiting or not.
    if (!config_.wait_after_handover || !deferred_drain_.empty()) {
      io_.stop();
      return;
    }
    // --after-handover=wait: the probes answer (/readyz 503) until SIGTERM ends the process.
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    handover_acceptor_.close(ignored);
    LOG_INFO("handover",
             "waiting for SIGTERM (--after-handover wait): /healthz answers 200, /readyz 503");
    systemd::notify("STATUS=handed over to a successor; waiting for SIGTERM");
    return;
  }
  LOG_WARN("handover", "serving on after the failed hand-over (", why, ")");
  handing_over_ = false;
  draining_.store(false);
  listener_closed_.store(false);
  if (metrics_ != nullptr) metrics_->set_draining(false);
  systemd::notify("STATUS=serving " + config_.socket_path);
  accept_loop_done_ = false;
  asio::co_spawn(control_, accept_loop(), asio::detached);
  asio::co_spawn(control_, reclaim_loop(), asio::detached);
  if (!deferred_drain_.empty()) begin_drain(std::exchange(deferred_drain_, {}));
}

void Server::own_socket_files() noexcept {
  owns_socket_file_ = !socket_unit_;
  owns_handover_file_ = handover_acceptor_.is_open() && !config_.handover_socket.empty();
}

void Server::start_successor() {
  if (successor_argv_.empty() || config_.handover_socket.empty()) {
    LOG_WARN("handover", "SIGUSR2 ignored: this daemon has no hand-over socket");
    return;
  }
  if (handover_busy_.load() || draining_.load()) {
    LOG_WARN("handover", "SIGUSR2 ignored: a hand-over or a drain is under way");
    return;
  }
  // Whatever --take-over this daemon was started with, its successor must take over.
  std::vector<std::string> argv = successor_argv_;
  std::erase_if(argv, [](const std::string& arg) { return arg.rfind("--take-over", 0) == 0; });
  argv.emplace_back("--take-over");
  std::vector<char*> cargv;
  for (std::string& arg : argv) cargv.push_back(arg.data());
  cargv.push_back(nullptr);
  // The successor starts with no signal blocked (its main blocks what it takes).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), nullptr, &attr, cargv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    LOG_ERROR("handover", "SIGUSR2: cannot start the successor ", argv[0], ": ", std::strerror(rc));
    return;
  }
  LOG_INFO("handover", "SIGUSR2: started the successor ", argv[0], " (pid ", pid,
           "); it asks for the pool");
  // Reaped here if it ends while this process lives (a refused hand-over): no zombie.
  std::thread([pid] {
    int status = 0;
    if (::waitpid(pid, &status, 0) == pid) {
      LOG_INFO("handover", "the successor (pid ", pid, ") exited with ",
               WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
  }).detach();
}

}  // namespace statepool::service
