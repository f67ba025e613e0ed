#pragma once
// GoogleTest only (header-only; include it from tests, which link GTest): a Daemon that
// prints the daemon's log to stderr when the test it ran in has failed, so a failing
// integration test shows what the daemon said.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <iostream>

#include "statepool/testing/daemon.hpp"

namespace statepool::testing {

class DaemonProcess : public Daemon {
 public:
  using Daemon::Daemon;
  ~DaemonProcess() {
    // Stop first, so the log printed is the whole log; ~Daemon then removes it.
    if (running()) stop(SIGKILL, std::chrono::seconds(5));
    if (::testing::Test::HasFailure()) std::cerr << "---- statepoold log ----\n" << log();
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
};

}  // namespace statepool::testing
