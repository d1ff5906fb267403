// A real sticky device fault: a test kernel writes to an unmapped address right after a GEMM's
// kernel (FaultInjector::ArmAfterLaunch), which kills the device's CUDA context for the rest of
// the process. The backend must see it (the sticky class of cudaError_t), mark the device
// failed, answer the GEMM in flight and every later one UNAVAILABLE, and never return a C
// from that device computed after the fault. Its own test binary: the context does not
// recover. Skips when no usable GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/backend/cuda_fault_kernel.h"
#include "server/backend/cuda_test_util.h"
#include "server/backend/fault_injector.h"

namespace hgemm {
namespace {

TEST(CudaStickyFault, TheDeviceIsFailedAndNothingAfterTheFaultIsReturned) {
  std::string error;
  std::unique_ptr<Backend> backend = MakeFaultInjectingCudaBackend(
      {.streams_per_device = 4, .device_memory_fraction = 0.3}, &error);
  if (backend == nullptr) GTEST_SKIP() << "no usable GPU: " << error;

  // Before: right answers on every slot, and a resident matrix and a kept C on the device.
  for (int slot = 0; slot < backend->NumSlots(); ++slot) {
    RandomGemm g(257, 300, 129, slot);
    ASSERT_TRUE(g.Run(*backend, slot).ok());
    EXPECT_TRUE(g.Correct());
  }
  RandomGemm kept(64, 64, 64, 50);
  kept.job.keep_c = true;
  ASSERT_TRUE(kept.Run(*backend, 0).ok());

  // The other three slots run GEMMs in a loop while slot 0's next GEMM faults.
  std::atomic<bool> faulted{false}, stop{false};
  std::atomic<int> ok_before{0}, ok_after{0}, wrong{0}, unavailable{0}, other{0};
  std::vector<std::thread> threads;
  for (int slot = 1; slot < backend->NumSlots(); ++slot) {
    threads.emplace_back([&, slot] {
      for (int i = 0; !stop; ++i) {
        const bool after_fault = faulted.load();
        RandomGemm g(512 + slot, 512, 1024, 100 * slot + i);
        absl::Status s = g.Run(*backend, slot);
        if (s.ok()) {
          (!g.Correct() ? wrong : after_fault ? ok_after : ok_before)++;
        } else {
          (s.code() == absl::StatusCode::kUnavailable ? unavailable : other)++;
          if (s.code() != absl::StatusCode::kUnavailable) ADD_FAILURE() << s;
        }
        if (!backend->DeviceHealthy(0) && i > 2) break;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are busy
  FaultInjector::Global().ArmAfterLaunch(
      [](cudaStream_t stream) { ASSERT_EQ(LaunchIllegalAddressWrite(stream), cudaSuccess); });
  RandomGemm victim(1000, 1000, 1000, 99);
  faulted = true;
  absl::Status s = victim.Run(*backend, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("has failed"), std::string::npos) << s;
  EXPECT_EQ(victim.c, std::vector<uint16_t>(1000 * 1000, 0xFFFF)) << "a C came back";
  EXPECT_FALSE(backend->DeviceHealthy(0));
  EXPECT_FALSE(backend->Healthy());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(other.load(), 0);
  // Once the device is known failed, no GEMM on it succeeds (ok_after counts GEMMs started
  // after the faulting one, which may have finished before the fault landed: at most one per
  // slot).
  EXPECT_LE(ok_after.load(), backend->NumSlots() - 1);
  std::printf("other slots: %d right before the fault, %d right while it landed, %d UNAVAILABLE\n",
              ok_before.load(), ok_after.load(), unavailable.load());

  // After: everything on the device is refused, C untouched.
  for (int slot = 0; slot < backend->NumSlots(); ++slot) {
    RandomGemm g(64, 64, 64, 200 + slot);
    s = g.Run(*backend, slot);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_EQ(g.c, std::vector<uint16_t>(64 * 64, 0xFFFF));
  }
  std::vector<uint16_t> host(64 * 64, 0xFFFF);
  EXPECT_EQ(backend->ReadResident(*kept.report.c_resident, host.data()).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(host, std::vector<uint16_t>(64 * 64, 0xFFFF));
  std::shared_ptr<ResidentBuffer> more;
  EXPECT_EQ(backend->AllocateResident(0, 4096, &more).code(), absl::StatusCode::kUnavailable);
  // The context is gone for good: CUDA itself says so.
  EXPECT_NE(cudaDeviceSynchronize(), cudaSuccess);
  kept.report.c_resident.reset();
  // The backend is torn down on a dead context; that must not hang or crash either.
  backend.reset();
}

}  // namespace
}  // namespace hgemm
