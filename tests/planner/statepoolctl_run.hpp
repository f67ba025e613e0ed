#pragma once
// What the planner's command-line tests share: the model configs in docs/models and a
// statepoolctl run with its exit status and output. Tests that include this define
// STATEPOOL_MODELS_DIR and STATEPOOLCTL_PATH (tests/planner/CMakeLists.txt).

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "statepool/support/read_file.hpp"

namespace statepool::testing {

inline std::string model_path(const std::string& file) {
  return std::string(STATEPOOL_MODELS_DIR) + "/" + file;
}

/// A model config's text (configs are a few KiB).
inline std::string model_text(const std::string& file) {
  return support::read_file(model_path(file), std::size_t{1} << 20);
}

struct ToolRun {
  int code = -1;
  std::string output;  ///< stdout and stderr together
};

/// Runs `statepoolctl ARGS` through the shell.
inline ToolRun statepoolctl(const std::string& args) {
  ToolRun run;
  FILE* pipe = ::popen((std::string(STATEPOOLCTL_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) run.output += buffer.data();
  const int status = ::pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace statepool::testing
