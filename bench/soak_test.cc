// The soak's bookkeeping against a real HgemmServer (CPU backend) on 127.0.0.1: a short run
// must count every kind of request, lose nothing and find nothing wrong; and its checks must
// bite (an impossible tolerance makes every verified C wrong).
#include "bench/soak.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <set>

#include "server/backend/cpu_backend.h"
#include "server/server.h"

namespace hgemm::bench {
namespace {

class SoakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.service.stream_chunk_bytes = 512;  // several result chunks per streamed C
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    options_.target = "127.0.0.1:" + std::to_string(server_->port());
    options_.clients = 4;
    options_.requests = 600;
    options_.max_dim = 24;
    options_.chunk_bytes = 256;
  }

  std::unique_ptr<HgemmServer> server_;
  SoakOptions options_;
};

TEST_F(SoakTest, ShortRunCountsEveryKindAndLosesNothing) {
  const SoakResult r = RunSoak(options_);
  EXPECT_GE(r.requests, options_.requests);
  EXPECT_EQ(r.lost, 0) << testing::PrintToString(r.problems);
  EXPECT_EQ(r.wrong, 0) << testing::PrintToString(r.problems);
  EXPECT_GT(r.verified, 0);
  std::set<std::string> kinds;
  int64_t sum = 0;
  for (const auto& [key, n] : r.by_kind_status) {
    kinds.insert(key.first);
    sum += n;
  }
  EXPECT_EQ(sum, r.requests);
  for (const char* kind : {"unary", "stream", "stream_gemm", "upload", "release"}) {
    EXPECT_TRUE(kinds.count(kind)) << kind;
  }
  const std::string text = FormatSoakResult(r, options_);
  EXPECT_NE(text.find("lost responses: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("wrong results: 0"), std::string::npos) << text;
}

TEST_F(SoakTest, ImpossibleToleranceMakesEveryCWrong) {
  options_.requests = 100;
  options_.tolerance = -1;
  const SoakResult r = RunSoak(options_);
  EXPECT_EQ(r.verified, 0);
  EXPECT_GT(r.wrong, 0);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("relative Frobenius error"), std::string::npos) << r.problems[0];
}

TEST(Soak, ReadsItsOwnMemory) {
  const ProcessMemory m = ReadProcessMemory(getpid());
  EXPECT_GT(m.rss_kib, 0);
  EXPECT_GE(m.hwm_kib, m.rss_kib);
  EXPECT_EQ(ReadProcessMemory(-5).rss_kib, -1);
  EXPECT_EQ(StatusCodeName(4), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace hgemm::bench
