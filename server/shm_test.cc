// End to end over a real Unix socket (in a temporary directory) with the CPU backend: the
// listener beside TCP, and shared-memory regions (real memfds) named by Gemm calls.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "client/gemm_client.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

double ErrorAgainstReference(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint32_t m,
                             uint32_t n, uint32_t k) {
  std::vector<float> reference = ReferenceGemm(a, b, m, n, k);
  return RelativeFrobeniusError(c, reference.data(), reference.size());
}

const uint16_t* Half(const std::string& bytes) {
  return reinterpret_cast<const uint16_t*>(bytes.data());
}

class ShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hgemm_shm_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_path_ = dir_ + "/hgemm.sock";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartServer(ServerOptions options) {
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {"unix:" + socket_path_};
    server_ = HgemmServer::Start(options, MakeCpuBackend({.workers = 2}));
    ASSERT_NE(server_, nullptr);
    unix_ = v1::GemmService::NewStub(Connect("unix:" + socket_path_));
    tcp_ = v1::GemmService::NewStub(Connect("127.0.0.1:" + std::to_string(server_->port())));
  }

  std::string dir_, socket_path_;
  std::mt19937_64 rng_{20261204};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<v1::GemmService::Stub> unix_, tcp_;
};

TEST_F(ShmTest, UnixSocketServesBesideTcpWithItsMode) {
  ServerOptions options;
  options.unix_socket_mode = 0660;
  StartServer(options);
  struct stat st {};
  ASSERT_EQ(stat(socket_path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  for (v1::GemmService::Stub* stub : {unix_.get(), tcp_.get()}) {
    v1::GemmRequest r = RandomRequest(19, 7, 33, rng_);
    v1::GemmResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Gemm(&context, r, &response).ok());
    EXPECT_LT(ErrorAgainstReference(Half(r.a()), Half(r.b()), Half(response.c()), 19, 7, 33),
              kServiceTolerance.fp32_acc);
  }
}

}  // namespace
}  // namespace hgemm
