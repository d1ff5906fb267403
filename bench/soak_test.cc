// The soak's bookkeeping against a real HgemmServer (CPU backend) on 127.0.0.1: a short run
// must count every kind of request, lose nothing and find nothing wrong; and its checks must
// bite (an impossible tolerance makes every verified C wrong).
#include "bench/soak.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "proto/hgemm.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"

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
  // Every action the loop picks is timed once, and the table prints its percentiles.
  int64_t timed = 0;
  for (const char* action : {"unary", "stream", "resident"}) {
    ASSERT_TRUE(r.action_ms.count(action)) << action;
    for (double ms : r.action_ms.at(action)) EXPECT_GT(ms, 0) << action;
  }
  for (const auto& [action, samples] : r.action_ms) timed += int64_t(samples.size());
  EXPECT_LE(timed, r.requests);  // an action makes one request or more
  const std::string text = FormatSoakResult(r, options_);
  EXPECT_NE(text.find("lost responses: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("wrong results: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("action (client ms)"), std::string::npos) << text;
  EXPECT_NE(text.find("p99"), std::string::npos) << text;
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

// Freivalds' test accepts a right C and catches the wrong Cs a server bug would return: a
// stale C (another GEMM's), a row or a tile left unwritten, a NaN.
TEST(Freivalds, AcceptsARightCAndCatchesWrongOnes) {
  const int64_t m = 300, n = 200, k = 150;
  std::mt19937_64 rng(7);
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::vector<uint16_t> c(m * n);
  CpuGemm(a.data(), b.data(), c.data(), m, n, k);
  const double right = FreivaldsError(a.data(), b.data(), c.data(), m, n, k, 2, 1);
  EXPECT_LE(right, kServiceTolerance.fp32_acc);
  EXPECT_GT(right, 0);  // fp16 rounding is seen: the metric is not trivially 0

  const std::vector<uint16_t> other_b = RandomHalfMatrix(k * n, rng);
  std::vector<uint16_t> stale(m * n);
  CpuGemm(a.data(), other_b.data(), stale.data(), m, n, k);
  EXPECT_GT(FreivaldsError(a.data(), b.data(), stale.data(), m, n, k, 2, 1), 0.5);

  std::vector<uint16_t> row = c;
  std::fill(row.begin() + 17 * n, row.begin() + 18 * n, 0);  // one row of 300 unwritten
  EXPECT_GT(FreivaldsError(a.data(), b.data(), row.data(), m, n, k, 2, 1), 0.01);

  std::vector<uint16_t> tile = c;
  for (int64_t i = 64; i < 80; ++i) {
    for (int64_t j = 128; j < 144; ++j) tile[i * n + j] = 0;  // one 16x16 tile unwritten
  }
  EXPECT_GT(FreivaldsError(a.data(), b.data(), tile.data(), m, n, k, 2, 1),
            kServiceTolerance.fp32_acc);

  // The estimate is steady with rows to average over: a right C of 32 rows (the fewest the
  // soak gives it) of a long k passes for every seed.
  const int64_t rows = 32, wide = 1500, deep = 2000;
  const std::vector<uint16_t> a2 = RandomHalfMatrix(rows * deep, rng),
                              b2 = RandomHalfMatrix(deep * wide, rng);
  std::vector<uint16_t> c2(rows * wide);
  CpuGemm(a2.data(), b2.data(), c2.data(), rows, wide, deep);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_LE(FreivaldsError(a2.data(), b2.data(), c2.data(), rows, wide, deep, 2, seed),
              kServiceTolerance.fp32_acc / 2)
        << seed;
  }

  std::vector<uint16_t> nan = c;
  nan[m * n / 2] = 0x7E00;
  EXPECT_FALSE(FreivaldsError(a.data(), b.data(), nan.data(), m, n, k, 2, 1) <= 1);
}

// The large scenario with Cs checked by Freivalds' test (small "large" shapes on the CPU).
TEST_F(SoakTest, LargeGemmsAreCheckedWithFreivalds) {
  options_.requests = 120;
  options_.weight_large = 100;
  options_.large_max_dim = 160;
  options_.full_check_max_mnk = 1000;
  SoakResult r = RunSoak(options_);
  EXPECT_EQ(r.wrong, 0) << testing::PrintToString(r.problems);
  EXPECT_EQ(r.lost, 0) << testing::PrintToString(r.problems);
  int64_t large_ok = 0;
  for (const auto& [key, count] : r.by_kind_status) {
    if (key.first == "large" && key.second == 0) large_ok += count;
  }
  EXPECT_GT(large_ok, 20);
  options_.tolerance = 1e-9;  // below fp16 rounding: every checked C fails
  options_.requests = 40;
  options_.weight_unary = options_.weight_stream = options_.weight_resident = 0;
  options_.weight_cancel = options_.weight_deadline = 0;  // only large GEMMs
  r = RunSoak(options_);
  EXPECT_GT(r.wrong, 0);
  EXPECT_TRUE(std::any_of(r.problems.begin(), r.problems.end(), [](const std::string& p) {
    return p.find("Freivalds relative error") != std::string::npos;
  })) << testing::PrintToString(r.problems);
}

// What the soak's cancel_upload scenario found (the "resident matrices left" line): an upload
// whose every byte arrived but that the client then cancelled (no WritesDone) was registered
// anyway (UploadMatrixReactor took the cancellation for "the client has sent everything"),
// while the client got CANCELLED and never learned the handle: it held quota until its TTL,
// forever with the server's default TTL 0.
TEST_F(SoakTest, CancelledUploadLeavesNoMatrix) {
  auto stub = v1::GemmService::NewStub(
      grpc::CreateChannel(options_.target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("x-client-id", "cancelled-upload");
  v1::MatrixInfo info;
  auto writer = stub->UploadMatrix(&context, &info);
  v1::UploadMatrixRequest message;
  message.mutable_header()->set_rows(16);
  message.mutable_header()->set_cols(16);
  ASSERT_TRUE(writer->Write(message));
  message.set_chunk(std::string(2 * 16 * 16, '\x3c'));
  ASSERT_TRUE(writer->Write(message));
  // Every byte is sent; wait until the server has them (GetServerInfo on the same connection
  // comes back after the chunk was delivered), then cancel instead of WritesDone.
  {
    grpc::ClientContext info_context;
    v1::ServerInfo server_info;
    ASSERT_TRUE(stub->GetServerInfo(&info_context, v1::GetServerInfoRequest(), &server_info).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  context.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Whatever the server does with the cancellation, it has done it within a few seconds.
  int listed = 0;
  for (int i = 0; i < 20 && listed == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    grpc::ClientContext list_context;
    list_context.AddMetadata("x-client-id", "cancelled-upload");
    v1::ListMatricesResponse list;
    ASSERT_TRUE(stub->ListMatrices(&list_context, v1::ListMatricesRequest(), &list).ok());
    listed = list.matrices_size();
    EXPECT_EQ(list.client_bytes(), listed == 0 ? 0u : list.matrices(0).bytes());
  }
  EXPECT_EQ(listed, 0) << "the cancelled upload was registered as a resident matrix";
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
