// docs/kernels.md lists exactly the variants the registry has (no GPU needed).
#include "kernels/variant_table.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kernels/registry.h"

namespace hgemm::kernels {
namespace {

TEST(VariantTable, DocsListTheRegisteredVariants) {
  // The docs describe an sm_90 machine (or none, as in CI): the wgmma family listed.
  if (FindVariant("wgmma_128x256_s4_g8") == nullptr) GTEST_SKIP() << "no sm_90 device";
  std::ifstream in("docs/kernels.md");
  ASSERT_TRUE(in) << "docs/kernels.md not in the runfiles";
  std::stringstream text;
  text << in.rdbuf();
  const std::string docs = text.str();
  const size_t begin = docs.find(kVariantTableBegin);
  ASSERT_NE(begin, std::string::npos) << "no begin line in docs/kernels.md";
  const size_t rows = docs.find('\n', begin) + 1;
  const size_t end = docs.find(kVariantTableEnd, rows);
  ASSERT_NE(end, std::string::npos) << "no end line in docs/kernels.md";
  EXPECT_EQ(docs.substr(rows, end - rows), FormatVariantTable())
      << "docs/kernels.md is out of date: bazel run //kernels:variant_table";
}

TEST(VariantTable, HasOneRowPerVariant) {
  const std::string table = FormatVariantTable();
  size_t lines = 0;
  for (char c : table) lines += c == '\n';
  EXPECT_EQ(lines, Variants().size() + 2);
  for (const VariantInfo& v : Variants()) {
    EXPECT_NE(table.find("| `" + v.name + "` |"), std::string::npos) << v.name;
  }
}

}  // namespace
}  // namespace hgemm::kernels
