// AsyncGemms against a real server (CPU backend) on 127.0.0.1: GEMMs started unary and
// streamed come back in their buffers and WaitIdle returns once every one is over; a kept C.
#include "client/async_gemms.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "proto/numerics/cpu_gemm.h"
#include "server/testing/cpu_server_test.h"

namespace hgemm {
namespace {

using AsyncGemmsTest = CpuServerTest;

TEST_F(AsyncGemmsTest, WaitIdleReturnsOnceEveryGemmIsOver) {
  std::mt19937_64 rng(41);
  const uint32_t m = 36, n = 44, k = 52;
  const std::vector<uint16_t> a = RandomHalfMatrix(m * k, rng), b = RandomHalfMatrix(k * n, rng);
  const std::vector<float> reference = ReferenceGemm(a.data(), b.data(), m, n, k);
  const GemmInto::Mode modes[] = {GemmInto::Mode::kAuto, GemmInto::Mode::kStream};
  constexpr int kGemms = 6;
  std::vector<std::vector<uint16_t>> c(kGemms, std::vector<uint16_t>(m * n, 0x7e00));
  std::vector<grpc::Status> status(kGemms);
  std::vector<int> streamed(kGemms, -1);
  std::atomic<int> done{0};
  {
    AsyncGemms async;
    for (int i = 0; i < kGemms; ++i) {
      async.Start(*client_, RequestOfShape(m, n, k),
                  {.a = a.data(), .a_bytes = 2 * a.size(), .b = b.data(), .b_bytes = 2 * b.size()},
                  {reinterpret_cast<char*>(c[i].data()), 2 * c[i].size()}, modes[i % 2], {},
                  std::make_shared<grpc::ClientContext>(),
                  [&, i](const grpc::Status& s, const v1::GemmResponse&, bool was_streamed) {
                    status[i] = s;
                    streamed[i] = was_streamed;
                    ++done;
                  });
    }
    async.WaitIdle();
    EXPECT_EQ(done.load(), kGemms);
  }
  for (int i = 0; i < kGemms; ++i) {
    ASSERT_TRUE(status[i].ok()) << i << ": " << status[i].error_message();
    EXPECT_EQ(streamed[i], i % 2) << i;
    EXPECT_LT(CompareToReference(c[i].data(), reference.data(), int64_t(m) * n, {}).rel_frobenius,
              ServiceTolerance(false, {}))
        << i;
  }
}

TEST_F(AsyncGemmsTest, AKeptCComesBackAsAHandle) {
  const std::vector<uint16_t> a(8 * 8, 0x3c00);
  v1::GemmRequest request = RequestOfShape(8, 8, 8);
  request.set_keep_c_resident(true);
  AsyncGemms async;
  grpc::Status status;
  std::string handle;
  async.Start(*client_, request, {.a = a.data(), .a_bytes = 128, .b = a.data(), .b_bytes = 128}, {},
              GemmInto::Mode::kAuto, {}, std::make_shared<grpc::ClientContext>(),
              [&](const grpc::Status& s, const v1::GemmResponse& response, bool) {
                status = s;
                handle = response.c_matrix().handle();
              });
  async.WaitIdle();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::string kept;
  ASSERT_TRUE(client_->DownloadMatrix(handle, &kept).ok());
  ASSERT_EQ(kept.size(), 128u);
  for (size_t i = 0; i < kept.size(); i += 2) {
    EXPECT_EQ(kept[i + 1] & 0xff, 0x48) << "8.0: a sum of eight ones";
  }
}

}  // namespace
}  // namespace hgemm
