#include "client/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace hgemm {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Npy, WriteThenReadRoundTrips) {
  HalfMatrix m{.rows = 3, .cols = 5, .data = std::string(30, '\0')};
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = static_cast<char>(i * 7 + 1);
  const std::string path = TempPath("m.npy");
  ASSERT_EQ(WriteNpy(path, m), "");
  HalfMatrix back;
  ASSERT_EQ(ReadNpy(path, &back), "");
  EXPECT_EQ(back.rows, 3);
  EXPECT_EQ(back.cols, 5);
  EXPECT_EQ(back.data, m.data);
}

TEST(Npy, HeaderIsWhatNumpyWrites) {
  const std::string path = TempPath("h.npy");
  ASSERT_EQ(WriteNpy(path, {.rows = 2, .cols = 2, .data = std::string(8, '\1')}), "");
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t header_end = bytes.size() - 8;
  EXPECT_EQ(header_end % 64, 0u);  // data starts 64-byte aligned, as numpy writes it
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
  EXPECT_NE(bytes.find("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }"),
            std::string::npos);
  EXPECT_EQ(bytes[header_end - 1], '\n');
}

TEST(Npy, RejectsOtherDtypes) {
  const std::string path = TempPath("f4.npy");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size()));
  out.put(0);
  out << header << "abcd";
  out.close();
  HalfMatrix m;
  EXPECT_NE(ReadNpy(path, &m).find("float16"), std::string::npos);
}

// A header is only a claim: sizing the buffer by what it says (2·rows·cols, wrapping for these)
// would throw std::length_error / bad_alloc, so the file's size is checked first.
TEST(Npy, HeaderLargerThanTheFileIsRefusedBeforeAllocating) {
  for (int64_t dim : {int64_t{99999999999}, int64_t{200000}}) {
    SCOPED_TRACE(dim);
    const std::string path = TempPath("huge.npy");
    ASSERT_EQ(WriteNpy(path, {.rows = dim, .cols = dim, .data = std::string(8, '\1')}), "");
    HalfMatrix m;
    const std::string error = ReadNpy(path, &m);
    EXPECT_TRUE(error.find("too large") != std::string::npos ||
                error.find("holds fewer than") != std::string::npos)
        << error;
    EXPECT_LE(m.data.capacity(), 64u);
    HalfMatrix shape;
    ASSERT_EQ(ReadNpyShape(path, &shape), "");
    EXPECT_EQ(shape.rows, dim);
    EXPECT_EQ(shape.cols, dim);
  }
}

TEST(Npy, MissingFileSaysSo) {
  HalfMatrix m;
  EXPECT_NE(ReadNpy("/nonexistent/x.npy", &m).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace hgemm
