// A device that fails for good (a sticky CUDA error), seen from outside the server: health
// turns NOT_SERVING once no device is usable (and stays SERVING while another one is),
// hgemm_device_failed{device} turns 1, and GEMMs on the failed device are UNAVAILABLE. On the
// CPU with a backend whose devices can be failed by the test; then on a GPU with the
// fault-injecting CUDA backend and a kernel that really faults (skipped without a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gemm_client.h"
#include "client/metrics_scrape.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/numerics/cpu_gemm.h"
#include "proto/numerics/error_stats.h"
#include "server/backend/cpu_backend.h"
#include "server/backend/cuda_fault_kernel.h"
#include "server/backend/fault_injector.h"
#include "server/core/status.h"
#include "server/server.h"
#include "server/testing/test_requests.h"

namespace hgemm {
namespace {

using grpc::health::v1::HealthCheckResponse;

// `devices` CPU backends posing as devices of one backend (slot d is device d); the test fails
// a device, after which its Run refuses as the CUDA backend's does.
class FailableBackend final : public Backend {
 public:
  explicit FailableBackend(int devices) : failed_(devices) {
    for (int d = 0; d < devices; ++d) inner_.push_back(MakeCpuBackend({.workers = 1}));
  }
  void FailDevice(int d) { failed_[d] = true; }

  std::string Name() const override { return "failable"; }
  std::vector<DeviceDescription> Devices() const override {
    std::vector<DeviceDescription> out;
    for (int d = 0; d < int(inner_.size()); ++d) {
      out.push_back({.id = d, .name = "fake", .memory_bytes = 1 << 30, .slots = 1});
    }
    return out;
  }
  std::vector<KernelDescription> Kernels() const override { return inner_[0]->Kernels(); }
  int NumSlots() const override { return int(inner_.size()); }
  int SlotDevice(int slot) const override { return slot; }
  int64_t MaxJobBytes() const override { return inner_[0]->MaxJobBytes(); }
  bool DeviceHealthy(int d) const override { return !failed_[d]; }
  absl::Status Run(int slot, const GemmJob& job, GemmReport* report) override {
    if (failed_[slot]) {
      return status::DeviceFailed("device " + std::to_string(slot) + " has failed");
    }
    return inner_[slot]->Run(0, job, report);
  }
  absl::Status AllocateResident(int d, int64_t bytes, std::shared_ptr<ResidentBuffer>* b) override {
    return inner_[d]->AllocateResident(d, bytes, b);
  }
  absl::Status WriteResident(ResidentBuffer& b, int64_t offset, const void* host,
                             int64_t bytes) override {
    return inner_[b.device_index]->WriteResident(b, offset, host, bytes);
  }
  absl::Status ReadResident(const ResidentBuffer& b, void* host) override {
    return inner_[b.device_index]->ReadResident(b, host);
  }

 private:
  std::vector<std::unique_ptr<Backend>> inner_;
  std::vector<std::atomic<bool>> failed_;
};

class DeviceFailureTest : public ::testing::Test {
 protected:
  void Start(std::unique_ptr<Backend> backend) {
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    server_ = HgemmServer::Start(options, std::move(backend));
    ASSERT_NE(server_, nullptr);
    auto channel = Connect("127.0.0.1:" + std::to_string(server_->port()));
    client_ = std::make_unique<GemmClient>(channel);
    health_ = grpc::health::v1::Health::NewStub(channel);
  }

