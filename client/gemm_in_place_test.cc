// GemmClient::GemmInPlace against a real server (CPU backend) on 127.0.0.1: A and B sent from
// the caller's memory, C written into the caller's buffer, checked against an fp32 reference;
// a buffer too small for C is an INTERNAL error with nothing written past it. GemmAsync, whose
// unary calls are GemmInPlace's, the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/testing/cpu_server_test.h"

namespace hgemm {
namespace {

using GemmInPlaceTest = CpuServerTest;

TEST_F(GemmInPlaceTest, OperandsFromTheCallersMemoryAndCIntoItsBuffer) {
  std::mt19937_64 rng(7);
  for (const auto& [m, n, k] : {std::tuple{1u, 1u, 1u}, {37u, 53u, 71u}, {128u, 96u, 300u}}) {
    const std::vector<uint16_t> a = RandomHalfMatrix(int64_t(m) * k, rng);
    const std::vector<uint16_t> b = RandomHalfMatrix(int64_t(k) * n, rng);
    std::vector<uint16_t> c(size_t(m) * n + 4, kFp16Poison);  // 4 guard elements past C
    v1::GemmResponse response;
    const grpc::Status s = client_->GemmInPlace(
        RequestOfShape(m, n, k),
        {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
        {reinterpret_cast<char*>(c.data()), 2 * size_t(m) * n}, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(response.c().empty());
    EXPECT_GT(response.timing().server_total_ms(), 0) << "the rest of the response is parsed";
    const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
    const ErrorStats e = CompareToReference(c.data(), reference.data(), int64_t(m) * n, {});
    EXPECT_EQ(e.nan_count, 0u) << m << "x" << n << "x" << k;
    EXPECT_LT(e.rel_frobenius, ServiceTolerance(false, {})) << m << "x" << n << "x" << k;
    for (size_t i = size_t(m) * n; i < c.size(); ++i) EXPECT_EQ(c[i], kFp16Poison);
  }
}

TEST_F(GemmInPlaceTest, AResidentBAndAnInPlaceA) {
  std::mt19937_64 rng(8);
  const uint32_t m = 20, n = 30, k = 40;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  v1::MatrixInfo info;
  ASSERT_TRUE(client_->UploadMatrix(k, n, HalfBytes(b), &info).ok());
  v1::GemmRequest request = RequestOfShape(m, n, k);
  request.set_b_handle(info.handle());
  std::vector<uint16_t> c(m * n, kFp16Poison);
  v1::GemmResponse response;
  const grpc::Status s =
      client_->GemmInPlace(request, {.a = a.data(), .a_bytes = 2 * a.size()},
                           {reinterpret_cast<char*>(c.data()), 2 * c.size()}, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  EXPECT_LT(CompareToReference(c.data(), reference.data(), m * n, {}).rel_frobenius,
            ServiceTolerance(false, {}));
}

TEST_F(GemmInPlaceTest, ABufferTooSmallForCIsAnErrorAndNothingIsWrittenPastIt) {
  std::mt19937_64 rng(9);
  const uint32_t m = 16, n = 16, k = 16;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::vector<uint16_t> c(m * n, kFp16Poison);
  const size_t capacity = 2 * (c.size() - 1);  // one element short
  v1::GemmResponse response;
  const grpc::Status s = client_->GemmInPlace(
      RequestOfShape(m, n, k),
      {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
      {reinterpret_cast<char*>(c.data()), capacity}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  EXPECT_NE(s.error_message().find("the buffer holds"), std::string::npos) << s.error_message();
  for (uint16_t x : c) EXPECT_EQ(x, kFp16Poison);
  // The server answered it and keeps serving; a right-sized call succeeds.
  EXPECT_TRUE(
      client_
          ->GemmInPlace(
              RequestOfShape(m, n, k),
              {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
              {reinterpret_cast<char*>(c.data()), 2 * c.size()}, &response)
          .ok());
}

TEST_F(GemmInPlaceTest, TheServersRefusalsComeBackAsForGemm) {
  const std::vector<uint16_t> a(10, 0x3c00);
  std::vector<uint16_t> c(4, kFp16Poison);
  v1::GemmResponse response;
  // A of 10 elements for a 2x3 A: the server names the operand.
  const grpc::Status s = client_->GemmInPlace(
      RequestOfShape(2, 2, 3), {.a = a.data(), .a_bytes = 20, .b = a.data(), .b_bytes = 12},
      {reinterpret_cast<char*>(c.data()), 8}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  for (uint16_t x : c) EXPECT_EQ(x, kFp16Poison);
}

// GemmAsync's outcome, waited for.
struct AsyncOutcome {
  grpc::Status status;
  v1::GemmResponse response;
};

AsyncOutcome RunAsync(const GemmClient& client, const v1::GemmRequest& request,
                      OperandBytes operands, bool streamed, CBuffer c_into) {
  std::promise<AsyncOutcome> outcome;
  client.GemmAsync(request, operands, streamed, c_into, {}, std::make_shared<grpc::ClientContext>(),
                   [&outcome](grpc::Status status, v1::GemmResponse response) {
                     outcome.set_value({std::move(status), std::move(response)});
                   });
  return outcome.get_future().get();
}

TEST_F(GemmInPlaceTest, GemmAsyncUnaryAndStreamedWriteCIntoTheCallersBuffer) {
  std::mt19937_64 rng(10);
  const uint32_t m = 45, n = 67, k = 89;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  for (bool streamed : {false, true}) {
    std::vector<uint16_t> c(m * n + 4, kFp16Poison);  // 4 guard elements past C
    const AsyncOutcome done =
        RunAsync(*client_, RequestOfShape(m, n, k),
                 {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
                 streamed, {reinterpret_cast<char*>(c.data()), 2 * size_t(m) * n});
    ASSERT_TRUE(done.status.ok()) << streamed << ": " << done.status.error_message();
    EXPECT_TRUE(done.response.c().empty()) << streamed;
    EXPECT_GT(done.response.timing().server_total_ms(), 0) << streamed;
    const ErrorStats e = CompareToReference(c.data(), reference.data(), int64_t(m) * n, {});
    EXPECT_EQ(e.nan_count, 0u) << streamed;
    EXPECT_LT(e.rel_frobenius, ServiceTolerance(false, {})) << streamed;
    for (size_t i = size_t(m) * n; i < c.size(); ++i) EXPECT_EQ(c[i], kFp16Poison) << streamed;
  }
}

TEST_F(GemmInPlaceTest, GemmAsyncIntoATooSmallBufferIsAnErrorAndNothingIsWrittenPastIt) {
  std::mt19937_64 rng(11);
  const uint32_t m = 16, n = 16, k = 16;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  std::vector<uint16_t> c(m * n, kFp16Poison);
  const AsyncOutcome done =
      RunAsync(*client_, RequestOfShape(m, n, k),
               {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
               false, {reinterpret_cast<char*>(c.data()), 2 * (c.size() - 1)});
  EXPECT_EQ(done.status.error_code(), grpc::StatusCode::INTERNAL) << done.status.error_message();
  EXPECT_NE(done.status.error_message().find("the buffer holds"), std::string::npos)
      << done.status.error_message();
  for (uint16_t x : c) EXPECT_EQ(x, kFp16Poison);
}

TEST_F(GemmInPlaceTest, GemmAsyncKeepingCOnTheServerExpectsNoCBack) {
  std::mt19937_64 rng(12);
  const uint32_t m = 24, n = 40, k = 56;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  v1::GemmRequest request = RequestOfShape(m, n, k);
  request.set_keep_c_resident(true);
  const AsyncOutcome done = RunAsync(
      *client_, request,
      {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()}, false, {});
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  ASSERT_FALSE(done.response.c_matrix().handle().empty());
  std::string kept;
  ASSERT_TRUE(client_->DownloadMatrix(done.response.c_matrix().handle(), &kept).ok());
  ASSERT_EQ(kept.size(), 2 * size_t(m) * n);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  EXPECT_LT(CompareToReference(reinterpret_cast<const uint16_t*>(kept.data()), reference.data(),
                               int64_t(m) * n, {})
                .rel_frobenius,
            ServiceTolerance(false, {}));
}

}  // namespace
}  // namespace hgemm
