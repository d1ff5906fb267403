// Injected CUDA failures at every call site class of the CUDA backend (FaultInjector, test
// build only): each costs exactly its GEMM (a clear INTERNAL or RESOURCE_EXHAUSTED naming the
// call), gives back what it held (the kept C's buffer, the slot's buffers and staging ring),
// leaves the device healthy, and the next GEMMs on that slot are right. An injected sticky
// code marks the device failed (UNAVAILABLE from then on) without harming the real context.
// Skips when no usable GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server/backend/cuda_fault_kernel.h"
#include "server/backend/cuda_test_util.h"
#include "server/backend/fault_injector.h"
#include "server/testing/shared_b_gemms.h"

namespace hgemm {
namespace {

// A small GEMM whose operands and C take several staging pieces (64 KiB): A 5, B 5, C 3.
constexpr int64_t kM = 300, kN = 280, kK = 520;

class CudaFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FaultInjector::Global().Reset();
    std::string error;
    backend_ = MakeFaultInjectingCudaBackend({.streams_per_device = 2,
                                              .preallocate_bytes_per_stream = 1 << 20,
                                              .device_memory_fraction = 0.2,
                                              .staging_piece_bytes = 64 << 10,
                                              .staging_buffers = 3},
                                             &error);
    if (backend_ == nullptr) GTEST_SKIP() << "no usable GPU: " << error;
  }
  void TearDown() override { FaultInjector::Global().Reset(); }

  // Three GEMMs on `slot` after a fault, each right: the same shape, a larger one (the slot's
  // buffers grow) and a tiny one.
  void ExpectNextGemmsRight(int slot, uint64_t seed) {
    using Shape = std::tuple<int64_t, int64_t, int64_t>;
    for (auto [m, n, k] : {Shape{kM, kN, kK}, Shape{700, 650, 600}, Shape{7, 5, 3}}) {
      RandomGemm g(m, n, k, seed++);
      absl::Status s = g.Run(*backend_, slot);
      ASSERT_TRUE(s.ok()) << m << "x" << n << "x" << k << " after the fault: " << s;
      EXPECT_LE(g.Error(), kKernelTolerance.fp32_acc) << m << "x" << n << "x" << k;
    }
    EXPECT_TRUE(backend_->DeviceHealthy(0));
    EXPECT_TRUE(backend_->Healthy());
  }

  std::unique_ptr<Backend> backend_;
};

struct FaultCase {
  const char* name;
  FaultSite site;
  cudaError_t error;
  int skip;  // calls at the site that succeed before the failing one
  absl::StatusCode code;
  const char* names;  // the message names this call
};

