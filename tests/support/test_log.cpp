// The daemon's log lines: RateLimitedLog, which the audit of refusals and the HTTP API's
// warnings write through, keeps a client that retries in a loop from flooding the log.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "statepool/support/log.hpp"

namespace statepool::support {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(RateLimitedLog, WritesABurstThenOneAPeriodAndCountsWhatItDropped) {
  RateLimitedLog log(LogLevel::warn, "test", "things", 3, std::chrono::milliseconds(200));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 10; ++i) log.write("thing " + std::to_string(i));
  std::vector<std::string> lines = lines_of(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find(" WARN  test: thing 0"), std::string::npos) << lines[0];
  EXPECT_NE(lines[2].find("thing 2"), std::string::npos) << lines[2];

  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  ::testing::internal::CaptureStderr();
  log.write("thing 10");
  log.write("thing 11");  // the bucket is empty again
  lines = lines_of(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("thing 10 (7 more things not shown)"), std::string::npos) << lines[0];
}

TEST(RateLimitedLog, BelowTheLogLevelNothingIsWritten) {
  RateLimitedLog log(LogLevel::info, "test", "things", 3, std::chrono::milliseconds(200));
  set_log_level(LogLevel::warn);
  ::testing::internal::CaptureStderr();
  log.write("hidden");
  const std::string out = ::testing::internal::GetCapturedStderr();
  set_log_level(LogLevel::info);
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace statepool::support