  HealthCheckResponse::ServingStatus Health() {
    grpc::ClientContext context;
    HealthCheckResponse response;
    grpc::Status s = health_->Check(&context, {}, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.status();
  }
  // Polls health until it is `want` (at most 10 s); returns the seconds it took, or -1.
  double WaitForHealth(HealthCheckResponse::ServingStatus want) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      if (Health() == want) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  double DeviceFailedGauge(int device) {
    std::string body;
    EXPECT_EQ(HttpGet("127.0.0.1", server_->metrics_port(), "/metrics", &body), 200);
    Scrape s = ParseExposition(body);
    EXPECT_TRUE(s.errors.empty());
    const std::string series = "hgemm_device_failed{device=\"" + std::to_string(device) + "\"}";
    EXPECT_TRUE(s.Has(series)) << body;
    return s.Get(series);
  }
  // A checked GEMM through the server: its status (and C right when OK).
  grpc::Status Gemm(uint32_t m, uint32_t n, uint32_t k) {
    v1::GemmRequest request = RandomRequest(m, n, k, rng_);
    v1::GemmResponse response;
    grpc::Status s = client_->Gemm(request, &response);
    if (s.ok()) {
      const auto* a = reinterpret_cast<const uint16_t*>(request.a().data());
      const auto* b = reinterpret_cast<const uint16_t*>(request.b().data());
      std::vector<float> reference = ReferenceGemm(a, b, m, n, k);
      EXPECT_EQ(response.c().size(), size_t(2) * m * n);
      EXPECT_LE(RelativeFrobeniusError(reinterpret_cast<const uint16_t*>(response.c().data()),
                                       reference.data(), int64_t(m) * n),
                kKernelTolerance.fp32_acc);
    }
    return s;
  }

  std::mt19937_64 rng_{20261204};
  std::unique_ptr<HgemmServer> server_;
  std::unique_ptr<GemmClient> client_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

TEST_F(DeviceFailureTest, LastDeviceFailedTurnsHealthNotServingAndRefusesGemms) {
  auto owned = std::make_unique<FailableBackend>(1);
  FailableBackend* backend = owned.get();
  Start(std::move(owned));
  ASSERT_GE(WaitForHealth(HealthCheckResponse::SERVING), 0);
  ASSERT_TRUE(Gemm(33, 65, 17).ok());
  EXPECT_EQ(DeviceFailedGauge(0), 0);
  backend->FailDevice(0);
  const double seconds = WaitForHealth(HealthCheckResponse::NOT_SERVING);
  ASSERT_GE(seconds, 0) << "health never turned NOT_SERVING";
  std::printf("health NOT_SERVING %.3f s after the device failed\n", seconds);
  EXPECT_EQ(DeviceFailedGauge(0), 1);
  grpc::Status s = Gemm(33, 65, 17);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("has failed"), std::string::npos) << s.error_message();
  EXPECT_FALSE(server_->backend().Healthy());
}

TEST_F(DeviceFailureTest, OneOfTwoFailedKeepsServingOnTheOther) {
  auto owned = std::make_unique<FailableBackend>(2);
  FailableBackend* backend = owned.get();
  Start(std::move(owned));
  ASSERT_GE(WaitForHealth(HealthCheckResponse::SERVING), 0);
  backend->FailDevice(0);
  for (int i = 0; i < 10; ++i) {
    grpc::Status s = Gemm(40 + i, 30, 20);
    EXPECT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the health watcher's poll
  EXPECT_EQ(Health(), HealthCheckResponse::SERVING);
  EXPECT_EQ(DeviceFailedGauge(0), 1);
  EXPECT_EQ(DeviceFailedGauge(1), 0);
  EXPECT_TRUE(server_->backend().Healthy());
  EXPECT_EQ(server_->backend().FailedDevices(), 1);
}

// Last: the fault kills this process's CUDA context.
TEST_F(DeviceFailureTest, RealStickyFaultOnTheGpu) {
  std::string error;
  std::unique_ptr<Backend> cuda =
      MakeFaultInjectingCudaBackend({.devices = {0}, .streams_per_device = 2}, &error);
  if (cuda == nullptr) GTEST_SKIP() << "no usable GPU: " << error;
  Start(std::move(cuda));
  ASSERT_GE(WaitForHealth(HealthCheckResponse::SERVING), 0);
  ASSERT_TRUE(Gemm(255, 257, 100).ok());
  FaultInjector::Global().ArmAfterLaunch(
      [](cudaStream_t stream) { ASSERT_EQ(LaunchIllegalAddressWrite(stream), cudaSuccess); });
  grpc::Status s = Gemm(1000, 1000, 1000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  const double seconds = WaitForHealth(HealthCheckResponse::NOT_SERVING);
  ASSERT_GE(seconds, 0) << "health never turned NOT_SERVING";
  std::printf("GPU: health NOT_SERVING %.3f s after the faulting GEMM's answer\n", seconds);
  EXPECT_EQ(DeviceFailedGauge(0), 1);
  for (int i = 0; i < 5; ++i) {
    s = Gemm(64 + i, 64, 64);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  server_->Shutdown();  // drains on a dead context without hanging
}

}  // namespace
}  // namespace hgemm
