// Verified GEMMs through the whole server (gRPC, CPU backend) with the tests' fault injector
// corrupting C after the GEMM (CpuBackendOptions::after_gemm): GemmOptions.verify answers a
// corrupted run with its rerun's C and names the suspect device, two corrupted runs arrive as
// DATA_LOSS, --verify checks GEMMs that do not ask, and the counts show in /metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/c_faults.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

class VerifyServerTest : public ::testing::Test {
 protected:
  // A server whose CPU backend corrupts the C of the next `corrupt_` runs (a row zeroed).
  void Start(bool verify_all = false) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.service.scheduler.verify_all = verify_all;
    options.service.scheduler.verify_failures_to_retire = 0;
    auto backend =
        MakeCpuBackend({.workers = 2, .after_gemm = [this](int, const GemmJob& job, void* c) {
                          if (corrupt_.fetch_sub(1) > 0) {
                            CorruptC(CFault::kRowZeroed, job.shape.c_type, job.shape.n, c, 0, 0);
                          }
                        }});
    server_ = HgemmServer::Start(options, std::move(backend));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  // A GEMM with fresh operands, `verify` asked or not; C checked against the reference when OK.
  grpc::Status Gemm(bool verify, v1::GemmResponse* response) {
    v1::GemmRequest request = RandomRequest(40, 24, 72, rng_);
    request.mutable_options()->set_verify(verify);
    grpc::Status s = client_->Gemm(request, response);
    if (s.ok()) {
      const auto* a = reinterpret_cast<const uint16_t*>(request.a().data());
      const auto* b = reinterpret_cast<const uint16_t*>(request.b().data());
      const std::vector<float> reference = ReferenceGemm(a, b, 40, 24, 72);
      EXPECT_LE(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(response->c().data()),
                                       reference.data(), 40 * 24),
                kKernelTolerance.fp32_acc);
    }
    return s;
  }

  double Metric(const std::string& series) {
    std::string body;
    EXPECT_EQ(HttpGet("127.0.0.1", server_->metrics_port(), "/metrics", &body), 200);
    const Scrape scrape = ParseExposition(body);
    EXPECT_TRUE(scrape.Has(series)) << body;
    return scrape.Get(series);
  }

  std::atomic<int> corrupt_{0};
  std::mt19937_64 rng_{20261207};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

TEST_F(VerifyServerTest, ACorruptedRunIsAnsweredByItsRerun) {
  Start();
  corrupt_ = 1;
  v1::GemmResponse response;
  grpc::Status s = Gemm(/*verify=*/true, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.execution().verified_repetitions(), 1u);
  ASSERT_TRUE(response.execution().has_suspect_device_id());
  EXPECT_EQ(response.execution().suspect_device_id(), -1);  // the CPU's id
  EXPECT_GE(response.timing().verify_ms(), 0);
  EXPECT_EQ(Metric("hgemm_verify_failures_total{device=\"-1\"}"), 1);
  EXPECT_EQ(Metric("hgemm_verify_reruns_total{device=\"-1\"}"), 1);
  EXPECT_EQ(Metric("hgemm_verify_suspect_total{device=\"-1\"}"), 1);
  EXPECT_EQ(Metric("hgemm_verified_gemms_total{device=\"-1\"}"), 1);
}

TEST_F(VerifyServerTest, TwoCorruptedRunsAreDataLoss) {
  Start();
  corrupt_ = 2;
  v1::GemmResponse response;
  grpc::Status s = Gemm(/*verify=*/true, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find("Freivalds"), std::string::npos) << s.error_message();
  EXPECT_TRUE(response.c().empty());
}

TEST_F(VerifyServerTest, UnverifiedGemmsAreNotChecked) {
  Start();
  v1::GemmResponse response;
  ASSERT_TRUE(Gemm(/*verify=*/false, &response).ok());
  EXPECT_EQ(response.execution().verified_repetitions(), 0u);
  EXPECT_EQ(response.timing().verify_ms(), 0);
}

TEST_F(VerifyServerTest, TheServerFlagChecksEveryGemm) {
  Start(/*verify_all=*/true);
  corrupt_ = 1;
  v1::GemmResponse response;
  grpc::Status s = Gemm(/*verify=*/false, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.execution().verified_repetitions(), 1u);
  EXPECT_TRUE(response.execution().has_suspect_device_id());
}

TEST_F(VerifyServerTest, TooManyRepetitionsAreRefused) {
  Start();
  v1::GemmRequest request = RandomRequest(8, 8, 8, rng_);
  request.mutable_options()->set_verify(true);
  request.mutable_options()->set_verify_repetitions(9);
  v1::GemmResponse response;
  grpc::Status s = client_->Gemm(request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("options.verify_repetitions"), std::string::npos)
      << s.error_message();
}

}  // namespace
}  // namespace hgemm
