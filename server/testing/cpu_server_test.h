// CpuServerTest: a GoogleTest fixture that serves hgemm on 127.0.0.1 (a port the system picks)
// with the CPU backend, and a GemmClient connected to it: the client library's tests run against
// a real server. RequestOfShape and kFp16Poison are what those tests build their GEMMs from.
// Test-only. Thread safety: as any ::testing::Test; client_ is thread-safe (GemmClient).
#ifndef HGEMM_SERVER_TESTING_CPU_SERVER_TEST_H_
#define HGEMM_SERVER_TESTING_CPU_SERVER_TEST_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "client/gemm_client.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"

namespace hgemm {

// An fp16 NaN: what an output buffer holds before the GEMM, so that a byte it did not write
// shows.
inline constexpr uint16_t kFp16Poison = 0x7e00;

class CpuServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    client_ = std::make_unique<GemmClient>(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
};

// A request of shape m×n×k (fp16, everything else unset): the operands come from the test.
inline v1::GemmRequest RequestOfShape(uint32_t m, uint32_t n, uint32_t k) {
  v1::GemmRequest request;
  request.set_m(m);
  request.set_n(n);
  request.set_k(k);
  return request;
}

}  // namespace hgemm

#endif  // HGEMM_SERVER_TESTING_CPU_SERVER_TEST_H_
