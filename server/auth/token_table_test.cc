#include "server/auth/token_table.h"

#include <gtest/gtest.h>

#include <thread>

#include "server/auth/test_certs.h"

namespace hgemm {
namespace {

using namespace std::chrono_literals;
using testing::ReplaceFile;
using testing::TokenLine;

TEST(TokenTable, ParsesPrincipalsHashesAdminsAndComments) {
  std::vector<TokenEntry> entries;
  const std::string text = "# team tokens\n\n" + TokenLine("alice", "a-token") + "  " +
                           TokenLine("ops", "o-token", true) + TokenLine("alice", "a-2");
  ASSERT_EQ(ParseTokenFile(text, &entries), "");
  ASSERT_EQ(entries.size(), 3u);
  TokenTable table(entries);
  EXPECT_EQ(table.Authenticate("a-token")->name, "alice");
  EXPECT_FALSE(table.Authenticate("a-token")->admin);
  EXPECT_EQ(table.Authenticate("a-2")->name, "alice");  // two tokens: rotation without a gap
  EXPECT_TRUE(table.Authenticate("o-token")->admin);
  EXPECT_FALSE(table.Authenticate("a-toke"));
  EXPECT_FALSE(table.Authenticate(""));
  EXPECT_TRUE(table.IsAdmin("ops"));
  EXPECT_FALSE(table.IsAdmin("alice"));
}

TEST(TokenTable, MalformedLinesAreNamed) {
  std::vector<TokenEntry> entries;
  EXPECT_EQ(ParseTokenFile("alice\n", &entries).rfind("line 1: expected PRINCIPAL", 0), 0u);
  EXPECT_NE(ParseTokenFile("# x\nalice not-hex\n", &entries).find("line 2: the hash of alice"),
            std::string::npos);
  // A token pasted instead of its hash is refused as not 64 hex digits.
  EXPECT_NE(ParseTokenFile("alice s3cret-token\n", &entries).find("never tokens"),
            std::string::npos);
  EXPECT_NE(
      ParseTokenFile(TokenLine("ops", "t") + "x " + std::string(64, 'a') + " root\n", &entries)
          .find("line 2: third field root"),
      std::string::npos);
  const std::string line = TokenLine("alice", "same");
  EXPECT_EQ(ParseTokenFile(line + TokenLine("bob", "same"), &entries),
            "line 2: the same token hash as line 1");
}

TEST(TokenTable, FileIsReloadedAndABadRewriteKeepsTheLastGoodOne) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/tokens";
  ReplaceFile(path, TokenLine("alice", "a-token"));
  std::string error;
  std::unique_ptr<TokenTable> table = TokenTable::Open(path, 20ms, &error);
  ASSERT_NE(table, nullptr) << error;
  EXPECT_TRUE(table->Authenticate("a-token"));

  ReplaceFile(path, TokenLine("bob", "b-token"));  // alice revoked, bob added
  while (table->Authenticate("a-token") || !table->Authenticate("b-token")) {
    std::this_thread::sleep_for(10ms);
  }
  ReplaceFile(path, "bob garbage\n");
  std::this_thread::sleep_for(200ms);  // ten periods: read, refused
  EXPECT_TRUE(table->Authenticate("b-token"));
  ReplaceFile(path, TokenLine("carol", "c-token"));  // the watch still works after a refusal
  while (!table->Authenticate("c-token")) std::this_thread::sleep_for(10ms);
}

TEST(TokenTable, BadFileAtStartIsAnErrorNamingIt) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/bad-tokens";
  ReplaceFile(path, "alice 1234\n");
  std::string error;
  EXPECT_EQ(TokenTable::Open(path, 1s, &error), nullptr);
  EXPECT_EQ(error.rfind(path + ": line 1: ", 0), 0u) << error;
  EXPECT_EQ(TokenTable::Open(path + ".missing", 1s, &error), nullptr);
  EXPECT_NE(error.find(path + ".missing: cannot open"), std::string::npos) << error;
}

}  // namespace
}  // namespace hgemm
