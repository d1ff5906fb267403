// GemmInto against a real server (CPU backend) on 127.0.0.1: each route (in place, stream,
// parallel parts, kept C) brings C back into the caller's buffer, checked against an fp32
// reference, with nothing written past it; and RetriedCall's tries.
#include "client/gemm_into.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/retried_call.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/testing/cpu_server_test.h"

namespace hgemm {
namespace {

using GemmIntoTest = CpuServerTest;

struct Case {
  const char* name;
  GemmInto::Mode mode;
  CallOptions options;
  bool streamed;
};

TEST_F(GemmIntoTest, EachRouteWritesCIntoTheCallersBuffer) {
  std::mt19937_64 rng(31);
  const uint32_t m = 40, n = 56, k = 72;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  CallOptions parts;
  parts.parallel_parts = 2;
  parts.parallel_min_bytes = 1;
  CallOptions small_unary;
  small_unary.unary_limit_bytes = 1000;
  small_unary.chunk_bytes = 999;
  for (const Case& test : {Case{"in place", GemmInto::Mode::kAuto, {}, false},
                           Case{"unary forced", GemmInto::Mode::kUnary, small_unary, false},
                           Case{"stream forced", GemmInto::Mode::kStream, {}, true},
                           Case{"stream by size", GemmInto::Mode::kAuto, small_unary, true},
                           Case{"parts", GemmInto::Mode::kAuto, parts, false}}) {
    std::vector<uint16_t> c(m * n + 4, kFp16Poison);  // 4 guard elements past C
    const GemmInto gemm(
        *client_, RequestOfShape(m, n, k),
        {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
        {reinterpret_cast<char*>(c.data()), 2 * size_t(m) * n}, test.mode, test.options);
    EXPECT_EQ(gemm.streamed(), test.streamed) << test.name;
    EXPECT_TRUE(gemm.idempotent()) << test.name;
    v1::GemmResponse response;
    const grpc::Status s = gemm.Try(test.options, &response);
    ASSERT_TRUE(s.ok()) << test.name << ": " << s.error_message();
    EXPECT_TRUE(response.c().empty()) << test.name;
    EXPECT_GT(response.timing().server_total_ms(), 0) << test.name;
    const ErrorStats e = CompareToReference(c.data(), reference.data(), int64_t(m) * n, {});
    EXPECT_EQ(e.nan_count, 0u) << test.name;
    EXPECT_LT(e.rel_frobenius, ServiceTolerance(false, {})) << test.name;
    for (size_t i = size_t(m) * n; i < c.size(); ++i) EXPECT_EQ(c[i], kFp16Poison) << test.name;
    // A second try of the same GEMM gives the same C.
    ASSERT_TRUE(gemm.Try(test.options, &response).ok()) << test.name;
  }
}

TEST_F(GemmIntoTest, AKeptCComesBackAsAHandleUnaryOrStreamed) {
  std::mt19937_64 rng(32);
  const uint32_t m = 16, n = 24, k = 32;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  for (GemmInto::Mode mode : {GemmInto::Mode::kAuto, GemmInto::Mode::kStream}) {
    v1::GemmRequest request = RequestOfShape(m, n, k);
    request.set_keep_c_resident(true);
    const GemmInto gemm(
        *client_, request,
        {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()}, {}, mode,
        {});
    v1::GemmResponse response;
    ASSERT_TRUE(gemm.Try({}, &response).ok());
    ASSERT_FALSE(response.c_matrix().handle().empty());
    std::string kept;
    ASSERT_TRUE(client_->DownloadMatrix(response.c_matrix().handle(), &kept).ok());
    ASSERT_EQ(kept.size(), 2 * size_t(m) * n);
    EXPECT_LT(CompareToReference(reinterpret_cast<const uint16_t*>(kept.data()), reference.data(),
                                 int64_t(m) * n, {})
                  .rel_frobenius,
              ServiceTolerance(false, {}));
  }
}

TEST_F(GemmIntoTest, ABufferTooSmallForCIsInternalAndNothingIsWrittenPastIt) {
  const std::vector<uint16_t> a(8 * 8, 0x3c00);
  CallOptions parts;
  parts.parallel_parts = 2;
  parts.parallel_min_bytes = 1;
  for (const CallOptions& options : {CallOptions{}, parts}) {
    std::vector<uint16_t> c(8 * 8, kFp16Poison);
    const GemmInto gemm(*client_, RequestOfShape(8, 8, 8),
                        {.a = a.data(), .a_bytes = 128, .b = a.data(), .b_bytes = 128},
                        {reinterpret_cast<char*>(c.data()), 2 * (c.size() - 1)},
                        GemmInto::Mode::kAuto, options);
    v1::GemmResponse response;
    EXPECT_EQ(gemm.Try(options, &response).error_code(), grpc::StatusCode::INTERNAL);
    for (uint16_t x : c) EXPECT_EQ(x, kFp16Poison);
  }
}

TEST(RetriedCall, EachTryGetsTheCallsOptionsWithTheDeadlineLeft) {
  CallOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  options.client_id = "me";
  RetryPolicy policy;
  policy.initial_backoff = policy.max_backoff = std::chrono::milliseconds(1);
  int tries = 0;
  const grpc::Status s =
      RetriedCall(policy, options, /*idempotent=*/false, [&](const CallOptions& try_options) {
        EXPECT_EQ(try_options.client_id, "me");
        EXPECT_GT(try_options.timeout.count(), 0);
        EXPECT_LE(try_options.timeout, options.timeout);
        if (++tries == 3) return grpc::Status::OK;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "queue is full; retry with backoff");
      });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(tries, 3);
}

}  // namespace
}  // namespace hgemm
