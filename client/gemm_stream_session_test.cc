// GemmStreamSession against a real server (CPU backend) on 127.0.0.1: GEMMs submitted copied
// and borrowed come back in their buffers, checked against an fp32 reference; a kept C; the
// refusals of Submit; a cancelled session, and one destroyed with GEMMs in flight.
#include "client/gemm_stream_session.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "client/error_details.h"
#include "proto/numerics/cpu_gemm.h"
#include "server/testing/cpu_server_test.h"

namespace hgemm {
namespace {

using GemmStreamSessionTest = CpuServerTest;

CBuffer BufferOf(std::vector<uint16_t>& c, size_t elements) {
  return {reinterpret_cast<char*>(c.data()), 2 * elements};
}

TEST_F(GemmStreamSessionTest, CopiedAndBorrowedOperandsComeBackInTheirBuffers) {
  std::mt19937_64 rng(21);
  const uint32_t m = 33, n = 47, k = 129;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  CallOptions options;
  options.chunk_bytes = 1000;  // several chunks per operand
  GemmStreamSession session(*client_, options);
  std::vector<std::vector<uint16_t>> c(4, std::vector<uint16_t>(m * n + 4, kFp16Poison));
  for (uint64_t id = 0; id < c.size(); ++id) {
    v1::GemmRequest request = RequestOfShape(m, n, k);
    OperandBytes borrowed;
    if (id % 2 == 0) {
      request.set_a(a.data(), 2 * a.size());
      request.set_b(b.data(), 2 * b.size());
    } else {
      borrowed = {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()};
    }
    const grpc::Status s = session.Submit(id, request, borrowed, BufferOf(c[id], m * n));
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  session.Close();
  std::set<uint64_t> answered;
  uint64_t id = 0;
  v1::GemmDone done;
  grpc::Status end;
  while (session.Next(&id, &done, &end)) {
    ASSERT_TRUE(StatusOf(done).ok()) << StatusOf(done).error_message();
    EXPECT_GT(done.timing().server_total_ms(), 0);
    EXPECT_TRUE(answered.insert(id).second) << id;
    const ErrorStats e = CompareToReference(c[id].data(), reference.data(), int64_t(m) * n, {});
    EXPECT_EQ(e.nan_count, 0u) << id;
    EXPECT_LT(e.rel_frobenius, ServiceTolerance(false, {})) << id;
    for (size_t i = size_t(m) * n; i < c[id].size(); ++i) EXPECT_EQ(c[id][i], kFp16Poison) << id;
  }
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_EQ(answered.size(), c.size());
  // Over: the same end again.
  EXPECT_FALSE(session.Next(&id, &done, &end));
  EXPECT_TRUE(end.ok());
}

TEST_F(GemmStreamSessionTest, AKeptCComesBackAsAHandle) {
  std::mt19937_64 rng(22);
  const uint32_t m = 8, n = 12, k = 16;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  GemmStreamSession session(*client_, {});
  v1::GemmRequest request = RequestOfShape(m, n, k);
  request.set_keep_c_resident(true);
  ASSERT_TRUE(
      session
          .Submit(7, request,
                  {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
                  {})
          .ok());
  uint64_t id = 0;
  v1::GemmDone done;
  grpc::Status end;
  ASSERT_TRUE(session.Next(&id, &done, &end)) << end.error_message();
  EXPECT_EQ(id, 7u);
  ASSERT_TRUE(StatusOf(done).ok()) << StatusOf(done).error_message();
  ASSERT_FALSE(done.c_matrix().handle().empty());
  std::string kept;
  ASSERT_TRUE(client_->DownloadMatrix(done.c_matrix().handle(), &kept).ok());
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  ASSERT_EQ(kept.size(), 2 * size_t(m) * n);
  EXPECT_LT(CompareToReference(reinterpret_cast<const uint16_t*>(kept.data()), reference.data(),
                               int64_t(m) * n, {})
                .rel_frobenius,
            ServiceTolerance(false, {}));
}

TEST_F(GemmStreamSessionTest, AnIdInFlightAndASubmitAfterCloseAreRefused) {
  const std::vector<uint16_t> a(4 * 4, 0x3c00);
  std::vector<uint16_t> c1(16, kFp16Poison), c2(16, kFp16Poison);
  GemmStreamSession session(*client_, {});
  const OperandBytes ab{.a = a.data(), .a_bytes = 32, .b = a.data(), .b_bytes = 32};
  ASSERT_TRUE(session.Submit(1, RequestOfShape(4, 4, 4), ab, BufferOf(c1, 16)).ok());
  EXPECT_EQ(session.Submit(1, RequestOfShape(4, 4, 4), ab, BufferOf(c2, 16)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  session.Close();
  EXPECT_EQ(session.Submit(2, RequestOfShape(4, 4, 4), ab, BufferOf(c2, 16)).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  uint64_t id = 0;
  v1::GemmDone done;
  grpc::Status end;
  ASSERT_TRUE(session.Next(&id, &done, &end)) << end.error_message();
  EXPECT_EQ(id, 1u);
  EXPECT_TRUE(StatusOf(done).ok());
  for (uint16_t x : c1) EXPECT_EQ(x, 0x4400);  // 4.0: a sum of four ones
  for (uint16_t x : c2) EXPECT_EQ(x, kFp16Poison);
  EXPECT_FALSE(session.Next(&id, &done, &end));
  EXPECT_TRUE(end.ok()) << end.error_message();
}

TEST_F(GemmStreamSessionTest, ACancelledSessionEndsCancelled) {
  GemmStreamSession session(*client_, {});
  session.Cancel();
  uint64_t id = 0;
  v1::GemmDone done;
  grpc::Status end;
  EXPECT_FALSE(session.Next(&id, &done, &end));
  EXPECT_EQ(end.error_code(), grpc::StatusCode::CANCELLED) << end.error_message();
}

TEST_F(GemmStreamSessionTest, DestroyedWithGemmsInFlight) {
  std::mt19937_64 rng(23);
  const uint32_t m = 64, n = 64, k = 64;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng);
  std::vector<std::vector<uint16_t>> c(8, std::vector<uint16_t>(m * n, kFp16Poison));
  {
    GemmStreamSession session(*client_, {});
    for (uint64_t id = 0; id < c.size(); ++id) {
      ASSERT_TRUE(
          session
              .Submit(
                  id, RequestOfShape(m, n, k),
                  {.a = a.data(), .a_bytes = 2 * a.size(), .b = a.data(), .b_bytes = 2 * a.size()},
                  BufferOf(c[id], m * n))
              .ok());
    }
  }  // cancelled, its answers dropped, the writer joined
  // The server keeps serving.
  v1::GemmRequest request = RequestOfShape(m, n, k);
  request.set_a(a.data(), 2 * a.size());
  request.set_b(a.data(), 2 * a.size());
  v1::GemmResponse response;
  EXPECT_TRUE(client_->Gemm(request, &response).ok());
}

}  // namespace
}  // namespace hgemm