class CudaFaultEachSite : public CudaFaultTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(CudaFaultEachSite, CostsItsGemmOnlyAndTheSlotRunsOnRight) {
  const FaultCase& f = GetParam();
  // The slot's buffers are 1 MiB: a 700x650x600 GEMM must grow them (the allocation site).
  const bool grows = f.site == FaultSite::kDeviceAlloc;
  RandomGemm g(grows ? 700 : kM, grows ? 650 : kN, grows ? 600 : kK, 1);
  FaultInjector::Global().Arm(f.site, f.error, f.skip);
  absl::Status s = g.Run(*backend_, 1);
  ASSERT_EQ(FaultInjector::Global().injected(f.site), 1) << "the fault was not reached";
  EXPECT_EQ(s.code(), f.code) << s;
  EXPECT_NE(s.message().find(f.names), std::string::npos) << s;
  EXPECT_NE(s.message().find("device 0 stream 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find(cudaGetErrorString(f.error)), std::string::npos) << s;
  ExpectNextGemmsRight(1, 100);
  ExpectNextGemmsRight(0, 200);  // the other slot never noticed
}

INSTANTIATE_TEST_SUITE_P(
    Sites, CudaFaultEachSite,
    ::testing::Values(
        FaultCase{"SlotBufferAlloc", FaultSite::kDeviceAlloc, cudaErrorMemoryAllocation, 0,
                  absl::StatusCode::kResourceExhausted, "growing the stream's buffers"},
        FaultCase{"FirstCopyToDevice", FaultSite::kCopyToDevice, cudaErrorInvalidValue, 0,
                  absl::StatusCode::kInternal, "cudaMemcpyAsync"},
        FaultCase{"CopyToDeviceMidB", FaultSite::kCopyToDevice, cudaErrorInvalidValue, 7,
                  absl::StatusCode::kInternal, "cudaMemcpyAsync"},
        FaultCase{"CopyToHostMidC", FaultSite::kCopyToHost, cudaErrorInvalidValue, 1,
                  absl::StatusCode::kInternal, "cudaMemcpyAsync"},
        FaultCase{"Launch", FaultSite::kLaunch, cudaErrorLaunchOutOfResources, 0,
                  absl::StatusCode::kInternal, "kernel "},
        FaultCase{"StartEvent", FaultSite::kEvent, cudaErrorInvalidResourceHandle, 0,
                  absl::StatusCode::kInternal, "cudaEventRecord"},
        FaultCase{"EventMidCopyToDevice", FaultSite::kEvent, cudaErrorInvalidResourceHandle, 5,
                  absl::StatusCode::kInternal, "cudaEvent"},
        FaultCase{"EventMidCopyToHost", FaultSite::kEvent, cudaErrorInvalidResourceHandle, 25,
                  absl::StatusCode::kInternal, "cudaEvent"},
        FaultCase{"SetDevice", FaultSite::kStream, cudaErrorInvalidDevice, 0,
                  absl::StatusCode::kInternal, "cudaSetDevice"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) { return std::string(info.param.name); });

// A GEMM whose C stays on the device: a fault after its buffer was taken gives it back (the
// next allocation of that size class gets the very same buffer from the cache).
TEST_F(CudaFaultTest, KeptResultsBufferGoesBackOnAFault) {
  RandomGemm first(kM, kN, kK, 2);
  first.job.keep_c = true;
  ASSERT_TRUE(first.Run(*backend_, 0).ok());
  ASSERT_NE(first.report.c_resident, nullptr);
  void* const address = first.report.c_resident->data;
  first.report.c_resident.reset();  // back to the cache
  for (FaultSite site : {FaultSite::kLaunch, FaultSite::kEvent}) {
    RandomGemm g(kM, kN, kK, 3);
    g.job.keep_c = true;
    // At the launch, or at the event recorded after it (the 23rd event call of this GEMM).
    FaultInjector::Global().Arm(site, cudaErrorLaunchOutOfResources,
                                site == FaultSite::kEvent ? 22 : 0);
    absl::Status s = g.Run(*backend_, 0);
    EXPECT_EQ(FaultInjector::Global().injected(site), 1) << FaultSiteName(site);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_EQ(g.report.c_resident, nullptr) << "a failed GEMM hands out no C";
    FaultInjector::Global().Reset();
  }
  std::shared_ptr<ResidentBuffer> again;
  ASSERT_TRUE(backend_->AllocateResident(0, kM * kN * 2, &again).ok());
  EXPECT_EQ(again->data, address) << "the failed GEMMs did not give the kept C's buffer back";
  again.reset();
  // And kept results work again, checked through a download.
  RandomGemm after(kM, kN, kK, 4);
  after.job.keep_c = true;
  ASSERT_TRUE(after.Run(*backend_, 0).ok());
  std::vector<uint16_t> c(kM * kN, 0xFFFF);
  ASSERT_TRUE(backend_->ReadResident(*after.report.c_resident, c.data()).ok());
  EXPECT_LE(after.Error(&c), kKernelTolerance.fp32_acc);
}

TEST_F(CudaFaultTest, KeptResultsAllocationIsResourceExhausted) {
  RandomGemm g(kM, kN, kK, 5);
  g.job.keep_c = true;
  FaultInjector::Global().Arm(FaultSite::kDeviceAlloc, cudaErrorMemoryAllocation);
  absl::Status s = g.Run(*backend_, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("for a resident matrix"), std::string::npos) << s;
  EXPECT_EQ(g.report.c_resident, nullptr);
  ExpectNextGemmsRight(0, 300);
}

TEST_F(CudaFaultTest, ResidentUploadAndDownloadFaultsCostOneCopy) {
  std::mt19937_64 rng(6);
  const std::vector<uint16_t> data = RandomHalfMatrix(100'000, rng);
  std::shared_ptr<ResidentBuffer> buffer;
  ASSERT_TRUE(backend_->AllocateResident(0, int64_t(data.size()) * 2, &buffer).ok());
  FaultInjector::Global().Arm(FaultSite::kCopyToDevice, cudaErrorInvalidValue);
  absl::Status s = backend_->WriteResident(*buffer, 0, data.data(), buffer->bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("upload of a resident matrix"), std::string::npos) << s;
  ASSERT_TRUE(backend_->WriteResident(*buffer, 0, data.data(), buffer->bytes).ok());
  std::vector<uint16_t> back(data.size(), 0xFFFF);
  FaultInjector::Global().Arm(FaultSite::kCopyToHost, cudaErrorInvalidValue);
  s = backend_->ReadResident(*buffer, back.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("download of a resident matrix"), std::string::npos) << s;
  ASSERT_TRUE(backend_->ReadResident(*buffer, back.data()).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(backend_->Healthy());
}

// A sticky code, injected (the real context stays fine): the device is failed for good, and
// everything on it is UNAVAILABLE, naming it.
TEST_F(CudaFaultTest, InjectedStickyErrorFailsTheDevice) {
  std::shared_ptr<ResidentBuffer> resident;
  ASSERT_TRUE(backend_->AllocateResident(0, 4096, &resident).ok());
  RandomGemm g(kM, kN, kK, 7);
  FaultInjector::Global().Arm(FaultSite::kEvent, cudaErrorIllegalAddress, 24);
  absl::Status s = g.Run(*backend_, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("has failed"), std::string::npos) << s;
  EXPECT_FALSE(backend_->DeviceHealthy(0));
  EXPECT_FALSE(backend_->Healthy());
  EXPECT_EQ(backend_->FailedDevices(), 1);
  FaultInjector::Global().Reset();
  for (int slot : {0, 1}) {
    RandomGemm next(kM, kN, kK, 8);
    s = next.Run(*backend_, slot);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("device 0 has failed"), std::string::npos) << s;
    EXPECT_EQ(next.c, std::vector<uint16_t>(kM * kN, 0xFFFF)) << "C was written";
  }
  std::shared_ptr<ResidentBuffer> more;
  EXPECT_EQ(backend_->AllocateResident(0, 4096, &more).code(), absl::StatusCode::kUnavailable);
  std::vector<uint16_t> host(2048);
  EXPECT_EQ(backend_->ReadResident(*resident, host.data()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(backend_->WriteResident(*resident, 0, host.data(), 4096).code(),
            absl::StatusCode::kUnavailable);
}

// Concurrent GEMMs on both slots while one slot's calls fail now and then: every OK answer is
// right, every failure is INTERNAL, and the device stays healthy.
TEST_F(CudaFaultTest, FaultsUnderConcurrencyNeverReturnAWrongC) {
  std::atomic<int> ok{0}, failed{0}, wrong{0}, other{0};
  std::vector<std::thread> threads;
  for (int slot : {0, 1}) {
    threads.emplace_back([&, slot] {
      for (int i = 0; i < 40; ++i) {
        if (slot == 1 && i % 4 == 0) {
          FaultInjector::Global().Arm(FaultSite(i / 4 % kNumFaultSites), cudaErrorInvalidValue,
                                      i % 3);
        }
        RandomGemm g(kM + i, kN, kK - i, 1000 * slot + i);
        absl::Status s = g.Run(*backend_, slot);
        if (s.ok()) {
          (g.Correct() ? ok : wrong)++;
        } else {
          (s.code() == absl::StatusCode::kInternal ||
                   s.code() == absl::StatusCode::kResourceExhausted
               ? failed
               : other)++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(failed.load(), 0);
  EXPECT_GT(ok.load(), 40);
  EXPECT_TRUE(backend_->Healthy());
}

// The CUDA backend's own RunBatch: members of 7, 2 (its C kept) and 9 rows against one
// resident B, checked. Their rows leave the device only after the stacked C has passed.
class CudaBatchFaultTest : public CudaFaultTest {
 protected:
  void MakeMembers(uint64_t seed, CSink middle_sink = CSink::kKeepC) {
    std::mt19937_64 rng(seed);
    b_ = std::make_unique<SharedB>(backend_.get(), kN, kK, GemmForm{}, rng);
    members_.clear();
    jobs_.clear();
    for (auto [m, sink] :
         {std::pair{7, CSink::kHost}, std::pair{2, middle_sink}, std::pair{9, CSink::kHost}}) {
      members_.push_back(std::make_unique<RowsGemm>(backend_.get(), *b_, m, rng, 1.0f, 0.0f, sink));
      members_.back()->job.verify_repetitions = 2;
      jobs_.push_back(&members_.back()->job);
    }
    reports_.assign(jobs_.size(), GemmReport());
  }
  std::vector<absl::Status> RunBatch(int slot) {
    return backend_->RunBatch(slot, jobs_, &reports_);
  }

  std::unique_ptr<SharedB> b_;
  std::vector<std::unique_ptr<RowsGemm>> members_;
  std::vector<const GemmJob*> jobs_;
  std::vector<GemmReport> reports_;
};

// A stacked C damaged before its check (row 8: the kept member's) reaches no member's sink:
// every status OK with the check's failure in each report, no kept C handed out, the host
// sinks still poisoned. The next batch passes and is right.
TEST_F(CudaBatchFaultTest, CheckFailureWritesNoSink) {
  for (bool corrupted : {true, false}) {
    SCOPED_TRACE(corrupted ? "corrupted" : "clean");
    MakeMembers(corrupted ? 11 : 12);
    if (corrupted) {
      FaultInjector::Global().ArmCorruptOutput([](cudaStream_t stream, void* c, int64_t) {
        for (int64_t col = 0; col < 8; ++col) {
          ASSERT_EQ(LaunchXorWord(stream, static_cast<uint16_t*>(c) + 8 * kN + 5 * col, 2, 0x4000u),
                    cudaSuccess);
        }
      });
    }
    const std::vector<absl::Status> statuses = RunBatch(1);
    for (size_t i = 0; i < jobs_.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(statuses[i].ok()) << statuses[i];
      EXPECT_EQ(reports_[i].batch_size, 3);
      if (corrupted) {
        EXPECT_NE(reports_[i].verify_failure, "");
        EXPECT_EQ(reports_[i].verified_repetitions, 0);
        EXPECT_EQ(reports_[i].c_resident, nullptr);
        EXPECT_TRUE(members_[i]->Untouched());
      } else {
        EXPECT_EQ(reports_[i].verify_failure, "");
        EXPECT_EQ(reports_[i].verified_repetitions, 2);
        EXPECT_TRUE(members_[i]->Correct(reports_[i]));
      }
    }
  }
  EXPECT_TRUE(backend_->Healthy());
}

// A member whose kept C cannot be allocated fails alone (RESOURCE_EXHAUSTED), the others are
// delivered right.
TEST_F(CudaBatchFaultTest, MemberWhoseKeptCCannotBeAllocatedFailsAlone) {
  MakeMembers(13);
  FaultInjector::Global().Arm(FaultSite::kDeviceAlloc, cudaErrorMemoryAllocation);
  const std::vector<absl::Status> statuses = RunBatch(0);
  EXPECT_EQ(FaultInjector::Global().injected(FaultSite::kDeviceAlloc), 1);
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kResourceExhausted) << statuses[1];
  EXPECT_EQ(reports_[1].c_resident, nullptr);
  for (size_t i : {size_t{0}, size_t{2}}) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i];
    EXPECT_TRUE(members_[i]->Correct(reports_[i])) << i;
  }
}

// A CUDA call of the batch that fails (copying the members' rows in, or C's out) fails every
// member with INTERNAL naming it and hands out no kept C; the device stays healthy and the
// next batch and GEMMs on that slot are right.
TEST_F(CudaBatchFaultTest, AFailedCallFailsEveryMemberAndTheSlotRunsOnRight) {
  for (FaultSite site : {FaultSite::kCopyToDevice, FaultSite::kCopyToHost}) {
    SCOPED_TRACE(FaultSiteName(site));
    // The stacked A's one piece (the members' rows share it), or the kept C's copy (after
    // the check's own copy; the host members' rows go last).
    MakeMembers(14, CSink::kKeepC);
    FaultInjector::Global().Arm(site, cudaErrorInvalidValue,
                                site == FaultSite::kCopyToHost ? 1 : 0);
    const std::vector<absl::Status> statuses = RunBatch(1);
    EXPECT_EQ(FaultInjector::Global().injected(site), 1);
    FaultInjector::Global().Reset();
    for (size_t i = 0; i < statuses.size(); ++i) {
      EXPECT_EQ(statuses[i].code(), absl::StatusCode::kInternal) << i << ": " << statuses[i];
      EXPECT_NE(statuses[i].message().find("cudaMemcpy"), std::string::npos) << statuses[i];
      EXPECT_EQ(reports_[i].c_resident, nullptr) << i;
    }
    MakeMembers(15, CSink::kDevice);
    const std::vector<absl::Status> next = RunBatch(1);
    for (size_t i = 0; i < next.size(); ++i) {
      ASSERT_TRUE(next[i].ok()) << i << ": " << next[i];
      EXPECT_TRUE(members_[i]->Correct(reports_[i])) << i;
    }
  }
  ExpectNextGemmsRight(1, 400);
}

}  // namespace
}  // namespace hgemm
