// Batching through the whole server (gRPC on 127.0.0.1, CPU backend of one worker, so that
// concurrent GEMMs queue): unary Gemm calls and GemmStream GEMMs of one client against one
// resident B come back right, and at least some of them say they ran in a batch
// (Execution.batch_size > 1), which /metrics counts; with --batching=off none does. Rounds of
// concurrent calls repeat until a batch shows (the test asserts no timing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"

namespace hgemm {
namespace {

constexpr uint32_t kN = 64, kK = 256;
constexpr int kCallers = 12;
constexpr int kMaxRounds = 200;

class BatchingServerTest : public ::testing::Test {
 protected:
  void Start(bool batching) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.service.scheduler.batching = batching;
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 1}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
    b_ = RandomHalfMatrix(kK * kN, rng_);
    v1::MatrixInfo info;
    const grpc::Status s = client_->UploadMatrix(
        kK, kN, std::string_view(reinterpret_cast<const char*>(b_.data()), b_.size() * 2), &info, 0,
        "B", Options());
    ASSERT_TRUE(s.ok()) << s.error_message();
    b_handle_ = info.handle();
  }

  // Every call is the same client's, the owner of B.
  static CallOptions Options() {
    CallOptions options;
    options.client_id = "batching-test";
    return options;
  }

  // A GEMM of `m` fresh rows against the resident B.
  v1::GemmRequest Request(uint32_t m, std::mt19937_64& rng) const {
    v1::GemmRequest request;
    request.set_m(m);
    request.set_n(kN);
    request.set_k(kK);
    const std::vector<uint16_t> a = RandomHalfMatrix(int64_t{m} * kK, rng);
    request.set_a(std::string(reinterpret_cast<const char*>(a.data()), a.size() * 2));
    request.set_b_handle(b_handle_);
    return request;
  }

  // Whether the answer's C is op(A)·B within the service's tolerance.
  bool Correct(const v1::GemmRequest& request, const v1::GemmResponse& response) const {
    const auto* a = reinterpret_cast<const uint16_t*>(request.a().data());
    const std::vector<float> reference = ReferenceGemm(a, b_.data(), request.m(), kN, kK);
    if (response.c().size() != size_t(request.m()) * kN * 2) return false;
    const ErrorStats error =
        CompareToReference(reinterpret_cast<const uint16_t*>(response.c().data()), reference.data(),
                           int64_t{request.m()} * kN);
    EXPECT_EQ(error.nan_count, 0u) << error.ToString();
    EXPECT_LE(error.rel_frobenius, kServiceTolerance.fp32_acc) << error.ToString();
    return error.nan_count == 0 && error.rel_frobenius <= kServiceTolerance.fp32_acc;
  }

  // One round of kCallers concurrent unary calls; returns the largest batch_size answered.
  uint32_t UnaryRound(int round) {
    std::mutex mu;
    uint32_t largest = 0;
    std::vector<std::thread> callers;
    for (int t = 0; t < kCallers; ++t) {
      callers.emplace_back([&, t] {
        std::mt19937_64 rng(uint64_t(round) * kCallers + uint64_t(t));
        const v1::GemmRequest request = Request(1 + uint32_t(t % 8), rng);
        v1::GemmResponse response;
        const grpc::Status s = client_->Gemm(request, &response, Options());
        EXPECT_TRUE(s.ok()) << s.error_message();
        if (!s.ok()) return;
        EXPECT_TRUE(Correct(request, response));
        const v1::Execution& e = response.execution();
        EXPECT_GE(e.batch_size(), 1u);
        EXPECT_EQ(e.batch_rows() == 0, e.batch_size() == 1);
        if (e.batch_size() > 1) {
          EXPECT_GE(e.batch_rows(), e.batch_size());
        }
        std::lock_guard<std::mutex> lock(mu);
        largest = std::max(largest, e.batch_size());
      });
    }
    for (std::thread& caller : callers) caller.join();
    return largest;
  }

  // One GemmStream of kCallers GEMMs, all in flight at once; returns the largest batch_size.
  uint32_t StreamRound(int round) {
    std::mt19937_64 rng(uint64_t(round) + 7777);
    std::vector<v1::GemmRequest> requests;
    for (int i = 0; i < kCallers; ++i) requests.push_back(Request(1 + uint32_t(i % 5), rng));
    std::vector<const v1::GemmRequest*> pointers;
    for (const v1::GemmRequest& r : requests) pointers.push_back(&r);
    std::vector<StreamedGemm> results;
    const grpc::Status s = client_->GemmStream(pointers, &results, Options());
    EXPECT_TRUE(s.ok()) << s.error_message();
    uint32_t largest = 0;
    for (size_t i = 0; i < results.size() && i < requests.size(); ++i) {
      EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
      if (!results[i].status.ok()) continue;
      EXPECT_TRUE(Correct(requests[i], results[i].response));
      largest = std::max(largest, results[i].response.execution().batch_size());
    }
    return largest;
  }

  double Metric(const std::string& series) {
    std::string body;
    EXPECT_EQ(HttpGet("127.0.0.1", server_->metrics_port(), "/metrics", &body), 200);
    const Scrape scrape = ParseExposition(body);
    EXPECT_TRUE(scrape.errors.empty()) << body;
    EXPECT_TRUE(scrape.Has(series)) << body;
    return scrape.Get(series);
  }

  std::mt19937_64 rng_{20261209};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
  std::vector<uint16_t> b_;
  std::string b_handle_;
};

TEST_F(BatchingServerTest, ConcurrentUnaryCallsOnOneBShareLaunches) {
  Start(/*batching=*/true);
  uint32_t largest = 0;
  for (int round = 0; round < kMaxRounds && largest < 2 && !HasFailure(); ++round) {
    largest = UnaryRound(round);
  }
  EXPECT_GE(largest, 2u) << "no call ran in a batch in " << kMaxRounds << " rounds";
  EXPECT_GE(Metric("hgemm_batch_members_count"), 1);
  EXPECT_GE(Metric("hgemm_batch_rows_sum"), 2);
}

TEST_F(BatchingServerTest, GemmsOfAStreamOnOneBShareLaunches) {
  Start(/*batching=*/true);
  uint32_t largest = 0;
  for (int round = 0; round < kMaxRounds && largest < 2 && !HasFailure(); ++round) {
    largest = StreamRound(round);
  }
  EXPECT_GE(largest, 2u) << "no GEMM ran in a batch in " << kMaxRounds << " streams";
}

TEST_F(BatchingServerTest, BatchingOffRunsEveryGemmAlone) {
  Start(/*batching=*/false);
  for (int round = 0; round < 5; ++round) {
    EXPECT_EQ(UnaryRound(round), 1u);
    EXPECT_EQ(StreamRound(round), 1u);
  }
  EXPECT_EQ(Metric("hgemm_batch_members_count"), 0);
}

}  // namespace
}  // namespace hgemm
