// The strict .npy reader and writer (npy.hpp): round trips, and every malformed file
// refused with a message that says what is wrong.

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "statepool/calibration/npy.hpp"
#include "statepool/testing/temp_dir.hpp"

namespace statepool::calibration {
namespace {

using testing::TempDir;

// A .npy file with header text `dict` (padded like numpy) and `data_bytes` bytes of data.
std::string npy_file(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string text = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + text.size() + 1) % 64 != 0) text.push_back(' ');
  text.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  out.push_back(static_cast<char>(text.size() & 0xFF));
  out.push_back(static_cast<char>(text.size() >> 8));
  if (major != 1) {
    out.push_back('\0');
    out.push_back('\0');
  }
  return out + text + std::string(data_bytes, '\0');
}

const std::string kGood = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

TEST(Npy, RoundTripsShapesAndRowRanges) {
  TempDir dir;
  const std::vector<std::vector<std::uint64_t>> shapes = {{2, 3}, {5}, {}, {2, 0, 3}, {3, 4, 5, 6}};
  for (const auto& shape : shapes) {
    std::uint64_t n = 1;
    for (const auto e : shape) n *= e;
    std::vector<float> values(n);
    std::iota(values.begin(), values.end(), -1.5f);
    const std::string path = dir.file("a.npy");
    write_npy(path, shape, values);
    const std::string bytes = testing::read_bytes(path);
    const std::size_t header = bytes.size() - 4 * n;
    EXPECT_EQ(header % 64, 0u) << "numpy pads the header to 64 bytes";
    const NpyArray back = read_npy(path);
    EXPECT_EQ(back.shape, shape);
    EXPECT_EQ(back.data, values);
  }
  const std::string path = dir.file("rows.npy");
  std::vector<float> values(4 * 3 * 2);
  std::iota(values.begin(), values.end(), 0.0f);
  write_npy(path, std::vector<std::uint64_t>{4, 3, 2}, values);
  const NpyReader reader(path);
  EXPECT_EQ(reader.rows(), 4u);
  EXPECT_EQ(reader.row_values(), 6u);
  std::vector<float> rows(12);
  reader.read_rows(2, 2, rows);
  EXPECT_EQ(rows.front(), 12.0f);
  EXPECT_EQ(rows.back(), 23.0f);
  EXPECT_THROW(reader.read_rows(3, 2, rows), NpyError);
  std::vector<float> wrong(5);
  EXPECT_THROW(reader.read_rows(0, 1, wrong), NpyError);
}

TEST(Npy, AcceptsVersionTwoAndKeysInAnyOrder) {
  TempDir dir;
  testing::write_bytes(dir.file("v2.npy"), npy_file(kGood, 24, 2));
  EXPECT_EQ(NpyReader(dir.file("v2.npy")).shape(), (std::vector<std::uint64_t>{2, 3}));
  testing::write_bytes(
      dir.file("order.npy"),
      npy_file("{\"shape\": (6,), \"fortran_order\": False, \"descr\": '<f4'}", 24));
  EXPECT_EQ(NpyReader(dir.file("order.npy")).shape(), (std::vector<std::uint64_t>{6}));
}

void expect_rejected(const std::string& bytes, const std::string& message_part) {
  TempDir dir;
  const std::string path = dir.file("bad.npy");
  testing::write_bytes(path, bytes);
  try {
    const NpyReader reader(path);
    ADD_FAILURE() << "accepted a file that should fail with '" << message_part << "'";
  } catch (const NpyError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(message_part), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << "the message names the file: " << what;
  }
}

TEST(Npy, RejectsMalformedFilesWithAClearMessage) {
  expect_rejected("", "too short");
  expect_rejected("PK\x03\x04 not numpy at all", "magic");
  std::string v4 = npy_file(kGood, 24);
  v4[6] = 4;
  expect_rejected(v4, "version 4.0");
  std::string no_newline = npy_file(kGood, 24);
  no_newline[no_newline.size() - 24 - 1] = ' ';
  expect_rejected(no_newline, "newline");
  expect_rejected(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48),
                  "'<f8' is not supported");
  expect_rejected(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24),
                  "'>f4' is not supported");
  expect_rejected(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", 6),
                  "'|u1' is not supported");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24),
                  "Fortran");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, }", 24), "no 'shape'");
  expect_rejected(npy_file("{'descr': '<f4', 'shape': (2, 3), }", 24), "no 'fortran_order'");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", 24),
                  "not a tuple");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24),
                  "non-negative integers");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24),
                  "unexpected header key 'x'");
  expect_rejected(npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                           "'shape': (2, 3)}",
                           24),
                  "repeats key 'descr'");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", 24),
                  "header");
  expect_rejected(npy_file("['descr', '<f4']", 24), "dictionary");
  const std::string good = npy_file(kGood, 24);
  expect_rejected(good.substr(0, 40), "truncated .npy header");
  expect_rejected(npy_file(kGood, 23), "truncated data");
  expect_rejected(npy_file(kGood, 0), "truncated data");
  expect_rejected(npy_file(kGood, 28), "unexpected bytes after");
  expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': "
                           "(4294967296, 4294967296, 4294967296), }",
                           0),
                  "too many values");
  std::string latin = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  latin[20] = static_cast<char>(0xE9);
  expect_rejected(latin, "non-ASCII");
}

TEST(Npy, MissingFileNamesThePath) {
  try {
    const NpyReader reader("/nonexistent/dir/x.npy");
    ADD_FAILURE();
  } catch (const NpyError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.npy: cannot open"), std::string::npos)
        << e.what();
  }
}

TEST(Npy, WriterPublishesOnlyCompleteFiles) {
  TempDir dir;
  const std::string path = dir.file("w.npy");
  {
    NpyWriter writer(path, {2, 2});
    writer.append(std::vector<float>{1, 2, 3});
    EXPECT_THROW(writer.append(std::vector<float>{4, 5}), NpyError);  // past the shape
    EXPECT_THROW(writer.finish(), NpyError);                          // 3 of 4 values
    EXPECT_FALSE(testing::exists(path));
  }
  EXPECT_FALSE(testing::exists(path));
  EXPECT_TRUE(testing::leftovers_of(path).empty()) << "a failed write leaves nothing behind";
  {
    NpyWriter writer(path, {2, 2});
    writer.append(std::vector<float>{1, 2});
    writer.append(std::vector<float>{3, 4});
    writer.finish();
  }
  EXPECT_EQ(read_npy(path).data, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_THROW(write_npy(path, std::vector<std::uint64_t>{3}, std::vector<float>{1, 2}), NpyError);
  EXPECT_EQ(read_npy(path).data, (std::vector<float>{1, 2, 3, 4})) << "old file untouched";
  EXPECT_THROW((void)read_npy(path, 3), NpyError);  // over the size guard
}

}  // namespace
}  // namespace statepool::calibration
