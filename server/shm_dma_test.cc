// Shared-memory regions on the CUDA backend (DMA straight from and to the client's
// pages): over a real Unix socket with real memfds, the server pins each region
// (cudaHostRegister) and copies A, B, C_in and C between it and the device without staging.
// Skips when no usable GPU is present.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <random>
#include <string>

#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cuda_backend.h"
#include "server/server.h"
#include "server/testing/forwarding_backend.h"
#include "server/testing/gated_backend.h"
#include "server/testing/memfd.h"
#include "server/testing/region_test.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

// The CUDA backend unable to pin (as over RLIMIT_MEMLOCK): its regions go through staging.
class NoPinBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status PinHostMemory(void*, int64_t, std::function<void()>*) override {
    return absl::ResourceExhaustedError("cudaHostRegister: out of memory (test)");
  }
};

class ShmDmaTest : public RegionTest {
 protected:
  void SetUp() override {
    std::string error;
    if (!MakeCudaBackend({.streams_per_device = 2}, &error)) {
      GTEST_SKIP() << "no usable GPU: " << error;
    }
    MakeSocketDir();
  }
  void TearDown() override {
    server_.reset();
    RegionTest::TearDown();
  }

  // A server on the CUDA backend (wrapped by `wrap` if given) with shared memory on.
  void StartServer(std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap = {}) {
    std::string error;
    std::unique_ptr<Backend> backend = MakeCudaBackend({.streams_per_device = 2}, &error);
    ASSERT_NE(backend, nullptr) << error;
    if (wrap) backend = wrap(std::move(backend));
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.more_listen_addresses = {socket_address()};
    options.service.regions.allow_shared_memory = true;
    server_ = HgemmServer::Start(options, std::move(backend));
    ASSERT_NE(server_, nullptr);
    stub_ = v1::GemmService::NewStub(
        grpc::CreateChannel(socket_address(), grpc::InsecureChannelCredentials()));
  }

  // `r`'s A, B and C_in (with beta ≠ 0) in one region, C poisoned in another: the GEMM by
  // regions; returns C as the region holds it. `dma`: what RegisterRegion must say.
  std::string GemmByRegions(const v1::GemmRequest& r, bool dma) {
    const int64_t c_bytes = int64_t(r.m()) * r.n() * 2;
    const int64_t b_offset = Pad(r.a().size()), c_in_offset = b_offset + Pad(r.b().size());
    const int64_t in_bytes = c_in_offset + r.c_in().size();
    TestMemfd in(in_bytes), out(c_bytes);
    Write(in, 0, r.a());
    Write(in, b_offset, r.b());
    Write(in, c_in_offset, r.c_in());
    Write(out, 0, std::string(c_bytes, '\xff'));  // NaN: an element not written fails
    v1::RegionInfo in_info, out_info;
    EXPECT_TRUE(Register(in, in_bytes, &in_info).ok());
    EXPECT_TRUE(Register(out, c_bytes, &out_info).ok());
    EXPECT_EQ(in_info.dma(), dma);
    EXPECT_EQ(out_info.dma(), dma);
    v1::GemmRequest shm = r;
    SetRegion(shm.mutable_a_region(), in_info.region(), 0);
    SetRegion(shm.mutable_b_region(), in_info.region(), b_offset);
    if (!r.c_in().empty()) SetRegion(shm.mutable_c_in_region(), in_info.region(), c_in_offset);
    SetRegion(shm.mutable_c_region(), out_info.region(), 0);
    v1::GemmResponse response;
    grpc::Status s = Gemm(shm, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(response.c().empty());
    EXPECT_TRUE(Unregister(in_info.region()).ok());
    EXPECT_TRUE(Unregister(out_info.region()).ok());
    return Read(out, 0, c_bytes);
  }

  std::mt19937_64 rng_{20261205};
  std::unique_ptr<HgemmServer> server_;
};

// An odd shape with alpha/beta and C_in from a region, against float64; a large one (each
// operand past a staging piece) against the fp32 reference.
TEST_F(ShmDmaTest, RegionGemmsByDmaMatchTheReference) {
  StartServer();
  v1::GemmRequest odd = RandomRequest(257, 129, 95, rng_);
  odd.set_alpha(0.75f);
  odd.set_beta(-1.25f);
  SetRandomCIn(&odd, rng_);
  EXPECT_LT(RelativeErrorOfC(odd, GemmByRegions(odd, /*dma=*/true)), kServiceTolerance.fp32_acc);

  const uint32_t m = 2304, n = 2048, k = 2080;
  const v1::GemmRequest large = RandomRequest(m, n, k, rng_);
  const std::string c = GemmByRegions(large, /*dma=*/true);
  const std::vector<float> reference =
      ReferenceGemm(reinterpret_cast<const uint16_t*>(large.a().data()),
                    reinterpret_cast<const uint16_t*>(large.b().data()), m, n, k);
  EXPECT_LT(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(c.data()), reference.data(),
                                   reference.size()),
            kServiceTolerance.fp32_acc);
}

// A GEMM holds its pinned regions: unregistering meanwhile is refused (nothing is unpinned or
// unmapped under its copies); once it is answered (correctly) the region unregisters.
TEST_F(ShmDmaTest, UnregisterWhileAGemmRunsIsRefused) {
  GatedBackend* gate = nullptr;
  StartServer([&](std::unique_ptr<Backend> cuda) {
    auto gated = std::make_unique<GatedBackend>(std::move(cuda));
    gate = gated.get();
    return gated;
  });
  const v1::GemmRequest r = RandomRequest(512, 384, 320, rng_);
  const int64_t c_bytes = 512 * 384 * 2;
  TestMemfd file(r.a().size() + c_bytes);
  Write(file, 0, r.a());
  Write(file, r.a().size(), std::string(c_bytes, '\xff'));
  v1::RegionInfo info;
  ASSERT_TRUE(Register(file, r.a().size() + c_bytes, &info).ok());
  EXPECT_TRUE(info.dma());
  v1::GemmRequest shm = r;
  SetRegion(shm.mutable_a_region(), info.region(), 0);
  SetRegion(shm.mutable_c_region(), info.region(), r.a().size());
  v1::GemmResponse response;
  auto running = std::async(std::launch::async, [&] { return Gemm(shm, &response); });
  gate->AwaitWaiting();
  grpc::Status s = Unregister(info.region());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  gate->Open();
  grpc::Status ran = running.get();
  ASSERT_TRUE(ran.ok()) << ran.error_message();
  EXPECT_LT(RelativeErrorOfC(r, Read(file, r.a().size(), c_bytes)), kServiceTolerance.fp32_acc);
  EXPECT_TRUE(Unregister(info.region()).ok());
}

// A region the backend could not pin still serves, through staging: dma false, C correct.
TEST_F(ShmDmaTest, UnpinnableRegionGoesThroughStaging) {
  StartServer([](std::unique_ptr<Backend> cuda) -> std::unique_ptr<Backend> {
    return std::make_unique<NoPinBackend>(std::move(cuda));
  });
  const v1::GemmRequest r = RandomRequest(300, 200, 100, rng_);
  EXPECT_LT(RelativeErrorOfC(r, GemmByRegions(r, /*dma=*/false)), kServiceTolerance.fp32_acc);
}

}  // namespace
}  // namespace hgemm
